"""``FastDataLoader`` (torch's DataLoader without the per-batch profiler
label) and ``prepare_loader``, which puts the fast data path into a loader.

Every ``next()`` on a torch DataLoader iterator opens and closes a
``torch.autograd.profiler.record_function`` scope, two dispatcher calls
that only matter while a profiler records; on a CPU machine they cost more
than everything the packed batch itself costs there (measured:
``docs/benchmark.md``). The iterators here do exactly what torch's do,
minus that scope while no profiler is running; with a profiler on they are
torch's own ``__next__``.

A packed batch is yielded as the structure its collate function made
(:func:`~fast_parallel.data.handout.hand_out`), so that hooks, evaluators
and scripts see stock's batch; the wrappers still move it in one copy per
buffer. Workers, sampling, seeding, worker-failure detection and shutdown
are torch's unchanged: the classes below only override ``__next__`` and
``_next_data``.
"""

import multiprocessing
from typing import Any

import torch
from torch.utils.data import DataLoader

from fast_parallel.compat import (check_dataloader_internals,
                                  fast_iterator_classes, worker_pids)
from fast_parallel.data.collate import PackedCollate, packed_for
from fast_parallel.data.handout import hand_out
from fast_parallel.data.loader_state import (loader_state,
                                             take_inherited_base_seed)
from fast_parallel.data.worker_exit import exit_with_parent

# torch's iterators without the per-batch profiler scope, taking the base
# seed of the loader's state and yielding stock's structure of a packed
# batch (the seam builds them from torch's private classes, checked on
# torch 2.13.0).
_Single, _Multi = fast_iterator_classes(take_inherited_base_seed, hand_out)


class _SingleProcessIter(_Single):
    """The single-process iterator (``num_workers=0``)."""


class _MultiProcessingIter(_Multi):
    """The multi-process iterator (workers), which tells the loader's state
    its workers' process ids."""

    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        loader_state(loader).worker_pids = tuple(worker_pids(self))


class FastDataLoader(DataLoader):
    """A ``torch.utils.data.DataLoader`` with the lighter ``__next__``.

    ``FastParallelHook`` switches the class of the Runner's own DataLoaders
    (exactly ``DataLoader``, not subclasses) to this one; nothing else about
    them changes. A ``PackedBatch`` from its collate function is yielded
    unpacked (:func:`~fast_parallel.data.handout.hand_out`).
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


def switch_to_fast_loader(loader: DataLoader) -> bool:
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


def prepare_loader(loader: DataLoader, pin: bool) -> None:
    """Puts the fast data path into a DataLoader whose iterator has not
    started: packed collate, :class:`FastDataLoader`, pinned memory, workers
    that end with the trainer (:mod:`fast_parallel.data.worker_exit`).

    The packed collate function reads the loader's
    :class:`~fast_parallel.data.loader_state.LoaderState`: its batches carry
    their worker's random states where that says so, whether it says so
    before or after this call.

    Args:
        loader (DataLoader): The DataLoader, changed in place.
        pin (bool): Turn ``pin_memory`` on (only where CUDA is available).
    """
    loader.collate_fn = packed_for(loader.collate_fn, loader_state(loader))
    switch_to_fast_loader(loader)
    if loader.num_workers > 0:
        loader.worker_init_fn = exit_with_parent(loader.worker_init_fn)
    if pin and torch.cuda.is_available() and not loader.pin_memory:
        loader.pin_memory = True
    if loader.pin_memory and not accelerator_available():
        # torch would not pin (and would warn from fast_parallel's loader,
        # whose iterator calls its __init__): the same batches, no warning.
        loader.pin_memory = False


def prepare_like(old: DataLoader, new: DataLoader) -> None:
    """Gives a DataLoader built again from ``old``'s config what ``old`` has
    on top of its config: collate function, class, pinning.

    A packed collate function that reads ``old``'s state is given one that
    reads ``new``'s (:func:`~fast_parallel.data.collate.packed_for`).

    Args:
        old (DataLoader): The running DataLoader.
        new (DataLoader): Its replacement, not started; changed in place.
    """
    fn = old.collate_fn
    if isinstance(fn, PackedCollate) and fn.state is not None:
        fn = packed_for(fn, loader_state(new))
    new.collate_fn = fn
    if isinstance(old, FastDataLoader):
        switch_to_fast_loader(new)
    new.pin_memory = old.pin_memory


def loader_figures(loader: DataLoader) -> str:
    """``2 workers, pinned`` for the start-of-training line."""
    workers = loader.num_workers
    pinned = 'pinned' if loader.pin_memory and accelerator_available() \
        else 'not pinned'
    return f'{workers} worker{"" if workers == 1 else "s"}, {pinned}'


def forks_workers(loader: Any) -> bool:
    """Whether ``loader``'s workers fork from this process (they then map
    what it mapped, such as the decoded-input cache), or it has none.

    Args:
        loader (DataLoader): The loader.

    Returns:
        bool: True without workers, or with the ``fork`` start method.
    """
    if loader.num_workers == 0:
        return True
    context = loader.multiprocessing_context
    method = context.get_start_method() if context is not None else \
        multiprocessing.get_start_method(allow_none=True) or \
        multiprocessing.get_context().get_start_method()
    return method == 'fork'
