"""The fast mixes' arithmetic: the Mosaic moves all patches' boxes in one
``cat``, multiply and add (``mosaic.moved_boxes``), the bits of stock's
per-patch deep copy, ``rescale_``, ``translate_`` and ``cat`` for every
dtype and value; MixUp's halves are mixed in ``uint8`` (``mix_halves``)."""
import copy

import numpy as np
import pytest
import torch
from mmdet.structures.bbox import HorizontalBoxes

from fast_parallel.pipeline.mixes import mix_halves, rescale
from fast_parallel.pipeline.mosaic import batchable, moved_boxes


def _stock(moves):
    moved = []
    for boxes, scale, padw, padh in moves:
        boxes = copy.deepcopy(boxes)
        boxes.rescale_([scale, scale])
        boxes.translate_([padw, padh])
        moved.append(boxes)
    return moved[0].cat(moved, 0)


def _bits(t):
    return t.view({
        torch.float32: torch.int32,
        torch.float64: torch.int64
    }[t.dtype])


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_moved_boxes_are_stocks_bits(dtype):
    rng = np.random.default_rng(0)
    for case in range(200):
        moves = []
        for _ in range(4):
            n = int(rng.integers(0, 6))
            values = rng.normal(0, 10**rng.integers(0, 5), (n, 4))
            if case % 7 == 0 and n:
                values[0, int(rng.integers(0, 4))] = rng.choice(
                    [np.nan, np.inf, -np.inf, -0.0])
            boxes = HorizontalBoxes(torch.tensor(values, dtype=dtype))
            # (pads past 2**24, not exact in float32: torch's own path)
            far = 2**25 + 1 if case % 11 == 0 else 0
            moves.append((boxes, float(rng.uniform(0.01, 9)),
                          int(rng.integers(-900, 900)) + far,
                          int(rng.integers(-900, 900))))
        assert batchable([m[0] for m in moves])
        before = [_bits(m[0].tensor).clone() for m in moves]
        got, want = moved_boxes(moves), _stock(moves)
        assert type(got) is HorizontalBoxes
        assert got.tensor.dtype == want.tensor.dtype
        assert got.tensor.shape == want.tensor.shape
        assert got.tensor.stride() == want.tensor.stride()
        assert torch.equal(_bits(got.tensor), _bits(want.tensor)), case
        for m, b in zip(moves, before):  # the patches' boxes untouched
            assert torch.equal(_bits(m[0].tensor), b)


def test_only_boxes_whose_moves_cannot_fail_are_batched():
    """Any other boxes are moved patch by patch where stock moves them, so
    that an error comes where stock's does."""
    f32 = HorizontalBoxes(torch.rand(2, 4))
    assert batchable([f32, f32.clone()])
    for other in [
            HorizontalBoxes(torch.rand(2, 4, dtype=torch.float64)),
            HorizontalBoxes(torch.rand(2, 4).half()),
            np.zeros((2, 4), np.float32), None
    ]:
        assert not batchable([f32, other])
    assert not batchable([HorizontalBoxes(torch.rand(2, 4).bfloat16())] * 2)


@pytest.mark.parametrize('opencv', [True, False])
def test_mix_halves_is_stocks_float32_mix_for_every_pair_and_layout(
        monkeypatch, opencv):
    from fast_parallel.pipeline import mixes
    from fast_parallel.pipeline.part_resize import opencv_setting
    monkeypatch.setattr(mixes, '_FLOOR_MEAN',
                        {} if opencv else {opencv_setting(): False})
    if opencv:  # (this OpenCV passes the check: its one pass is taken)
        assert mixes._weighted_is_floor_mean()
    values = np.arange(256, dtype=np.uint8)
    a, b = np.meshgrid(values, values)
    a = np.repeat(a[..., None], 3, 2)  # every pair, 3 channels
    b = np.repeat(b[..., None], 3, 2)
    for ori, crop in [(a, b), (a, b[:, 1::2]), (a[::-1], b),
                      (np.asfortranarray(a), b[:, ::-1]),
                      (a[:, ::2], b[:, 1::2]), (a, np.asfortranarray(b)),
                      (a, b[::-1])]:
        ori, crop = ori[:, :crop.shape[1]], crop[:, :ori.shape[1]]
        want = (0.5 * ori.astype(np.float32) +
                0.5 * crop.astype(np.float32)).astype(np.uint8)
        got = mix_halves(ori, crop)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.strides == want.strides
        assert np.array_equal(got, want)


def test_the_one_pass_mix_is_checked_for_each_opencv_setting(monkeypatch):
    """A check's verdict holds for the OpenCV setting it ran under only: a
    failed check under one setting leaves another to its own check."""
    import cv2

    from fast_parallel.pipeline import mixes
    from fast_parallel.pipeline.part_resize import opencv_setting
    monkeypatch.setattr(mixes, '_FLOOR_MEAN', {opencv_setting(): False})
    assert not mixes._weighted_is_floor_mean()
    optimized = cv2.useOptimized()
    try:
        cv2.setUseOptimized(not optimized)
        assert mixes._weighted_is_floor_mean()  # (its own check: passes)
        assert len(mixes._FLOOR_MEAN) == 2
    finally:
        cv2.setUseOptimized(optimized)
    assert not mixes._weighted_is_floor_mean()


