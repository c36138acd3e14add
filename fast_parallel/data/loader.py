"""``FastDataLoader``: torch's DataLoader without the per-batch profiler label.

Every ``next()`` on a torch DataLoader iterator opens and closes a
``torch.autograd.profiler.record_function`` scope, two dispatcher calls
that only matter while a profiler records. Measured on this project's CPU
machine (``tools/benchmark.py``, a model step between batches), they are
1.2-1.8 ms of the main process's ~5 ms per-batch DataLoader cost, more
than everything the packed batch itself costs there. The iterators here do
exactly what torch's do, minus that scope while no profiler is running;
with a profiler on they are torch's own ``__next__``.

Workers, sampling, seeding, worker-failure detection and shutdown are
torch's unchanged: the classes below only override ``__next__``.
"""

import torch
from torch.utils.data import DataLoader

from fast_parallel.compat import (check_dataloader_internals,
                                  fast_iterator_classes)

# torch's iterators without the per-batch profiler scope (the seam builds
# them from torch's private classes, checked on torch 2.13.0).
_Single, _Multi = fast_iterator_classes()


class _SingleProcessIter(_Single):
    """The single-process iterator (``num_workers=0``)."""


class _MultiProcessingIter(_Multi):
    """The multi-process iterator (workers)."""


class FastDataLoader(DataLoader):
    """A ``torch.utils.data.DataLoader`` with the lighter ``__next__``.

    ``FastParallelHook`` switches the class of the Runner's own DataLoaders
    (exactly ``DataLoader``, not subclasses) to this one; nothing else about
    them changes.
    """

    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        self.check_worker_number_rationality()
        return _MultiProcessingIter(self)


def accelerator_available() -> bool:
    """Whether torch has an accelerator to pin memory for.

    torch's DataLoader pins only then, and warns when ``pin_memory=True``
    finds none.

    Returns:
        bool: ``torch.accelerator.is_available()`` (torch >= 2.6), else
        ``torch.cuda.is_available()``.
    """
    accelerator = getattr(torch, 'accelerator', None)
    if accelerator is not None:
        return accelerator.is_available()
    return torch.cuda.is_available()


def make_fast(loader: DataLoader) -> bool:
    """Switches a plain ``DataLoader`` to :class:`FastDataLoader` in place.

    Args:
        loader (DataLoader): A DataLoader; subclasses are left alone (they
            may override ``_get_iterator`` themselves).

    Returns:
        bool: Whether the class changed.

    Raises:
        CompatError: When the installed torch lacks an internal the fast
            iterators use (:mod:`fast_parallel.compat`).
    """
    if type(loader) is not DataLoader:
        return False
    check_dataloader_internals()
    loader.__class__ = FastDataLoader
    return True
