"""The decoded-input cache: each train image decoded once per run, one copy
shared by all DataLoader workers.

:class:`DecodedCache` lives in anonymous shared memory made in the main
process before the workers fork (so it ends with the last process that maps
it); :class:`FastLoadImageFromFile` hands out a copy of a cached image
(stock's bytes: decoding is deterministic) when the file's size and mtime
are still those it was decoded from, and decodes stock's way otherwise. A
failed decode is never cached. How it is sized (``'auto'``): ``docs/
pipeline.md``.
"""
import mmap
import multiprocessing
import os
import weakref
from typing import Any, Dict, Optional, Sequence

import numpy as np
from mmcv.transforms import LoadImageFromFile

from fast_parallel.pipeline.stats import count

__all__ = ['DecodedCache', 'FastLoadImageFromFile', 'available_memory']

# one row per image: state, offset, nbytes, dtype number, ndim, shape (3),
# file size, file mtime (ns)
_STATE, _OFFSET, _NBYTES, _DTYPE, _NDIM, _SHAPE, _SIZE, _MTIME = (0, 1, 2, 3,
                                                                  4, 5, 8, 9)
_ROW = 10
_READY = 1
_WRITING = 2  # space taken by one writer: the others leave it
#: The dtypes a decode gives (mmcv's backends); others are not cached.
_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32),
           np.dtype(np.int16), np.dtype(np.float64), np.dtype(np.int32))


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


class DecodedCache:
    """Decoded images by path, in shared memory, filled as they are decoded.

    Args:
        paths (Sequence[str]): Every image path the dataset may load.
        capacity (int): Bytes for the decoded images; an image that no
            longer fits is not cached (and counted).
    """

    def __init__(self, paths: Sequence[str], capacity: int) -> None:
        self.slots: Dict[str, int] = {p: i for i, p in enumerate(paths)}
        self.capacity = int(capacity)
        self._data_map = mmap.mmap(-1, max(self.capacity, 1))
        self._table_map = mmap.mmap(-1, max(len(paths), 1) * _ROW * 8 + 8)
        self.data = np.frombuffer(self._data_map, np.uint8)
        table = np.frombuffer(self._table_map, np.int64)
        self.top = table[:1]  # the next free byte
        self.table = table[1:].reshape(-1, _ROW)
        self.lock = multiprocessing.get_context('fork').Lock()

    def __deepcopy__(self, memo: dict) -> 'DecodedCache':
        return self  # one cache per run, whatever copies the dataset

    def __reduce__(self) -> Any:
        # a spawned worker cannot map it: it decodes, as stock does
        return (type(None), ())

    @property
    def used(self) -> int:
        """Bytes of decoded images held."""
        return int(self.top[0])

    def get(self, path: str) -> Optional[np.ndarray]:
        """A copy of the cached image of ``path`` while the file is
        unchanged; None otherwise."""
        slot = self.slots.get(path)
        if slot is None:
            return None
        with self.lock:  # the writer's data is visible after its release
            row = self.table[slot].copy()
        if row[_STATE] != _READY:
            return None
        try:
            stat = os.stat(path)
        except OSError:
            return None
        if (stat.st_size, stat.st_mtime_ns) != (row[_SIZE], row[_MTIME]):
            count('cache: file changed since it was cached')
            return None
        shape = tuple(int(v) for v in row[_SHAPE:_SHAPE + row[_NDIM]])
        start = int(row[_OFFSET])
        flat = self.data[start:start + int(row[_NBYTES])]
        out = np.empty(shape, dtype=_DTYPES[int(row[_DTYPE])])
        out.reshape(-1).view(np.uint8)[:] = flat
        return out

    def put(self, path: str, img: np.ndarray, stat: os.stat_result) -> None:
        """Keeps ``img``, decoded from ``path`` as it was at ``stat``."""
        slot = self.slots.get(path)
        if slot is None or img.ndim > 3 or not img.flags.c_contiguous or \
                img.dtype not in _DTYPES:
            return
        with self.lock:
            if self.table[slot, _STATE] != 0:  # kept, or being kept
                return
            start = int(self.top[0])
            if start + img.nbytes > self.capacity:
                count('cache: full')
                return
            self.top[0] = start + img.nbytes
            self.table[slot, _STATE] = _WRITING
        self.data[start:start + img.nbytes] = img.reshape(-1).view(np.uint8)
        row = np.zeros(_ROW, np.int64)
        row[[_OFFSET, _NBYTES, _DTYPE,
             _NDIM]] = (start, img.nbytes, _DTYPES.index(img.dtype), img.ndim)
        row[_SHAPE:_SHAPE + img.ndim] = img.shape
        row[[_SIZE, _MTIME]] = (stat.st_size, stat.st_mtime_ns)
        row[_STATE] = _READY
        with self.lock:
            self.table[slot] = row


