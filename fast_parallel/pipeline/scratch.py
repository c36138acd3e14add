"""Per-thread scratch memory for temporaries no one else sees: MixUp's
float64 canvas and its jitter resize (up to ~35 MB), and the Mosaic's
canvas where only the next ``RandomAffine`` reads it (~5 MB).

Stock allocates them anew for every sample. Kept, their pages stay mapped
(and MixUp's canvas's pad need be written only where the last image lay:
``mix_window.padded_canvas``); what a transform hands on to the user is
always a new array. Why and what it costs: ``docs/pipeline.md`` ("Scratch
memory").
"""
import threading

import numpy as np

__all__ = ['owned_scratch', 'scratch']

_LOCAL = threading.local()


def scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """This thread's ``name`` array, viewed as a C-contiguous ``shape`` of
    ``dtype`` (contents left over from its last use; grown as needed).

    Args:
        name (str): Which temporary.
        shape (tuple): Its shape (non-negative ints).
        dtype: Its dtype.

    Returns:
        np.ndarray: A view of memory this thread keeps.
    """
    dtype = np.dtype(dtype)
    size = 1
    for n in shape:
        size *= int(n)
    kept = getattr(_LOCAL, name, None)
    if kept is None or kept.dtype != dtype or kept.size < size:
        kept = np.empty(max(size, 1), dtype)
        setattr(_LOCAL, name, kept)
    return kept[:size].reshape(shape)


def owned_scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    """This thread's ``name`` array of exactly ``shape`` and ``dtype``, an
    array that owns its memory (contents left over from its last use)."""
    kept = getattr(_LOCAL, name, None)
    if kept is None or kept.shape != tuple(shape) or \
            kept.dtype != np.dtype(dtype):
        kept = np.empty(shape, dtype)
        setattr(_LOCAL, name, kept)
    return kept
