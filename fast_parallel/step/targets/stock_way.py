"""The one way a sample's targets are computed the stock way, and counted.

Each family's batched method runs its targets inside :func:`batch_targets`:
the op counter sees them as a phase (``TargetStats.computing``), and the
samples the batched path cannot decide as stock does are computed by stock's
own per-sample method through :meth:`StockWay.fill` (or, for a whole batch,
:meth:`StockWay.count`), then counted once per batch in the head's
:class:`~fast_parallel.step.targets.stats.TargetStats`.
"""
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, TypeVar

__all__ = ['StockWay', 'batch_targets']

Row = TypeVar('Row')


class StockWay:
    """How many samples of one batch took the stock path."""

    def __init__(self) -> None:
        self.samples = 0

    def fill(self, rows: List[Optional[Row]],
             compute: Callable[[int], Row]) -> List[Row]:
        """Computes ``rows[i] = compute(i)`` where the batch left None.

        Args:
            rows (list): Per sample, the batched result or None.
            compute (callable): Stock's result of sample ``i``.

        Returns:
            list: ``rows``, complete.
        """
        for i, row in enumerate(rows):
            if row is None:
                rows[i] = compute(i)
                self.samples += 1
        return rows

    def count(self, samples: int = 1) -> None:
        """Counts samples computed the stock way outside :meth:`fill`."""
        self.samples += samples


@contextmanager
def batch_targets(head: Any, num_samples: int) -> Iterator[StockWay]:
    """Around one batch's targets on a switched head.

    Args:
        head: A head :func:`~fast_parallel.step.targets.switch.install`
            switched (it has ``fast_target_stats``).
        num_samples (int): Samples in the batch.

    Yields:
        StockWay: Counts the samples computed the stock way; added to the
        head's counter when the block ends.
    """
    stats = head.fast_target_stats
    way = StockWay()
    with stats.computing():
        yield way
    stats.add(num_samples, way.samples)
