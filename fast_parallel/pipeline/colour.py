"""Fast form of mmdet's ``YOLOXHSVRandomAug``: stock's bytes and draws.

Stock shifts the HSV image in ``int16`` passes over the whole image, then
casts back; each output byte is a function of one input byte and the
sample's gains, so a 256-entry table per channel, built with stock's
arithmetic, gives the same bytes. The two colour conversions are stock's own
calls. A non-``uint8`` or non-3-channel image goes to stock's ``transform``,
counted.
"""
import cv2
import numpy as np
from mmdet.datasets.transforms import YOLOXHSVRandomAug

from fast_parallel.compat import hsv_gains as hsv_gains_of
from fast_parallel.pipeline.stats import count

__all__ = ['FastYOLOXHSVRandomAug', 'hsv_table']

_VALUES = np.arange(256, dtype=np.uint8)


def _identity(table: np.ndarray) -> bool:
    """Whether ``table`` maps every value OpenCV's ``uint8`` BGR to HSV
    gives to itself (H is 0..179 for every colour: a test checks all 2^24).
    """
    return np.array_equal(table[:180, 0, 0], _VALUES[:180]) and \
        np.array_equal(table[:, 0, 1], _VALUES) and \
        np.array_equal(table[:, 0, 2], _VALUES)


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
        table = hsv_table(hsv_gains)
        if not _identity(table):  # (no shift: every value to itself)
            img_hsv = cv2.LUT(img_hsv, table)
        cv2.cvtColor(img_hsv, cv2.COLOR_HSV2BGR, dst=img)
        results['img'] = img
        return results
