"""The workers' side with stock's bytes: fast forms of upstream transforms
swapped on the train dataset's instances (:func:`switch_pipeline`, the table
:data:`SWAPS`), and the mixing wrapper without needless copies. What each
does and why it is exact: ``docs/pipeline.md``.
"""
from fast_parallel.pipeline.stats import COUNTS
from fast_parallel.pipeline.switch import (NEVER_NONE, STAYS_STOCK, SWAPS,
                                           switch_pipeline)

__all__ = ['COUNTS', 'NEVER_NONE', 'STAYS_STOCK', 'SWAPS', 'switch_pipeline']
