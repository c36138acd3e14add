"""How many samples the batched targets computed, and how many stock's way.

A sample whose targets hang on an implementation-defined choice (a tie at a
top-k boundary), or an input the batched path does not cover, is computed by
stock's own per-sample method; :class:`TargetStats` counts them, says so in
the log the first time it happens and gives the totals for the epoch line.
"""
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from mmengine.logging import MMLogger


class TargetStats:
    """Per-head counts of the batched target path.

    Args:
        name (str): The pair, e.g. ``'YOLOXHead/SimOTAAssigner'``.
        unit (str): What a sample is called, e.g. ``'images'``.
    """

    def __init__(self, name: str, unit: str = 'samples') -> None:
        self.name = name
        self.unit = unit
        self.calls = 0
        self.samples = 0
        self.stock = 0
        self.reported = False
        #: Totals since the last :meth:`pop` (the epoch line).
        self._since = [0, 0]
        #: Called with True before and False after each batch's targets
        #: (``fast_parallel.bench`` counts them as a phase); None: nothing.
        self.observer: Optional[Callable[[bool], None]] = None

    @contextmanager
    def computing(self) -> Iterator[None]:
        """Around one batch's target computation (tells the observer)."""
        if self.observer is None:
            yield
            return
        self.observer(True)
        try:
            yield
        finally:
            self.observer(False)

    def add(self, samples: int, stock: int) -> None:
        """Counts one batch: ``samples`` in it, ``stock`` of them stock's way.

        The first batch with any stock sample logs one line.
        """
        self.calls += 1
        self.samples += samples
        self.stock += stock
        self._since[0] += samples
        self._since[1] += stock
        if stock and not self.reported:
            self.reported = True
            what = ('a batch computed the stock way (an input the batched '
                    'path does not cover)' if self.unit == 'batches' else
                    f'{stock} of {samples} {self.unit} of a batch computed '
                    'the stock way (a tie the batched path cannot decide as '
                    'stock does, or an input it does not cover)')
            MMLogger.get_current_instance().info(
                f'FastParallelHook: targets: {self.name}: {what}; the '
                'numbers stay stock\'s. Counted, with totals at the end of '
                'each epoch.')

    def pop(self) -> Optional[str]:
        """The counts since the last call, for the log, or None if none."""
        samples, stock = self._since
        self._since = [0, 0]
        if not samples:
            return None
        return (f'{self.name} batched for {samples - stock} of {samples} '
                f'{self.unit}, {stock} computed the stock way')
