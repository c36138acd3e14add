"""``enable(cfg)``: the fast-path opt-in applied to a ``Config``."""
from typing import Optional, Sequence

from mmengine.config import Config


#: The hooks ``enable`` adds and ``disable`` removes.
FAST_HOOKS = ('FastParallelHook', 'ExactResumeHook')


def enable(cfg: Config,
           device_ids: Optional[Sequence[int]] = None) -> Config:
    """Switches a config to the fast data path, in place.

    Adds ``fast_parallel`` to ``custom_imports`` and ``FastParallelHook`` and
    ``ExactResumeHook`` to ``custom_hooks`` (each once), and, for launchers
    other than ``none``,
    ``model_wrapper_cfg=dict(type='FastDistributedDataParallel')`` unless
    the config names a wrapper of its own. Nothing else changes: the model, its
    data_preprocessor, the pipelines and the schedules stay as they are.

    Args:
        cfg (Config): An mmdet / mmdet3d config.
        device_ids (Sequence[int], optional): GPUs for a one-process,
            several-GPU run (``FastDataParallel``). Defaults to None.

    Returns:
        Config: ``cfg``, changed.
    """
    imports = dict(cfg.get('custom_imports', None) or {})
    names = list(imports.get('imports', []))
    if isinstance(names, str):
        names = [names]
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

    if cfg.get('launcher', 'none') != 'none' and not cfg.get(
            'model_wrapper_cfg', None):
        cfg.model_wrapper_cfg = dict(type='FastDistributedDataParallel')
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
    """Removes what :func:`enable` (or a fast config) adds, in place.

    Args:
        cfg (Config): A config.

    Returns:
        Config: ``cfg`` on the stock path.
    """
    cfg.custom_hooks = [
        h for h in (cfg.get('custom_hooks', None) or [])
        if _hook_type(h) not in FAST_HOOKS
    ]
    wrapper = cfg.get('model_wrapper_cfg', None) or {}
    if wrapper.get('type') in ('FastDistributedDataParallel',
                               'FastDataParallel'):
        cfg.model_wrapper_cfg = None
    return cfg


def _hook_type(hook) -> str:
    kind = hook.get('type') if isinstance(hook, dict) else type(hook)
    return kind if isinstance(kind, str) else getattr(kind, '__name__', '')
