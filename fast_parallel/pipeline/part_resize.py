"""The top-left part of a Mosaic patch's keep-ratio resize, where the next
``RandomAffine`` reads only that part.

OpenCV's bilinear resize of an 8-bit image computes each output row and
column from its index and the scale alone (fixed-point, no IPP), so the
resize of the image cut just past the last source pixel the part reads,
given stock's scale factors (``fx``, ``fy``) rather than a size, has the
part's bytes. OpenCV copies where the cut's size rounds to itself: those
take the full resize. Each process checks the rule on its own OpenCV once
for each setting of the thread's OpenCV optimizations
(:func:`cut_resize_is_exact`); where it fails, every resize is whole. Why:
``docs/pipeline.md`` ("Mosaic's resizes of patches read in part").
"""
import math
from typing import Dict, Optional, Tuple

import cv2
import mmcv.image.geometric as mmcv_geometric
import numpy as np

__all__ = [
    'cut_resize_is_exact', 'needed_part', 'opencv_setting', 'resized_part'
]

#: Source pixels read past the last one the part's last output pixel
#: starts from: bilinear reads the next one, and OpenCV rounds the source
#: position to float (a margin for that rounding).
_MARGIN = 3

#: OpenCV's per-thread settings that pick a resize's code path (its
#: optimizations, IPP, IPP where it rounds otherwise) -> whether the rule
#: held under them.
_EXACT: Dict[tuple, bool] = {}


def needed_part(reads: Optional[tuple], paste: tuple, crop: tuple,
                size: tuple) -> Optional[Tuple[int, int]]:
    """``(cols, rows)``: the top-left part of a patch resized to ``size``
    that holds every pixel of it the box ``reads`` (x0, y0, x1, y1; ends
    excluded) covers, where it is pasted at ``paste`` from ``crop`` (x1,
    y1, x2, y2); None where that is the whole, or unknown."""
    if reads is None or not all(
            type(v) is int
            for v in tuple(reads) + tuple(paste) + tuple(crop) + tuple(size)):
        return None
    cols = min(paste[2], reads[2]) - paste[0] + crop[0]
    rows = min(paste[3], reads[3]) - paste[1] + crop[1]
    if cols >= size[0] and rows >= size[1]:
        return None
    return max(cols, 1), max(rows, 1)


def _source_end(count: int, inv_scale: float, length: int) -> int:
    """How many source pixels (from 0) the first ``count`` output pixels
    of a resize by ``inv_scale`` read, with the margin."""
    last = math.floor((count - 0.5) / inv_scale - 0.5)
    return min(length, max(last, 0) + 1 + _MARGIN)


def resized_part(img: np.ndarray, size: tuple,
                 part: Tuple[int, int]) -> Optional[np.ndarray]:
    """An image whose top-left ``part`` (cols, rows) has the bytes of
    ``mmcv.imresize(img, size)``'s, made from the top-left of ``img``;
    None where it is not made so (then resize the whole).

    Args:
        img (np.ndarray): A 3-channel ``uint8`` image.
        size (tuple): Stock's (width, height).
        part (tuple): (cols, rows) needed, from the top left.

    Returns:
        np.ndarray | None: At least ``part`` large.
    """
    if mmcv_geometric.imread_backend != 'cv2' or not cut_resize_is_exact():
        return None
    return _resized_part(img, size, part)


def _resized_part(img: np.ndarray, size: tuple,
                  part: Tuple[int, int]) -> Optional[np.ndarray]:
    height, width = img.shape[:2]
    cols, rows = min(part[0], size[0]), min(part[1], size[1])
    if min(size) <= 0 or min(height, width) <= 0:
        return None
    # OpenCV's own scale: (double)dsize / ssize
    fx, fy = size[0] / width, size[1] / height
    src_w = _source_end(cols, fx, width)
    src_h = _source_end(rows, fy, height)
    cut = (round(src_w * fx), round(src_h * fy))  # (OpenCV's cvRound)
    if (src_w >= width and src_h >= height) or min(cut) <= 0 or \
            cut == (src_w, src_h):
        return None  # (nothing to cut, or OpenCV would only copy)
    out = cv2.resize(
        img[:src_h, :src_w],
        None,
        fx=fx,
        fy=fy,
        interpolation=cv2.INTER_LINEAR)
    if out.shape[0] < rows or out.shape[1] < cols:
        return None
    return out


def _cut_matches(rng: np.random.Generator, shape: tuple, size: tuple,
                 part: tuple) -> bool:
    img = rng.integers(0, 256, shape, dtype=np.uint8)
    out = _resized_part(img, size, part)
    whole = cv2.resize(img, size, interpolation=cv2.INTER_LINEAR)
    cols, rows = part
    return out is not None and np.array_equal(out[:rows, :cols],
                                              whole[:rows, :cols])


def opencv_setting() -> tuple:
    """This thread's OpenCV settings that pick a call's code path: its
    optimizations, IPP, and IPP where it rounds otherwise (a check of an
    OpenCV rule holds for the setting it ran under)."""
    return (cv2.useOptimized(), cv2.ipp.useIPP(), cv2.ipp.useIPP_NotExact())


def cut_resize_is_exact() -> bool:
    """Whether this process's OpenCV, under this thread's settings
    (``cv2.useOptimized``, ``cv2.ipp.useIPP`` and ``useIPP_NotExact``:
    IPP works its scale out from the sizes), gives a cut's resize the
    whole's bytes (checked once per setting: upscales, downscales, exact
    2x both ways; cut in rows, columns or both)."""
    mode = opencv_setting()
    exact = _EXACT.get(mode)
    if exact is None:
        _EXACT[mode] = False  # (while checking: whole resizes)
        rng = np.random.default_rng(0)
        cases = [((97, 131, 3), (173, 128), (61, 40)),
                 ((131, 97, 3), (128, 173), (128, 51)),
                 ((150, 200, 3), (96, 72), (40, 72)),
                 ((480, 512, 3), (640, 600), (333, 251)),
                 ((509, 536, 3), (640, 607), (640, 300)),
                 ((360, 640, 3), (320, 180), (200, 101)),
                 ((90, 160, 3), (320, 180), (201, 99))]
        exact = _EXACT[mode] = all(_cut_matches(rng, *case) for case in cases)
    return exact
