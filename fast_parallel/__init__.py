"""fast_parallel: one copy per dtype and native scatter for mmdet/mmdet3d."""
from .accuracy import AccuracyParityHook
from .adapters import register_adapter, register_tensor_holder
from .checkpoint import allow_mmengine_checkpoints
from .collate import PackedCollate, packed_collate
from .config import disable, enable
from .foreach_ema import fuse_ema, unfuse_ema
from .fused_optim import (fuse_optim_wrapper, fuse_optimizer,
                          unfuse_optimizer)
from .hooks import FastParallelHook
from .opcount import OpCounter, count_iteration_ops
from .packing import PackedBatch, PackingError, pack
from .parity import PerturbFirstBatchHook
from .resume import ExactResumeHook
from .wrappers import FastDataParallel, FastDistributedDataParallel

__version__ = '0.1.0'

# mmengine checkpoints load with torch's weights_only=True (see checkpoint.py).
allow_mmengine_checkpoints()

__all__ = [
    'AccuracyParityHook', 'ExactResumeHook', 'FastDataParallel',
    'FastDistributedDataParallel', 'FastParallelHook', 'OpCounter',
    'PackedBatch', 'PackedCollate', 'PackingError',
    'PerturbFirstBatchHook',
    'allow_mmengine_checkpoints', 'count_iteration_ops', 'disable', 'enable',
    'fuse_ema', 'fuse_optim_wrapper', 'fuse_optimizer', 'pack',
    'packed_collate', 'register_adapter', 'register_tensor_holder',
    'unfuse_ema', 'unfuse_optimizer', '__version__'
]
