"""``enable(cfg)``: the fast-path opt-in applied to a ``Config``."""
from typing import Any, Optional, Sequence

from mmengine.config import Config

#: The hooks ``enable`` adds and ``disable`` removes.
FAST_HOOKS = ('FastParallelHook', 'ExactResumeHook')
#: The loader configs whose packed collate ``disable`` unwraps.
LOADER_KEYS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def enable(cfg: Config, device_ids: Optional[Sequence[int]] = None) -> Config:
    """Switches a config to the fast data path, in place.

    Adds ``fast_parallel`` to ``custom_imports`` and ``FastParallelHook`` and
    ``ExactResumeHook`` to ``custom_hooks`` (each once). Nothing else
    changes: the model, its data_preprocessor, the pipelines, the schedules
    and ``model_wrapper_cfg`` stay as they are. Under a launcher the Runner
    builds the very wrapper it builds for stock (``MMDistributedDataParallel``
    with ``broadcast_buffers=False`` and the config's
    ``find_unused_parameters``, or the config's own ``model_wrapper_cfg``),
    and :class:`~fast_parallel.FastParallelHook` turns that instance into a
    ``FastDistributedDataParallel`` in place, every setting kept.

    Args:
        cfg (Config): An mmdet / mmdet3d config.
        device_ids (Sequence[int], optional): GPUs for a one-process,
            several-GPU run (``FastDataParallel``). Defaults to None.

    Returns:
        Config: ``cfg``, changed.
    """
    imports = dict(cfg.get('custom_imports', None) or {})
    names = imports.get('imports', [])
    # mmengine accepts one module name as a plain string.
    names = [names] if isinstance(names, str) else list(names)
    if 'fast_parallel' not in names:
        names.append('fast_parallel')
    imports['imports'] = names
    imports.setdefault('allow_failed_imports', False)
    cfg.custom_imports = imports

    hooks = list(cfg.get('custom_hooks', None) or [])
    if not any(_hook_type(h) == 'FastParallelHook' for h in hooks):
        hook = dict(type='FastParallelHook')
        if device_ids:
            hook['device_ids'] = list(device_ids)
        hooks.append(hook)
    if not any(_hook_type(h) == 'ExactResumeHook' for h in hooks):
        hooks.append(dict(type='ExactResumeHook'))
    cfg.custom_hooks = hooks
    return cfg


def is_enabled(cfg: Config) -> bool:
    """Whether a config is on the fast path (has ``FastParallelHook``).

    Args:
        cfg (Config): A config.

    Returns:
        bool: True when ``custom_hooks`` holds a ``FastParallelHook``.
    """
    return any(
        _hook_type(h) == 'FastParallelHook'
        for h in (cfg.get('custom_hooks', None) or []))


def disable(cfg: Config) -> Config:
    """Takes a config off the fast path, in place.

    The fast hooks go (``FastParallelHook``, ``ExactResumeHook``). A loader
    config that packs by itself (``collate_fn=dict(type='packed_collate')``,
    or a ``PackedCollate``) gets back the collate function the packed one
    wraps (its ``inner``, or mmengine's default ``pseudo_collate``): a stock
    model reads stock's batches, which a packed batch only becomes in the
    fast wrapper (see :func:`stock_collate_cfg`).
    ``fast_parallel`` stays in ``custom_imports``: a config may name what
    the package registers besides the hooks (the PointPillars configs use
    ``KittiMetricCPU`` and ``DataBaseSamplerNp124``), and importing it
    changes nothing in a stock run (it registers names and extends torch's
    safe-loading allow-list). A ``model_wrapper_cfg`` naming
    ``FastDistributedDataParallel`` names its stock parent
    ``MMDistributedDataParallel`` instead, every other key kept, so the stock
    run gets the wrapper settings the fast one had; one naming
    ``FastDataParallel`` (which has no stock counterpart) is removed.

    Args:
        cfg (Config): A config.

    Returns:
        Config: ``cfg`` on the stock path.
    """
    cfg.custom_hooks = [
        h for h in (cfg.get('custom_hooks', None) or [])
        if _hook_type(h) not in FAST_HOOKS
    ]
    for key in LOADER_KEYS:
        loader = cfg.get(key, None)
        if isinstance(loader, dict) and 'collate_fn' in loader:
            loader['collate_fn'] = stock_collate_cfg(loader['collate_fn'])
    wrapper = cfg.get('model_wrapper_cfg', None) or {}
    kind = _type_name(wrapper.get('type'))
    if kind == 'FastDistributedDataParallel':
        wrapper['type'] = 'MMDistributedDataParallel'
    elif kind == 'FastDataParallel':
        cfg.model_wrapper_cfg = None
    return cfg


def stock_collate_cfg(collate: Any) -> Any:
    """The collate function a packed one wraps, as a loader config names it.

    Args:
        collate: A loader's ``collate_fn`` config: a dict, a name, a
            function or a :class:`~fast_parallel.PackedCollate`.

    Returns:
        ``collate`` itself when it does not pack; else its ``inner`` (a dict
        with ``type='packed_collate'`` and no ``inner``, or
        ``packed_collate`` itself, gives ``dict(type='pseudo_collate')``,
        mmengine's default).
    """
    from fast_parallel.data.collate import PackedCollate, packed_collate
    if isinstance(collate, PackedCollate):
        return collate.inner
    if collate is packed_collate or collate == 'packed_collate':
        return dict(type='pseudo_collate')
    if isinstance(collate, dict) and _type_name(
            collate.get('type')) == 'packed_collate':
        inner = collate.get('inner', None)
        return dict(type='pseudo_collate') if inner is None else inner
    return collate


def _hook_type(hook) -> str:
    return _type_name(
        hook.get('type') if isinstance(hook, dict) else type(hook))


def _type_name(kind) -> str:
    """The registry name of a config ``type``: a string, or a class."""
    return kind if isinstance(kind, str) else getattr(kind, '__name__', '')
