"""numpy's global random state, saved and put back around a peek at draws
that are all ``uniform`` (the fast Mosaic's look at ``RandomAffine``'s
matrix, :mod:`~fast_parallel.pipeline.unread`): a memory copy of the
MT19937's key and position where numpy has ``get_bit_generator`` and a
once-per-process check finds the copy restores the state; ``get_state`` /
``set_state`` otherwise. Why: ``docs/pipeline.md``.
"""
import ctypes
from typing import Any, Optional

import numpy as np

__all__ = ['copies_state', 'restore_numpy_state', 'save_numpy_state']

#: numpy's ``mt19937_state`` (``uint32 key[624]; int pos``), in bytes.
_MT19937_BYTES = 624 * 4 + 4


def save_numpy_state() -> Any:
    """numpy's global state, to put back after a peek at draws that are
    all ``uniform`` (mmdet's ``RandomAffine`` matrix): the MT19937 key and
    position, copied as memory (~1 us; ``get_state`` / ``set_state`` take
    ~55 us), where numpy has ``get_bit_generator`` (1.25+); else
    ``get_state``. A uniform draw leaves the legacy Gaussian cache as it
    is."""
    getter = getattr(np.random, 'get_bit_generator', None)
    generator = getter() if getter is not None else None
    if type(generator).__name__ != 'MT19937' or not copies_state():
        return np.random.get_state()
    return _SavedMemory(generator)


class _SavedMemory:
    """An MT19937's state memory, copied when made (the generator is held,
    so its state's address stays valid); :meth:`put_back` copies it back.
    Both copies hold the generator's lock, as numpy's own draws do."""

    __slots__ = ('generator', 'address', 'memory')

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self.address = generator.ctypes.state_address
        self.memory = ctypes.create_string_buffer(_MT19937_BYTES)
        with generator.lock:
            ctypes.memmove(self.memory, self.address, _MT19937_BYTES)

    def put_back(self) -> None:
        with self.generator.lock:
            ctypes.memmove(self.address, self.memory, _MT19937_BYTES)


_COPIES_STATE: Optional[bool] = None


def copies_state() -> bool:
    """Whether copying the state's memory puts numpy's state back (checked
    once per process on a generator of its own: the layout is numpy's)."""
    global _COPIES_STATE
    if _COPIES_STATE is None:
        generator = np.random.MT19937(12345)
        own = np.random.RandomState(generator)
        before = own.get_state()
        saved = _SavedMemory(generator)
        own.uniform(size=700)  # (past a 624-word refill)
        saved.put_back()
        after = own.get_state()
        _COPIES_STATE = bool(
            np.array_equal(before[1], after[1]) and before[2:] == after[2:])
    return _COPIES_STATE


def restore_numpy_state(state: Any) -> None:
    """Puts back what :func:`save_numpy_state` saved."""
    if type(state) is _SavedMemory:
        state.put_back()
    else:
        np.random.set_state(state)
