"""The box steps of the fast Mosaic and MixUp (stock's ``rescale_``,
``clip_``, ``flip_``, ``translate_``, ``cat``, ``is_inside`` and the pick
of the boxes inside) on numpy arrays, for ``HorizontalBoxes`` of float32 or
float64 on the CPU.

Each step is the IEEE operation torch makes, on the same operands of the
boxes' dtype (a product or sum with a scalar, a difference from one, a
copy, a comparison), so it gives torch's bits. ``clip_`` is a min / max,
which two kernels may answer differently for a NaN or a negative zero: the
steps run here only on boxes without either, checked where one could
appear; the caller runs stock's steps otherwise. What goes is torch's cost
per call (tens of microseconds each, its code cold after the images' work).
Why: ``docs/pipeline.md`` ("Torch's small calls").
"""
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = [
    'as_boxes', 'as_tensor_like', 'box_array', 'clean', 'clip', 'exact_ints',
    'inside', 'mixed_boxes', 'mosaic_boxes', 'move_operands'
]

#: Ints float32 holds exactly.
EXACT_INT = 1 << 24

_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}
_TORCH = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64
}


def box_array(boxes: Any) -> Optional[np.ndarray]:
    """A numpy view of ``boxes``' memory where the steps can run on it:
    ``HorizontalBoxes`` (that class exactly) holding a plain, strided
    float32 / float64 CPU tensor of shape (n, 4) without grad; else None."""
    from mmdet.structures.bbox import HorizontalBoxes
    if type(boxes) is not HorizontalBoxes:
        return None
    t = boxes.tensor
    if type(t) is not torch.Tensor or t.dtype not in _NUMPY or \
            t.layout is not torch.strided or t.device.type != 'cpu' or \
            t.dim() != 2 or t.shape[1] != 4 or t.requires_grad or \
            t.is_neg() or t.is_conj():
        return None
    return t.numpy()


def exact_ints(*values: Any) -> bool:
    """Whether each value is a Python int of at most 2**24 in size: one
    that float32 holds exactly, as torch and numpy both cast it."""
    return all(type(v) is int and -EXACT_INT <= v <= EXACT_INT for v in values)


def clean(a: np.ndarray) -> bool:
    """Whether ``a`` holds no NaN and no negative zero, so that every min or
    max of its values has one answer."""
    if np.isnan(a).any():
        return False
    if not np.signbit(a).any():
        return True
    return not np.signbit(a[a == 0]).any()


def clip(a: np.ndarray, h: int, w: int) -> None:
    """Stock's ``clip_([h, w])``, in place, for a :func:`clean` ``a`` and
    :func:`exact_ints` ``h``, ``w`` (not negative)."""
    kind = a.dtype.type
    np.clip(a[:, 0::2], kind(0), kind(w), out=a[:, 0::2])
    np.clip(a[:, 1::2], kind(0), kind(h), out=a[:, 1::2])


def inside(a: np.ndarray, h: int, w: int) -> np.ndarray:
    """Stock's ``is_inside([h, w]).numpy()`` (any ``a``: comparisons have
    one answer) for :func:`exact_ints` ``h``, ``w``."""
    kind = a.dtype.type
    zero = kind(0)
    return (a[:, 0] < kind(w)) & (a[:, 1] < kind(h)) & \
        (a[:, 2] > zero) & (a[:, 3] > zero)


def as_boxes(a: np.ndarray) -> Any:
    """``HorizontalBoxes`` of a copy of ``a`` in memory torch made, as
    stock's steps leave it (a new C-ordered tensor)."""
    from mmdet.structures.bbox import HorizontalBoxes
    return HorizontalBoxes(
        _copied_into(
            torch.empty(a.shape, dtype=_TORCH[a.dtype], device='cpu'), a),
        clone=False)


