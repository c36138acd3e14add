"""fast_parallel: one copy per dtype and native scatter for mmdet/mmdet3d.

Importing it registers what a training config names (the hooks, wrappers,
the packed collate, ``AccuracyParityHook``) and allow-lists mmengine
checkpoints for torch's safe loading. Tooling (the parity recorder, the op
counter, benchmarks) loads from :mod:`fast_parallel.parity.runner` and
:mod:`fast_parallel.bench` when a tool or test uses it.
"""
from fast_parallel.config import disable, enable
from fast_parallel.data.adapters import (register_adapter,
                                         register_tensor_holder)
from fast_parallel.data.batch import PackedBatch
from fast_parallel.data.collate import PackedCollate, packed_collate
from fast_parallel.data.errors import PackingError
from fast_parallel.data.packing import pack
from fast_parallel.hooks import FastParallelHook
from fast_parallel.parity.accuracy import AccuracyParityHook
from fast_parallel.resume.checkpoint import allow_mmengine_checkpoints
from fast_parallel.resume.hook import ExactResumeHook
from fast_parallel.step.foreach_ema import fuse_ema, unfuse_ema
from fast_parallel.step.fused_optim import (fuse_optim_wrapper, fuse_optimizer,
                                            unfuse_optimizer)
from fast_parallel.wrappers import (FastDataParallel,
                                    FastDistributedDataParallel)

__version__ = '0.1.0'

# mmengine checkpoints load with torch's weights_only=True (see checkpoint.py).
allow_mmengine_checkpoints()

__all__ = [
    'AccuracyParityHook', 'ExactResumeHook', 'FastDataParallel',
    'FastDistributedDataParallel', 'FastParallelHook', 'PackedBatch',
    'PackedCollate', 'PackingError', 'allow_mmengine_checkpoints', 'disable',
    'enable', 'fuse_ema', 'fuse_optim_wrapper', 'fuse_optimizer', 'pack',
    'packed_collate', 'register_adapter', 'register_tensor_holder',
    'unfuse_ema', 'unfuse_optimizer', '__version__'
]
