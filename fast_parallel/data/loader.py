"""``FastDataLoader`` (torch's DataLoader without the per-batch profiler
label) and ``prepare_loader``, which puts the fast data path into a loader.

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
from fast_parallel.data.collate import (PackedCollate, is_packed_collate,
                                        reporting_worker_states)
from fast_parallel.data.worker_exit import exit_with_parent

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


def prepare_loader(loader: DataLoader,
                   pin: bool,
                   worker_states: bool = False) -> None:
    """Puts the fast data path into a DataLoader whose iterator has not
    started: packed collate, :class:`FastDataLoader`, pinned memory, workers
    that end with the trainer (:mod:`fast_parallel.data.worker_exit`).

    Args:
        loader (DataLoader): The DataLoader, changed in place.
        pin (bool): Turn ``pin_memory`` on (only where CUDA is available).
        worker_states (bool): Make the packed collate function report its
            workers' random states (``ExactResumeHook`` keeps them).
            Defaults to False.
    """
    if worker_states:
        loader.collate_fn = reporting_worker_states(loader.collate_fn)
    elif not is_packed_collate(loader.collate_fn):
        loader.collate_fn = PackedCollate(loader.collate_fn)
    make_fast(loader)
    if loader.num_workers > 0:
        loader.worker_init_fn = exit_with_parent(loader.worker_init_fn)
    if pin and torch.cuda.is_available() and not loader.pin_memory:
        loader.pin_memory = True
    if loader.pin_memory and not accelerator_available():
        # torch would not pin (and would warn from fast_parallel's loader,
        # whose iterator calls its __init__): the same batches, no warning.
        loader.pin_memory = False


def loader_figures(loader: DataLoader) -> str:
    """``2 workers, pinned`` for the start-of-training line."""
    workers = loader.num_workers
    pinned = 'pinned' if loader.pin_memory and accelerator_available() \
        else 'not pinned'
    return f'{workers} worker{"" if workers == 1 else "s"}, {pinned}'
