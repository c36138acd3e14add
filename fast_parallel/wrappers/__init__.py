"""Model wrappers that move packed batches with one copy per buffer."""
from .data_parallel import FastDataParallel
from .distributed import FastDistributedDataParallel
from .scatter import batch_size_of, chunk_sizes, gather_log_vars, split_batch
from .transfer import TransferStats

__all__ = [
    'FastDataParallel', 'FastDistributedDataParallel', 'TransferStats',
    'batch_size_of', 'chunk_sizes', 'gather_log_vars', 'split_batch'
]
