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
from typing import Any

import torch
from torch.autograd import profiler
from torch.utils.data import DataLoader

from fast_parallel.compat import check_dataloader_internals, dataloader_class

# torch internals, by name: a torch without one fails here, with a message
# that names it (fast_parallel.compat).
_BaseDataLoaderIter = dataloader_class('_BaseDataLoaderIter')
_DatasetKind = dataloader_class('_DatasetKind')
_MultiProcessingDataLoaderIter = dataloader_class(
    '_MultiProcessingDataLoaderIter')
_SingleProcessDataLoaderIter = dataloader_class('_SingleProcessDataLoaderIter')


class _UnlabelledNext:
    """``__next__`` of torch's iterators without the profiler scope."""

    def __next__(self) -> Any:
        # torch's profilers (autograd, kineto, emit_nvtx/itt) set this flag.
        if profiler._is_profiler_enabled or \
                self._dataset_kind != _DatasetKind.Map:
            # Iterable datasets keep torch's length checks and warnings.
            return super().__next__()
        if self._sampler_iter is None:
            self._reset()
        data = self._next_data()
        self._num_yielded += 1
        return data


class _InheritedSeed(_BaseDataLoaderIter):
    """Takes the base seed a restarted loader inherits from its predecessor.

    It sits right above torch's base class in the MRO, so the seed is in
    place before ``_MultiProcessingDataLoaderIter`` hands it to its workers
    (torch seeds each worker's ``random`` and torch generators with
    ``base_seed + worker_id``). :mod:`fast_parallel.data.rebuild` sets
    ``_fast_parallel_base_seed`` on a loader it builds again; the draw
    torch made is undone there too.
    """

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        seed = getattr(loader, '_fast_parallel_base_seed', None)
        if seed is not None:
            self._base_seed = seed


class _SingleProcessIter(_UnlabelledNext, _SingleProcessDataLoaderIter,
                         _InheritedSeed):
    pass


class _MultiProcessingIter(_UnlabelledNext, _MultiProcessingDataLoaderIter,
                           _InheritedSeed):
    pass


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
