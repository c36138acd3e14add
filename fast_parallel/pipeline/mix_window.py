"""MixUp's image steps (stock's bytes and draws), shared by the fast
``MixUp`` and ``CachedMixUp``, and the canvas helpers the fast Mosaic uses.

:class:`MixWindow` builds only the target-sized crop of MixUp's padded,
jittered canvas; :func:`padded_canvas` keeps that float64 canvas in this
thread's scratch memory. Why the bytes are stock's: ``docs/pipeline.md``
("MixUp", "Scratch memory").
"""
import threading
from typing import Any, Optional

import mmcv
import mmcv.image.geometric as mmcv_geometric
import numpy as np
from numpy import random

from fast_parallel.pipeline.copies import CV_NATIVE, flipped_copy
from fast_parallel.pipeline.scratch import scratch

__all__ = [
    'MixWindow', 'fill', 'filled', 'fit_patch', 'padded_canvas', 'resize_keeps'
]


def filled(shape: tuple, value, dtype) -> np.ndarray:
    """``np.full(shape, value, dtype)``, fast for one value per channel.

    numpy broadcasts a ``(3,)`` fill element by element; filling one row
    first and copying it down the rows gives the same bytes (the same
    unsafe cast of each value) in row-sized copies.
    """
    out = np.empty(shape, dtype=dtype)
    fill(out, value)
    return out


def fill(out: np.ndarray, value) -> None:
    """``out[...] = value`` as ``np.full`` fills (its unsafe cast, its
    broadcast and its error), a row at a time for one value per channel."""
    values = np.asarray(value)
    if values.size == 1 or out.ndim != 3 or values.shape[-1:] != (
            out.shape[2], ) or values.size != out.shape[2]:
        np.copyto(out, value, casting='unsafe')  # (np.full's own fill)
        return
    row = np.empty(out.shape[1:], dtype=out.dtype)
    row[...] = values.reshape(-1)
    out[...] = row


#: MixUp canvas dtypes (numpy's rule for a uint8 image times a pad_val in
#: 0..255) whose same-size OpenCV resize keeps values 0..255.
_COPIED_CANVAS = frozenset(
    np.dtype(t) for t in (np.uint8, np.int64, np.float64))


def resize_keeps(img: np.ndarray) -> bool:
    """Whether ``mmcv.imresize`` of ``img`` to its own size gives ``img``'s
    bytes, shape and dtype (OpenCV copies a same-size image; its binding
    casts some dtypes and drops a last axis of 1; pillow may not copy)."""
    return mmcv_geometric.imread_backend == 'cv2' and \
        img.dtype in CV_NATIVE and img.ndim in (2, 3) and \
        not (img.ndim == 3 and img.shape[2] == 1)


def fit_patch(t: Any, patch: Optional[dict], img: np.ndarray,
              size: tuple) -> np.ndarray:
    """Stock's keep-ratio ``mmcv.imresize(img, size)`` of a loaded patch;
    from ``t``'s :class:`~fast_parallel.pipeline.fit_cache.FitCache` where
    the switch gave it one (read-only then: the callers only read it)."""
    fit = getattr(t, '_fp_fit', None)
    if fit is None or patch is None:
        return mmcv.imresize(img, size)
    return fit.resized(patch, img, size)


#: Per thread: ``(shape, dtype, pad), (h, w), memory`` of the last canvas
#: :func:`padded_canvas` made (None while one is being made).
_LAST_CANVAS = threading.local()


