"""What the fast pipeline did: samples, reuses, stock ways, cache hits.

:data:`COUNTS` counts in each process (a DataLoader worker its own); the
pipeline benchmark reads it in its one process. :func:`share_counts`, called
by ``FastParallelHook`` before the workers fork, adds totals by category in
shared memory that the forked workers add to, and the hook logs them each
epoch (:func:`shared_totals`).
"""
import mmap
import multiprocessing
from collections import Counter
from typing import Dict, Optional

import numpy as np

__all__ = ['CATEGORIES', 'COUNTS', 'count', 'share_counts', 'shared_totals']

#: Per process: ``'samples'`` made by a fast wrapper, ``'mix loads
#: reused'``, ``'stock: <transform>: <why>'`` for a sample a fast transform
#: handed to stock's, ``'stock copy: <type>'`` for a transform run with
#: stock's retry copy, ``'cache: ...'`` for the decoded-input cache,
#: ``'deferred decodes...'`` for the Mosaic patches handed over undecoded
#: (:mod:`~fast_parallel.pipeline.unread`), ``'Mosaic: resizes cut to the
#: part read'`` (:mod:`~fast_parallel.pipeline.part_resize`).
COUNTS: Counter = Counter()

#: The shared totals, by the start of the keys they sum.
CATEGORIES = ('samples', 'stock: ', 'stock copy: ', 'mix loads reused',
              'cache: hits', 'cache: decoded', 'cache: full',
              'cache: file changed', 'cache: gt-database hits',
              'cache: gt-database files read', 'cache: disk file unreadable',
              'cache: disk write failed', 'cache: resizes kept',
              'deferred decodes: never read', 'deferred decodes: decoded',
              'deferred decodes', 'Mosaic: resizes cut to the part read')


class _Shared:
    """int64 totals in anonymous shared memory, and a fork-inherited lock.
    """

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 8 * len(CATEGORIES))
        self.totals = np.frombuffer(self._map, np.int64)
        self.lock = multiprocessing.get_context('fork').Lock()

    def __reduce__(self):
        return (type(None), ())  # a spawned worker counts only its own


_SHARED: Optional[_Shared] = None


def _category(key: str) -> Optional[int]:
    # 'stock copy: ' before 'stock: ' would not match it: both checked
    if key.startswith('stock copy: '):
        return CATEGORIES.index('stock copy: ')
    for i, start in enumerate(CATEGORIES):
        if key.startswith(start):
            return i
    return None


def count(key: str) -> None:
    """Counts one ``key`` here and, after :func:`share_counts`, in the
    shared totals."""
    COUNTS[key] += 1
    shared = _SHARED
    if shared is not None:
        index = _category(key)
        if index is not None:
            with shared.lock:
                shared.totals[index] += 1


def share_counts() -> None:
    """Makes the shared totals (once per process tree; call it before the
    workers fork)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = _Shared()


def shared_totals() -> Optional[Dict[str, int]]:
    """The shared totals by category, or None before :func:`share_counts`.
    """
    shared = _SHARED
    if shared is None:
        return None
    with shared.lock:
        values = shared.totals.copy()
    return {name.rstrip(': '): int(v) for name, v in zip(CATEGORIES, values)}
