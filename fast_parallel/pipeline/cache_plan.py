"""Which inputs the run caches, where, and the start line's words.

``cache_inputs='auto'`` sizes the train set's decoded images (from the
data infos) and its gt-database files (from the database infos), without
reading a file or drawing a random number, and maps one shared-memory
:class:`~fast_parallel.pipeline.cache.DecodedCache` per dataset and per
database when all of it fits :data:`AUTO_SHARE` of the available memory.
``'disk:DIR'`` keeps decoded images as files
(:mod:`~fast_parallel.pipeline.disk_cache`). Why and how: ``docs/
pipeline.md``.
"""
import os
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmcv.transforms import LoadImageFromFile

from fast_parallel.pipeline.cache import DecodedCache, FastLoadImageFromFile

__all__ = [
    'AUTO_SHARE', 'available_memory', 'budget_left', 'disk_folder',
    'install_cache'
]

#: Share of ``MemAvailable`` the decoded train set may take with
#: ``cache_inputs='auto'``.
AUTO_SHARE = 0.4
_CHANNELS = {'color': 3, 'grayscale': 1}
_DISK = 'disk:'


def available_memory() -> Optional[int]:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where unknown).
    """
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def disk_folder(cache_inputs: Optional[str]) -> Optional[str]:
    """The folder of ``'disk:DIR'``; None for ``'auto'`` and None.

    Raises:
        ValueError: For any other value.
    """
    if cache_inputs is None or cache_inputs == 'auto':
        return None
    if isinstance(cache_inputs, str) and cache_inputs.startswith(_DISK) \
            and cache_inputs[len(_DISK):].strip():
        return os.path.expanduser(cache_inputs[len(_DISK):].strip())
    raise ValueError("cache_inputs must be 'auto', 'disk:DIR' or None, got "
                     f'{cache_inputs!r}')


def _gb(nbytes: float) -> str:
    return f'{nbytes / 1e9:.1f} GB'


def _decoded_size(dataset: Any, load: LoadImageFromFile) -> Any:
    """(paths, bytes) of the decoded images of ``dataset``, or why unknown.
    """
    channels = _CHANNELS.get(load.color_type)
    if channels is None or load.to_float32:
        return f'color_type {load.color_type!r}' + (
            ', to_float32' if load.to_float32 else '') + \
            ': decoded sizes unknown'
    if _through_backend(load):
        return 'files read through a storage backend'
    paths, total = [], 0
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        if not {'img_path', 'height', 'width'} <= info.keys():
            return 'the data infos give no image sizes'
        paths.append(info['img_path'])
        total += int(info['height']) * int(info['width']) * channels
    return paths, total


def _through_backend(load: LoadImageFromFile) -> bool:
    return load.backend_args is not None or \
        load.file_client_args is not None


#: Each train dataset's caches by what they hold (an image decode's flags,
#: or a database's files), so that a pipeline rebuilt mid-run gets the same.
_KEPT: 'weakref.WeakKeyDictionary[Any, Dict[tuple, Any]]' = \
    weakref.WeakKeyDictionary()


def _decode_key(load: LoadImageFromFile) -> tuple:
    return ('image', load.color_type, load.imdecode_backend, load.to_float32)


def _plans(loads: Sequence[Any],
           databases: Sequence[Any]) -> Tuple[List[tuple], List[str]]:
    """(dataset, part, fast class, key, paths, bytes) for each part still
    without a cache (a part with a kept one gets it), and the reasons of
    the parts that cannot be cached."""
    plans, why = [], []
    parts = [(dataset, load, FastLoadImageFromFile, _decode_key(load))
             for dataset, load in loads]
    for dataset, sampler in databases:
        from fast_parallel.pipeline.points_cache import (
            FastLoadPointsFromFile, database_files)
        found = database_files(sampler)
        if isinstance(found, str):
            why.append(found)
            continue
        loader, paths, total = found
        parts.append((dataset, loader, FastLoadPointsFromFile,
                      ('points', loader.load_dim, tuple(paths)), paths, total))
    for dataset, part, fast, key, *found in parts:
        if type(part) is fast and part._fp_cache is not None:
            continue
        kept = _KEPT.get(dataset, {}).get(key)
        if kept is not None:
            part.__class__ = fast
            part._fp_cache = kept
            continue
        if not found:
            found = _decoded_size(dataset, part)
            if isinstance(found, str):
                why.append(found)
                continue
        plans.append((dataset, part, fast, key, *found))
    return plans, why


def install_cache(loads: Sequence[Any],
                  cache_inputs: Optional[str],
                  forked: bool,
                  databases: Sequence[Any] = ()) -> str:
    """Gives each image load and gt-database points loader a cache.

    With ``'auto'``: a :class:`DecodedCache` each, where all of them fit
    the budget together (else none). A part on a dataset that has a cache
    for the same inputs (a pipeline a hook rebuilt) gets that one.

    Args:
        loads (Sequence[tuple]): The train datasets and their image loads
            (stock's or fast already).
        cache_inputs (str | None): ``'auto'``, ``'disk:DIR'`` or None.
        forked (bool): Whether the DataLoader workers fork from this
            process (a spawned worker cannot map shared memory).
        databases (Sequence[tuple]): The train datasets and their
            ``ObjectSample``'s gt-database samplers.

    Returns:
        str: The start line's words, e.g. ``inputs cached in shared memory
        (up to 1.2 GB; 6.0 GB available): images``.
    """
    if cache_inputs is None:
        return 'inputs not cached (cache_inputs=None)'
    folder = disk_folder(cache_inputs)
    if folder is not None:
        return _install_disk(loads, folder, databases)
    if not loads and not databases:
        return 'inputs not cached (no LoadImageFromFile or gt-database)'
    if not forked:
        return 'inputs not cached (the workers are not forked)'
    plans, why = _plans(loads, databases)
    left = ''.join(f'; not cached: {reason}' for reason in why)
    need = sum(plan[-1] for plan in plans)
    available = available_memory()
    if available is None or need > AUTO_SHARE * available:
        return (f'inputs not cached (the decoded train set needs '
                f'{_gb(need)}, over {AUTO_SHARE:.0%} of the ' +
                (f'{_gb(available)} available)' if available else
                 'memory available, which is unknown)') + left)
    for dataset, part, fast, key, paths, total in plans:
        part.__class__ = fast
        part._fp_cache = DecodedCache(paths, total)
        _KEPT.setdefault(dataset, {})[key] = part._fp_cache
    images = {
        id(load._fp_cache): load._fp_cache
        for _, load in loads if getattr(load, '_fp_cache', None) is not None
    }
    files = {
        id(loader._fp_cache): loader._fp_cache
        for loader in (getattr(sampler, 'points_loader', None)
                       for _, sampler in databases)
        if getattr(loader, '_fp_cache', None) is not None
    }
    if not images and not files:
        return f'inputs not cached ({"; ".join(why)})'
    what = ', '.join(name for name, has in (('images', images),
                                            ('gt-database files', files))
                     if has)
    total_held = sum(c.capacity for c in {**images, **files}.values())
    return (f'inputs cached in shared memory (up to {_gb(total_held)}; '
            f'{_gb(available)} available): {what}{left}')


def budget_left(loads: Sequence[Any], databases: Sequence[Any] = ()) -> float:
    """Bytes of shared memory ``'auto'`` still allows beside the caches of
    ``loads`` and ``databases`` (:func:`install_cache`'s arguments)."""
    available = available_memory()
    if available is None:
        return 0.0
    parts = [load for _, load in loads] + [
        getattr(sampler, 'points_loader', None) for _, sampler in databases
    ]
    held = {
        id(c): c.capacity
        for c in (getattr(p, '_fp_cache', None) for p in parts)
        if isinstance(c, DecodedCache)
    }
    return AUTO_SHARE * available - sum(held.values())


def _install_disk(loads: Sequence[Any], folder: str,
                  databases: Sequence[Any]) -> str:
    """``'disk:DIR'``: a :class:`~fast_parallel.pipeline.disk_cache.
    DiskCache` for each image load read from local files."""
    from fast_parallel.pipeline.disk_cache import DiskCache, decoder_versions
    notes = ('; gt-database files not cached (arrays on disk already)'
             if databases else '')
    local = [load for _, load in loads if not _through_backend(load)]
    if not local:
        return ('inputs not cached (' +
                ('files read through a storage backend'
                 if loads else 'no LoadImageFromFile') + ')' + notes)
    try:
        for load in local:
            if isinstance(load, FastLoadImageFromFile) and \
                    isinstance(load._fp_cache, DiskCache):
                continue
            flags = (f'{_decode_key(load)!r}; '
                     f'{decoder_versions(load.imdecode_backend)}')
            cache = DiskCache(folder, flags)
            load.__class__ = FastLoadImageFromFile
            load._fp_cache = cache
    except OSError as e:
        return f'inputs not cached (cannot make {folder}: {e})' + notes
    return (f'inputs cached on disk in {local[0]._fp_cache.root} (one .npy '
            'per decoded image)' + notes)