def padded_canvas(shape: tuple, one: np.ndarray,
                  image: np.ndarray) -> np.ndarray:
    """Stock's ``np.ones(shape, one.dtype) * pad_val`` (``one``: the pad,
    ``(1, 1, 3)``, already of the canvas's dtype) with ``image`` written at
    its top left, in this thread's scratch memory.

    The pad is written where the last canvas of the same shape, dtype and
    pad, in the same memory, held its image, and wherever the memory's
    state is unknown.

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
    known = getattr(_LAST_CANVAS, 'made', None)
    _LAST_CANVAS.made = None  # (unknown until this call is done)
    h, w = image.shape[:2]
    canvas[:h, :w] = image  # (stock's error for a larger image)
    if known is not None and known[0] == key and known[2] is canvas.base:
        last_h, last_w = known[1]  # the pad is everywhere else already
        fill(canvas[h:last_h, :last_w], one)
        fill(canvas[:min(h, last_h), w:last_w], one)
    else:
        fill(canvas[h:], one)
        fill(canvas[:h, w:], one)
    _LAST_CANVAS.made = (key, (h, w), canvas.base)
    return canvas


#: Elements of the largest jitter resize kept in scratch memory (float64:
#: 256 MB; YOLOX's largest is 25 MB).
_MOST_KEPT = 1 << 25


def _jittered(canvas: np.ndarray, size: tuple) -> Optional[np.ndarray]:
    """Scratch memory for OpenCV's jitter resize of the float64 ``canvas``
    to ``size`` (width, height); None (stock's new array, or stock's
    error) for another dtype, backend or an empty size."""
    if canvas.dtype != np.float64 or min(size) <= 0 or \
            mmcv_geometric.imread_backend != 'cv2' or \
            size[0] * size[1] * canvas[0, 0].size > _MOST_KEPT:
        return None  # (a huge size: OpenCV's own allocation, and error)
    return scratch('jittered', (size[1], size[0]) + canvas.shape[2:],
                   canvas.dtype)


class MixWindow:
    """Stock's MixUp image steps 1-5 (jitter and flip draws, canvas, keep-
    ratio resize, float64 jitter resize, flip, offset draws, crop), building
    only the target-sized crop of the padded canvas.

    Args:
        t (MixUp | CachedMixUp): The transform (its arguments).
        retrieve_img (np.ndarray): The mix image, 3-channel uint8.
        target_shape (tuple): The sample image's (height, width).
        patch (dict, optional): The loaded mix sample (its ``img_path``),
            for the transform's kept resizes, if any.
    """

    def __init__(self,
                 t,
                 retrieve_img: np.ndarray,
                 target_shape,
                 patch: Optional[dict] = None) -> None:
        jit_factor = random.uniform(*t.ratio_range)
        self.is_flip = random.uniform(0, 1) > t.flip_ratio
        # stock: np.ones(..., img dtype) * pad_val; numpy's own rule gives
        # the canvas dtype and value (float64 for a float pad_val; one
        # value per channel for three)
        one = np.ones((1, 1, 3), dtype=retrieve_img.dtype) * t.pad_val
        canvas_shape = (t.dynamic_scale[1], t.dynamic_scale[0], 3)
        # stock makes its canvas here: its errors for a bad img_scale
        # (negative, float, too large) come first (memory left untouched)
        np.empty(canvas_shape, one.dtype)
        scale_ratio = min(t.dynamic_scale[1] / retrieve_img.shape[0],
                          t.dynamic_scale[0] / retrieve_img.shape[1])
        retrieve_img = fit_patch(t, patch, retrieve_img,
                                 (int(retrieve_img.shape[1] * scale_ratio),
                                  int(retrieve_img.shape[0] * scale_ratio)))
        self.scale_ratio = scale_ratio * jit_factor
        if jit_factor == 1.0 and one.dtype in _COPIED_CANVAS and \
                mmcv_geometric.imread_backend == 'cv2':
            # OpenCV's same-size resize copies the canvas (an int64 one as
            # int32): values 0..255 stay, so the window is read off the
            # image and the canvas's pad, without making the canvas
            self.origin_h, self.origin_w = canvas_shape[:2]
            rows, cols = self._offsets(t, target_shape)
            self._window_of_image(retrieve_img, one.astype(np.uint8), rows,
                                  cols)
            return
        out_img = padded_canvas(canvas_shape, one, retrieve_img)
        size = (int(out_img.shape[1] * jit_factor),
                int(out_img.shape[0] * jit_factor))
        out_img = mmcv.imresize(out_img, size, out=_jittered(out_img, size))
        self.origin_h, self.origin_w = out_img.shape[:2]
        rows, cols = self._offsets(t, target_shape)
        y0, x0 = self.y_offset, self.x_offset
        if self.is_flip and rows > 0 and cols > 0:
            # flipped column x is column origin_w - 1 - x: the unflipped
            # window cast (contiguous reads), then its bytes flipped by
            # OpenCV (copies.flipped_copy; numpy copies a reversed view an
            # element group at a time)
            mirrored = out_img[y0:y0 + rows,
                               self.origin_w - x0 - cols:self.origin_w -
                               x0].astype(np.uint8)[:, ::-1]
            flipped = flipped_copy(mirrored)
            self._put(mirrored if flipped is None else flipped, rows, cols)
        else:  # (an empty window is the same either way)
            self._put(out_img[y0:y0 + rows, x0:x0 + cols], rows, cols)

    def _offsets(self, t, target_shape) -> tuple:
        """Stock's offset draws; the crop filled with the padded canvas's
        pad; the (rows, cols) of the crop the resized canvas covers."""
        target_h, target_w = target_shape
        padded_h = max(self.origin_h, target_h)
        padded_w = max(self.origin_w, target_w)
        self.x_offset, self.y_offset = 0, 0
        if padded_h > target_h:
            self.y_offset = random.randint(0, padded_h - target_h)
        if padded_w > target_w:
            self.x_offset = random.randint(0, padded_w - target_w)
        # stock pads the whole canvas (float64, cast to uint8), then crops
        self._fill = (np.ones((1, 1, 3)) * t.pad_val).astype(np.uint8)
        self._target = (target_h, target_w, 3)
        rows = max(0, min(target_h, self.origin_h - self.y_offset))
        cols = max(0, min(target_w, self.origin_w - self.x_offset))
        return rows, cols

    def _put(self, window: np.ndarray, rows: int, cols: int) -> None:
        """The crop: ``window`` (cast to uint8 as stock's assignment casts)
        over the padded canvas's fill."""
        if (rows, cols) == self._target[:2]:
            self.crop = window.astype(np.uint8, copy=False)
            return
        self.crop = filled(self._target, self._fill, np.uint8)
        self.crop[:rows, :cols] = window

    def _window_of_image(self, image: np.ndarray, pad: np.ndarray, rows: int,
                         cols: int) -> None:
        """The crop's ``rows`` x ``cols`` window of the unresized canvas
        (``pad`` with ``image`` at its top left, flipped if drawn)."""
        y0, x0 = self.y_offset, self.x_offset
        self.crop = filled(self._target, self._fill, np.uint8)
        if rows > 0 and cols > 0 and not np.array_equal(pad, self._fill):
            self.crop[:rows, :cols] = filled((rows, cols, 3), pad, np.uint8)
        image_h, image_w = image.shape[:2]
        lo, hi = ((self.origin_w - image_w, self.origin_w) if self.is_flip else
                  (0, image_w))
        r1 = min(image_h, y0 + rows)
        c0, c1 = max(x0, lo), min(x0 + cols, hi)
        if r1 <= y0 or c1 <= c0:
            return
        if self.is_flip:  # canvas column x is image column origin_w - 1 - x
            part = image[y0:r1, self.origin_w - c1:self.origin_w - c0][:, ::-1]
        else:
            part = image[y0:r1, c0:c1]
        self.crop[:r1 - y0, c0 - x0:c1 - x0] = part
