"""Hooks that fail on purpose: a crash or a failing rank mid-training.

Imported by the fault tests' configs (``custom_imports``); each does nothing
unless its environment variable is set.
"""
import os
import signal
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class CrashAtIterHook(Hook):
    """Kills the process with SIGKILL when iteration ``FP_KILL_AT_ITER``
    (0-based) is about to run: no hook, no ``finally``, no flush runs. With
    ``FP_KILL_RANK`` only that rank dies; ``FP_KILL_STAMP`` names a file
    that gets the time of the kill (``time.time()``) first."""

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        at = os.environ.get('FP_KILL_AT_ITER')
        rank = os.environ.get('FP_KILL_RANK')
        if at is None or runner.iter != int(at) or (rank is not None and
                                                    runner.rank != int(rank)):
            return
        stamp = os.environ.get('FP_KILL_STAMP')
        if stamp:
            with open(stamp, 'w') as f:
                f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class RaiseAtIterHook(Hook):
    """Raises in rank ``FP_RAISE_RANK`` when iteration ``FP_RAISE_AT_ITER``
    is about to run (a rank that fails while the others go on)."""

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        at = os.environ.get('FP_RAISE_AT_ITER')
        rank = int(os.environ.get('FP_RAISE_RANK', '0'))
        if at is not None and runner.iter == int(at) and \
                runner.rank == rank:
            raise RuntimeError(f'rank {rank} fails on purpose at iteration '
                               f'{runner.iter}')
