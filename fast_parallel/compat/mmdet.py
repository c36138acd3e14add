"""mmdet internals: switch-once hooks, module state outside the
``state_dict``, the YOLOX head's per-image target method.

Checked on mmdet 3.3.0 (:data:`fast_parallel.compat.CHECKED_ON`).
"""
from types import MappingProxyType
from typing import Any, Mapping, Tuple

from fast_parallel.compat.core import private

#: The upstream module classes whose plain attributes a resumed run needs,
#: by ``(module path, class name)``: their attribute names. Read-only: the
#: resume room keeps its own registry, these entries first
#: (``fast_parallel.resume.hook.register_stateful_module``).
_RESIZE = ('mmdet.models.data_preprocessors.data_preprocessor',
           'BatchSyncRandomResize')
_STATEFUL_DEFAULTS = {_RESIZE: ('_input_size', )}
STATEFUL_MODULE_ATTRS: Mapping[Tuple[str, str], Tuple[str, ...]] = \
    MappingProxyType(_STATEFUL_DEFAULTS)
#: ``YOLOXHead``'s per-image target method, its L1 helper and its box
#: decoder (the stock path batched targets fall back to, and the decoder the
#: batched loss calls; an instance must not override them).
YOLOX_HEAD_METHODS = ('_get_targets_single', '_get_l1_target', '_bbox_decode')


def yolox_targets_single(head: Any) -> Any:
    """``head._get_targets_single``, the per-image stock target path."""
    return private(head, '_get_targets_single', 'mmdet',
                   'YOLOX images that take the stock target path')


def yolox_bbox_decode(head: Any) -> Any:
    """``head._bbox_decode``, the box decoder of ``YOLOXHead.loss_by_feat``.
    """
    return private(head, '_bbox_decode', 'mmdet',
                   'the YOLOX loss with batched targets')


#: mmdet hooks that switch the train pipeline once, restarting persistent
#: workers to do it, and the attribute that says they have switched
#: (mmdet 3.3.0). A resumed run's instance starts unswitched: it switches
#: again in the first resumed epoch, wherever the original switched.
SWITCH_ONCE_HOOKS = {
    'YOLOXModeSwitchHook': '_has_switched',
    'PipelineSwitchHook': '_has_switched'
}


def switched_hooks(hooks: Any) -> set:
    """The names of the switch-once hooks among ``hooks`` that switched.

    Args:
        hooks (list[Hook]): The Runner's hooks.

    Returns:
        set[str]: Class names from :data:`SWITCH_ONCE_HOOKS`.
    """
    done = set()
    for hook in hooks:
        name = type(hook).__name__
        if name in SWITCH_ONCE_HOOKS and private(
                hook, SWITCH_ONCE_HOOKS[name], 'mmdet',
                'exact resume (whether the hook switched the pipeline)'):
            done.add(name)
    return done


def mix_skip_type_keys(dataset: Any) -> Any:
    """``MultiImageMixDataset._skip_type_keys``: the transform types
    ``YOLOXModeSwitchHook`` switched off (None: none)."""
    return private(dataset, '_skip_type_keys', 'mmdet',
                   'the fast MultiImageMixDataset')


def mosaic_combine(transform: Any) -> Any:
    """``Mosaic._mosaic_combine``: where a patch is pasted and cropped."""
    return private(transform, '_mosaic_combine', 'mmdet', 'the fast Mosaic')


def affine_matrix(transform: Any) -> Any:
    """``RandomAffine._get_random_homography_matrix``: the warp's random
    matrix (stock's draws), peeked by the fast Mosaic."""
    return private(transform, '_get_random_homography_matrix', 'mmdet',
                   'the fast Mosaic (patches RandomAffine never reads)')


def own_random_matrix(transform: Any) -> bool:
    """Whether a ``RandomAffine`` instance draws its matrix with the class's
    ``_get_random_homography_matrix``, outside mmcv's
    ``cache_random_params`` (its ``_cache_enabled``): a peek at its draws
    is then what its next call draws."""
    return not getattr(transform, '_cache_enabled', False) and \
        '_get_random_homography_matrix' not in vars(transform)


def hsv_gains(transform: Any) -> Any:
    """``YOLOXHSVRandomAug._get_hsv_gains``: the sample's random gains
    (stock's draws)."""
    return private(transform, '_get_hsv_gains', 'mmdet',
                   'the fast YOLOXHSVRandomAug')
