"""fast_parallel: one copy per dtype and native scatter for mmdet/mmdet3d."""
from .accuracy import AccuracyParityHook
from .adapters import register_adapter, register_tensor_holder
from .checkpoint import allow_mmengine_checkpoints
from .collate import PackedCollate, packed_collate
from .config import disable, enable
from .hooks import FastParallelHook
from .packing import PackedBatch, PackingError, pack
from .resume import ExactResumeHook
from .wrappers import FastDataParallel, FastDistributedDataParallel

__version__ = '0.1.0'

# mmengine checkpoints load with torch's weights_only=True (see checkpoint.py).
allow_mmengine_checkpoints()

__all__ = [
    'AccuracyParityHook', 'ExactResumeHook', 'FastDataParallel',
    'FastDistributedDataParallel', 'FastParallelHook', 'PackedBatch',
    'PackedCollate', 'PackingError',
    'allow_mmengine_checkpoints', 'disable', 'enable', 'pack',
    'packed_collate', 'register_adapter', 'register_tensor_holder',
    '__version__'
]
