"""Fast form of mmdet's ``YOLOXHSVRandomAug``: stock's bytes and draws.

Stock shifts the HSV image in ``int16`` passes over the whole image, then
casts back; each output byte is a function of one input byte and the
sample's gains, so a 256-entry table per channel, built with stock's
arithmetic, gives the same bytes; it is looked up on each plane it moves
(none where no value moves). The two colour conversions are stock's own
calls. A non-``uint8`` or non-3-channel image goes to stock's ``transform``,
counted.
"""
import cv2
import numpy as np
from mmdet.datasets.transforms import YOLOXHSVRandomAug

from fast_parallel.compat import hsv_gains as hsv_gains_of
from fast_parallel.pipeline.stats import count

__all__ = ['FastYOLOXHSVRandomAug', 'hsv_table', 'shift']

_VALUES = np.arange(256, dtype=np.uint8)

#: How many values each channel of OpenCV's ``uint8`` BGR to HSV takes (H is
#: 0..179 for every colour: a test checks all 2^24).
_TAKEN = (180, 256, 256)


def _shifted(table: np.ndarray) -> list:
    """The channels whose ``table`` column moves a value they take."""
    return [
        c for c, n in enumerate(_TAKEN)
        if not np.array_equal(table[:n, 0, c], _VALUES[:n])
    ]


def shift(img_hsv: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``cv2.LUT(img_hsv, table)``'s bytes: each column of the table looked
    up on its own plane, only for the planes it moves, then the planes
    merged (at 640 x 640, OpenCV's lookup in a three-channel table took
    520 us; one plane's in a one-channel table 105 us).

    Args:
        img_hsv (np.ndarray): OpenCV's ``uint8`` HSV image (H < 180).
        table (np.ndarray): :func:`hsv_table`'s ``(256, 1, 3)`` table.

    Returns:
        np.ndarray: The shifted image (``img_hsv`` itself where nothing
        moves).
    """
    moved = _shifted(table)
    if not moved:
        return img_hsv
    planes = list(cv2.split(img_hsv))
    for c in moved:
        planes[c] = cv2.LUT(planes[c], np.ascontiguousarray(table[:, 0, c]))
    return cv2.merge(planes)


def hsv_table(hsv_gains: np.ndarray) -> np.ndarray:
    """Stock's per-channel shift of every ``uint8`` value, as a table.

    Args:
        hsv_gains (np.ndarray): The sample's ``int16`` gains (h, s, v).

    Returns:
        np.ndarray: ``(256, 1, 3)`` ``uint8``, for ``cv2.LUT``.
    """
    values = np.arange(256, dtype=np.int16)
    table = np.empty((256, 1, 3), dtype=np.int16)
    table[:, 0, 0] = (values + hsv_gains[0]) % 180
    table[:, 0, 1] = np.clip(values + hsv_gains[1], 0, 255)
    table[:, 0, 2] = np.clip(values + hsv_gains[2], 0, 255)
    return table.astype(np.uint8)


class FastYOLOXHSVRandomAug(YOLOXHSVRandomAug):
    """``YOLOXHSVRandomAug`` with a lookup table for the shift."""

    def transform(self, results: dict) -> dict:
        img = results['img']
        if not (isinstance(img, np.ndarray) and img.dtype == np.uint8
                and img.ndim == 3 and img.shape[2] == 3):
            count('stock: YOLOXHSVRandomAug: not a 3-channel uint8 '
                  'image')
            return super().transform(results)
        hsv_gains = hsv_gains_of(self)()
        img_hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
        img_hsv = shift(img_hsv, hsv_table(hsv_gains))
        cv2.cvtColor(img_hsv, cv2.COLOR_HSV2BGR, dst=img)
        results['img'] = img
        return results
