"""torch internals: DataLoader iterators, the dispatcher's Python mode.

Checked on torch 2.13.0 (:data:`fast_parallel.compat.CHECKED_ON`).
"""
import functools
from typing import Any, Callable, Optional, Tuple

from fast_parallel.compat.core import private

# ------------------------------------------------------ torch DataLoader ---
_LOADER_USE = 'FastDataLoader (the DataLoader iterators it extends)'


def _dataloader_module() -> Any:
    import torch.utils.data.dataloader as module
    return module


def dataloader_class(name: str) -> type:
    """A class of ``torch.utils.data.dataloader`` by name (private ones).

    Args:
        name (str): E.g. ``'_BaseDataLoaderIter'``.

    Returns:
        type: The class.
    """
    return private(_dataloader_module(), name, 'torch', _LOADER_USE)


#: What the fast iterators use of torch's: (class name, attribute).
_ITERATOR_METHODS = (
    ('_BaseDataLoaderIter', '_next_data'),
    ('_BaseDataLoaderIter', '_reset'),
    ('_MultiProcessingDataLoaderIter', '_shutdown_workers'),
    ('_MultiProcessingDataLoaderIter', '_try_get_data'),
    ('_MultiProcessingDataLoaderIter', '_mark_worker_as_unavailable'),
    ('DataLoader', '_get_iterator'),
    ('DataLoader', 'check_worker_number_rationality'),
)
#: Attributes torch's iterators set in ``__init__`` that fast_parallel reads.
_ITERATOR_STATE = ('_base_seed', '_sampler_iter', '_num_yielded',
                   '_dataset_kind')


@functools.lru_cache(maxsize=None)
def check_dataloader_internals() -> None:
    """Checks, once, everything fast_parallel uses of torch's DataLoader.

    Raises:
        CompatError: Naming the first internal that is missing.
    """
    from torch.autograd import profiler
    from torch.utils.data import DataLoader
    private(profiler, '_is_profiler_enabled', 'torch', _LOADER_USE)
    for cls, attr in _ITERATOR_METHODS:
        owner = DataLoader if cls == 'DataLoader' else dataloader_class(cls)
        private(owner, attr, 'torch', _LOADER_USE)
    # An iterator draws its base seed: from a generator of its own here, so
    # that the check leaves the global random state (and so the run) alone.
    import torch
    loader = DataLoader([0], generator=torch.Generator())
    private(loader, '_iterator', 'torch', _LOADER_USE)
    iterator = iter(loader)
    for attr in _ITERATOR_STATE:
        private(iterator, attr, 'torch', _LOADER_USE)


# ------------------------------------------ persistent workers, resume ---
_PERSISTENT_USE = 'exact resume (the persistent workers\' iterator)'


def persistent_iterator(loader: Any) -> Any:
    """A DataLoader's persistent iterator (``loader._iterator``), or None.
    """
    return private(loader, '_iterator', 'torch', _PERSISTENT_USE)


def set_persistent_iterator(loader: Any, iterator: Any) -> None:
    """Sets ``loader._iterator``, which ``DataLoader.__iter__`` reuses
    (``_reset``) or, when None, starts anew (``_get_iterator``)."""
    private(loader, '_iterator', 'torch', _PERSISTENT_USE)
    loader._iterator = iterator


def iterator_base_seed(iterator: Any) -> Optional[int]:
    """The base seed a DataLoader iterator gave its workers, or None."""
    return None if iterator is None else private(iterator, '_base_seed',
                                                 'torch', _PERSISTENT_USE)


def shutdown_workers(iterator: Any) -> None:
    """Stops a multi-process DataLoader iterator's workers now (torch's
    ``_shutdown_workers``); does nothing for single-process ones."""
    stop = getattr(iterator, '_shutdown_workers', None)
    if stop is not None:
        stop()


def start_iterator(loader: Any) -> Any:
    """A new iterator of ``loader`` (``DataLoader._get_iterator``)."""
    return private(loader, '_get_iterator', 'torch', _PERSISTENT_USE)()


def override_start(loader: Any, start: Optional[Callable[[], Any]]) -> None:
    """Makes ``DataLoader.__iter__`` start the loader's next persistent
    iterator with ``start`` (an instance attribute ``_get_iterator``, one
    instance only); None takes it away again."""
    private(loader, '_get_iterator', 'torch', _PERSISTENT_USE)
    if start is None:
        loader.__dict__.pop('_get_iterator', None)
    else:
        loader._get_iterator = start


