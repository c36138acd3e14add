"""DataLoader workers that end with their trainer, however it ends.

torch's worker notices a dead parent only between batches (its watchdog, every
5 s) and then leaves its loop; at exit, ``multiprocessing`` joins the feeder
thread of the worker's result queue. When the batches already in that pipe
fill it (64 KiB on Linux) and no one reads any more, the feeder blocks in
``write`` forever, because the worker holds the pipe's read end itself
(inherited at fork): the worker lives on, holding its memory.
:class:`ExitWithParent` wraps a loader's ``worker_init_fn`` so that the worker
ends as soon as its parent does: the kernel kills it (Linux
``PR_SET_PDEATHSIG``) where the worker was forked by the parent's main thread
(the signal follows the forking *thread*), else a daemon thread polls the
parent and SIGKILLs the worker itself. Nothing random is drawn and the
loader's own ``worker_init_fn`` runs as before, so batches stay stock's.
Details: ``docs/reliability.md``.
"""
import ctypes
import os
import signal
import sys
import threading
from typing import Callable, Optional

__all__ = ['ExitWithParent', 'exit_with_parent']

#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``.
_PR_SET_PDEATHSIG = 1
#: Seconds between two looks at the parent where the kernel cannot watch.
POLL_SECONDS = 0.5


def _set_parent_death_signal() -> bool:
    """Asks Linux to SIGKILL this process when its parent thread ends.

    Returns:
        bool: Whether the kernel accepted it (False off Linux).
    """
    if not sys.platform.startswith('linux'):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _end_now() -> None:
    """Ends this worker at once: no exit handlers, no thread joins (the
    feeder thread of a full pipe would block them)."""
    os.kill(os.getpid(), signal.SIGKILL)


def _poll_parent(parent: int) -> None:
    """Ends this process once ``parent`` is no longer its parent."""
    event = threading.Event()
    while os.getppid() == parent:
        event.wait(POLL_SECONDS)
    _end_now()


class ExitWithParent:
    """``worker_init_fn``: end with the parent first, then the loader's own.

    A class, not a closure, so that workers started with ``spawn`` or
    ``forkserver`` get it pickled.

    Args:
        init_fn (callable, optional): The loader's ``worker_init_fn``.
    """

    def __init__(self, init_fn: Optional[Callable[[int], None]]) -> None:
        self.init_fn = init_fn
        # The main thread of the process that builds the workers: a worker
        # forked by it has this thread id (fork keeps the caller's).
        self.main_thread = threading.main_thread().ident
        self.pid = os.getpid()
        self.pickled = False

    def __setstate__(self, state: dict) -> None:
        # A worker started with spawn/forkserver: not a fork of the thread.
        self.__dict__.update(state, pickled=True)

    def __call__(self, worker_id: int) -> None:
        parent = os.getppid()
        forked_by_main = (not self.pickled and parent == self.pid
                          and threading.get_ident() == self.main_thread)
        if not (forked_by_main and _set_parent_death_signal()):
            threading.Thread(
                target=_poll_parent,
                args=(parent, ),
                name='fast_parallel-parent-watch',
                daemon=True).start()
        if os.getppid() != parent:  # the parent died before the signal was set
            _end_now()
        if self.init_fn is not None:
            self.init_fn(worker_id)


def exit_with_parent(
        init_fn: Optional[Callable[[int], None]]) -> ExitWithParent:
    """``init_fn`` wrapped in :class:`ExitWithParent` (once).

    Args:
        init_fn (callable, optional): A loader's ``worker_init_fn``.

    Returns:
        ExitWithParent: ``init_fn`` itself when it is one already.
    """
    if isinstance(init_fn, ExitWithParent):
        return init_fn
    return ExitWithParent(init_fn)
