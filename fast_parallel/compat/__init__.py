"""The one seam for the private torch / mmengine / mmdet names fast_parallel
relies on.

Each internal is looked up here, by name, in the module of its package
(:mod:`.torch_data`, :mod:`.mmengine`, :mod:`.mmdet`, :mod:`.optim`), next to
the versions it was checked on (:data:`CHECKED_ON`). On a version without
one, the part that needs it fails at once with :class:`CompatError`, naming
the internal, the installed and the checked version and what to do. See
``docs/troubleshooting.md``.
"""
# yapf: disable
from fast_parallel.compat.core import (CHECKED_ON, ITEM_OP, CompatError,
                                       installed_version,
                                       missing_internal_error, private)
from fast_parallel.compat.mmdet import (STATEFUL_MODULE_ATTRS,
                                        SWITCH_ONCE_HOOKS, YOLOX_HEAD_METHODS,
                                        affine_matrix, hsv_gains,
                                        mix_skip_type_keys, mosaic_combine,
                                        own_random_matrix, switched_hooks,
                                        yolox_bbox_decode,
                                        yolox_targets_single)
from fast_parallel.compat.mmengine import (CHECKPOINT_SAVE_METHOD,
                                           ELEMENT_FIELD_SETS, LOADER_CONFIGS,
                                           check_runner,
                                           checkpoint_save_method,
                                           counts_iterations,
                                           data_element_fields,
                                           decide_val_interval,
                                           history_statistics_methods,
                                           image_steps,
                                           infinite_iterator_class,
                                           is_resuming, loader_config,
                                           loop_length, loop_progress,
                                           message_hub_instances,
                                           preprocessor_device,
                                           randomness_config, run_forward,
                                           runner_loop)
from fast_parallel.compat.torch_data import (base_iterator_class,
                                             check_dataloader_internals,
                                             dataloader_class,
                                             dispatch_mode_class,
                                             fast_iterator_classes,
                                             iterator_base_seed,
                                             nameless_shared_empty,
                                             override_start,
                                             persistent_iterator,
                                             point_holder_at,
                                             set_persistent_iterator,
                                             shutdown_workers, start_iterator,
                                             started_iterators,
                                             storage_use_count, worker_pids)

# yapf: enable

#: Where numpy 1 (``numpy.core``) and numpy 2 (``numpy._core``) pickle
#: their array and scalar rebuilders from.
NUMPY_PICKLE_MODULES = ('numpy.core.multiarray', 'numpy._core.multiarray')

__all__ = [
    'CHECKED_ON', 'CHECKPOINT_SAVE_METHOD', 'checkpoint_save_method',
    'CompatError', 'ITEM_OP', 'ELEMENT_FIELD_SETS', 'LOADER_CONFIGS',
    'NUMPY_PICKLE_MODULES', 'STATEFUL_MODULE_ATTRS', 'SWITCH_ONCE_HOOKS',
    'YOLOX_HEAD_METHODS', 'affine_matrix', 'base_iterator_class', 'hsv_gains',
    'mix_skip_type_keys', 'mosaic_combine', 'own_random_matrix',
    'check_dataloader_internals', 'check_runner', 'counts_iterations',
    'data_element_fields', 'dataloader_class', 'decide_val_interval',
    'dispatch_mode_class', 'fast_iterator_classes',
    'history_statistics_methods', 'image_steps', 'infinite_iterator_class',
    'installed_version', 'is_resuming', 'iterator_base_seed', 'loader_config',
    'loop_length', 'loop_progress', 'message_hub_instances',
    'missing_internal_error', 'nameless_shared_empty', 'override_start',
    'point_holder_at', 'persistent_iterator', 'preprocessor_device', 'private',
    'randomness_config', 'run_forward', 'runner_loop',
    'set_persistent_iterator', 'shutdown_workers', 'start_iterator',
    'started_iterators', 'storage_use_count', 'switched_hooks', 'worker_pids',
    'yolox_bbox_decode', 'yolox_targets_single'
]