def point_holder_at(holder: Any, attr: str, old: Any, new: Any,
                    iterator: Any) -> None:
    """Points a holder that :func:`started_iterators` found at a new loader
    and its iterator (the old loader itself is left alone).

    Args:
        holder: The loop, or a wrapper of the old loader's iterator.
        attr (str): The attribute holding the iterator.
        old (DataLoader): The loader replaced.
        new (DataLoader): Its replacement.
        iterator: The new loader's iterator.
    """
    if holder is old:
        return
    if getattr(holder, '_dataloader', None) is old:
        holder._dataloader = new
    setattr(holder, attr, iterator)


def started_iterators(loop: Any, loader: Any) -> list:
    """Where a loop (or its loader) holds an iterator already started.

    Looks at the loader's persistent iterator (``loader._iterator``), the
    loop's own attributes that are DataLoader iterators, and wrappers that
    hold one over this loader (mmengine's ``_InfiniteDataloaderIterator``:
    ``_dataloader`` and ``_iterator``).

    Args:
        loop: An mmengine loop.
        loader (DataLoader): Its DataLoader.

    Returns:
        list[tuple]: ``(holder, attribute)`` pairs; empty when no iterator
        has started.
    """
    found = []
    if getattr(loader, '_iterator', None) is not None:
        found.append((loader, '_iterator'))
    for attr, value in vars(loop).items():
        if isinstance(value, base_iterator_class()):
            found.append((loop, attr))
        elif (getattr(value, '_dataloader', None) is loader and isinstance(
                getattr(value, '_iterator', None), base_iterator_class())):
            found.append((value, '_iterator'))
    return found


def base_iterator_class() -> type:
    """torch's ``_BaseDataLoaderIter``."""
    return dataloader_class('_BaseDataLoaderIter')


@functools.lru_cache(maxsize=None)
def fast_iterator_classes(inherited_seed: Callable[[Any], Optional[int]],
                          hand_out: Callable[[Any], Any]) -> Tuple[type, type]:
    """torch's single- and multi-process DataLoader iterators without the
    per-batch profiler scope, taking an inherited base seed and yielding
    ``hand_out`` of each batch.

    Args:
        inherited_seed (callable): ``inherited_seed(loader)``: the base seed
            the loader's new iterator gives its workers instead of the one
            it drew, or None to keep that
            (:func:`fast_parallel.data.loader_state.take_inherited_base_seed`).
        hand_out (callable): What a batch becomes before it is yielded
            (:func:`fast_parallel.data.handout.hand_out`).

    Returns:
        tuple: ``(single-process class, multi-process class)``.
    """
    from torch.autograd import profiler
    base = dataloader_class('_BaseDataLoaderIter')
    kind = dataloader_class('_DatasetKind')
    single = dataloader_class('_SingleProcessDataLoaderIter')
    multi = dataloader_class('_MultiProcessingDataLoaderIter')

    class _NextWithoutProfilerScope:
        """``__next__`` of torch's iterators without the profiler scope."""

        def __next__(self) -> Any:
            # torch's profilers (autograd, kineto, emit_nvtx/itt) set it.
            if profiler._is_profiler_enabled or \
                    self._dataset_kind != kind.Map:
                # Iterable datasets keep torch's length checks and warnings.
                return super().__next__()
            if self._sampler_iter is None:
                self._reset()
            data = self._next_data()
            self._num_yielded += 1
            return data

    class _HandOut:
        """``_next_data`` (torch's, after the pin thread) through
        ``hand_out``; every ``__next__`` path calls it."""

        def _next_data(self) -> Any:
            return hand_out(super()._next_data())

    class _InheritedSeed(base):
        """Takes the base seed ``inherited_seed`` gives (a rebuilt loader's
        predecessor's, a checkpoint's), right above torch's base class in
        the MRO, so the seed is in place before the multi-process iterator
        hands it to its workers."""

        def __init__(self, loader: Any) -> None:
            super().__init__(loader)
            seed = inherited_seed(loader)
            if seed is not None:
                self._base_seed = seed

    class SingleProcessIter(_NextWithoutProfilerScope, _HandOut, single,
                            _InheritedSeed):
        pass

    class MultiProcessingIter(_NextWithoutProfilerScope, _HandOut,
                              _WorkerDeathNamed, multi, _InheritedSeed):
        pass

    return SingleProcessIter, MultiProcessingIter


#: How long a failed receive waits for a worker's death to show (seconds).
_DEATH_WAIT_S = 5.0