class FastLoadImageFromFile(LoadImageFromFile):
    """``LoadImageFromFile`` that takes a decoded image from the run's
    :class:`DecodedCache` (``_fp_cache``, set by the switch), when it has
    it; stock's decode otherwise."""

    _fp_cache: Optional[DecodedCache] = None

    def transform(self, results: dict) -> Optional[dict]:
        cache = self._fp_cache
        if cache is None:
            return super().transform(results)
        filename = results['img_path']
        img = cache.get(filename)
        if img is not None:
            count('cache: hits')
            results['img'] = img
            results['img_shape'] = img.shape[:2]
            results['ori_shape'] = img.shape[:2]
            return results
        try:
            stat = os.stat(filename)
        except OSError:
            stat = None
        out = super().transform(results)
        if out is not None and stat is not None:
            count('cache: decoded')
            cache.put(filename, out['img'], stat)
        return out


#: Share of ``MemAvailable`` the decoded train set may take with
#: ``cache_inputs='auto'``.
AUTO_SHARE = 0.4
_CHANNELS = {'color': 3, 'grayscale': 1}


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
    if load.backend_args is not None or load.file_client_args is not None:
        return 'files read through a storage backend'
    paths, total = [], 0
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        if not {'img_path', 'height', 'width'} <= info.keys():
            return 'the data infos give no image sizes'
        paths.append(info['img_path'])
        total += int(info['height']) * int(info['width']) * channels
    return paths, total


#: Each train dataset's cache and the decode flags it was made for, so that
#: a pipeline rebuilt mid-run gets the same one.
_KEPT: 'weakref.WeakKeyDictionary[Any, tuple]' = weakref.WeakKeyDictionary()


def _decode_key(load: LoadImageFromFile) -> tuple:
    return (load.color_type, load.imdecode_backend, load.to_float32)


def install_cache(loads: Sequence[Any], cache_inputs: Optional[str],
                  forked: bool) -> str:
    """Gives each ``(dataset, LoadImageFromFile)`` of ``loads`` a
    :class:`DecodedCache`, where the whole decoded set fits the budget.

    A load on a dataset that has a cache for the same decode flags (a
    pipeline a hook rebuilt) gets that one.

    Args:
        loads (Sequence[tuple]): The train datasets and their image loads
            (stock's or fast already).
        cache_inputs (str | None): ``'auto'`` or None (off).
        forked (bool): Whether the DataLoader workers fork from this
            process (a spawned worker cannot map the cache).

    Returns:
        str: The start line's words, e.g. ``inputs cached in shared memory
        (up to 1.2 GB; 6.0 GB available)``.
    """
    if cache_inputs is None:
        return 'inputs not cached (cache_inputs=None)'
    if cache_inputs != 'auto':
        raise ValueError(f"cache_inputs must be 'auto' or None, got "
                         f'{cache_inputs!r}')
    if not loads:
        return 'inputs not cached (no LoadImageFromFile)'
    if not forked:
        return 'inputs not cached (the workers are not forked)'
    plans = []
    for dataset, load in loads:
        kept = _KEPT.get(dataset)
        if type(load) is FastLoadImageFromFile:
            continue
        if kept is not None and kept[0] == _decode_key(load):
            load.__class__ = FastLoadImageFromFile
            load._fp_cache = kept[1]
            continue
        found = _decoded_size(dataset, load)
        if isinstance(found, str):
            return f'inputs not cached ({found})'
        plans.append((dataset, load, *found))
    need = sum(total for *_, total in plans)
    available = available_memory()
    if available is None or need > AUTO_SHARE * available:
        return (f'inputs not cached (the decoded train set needs '
                f'{_gb(need)}, over {AUTO_SHARE:.0%} of the ' +
                (f'{_gb(available)} available)'
                 if available else 'memory available, which is unknown)'))
    for dataset, load, paths, total in plans:
        load.__class__ = FastLoadImageFromFile
        load._fp_cache = DecodedCache(paths, total)
        _KEPT[dataset] = (_decode_key(load), load._fp_cache)
    held = sum({
        id(load._fp_cache): load._fp_cache.capacity
        for _, load in loads
    }.values())
    return (f'inputs cached in shared memory (up to {_gb(held)}; '
            f'{_gb(available)} available)')