def test_every_colour_has_a_hue_below_180_so_zero_gains_change_nothing():
    """The fast HSV leaves out the table where it maps every value OpenCV
    gives to itself: H is 0..179 for all 2^24 colours."""
    import cv2
    from mmdet.datasets.transforms import YOLOXHSVRandomAug

    from fast_parallel.pipeline.colour import FastYOLOXHSVRandomAug
    v = np.arange(1 << 24, dtype=np.uint32)
    every = np.stack([(v >> 16) & 255, (v >> 8) & 255, v & 255],
                     -1).astype(np.uint8).reshape(4096, 4096, 3)
    optimized = cv2.useOptimized()
    try:  # (one pixel a row: OpenCV's scalar code; optimizations off too)
        for use in (True, False):
            cv2.setUseOptimized(use)
            for shape in ((4096, 4096, 3), (1 << 24, 1, 3)):
                hsv = cv2.cvtColor(every.reshape(shape), cv2.COLOR_BGR2HSV)
                assert hsv[..., 0].max() == 179, (use, shape)
    finally:
        cv2.setUseOptimized(optimized)
    stock = YOLOXHSVRandomAug(0, 0, 0)  # every gain 0
    fast = copy.deepcopy(stock)
    fast.__class__ = FastYOLOXHSVRandomAug
    want = stock.transform(dict(img=every.copy()))['img']
    assert np.array_equal(fast.transform(dict(img=every.copy()))['img'], want)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.half])
def test_rescale_is_stocks_rescale_for_every_value(dtype):
    """MixUp's ``rescale_([r, r])`` as one multiply by ``r``: the bits of
    stock's for any boxes (NaN, infinities, signed zeros, tiny, huge) and
    any ratio; a NaN ratio or another dtype takes stock's own call."""
    rng = np.random.default_rng(1)
    ints = {
        torch.float32: torch.int32,
        torch.float64: torch.int64,
        torch.half: torch.int16
    }[dtype]
    ratios = [
        1.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.5e38, 1e300, 1e-310,
        0.7, 1.3
    ]
    for case in range(1500):
        n = int(rng.integers(0, 12))
        raw = rng.integers(
            0, 2**32, (n, 4),
            dtype=np.uint64).astype(np.uint32).view(np.float32)
        values = raw if case % 2 else rng.normal(0, 10.0**rng.integers(
            -40, 38), (n, 4)).astype(np.float32)
        values[np.abs(values) < 1e-3] *= -1
        tensor = torch.from_numpy(values.copy()).to(dtype)
        ratio = ratios[case % len(ratios)] if case % 3 else float(
            rng.uniform(0.1, 4))
        fast, stock = HorizontalBoxes(tensor), HorizontalBoxes(tensor)
        before, kept = fast.tensor, fast.tensor.clone()
        rescale(fast, float(ratio))
        stock.rescale_([float(ratio), float(ratio)])
        assert fast.tensor.dtype == stock.tensor.dtype
        assert fast.tensor.stride() == stock.tensor.stride()
        assert torch.equal(fast.tensor.view(ints), stock.tensor.view(ints))
        # a new tensor, as stock's: the old one is left as it was
        assert fast.tensor is not before
        assert torch.equal(before.view(ints), kept.view(ints))


def test_moved_boxes_with_a_scale_torch_refuses_raise_torchs_error():
    boxes = HorizontalBoxes(torch.ones(2, 4))
    for scale in (None, '0.5'):
        with pytest.raises((TypeError, ValueError)) as fast:
            moved_boxes([(boxes, scale, 3, 4)] * 4)
        with pytest.raises((TypeError, ValueError)) as stock:
            _stock([(boxes, scale, 3, 4)] * 4)
        assert type(fast.value) is type(stock.value)


def test_the_hsv_shift_is_looked_up_on_the_planes_it_moves():
    """The fast HSV looks each channel's table up on its own plane, only
    where it moves a value: stock's bytes and draws for every set of moving
    channels (a channel moves nothing where its gain is drawn 0)."""
    import cv2
    from mmdet.datasets.transforms import YOLOXHSVRandomAug

    from fast_parallel.pipeline.colour import (FastYOLOXHSVRandomAug, _shifted,
                                               hsv_table, shift)
    rng = np.random.default_rng(4)
    image = rng.integers(0, 256, (512, 384, 3), dtype=np.uint8)
    image[0, :256] = np.arange(256, dtype=np.uint8)[:, None]  # every value
    seen = set()
    for moving in range(8):
        deltas = [170 if moving >> c & 1 else 0 for c in range(3)]
        stock = YOLOXHSVRandomAug(*deltas)
        fast = copy.deepcopy(stock)
        fast.__class__ = FastYOLOXHSVRandomAug
        for seed in range(40):
            np.random.seed(seed)
            gains = stock._get_hsv_gains()
            channels = _shifted(hsv_table(gains))
            seen.add(tuple(channels))
            np.random.seed(seed)
            want = stock.transform(dict(img=image.copy()))['img']
            state = np.random.get_state()
            np.random.seed(seed)
            got = fast.transform(dict(img=image.copy()))['img']
            after = np.random.get_state()  # (key and position both)
            assert np.array_equal(after[1], state[1]) and \
                after[2:] == state[2:]
            assert got.dtype == want.dtype and np.array_equal(got, want)
    assert len(seen) == 8  # every set of channels, none to all three
    # the lookup alone, on random tables: cv2.LUT's bytes
    hsv = cv2.cvtColor(image, cv2.COLOR_BGR2HSV)
    for _ in range(20):
        table = rng.integers(0, 256, (256, 1, 3), dtype=np.uint8)
        table[:, 0, rng.random(3) < 0.5] = np.arange(256)[:, None]
        got = shift(hsv, table)
        assert got.flags.c_contiguous and np.array_equal(
            got, cv2.LUT(hsv, table))
