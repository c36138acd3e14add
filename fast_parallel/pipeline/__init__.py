"""The workers' side with stock's bytes: fast forms of upstream transforms
swapped on the train dataset's instances (:func:`switch_pipeline`, the table
:data:`SWAPS`), the mixing wrapper without needless copies, the decoded-input
cache and the data-bound line. What each does and why it is exact:
``docs/pipeline.md``. The transforms import mmdet, so they load when first
used, not with ``fast_parallel``.
"""
from typing import Any

from fast_parallel.pipeline.stats import COUNTS

__all__ = [
    'COUNTS', 'LAZY_SWAPS', 'NEVER_NONE', 'STAYS_STOCK', 'SWAPS',
    'switch_pipeline'
]

_FROM_SWITCH = frozenset(
    {'LAZY_SWAPS', 'NEVER_NONE', 'STAYS_STOCK', 'SWAPS', 'switch_pipeline'})


def __getattr__(name: str) -> Any:
    if name in _FROM_SWITCH:
        from fast_parallel.pipeline import switch
        return getattr(switch, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