def as_tensor_like(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``a``'s values laid out as torch lays out the result of
    an elementwise step on ``like`` (``empty_like``: its strides where they
    are dense, else C order), in torch's memory."""
    return _copied_into(torch.empty_like(like), a)


def _copied_into(tensor: torch.Tensor, a: np.ndarray) -> torch.Tensor:
    """``tensor`` holding ``a``'s values, copied by torch: a tensor that
    never lent numpy its memory, so torch can resize it, as stock's."""
    if a.size:
        tensor.copy_(torch.from_numpy(a))
    return tensor


def move_operands(moves: list, rows: Sequence[int],
                  dtype: Any) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The Mosaic's per-row operands, made by numpy in ``dtype``: each
    patch's scale ratio and ``(padw, padh, padw, padh)``, one row per box
    (``rows`` per patch). A Python float rounds to the dtype as
    ``torch.tensor`` rounds it (to inf silently, as torch's), and the ints
    are exact; None where a scale is not a Python float or a shift not
    :func:`exact_ints`.

    Args:
        moves (list[tuple]): (boxes, scale ratio, padw, padh) per patch.
        rows (Sequence[int]): Boxes per patch.
        dtype: The boxes' numpy dtype.

    Returns:
        tuple | None: (factors ``(n, 1)``, shifts ``(n, 4)``), or None.
    """
    scales = [scale for _, scale, _, _ in moves]
    shifts = [[padw, padh, padw, padh] for _, _, padw, padh in moves]
    if not all(type(s) is float for s in scales) or \
            not exact_ints(*(v for row in shifts for v in row)):
        return None
    with np.errstate(over='ignore'):
        factors = np.array([[s] for s in scales], dtype)
    return (np.repeat(factors, rows,
                      0), np.repeat(np.array(shifts, dtype), rows, 0))


def mixed_boxes(
        boxes: Any, retrieved: Any, ratio: float, origin: Sequence[int],
        flip: bool, offsets: Sequence[int], target: Sequence[int],
        clip_border: bool) -> Optional[Tuple[np.ndarray, Any, np.ndarray]]:
    """MixUp's box steps (mmdet 3.3.0's ``MixUp`` / ``CachedMixUp``): the
    retrieved boxes rescaled by ``ratio``, clipped to ``origin`` and flipped
    as drawn; their copy moved by ``-offsets`` and clipped to ``target``;
    ``boxes`` and that copy joined, and those inside ``target`` kept.

    Args:
        boxes: The sample's boxes (read only), or None where it has none
            (then stock's steps raise stock's error, in stock's order).
        retrieved: The mix image's boxes (read only).
        ratio (float): The scale ratio (jitter included).
        origin (Sequence[int]): The jittered canvas's (height, width).
        flip (bool): Whether the flip was drawn.
        offsets (Sequence[int]): The crop's (x, y) offsets.
        target (Sequence[int]): The sample image's (height, width).
        clip_border (bool): The transform's ``bbox_clip_border``.

    Returns:
        tuple | None: (the retrieved boxes as stock leaves them, as an
        array; the kept boxes, ``HorizontalBoxes``; the inside mask), or
        None where these steps may not give stock's bits (run stock's).
    """
    a, b = box_array(retrieved), box_array(boxes)
    # (one object for both: stock's moves of the one change the other)
    if a is None or b is None or boxes is retrieved or a.dtype != b.dtype or \
            type(ratio) is not float or not abs(ratio) < 1e38 or \
            not exact_ints(*origin, *target, *offsets) or \
            min(*origin, *target) < 0:
        return None
    kind = a.dtype.type
    with np.errstate(all='ignore'):  # (torch's steps warn of nothing)
        moved = a * kind(ratio)
        if not clean(moved):
            return None
        if clip_border:
            clip(moved, *origin)
        if flip:  # (clean, so W - x is never a NaN nor a negative zero)
            width = kind(origin[1])
            left = moved[:, 0].copy()
            moved[:, 0] = width - moved[:, 2]
            moved[:, 2] = width - left
        x, y = offsets
        shifted = moved + np.array([-x, -y, -x, -y], dtype=a.dtype)
        if clip_border:  # (a clean sum with ints is clean)
            clip(shifted, *target)
        joined = np.concatenate((b, shifted))
        keep = inside(joined, *target)
        return moved, as_boxes(joined[keep]), keep


def mosaic_boxes(moves: list, shape: Sequence[int],
                 clip_border: bool) -> Optional[Tuple[Any, np.ndarray]]:
    """The Mosaic's box steps (mmdet 3.3.0's ``Mosaic`` / ``CachedMosaic``):
    each patch's boxes rescaled and moved, joined, clipped to ``shape`` and
    those inside it kept.

    Args:
        moves (list[tuple]): (boxes, scale ratio, padw, padh) per patch,
            the boxes read only.
        shape (Sequence[int]): The canvas's (height, width).
        clip_border (bool): The transform's ``bbox_clip_border``.

    Returns:
        tuple | None: (the kept boxes, ``HorizontalBoxes``; the inside mask),
        or None where these steps may not give stock's bits.
    """
    arrays = [box_array(boxes) for boxes, *_ in moves]
    if any(a is None for a in arrays) or \
            len({a.dtype for a in arrays}) != 1 or \
            not exact_ints(*shape) or min(shape) < 0:
        return None
    operands = move_operands(moves, [len(a) for a in arrays], arrays[0].dtype)
    if operands is None or not all(abs(s) < 1e38 for _, s, *_ in moves):
        return None
    factors, pads = operands
    with np.errstate(all='ignore'):  # (torch's steps warn of nothing)
        moved = np.concatenate(arrays) * factors + pads
        if clip_border:
            if not clean(moved):
                return None
            clip(moved, *shape)
        keep = inside(moved, *shape)
        return as_boxes(moved[keep]), keep
