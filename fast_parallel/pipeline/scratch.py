"""Per-thread scratch memory for temporaries no one else sees: MixUp's
float64 canvas and its jitter resize (up to ~35 MB), and the Mosaic's
canvas where only the next ``RandomAffine`` reads it (~5 MB).

Stock allocates them anew for every sample. Kept, their pages stay mapped,
and MixUp's canvas's pad is written only where the last image lay; what a
transform hands on to the user is always a new array. Why and what it
costs: ``docs/pipeline.md`` ("Scratch memory").
"""
import threading
from typing import Optional

import numpy as np

__all__ = ['owned_scratch', 'padded_canvas', 'scratch']

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
        if kept is not None and name == 'canvas':
            _LOCAL.canvas_pad = None  # (the pad is no longer there)
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


def padded_canvas(shape: tuple, one: np.ndarray,
                  image: np.ndarray) -> np.ndarray:
    """Stock's ``np.ones(shape, one.dtype) * pad_val`` (``one``: the pad,
    ``(1, 1, 3)``, already of the canvas's dtype) with ``image`` written at
    its top left, in this thread's scratch memory.

    The pad is written where the last canvas of the same shape, dtype and
    pad held its image, and wherever the memory's state is unknown.

    Args:
        shape (tuple): ``(height, width, 3)``.
        one (np.ndarray): The pad value(s), ``(1, 1, 3)`` or ``(1, 1, 1)``.
        image (np.ndarray): At most ``shape``'s height and width.

    Returns:
        np.ndarray: The canvas (scratch: valid until this thread's next
        call).
    """
    canvas = scratch('canvas', shape, one.dtype)
    key = (tuple(shape), one.dtype.str, one.tobytes())
    known: Optional[tuple] = getattr(_LOCAL, 'canvas_pad', None)
    _LOCAL.canvas_pad = None  # (unknown until this call is done)
    h, w = image.shape[:2]
    canvas[:h, :w] = image  # (stock's error for a larger image)
    if known is not None and known[0] == key:
        last_h, last_w = known[1]  # the pad is everywhere else already
        _fill(canvas[h:last_h, :last_w], one)
        _fill(canvas[:min(h, last_h), w:last_w], one)
    else:
        _fill(canvas[h:], one)
        _fill(canvas[:h, w:], one)
    _LOCAL.canvas_pad = (key, (h, w))
    return canvas


def _fill(region: np.ndarray, one: np.ndarray) -> None:
    """``region[...] = one``, one row at a time (numpy broadcasts a
    3-value pad element by element; the bytes are the same)."""
    if region.size:
        row = np.empty(region.shape[1:], region.dtype)
        row[...] = one.reshape(-1)
        region[...] = row