class _WorkerDeathNamed:
    """torch's ``_try_get_data``, but a worker killed while its batch is
    received is named as torch names it, not left as a bare socket error.

    A batch's shared memory comes over a socket from the worker that made
    it. Killed in that moment, the worker resets the socket before the
    kernel shows it dead, so torch's check (``is_alive()`` of each worker,
    at once) finds none dead and re-raises the ``ConnectionResetError`` /
    ``EOFError``. Here the check waits up to ``_DEATH_WAIT_S`` for a death
    to show, then raises torch's own ``RuntimeError('DataLoader worker
    (pid(s) ...) exited unexpectedly')`` from the socket error; with no
    death, the socket error as torch raises it.
    """

    def _try_get_data(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._try_get_data(*args, **kwargs)
        except (ConnectionError, EOFError) as error:
            import time
            workers = private(self, '_workers', 'torch', _LOADER_USE)
            running = private(self, '_workers_status', 'torch', _LOADER_USE)
            until = time.monotonic() + _DEATH_WAIT_S
            while True:
                dead = [
                    i for i, w in enumerate(workers)
                    if running[i] and not w.is_alive()
                ]
                if dead or time.monotonic() > until:
                    break
                time.sleep(0.01)
            if not dead:
                raise
            for i in dead:
                self._mark_worker_as_unavailable(i)
            pids = ', '.join(str(workers[i].pid) for i in dead)
            raise RuntimeError(f'DataLoader worker (pid(s) {pids}) exited '
                               'unexpectedly') from error


def dispatch_mode_class() -> type:
    """torch's ``TorchDispatchMode`` (``torch.utils._python_dispatch``)."""
    import importlib
    module = importlib.import_module('torch.utils._python_dispatch')
    return private(module, 'TorchDispatchMode', 'torch',
                   'counting operations (fast_parallel.bench.opcount)')


# ------------------------------------------------- shared ring reuse ---
def storage_use_count(tensor: Any) -> int:
    """How many references hold the storage ``tensor`` lives on.

    Counts every tensor, view, ``.detach()``, ``.data`` and NumPy array
    (through the tensor it keeps) that shares the storage (torch's
    ``_storage_Use_Count``), plus the references to the storage's one Python
    object (``untyped_storage()`` returns the same object while it lives,
    which holds no count of its own), this call's included: the shared ring
    reuses a slot only when this is back to what the ring itself holds
    (:mod:`fast_parallel.data.ring`).

    Args:
        tensor (Tensor): Any tensor on the storage.

    Returns:
        int: The two counts, added.
    """
    import sys

    import torch
    count = private(torch._C, '_storage_Use_Count', 'torch',
                    'the shared ring (when a slot may be reused)')
    storage = tensor.untyped_storage()
    return count(storage._cdata) + sys.getrefcount(storage)


def nameless_shared_empty(numel: int, dtype: Any) -> Any:
    """A 1-D CPU tensor in shared memory that never has a name.

    torch's ``share_memory_()`` (and the pickling of a tensor into a
    worker's queue) makes ``/dev/shm/torch_<pid>_...`` and unlinks it right
    after mapping it: a process killed between the two (a DataLoader worker
    whose trainer died) leaves the segment in ``/dev/shm`` until reboot.
    Here the memory is a Linux ``memfd`` mapped by torch's own file-descriptor
    storage (``UntypedStorage._new_shared_fd_cpu``, as a receiving process
    maps it): it is shared the same way (pickling hands over the same
    descriptor) and ends with the last process that maps it, whatever kills
    them. Elsewhere (no ``memfd_create``, or the ``file_system`` sharing
    strategy, whose names torch's manager cleans) it is ``share_memory_()``.

    Args:
        numel (int): Elements.
        dtype (torch.dtype): Their dtype.

    Returns:
        Tensor: Uninitialised, ``is_shared()``.
    """
    import os

    import torch
    import torch.multiprocessing as mp
    if (not hasattr(os, 'memfd_create')
            or mp.get_sharing_strategy() != 'file_descriptor'):
        return torch.empty(numel, dtype=dtype).share_memory_()
    new_shared_fd = private(torch.UntypedStorage, '_new_shared_fd_cpu',
                            'torch', 'nameless shared memory (the ring)')
    nbytes = max(numel * torch.empty(0, dtype=dtype).element_size(), 1)
    fd = os.memfd_create('fast_parallel', os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        storage = new_shared_fd(fd, nbytes)  # maps a duplicate of fd
    finally:
        os.close(fd)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (numel, ))


def worker_pids(iterator: Any) -> list:
    """The process ids of a DataLoader iterator's workers (torch's
    ``_workers``); [] for a single-process one."""
    if iterator is None or not hasattr(iterator, '_workers'):
        return []
    workers = private(iterator, '_workers', 'torch',
                      'the data-bound line (workers\' CPU time)')
    return [w.pid for w in workers if w.pid is not None]
