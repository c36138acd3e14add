"""Model wrappers that move packed batches with one copy per buffer."""
from fast_parallel.wrappers.data_parallel import FastDataParallel
from fast_parallel.wrappers.distributed import FastDistributedDataParallel
from fast_parallel.wrappers.scatter import (batch_size_of, chunk_sizes,
                                            gather_log_vars, split_batch)
from fast_parallel.wrappers.transfer import TransferStats

__all__ = [
    'FastDataParallel', 'FastDistributedDataParallel', 'TransferStats',
    'batch_size_of', 'chunk_sizes', 'gather_log_vars', 'split_batch'
]
