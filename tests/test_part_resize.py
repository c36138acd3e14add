"""The top-left part of a Mosaic patch's resize: OpenCV's whole resize's
bytes there, for every size, scale and cut, or the whole resize."""
import random

import cv2
import numpy as np
import pytest

from fast_parallel.pipeline import part_resize
from fast_parallel.pipeline.part_resize import (cut_resize_is_exact,
                                                needed_part, resized_part)


def test_a_cut_resize_has_the_whole_resizes_bytes_in_its_part():
    rng = np.random.default_rng(0)
    draw = random.Random(0)
    made = 0
    for case in range(1500):
        height, width = draw.randint(1, 400), draw.randint(1, 400)
        # any ratio, Mosaic's fit to 640 and a 2x downscale (OpenCV's area
        # path), one side kept or both
        ratio = draw.choice(
            [draw.uniform(0.2, 3.0), 640 / max(height, width), 0.5, 1.0])
        size = (max(1, int(width * draw.choice([ratio, 1.0]))),
                max(1, int(height * ratio)))
        img = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        whole = cv2.resize(img, size, interpolation=cv2.INTER_LINEAR)
        part = (draw.randint(1, size[0]), draw.randint(1, size[1]))
        out = resized_part(img, size, part)
        if out is None:
            continue
        made += 1
        cols, rows = part
        assert out.dtype == whole.dtype and out.shape[2] == 3, case
        assert np.array_equal(out[:rows, :cols],
                              whole[:rows, :cols]), (case, (height, width),
                                                     size, part)
    assert made > 1000  # (None only where nothing is cut or OpenCV copies)


def test_where_opencv_would_copy_the_cut_the_whole_is_resized():
    img = np.random.default_rng(1).integers(0, 256, (52, 644, 3), np.uint8)
    # 52 x 644 -> 51 x 640: a 20 x 29 cut rounds to 20 x 29 (a copy)
    assert resized_part(img, (640, 51), (27, 18)) is None
    assert resized_part(img, (640, 51), (400, 40)) is not None


def test_the_part_needed_is_what_the_read_box_covers():
    size = (600, 400)
    paste, crop = (40, 100, 640, 500), (0, 0, 600, 400)
    assert needed_part(None, paste, crop, size) is None
    assert needed_part((0, 0, 2000, 2000), paste, crop, size) is None
    assert needed_part((0, 0, 300, 2000), paste, crop, size) == (260, 400)
    assert needed_part((0, 0, 300, 250), paste, crop, size) == (260, 150)
    # a patch cropped at its top left (pasted at the canvas's edge)
    assert needed_part((0, 0, 300, 250), (0, 0, 500, 300),
                       (100, 100, 600, 400), size) == (400, 350)
    # a box that ends before the paste: one pixel (nothing pasted)
    assert needed_part((0, 0, 30, 50), paste, crop, size) == (1, 1)
    assert needed_part((0, 0, 300.0, 250), paste, crop, size) is None


def test_without_the_rule_on_this_opencv_every_resize_is_whole(monkeypatch):

    class Skewed:  # an OpenCV whose fx / fy resize rounds otherwise
        INTER_LINEAR = cv2.INTER_LINEAR
        ipp = cv2.ipp
        useOptimized = staticmethod(cv2.useOptimized)

        @staticmethod
        def resize(img, size, fx=None, fy=None, interpolation=None):
            if size is None:
                size = (round(img.shape[1] * fx) + 1, round(img.shape[0] * fy))
            return cv2.resize(img, size, interpolation=interpolation)

    monkeypatch.setattr(part_resize, 'cv2', Skewed)
    monkeypatch.setattr(part_resize, '_EXACT', {})
    assert cut_resize_is_exact() is False
    img = np.zeros((100, 100, 3), np.uint8)
    assert resized_part(img, (150, 150), (20, 20)) is None
    monkeypatch.setattr(part_resize, 'cv2', cv2)
    monkeypatch.setattr(part_resize, '_EXACT', {})
    assert cut_resize_is_exact() is True


@pytest.mark.parametrize('backend', ['pillow'])
def test_another_backend_resizes_whole(monkeypatch, backend):
    import mmcv.image.geometric as geometric
    monkeypatch.setattr(geometric, 'imread_backend', backend)
    img = np.zeros((100, 100, 3), np.uint8)
    assert resized_part(img, (150, 150), (20, 20)) is None


def test_ipp_where_it_rounds_otherwise_makes_every_resize_whole():
    """``cv2.ipp.setUseIPP_NotExact(True)`` (per thread) sends 8-bit
    resizes through IPP, whose scale comes from the sizes: the rule is
    checked again under it, fails, and the resize is whole."""
    img = np.random.default_rng(3).integers(0, 256, (480, 512, 3), np.uint8)
    assert resized_part(img, (640, 600), (333, 251)) is not None
    was = cv2.ipp.useIPP_NotExact()
    cv2.ipp.setUseIPP_NotExact(True)
    try:
        out = resized_part(img, (640, 600), (333, 251))
        whole = cv2.resize(img, (640, 600), interpolation=cv2.INTER_LINEAR)
        assert out is None or np.array_equal(out[:251, :333],
                                             whole[:251, :333])
        assert out is None  # (this build: IPP rounds otherwise)
    finally:
        cv2.ipp.setUseIPP_NotExact(was)
    assert resized_part(img, (640, 600), (333, 251)) is not None
