"""Scratch memory for MixUp's temporaries: stock's canvas after any sequence
of calls, and nothing handed on that shares it."""
import copy
import random
import threading
import warnings

import numpy as np
import pytest
from mmdet.datasets.transforms import MixUp

from fast_parallel.pipeline import scratch as scratch_module
from fast_parallel.pipeline.mix_window import padded_canvas
from fast_parallel.pipeline.mixes import FastMixUp
from fast_parallel.pipeline.scratch import scratch


def _stock_canvas(shape, pad_val, image):
    # MixUp's own lines (mmdet 3.3.0)
    out_img = np.ones(shape, dtype=image.dtype) * pad_val
    out_img[:image.shape[0], :image.shape[1]] = image
    return out_img


def test_padded_canvas_is_stocks_after_any_sequence_of_calls():
    rng = np.random.default_rng(0)
    pads = [114.0, 114, 0.5, (114, 0, 255), (1.5, 7, 255.0), 255]
    shapes = [(40, 40, 3), (40, 64, 3), (64, 40, 3), (8, 8, 3)]
    for step in range(600):
        shape = shapes[int(rng.integers(len(shapes)))]
        pad_val = pads[int(rng.integers(len(pads)))]
        h = int(rng.integers(0, shape[0] + 1))
        w = int(rng.integers(0, shape[1] + 1))
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = _stock_canvas(shape, pad_val, image)
        one = np.ones((1, 1, 3), dtype=np.uint8) * pad_val
        got = padded_canvas(shape, one, image)
        assert got.dtype == want.dtype and got.shape == want.shape, step
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), step
        if rng.random() < 0.1:  # a failed call: stock's error, pad redone
            with pytest.raises(ValueError):
                padded_canvas(shape, one,
                              np.zeros((shape[0] + 1, 1, 3), np.uint8))


def test_a_larger_image_raises_stocks_error_and_the_pad_is_redone():
    one = np.ones((1, 1, 3), dtype=np.uint8) * 114.0
    image = np.full((10, 10, 3), 9, np.uint8)
    padded_canvas((12, 12, 3), one, image)
    with pytest.raises(ValueError) as fast:
        padded_canvas((12, 12, 3), one, np.zeros((13, 5, 3), np.uint8))
    with pytest.raises(ValueError) as stock:
        _stock_canvas((12, 12, 3), 114.0, np.zeros((13, 5, 3), np.uint8))
    assert str(fast.value) == str(stock.value)
    small = np.full((2, 2, 3), 5, np.uint8)
    assert np.array_equal(
        padded_canvas((12, 12, 3), one, small),
        _stock_canvas((12, 12, 3), 114.0, small))


def test_each_thread_has_its_own_scratch():
    mine = scratch('canvas', (4, 4, 3), np.float64)
    theirs = []
    thread = threading.Thread(
        target=lambda: theirs.append(scratch('canvas', (4, 4, 3), np.float64)))
    thread.start()
    thread.join()
    assert not np.shares_memory(mine, theirs[0])
    assert np.shares_memory(mine, scratch('canvas', (2, 2, 3), np.float64))


def test_mixup_hands_on_nothing_that_shares_its_scratch():
    rng = np.random.default_rng(1)
    random.seed(1)
    np.random.seed(1)
    stock = MixUp(img_scale=(64, 64), ratio_range=(0.5, 1.6), pad_val=114.0)
    fast = copy.deepcopy(stock)
    fast.__class__ = FastMixUp
    kept = []
    for _ in range(40):
        results = dict(
            img=rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            gt_bboxes=np.array([[1, 1, 30, 30]], np.float32),
            gt_bboxes_labels=np.array([1]),
            gt_ignore_flags=np.array([False]))
        results['mix_results'] = [
            dict(results, img=rng.integers(0, 256, (50, 40, 3), np.uint8))
        ]
        out = fast.transform(results)
        kept.append(out['img'])
    buffers = [
        getattr(scratch_module._LOCAL, name) for name in ('canvas', 'jittered')
    ]
    assert all(not np.shares_memory(img, buf) for img in kept
               for buf in buffers)


def _patch(rng):
    """A Mosaic patch: a 30 x 40 colour image with one box."""
    import torch
    from mmdet.structures.bbox import HorizontalBoxes
    return dict(
        img=rng.integers(0, 256, (30, 40, 3), dtype=np.uint8),
        gt_bboxes=HorizontalBoxes(torch.tensor([[1., 1, 20, 20]])),
        gt_bboxes_labels=np.array([1]),
        gt_ignore_flags=np.array([False]))


def test_the_mosaic_canvas_is_kept_only_for_the_affine_that_reads_it():
    """With the next RandomAffine known (the mixing wrapper sets
    ``_fp_then``), the canvas is this thread's kept array: it only reads it
    and makes a new image. Otherwise each sample gets a new canvas, as
    stock's (a transform of the user's may keep it)."""
    from mmdet.datasets.transforms import Mosaic, RandomAffine

    from fast_parallel.pipeline.mosaic import FastMosaic, mosaic_of
    rng = np.random.default_rng(2)

    def patch():
        return _patch(rng)

    t = copy.deepcopy(Mosaic(img_scale=(40, 40)))
    t.__class__ = FastMosaic
    first = mosaic_of(t, patch(), [patch() for _ in range(3)])['img']
    second = mosaic_of(t, patch(), [patch() for _ in range(3)])['img']
    assert not np.shares_memory(first, second)
    t._fp_then = RandomAffine()
    first = mosaic_of(t, patch(), [patch() for _ in range(3)])['img']
    second = mosaic_of(t, patch(), [patch() for _ in range(3)])['img']
    assert first is second and first.base is None


@pytest.mark.parametrize('pad_val', [(114, 114), 114.5,
                                     (1, 2, 3), 7, 2**70, np.nan])
def test_the_kept_mosaic_canvas_is_filled_as_stocks_new_one(pad_val):
    """Stock's ``np.full``: its values where the affine reads (its warp
    gives stock's bytes), its broadcast, its error and its warning (made an
    error here) before the draws."""
    from mmdet.datasets.transforms import Mosaic, RandomAffine

    from fast_parallel.pipeline.mosaic import FastMosaic
    rng = np.random.default_rng(5)

    def patch():
        return _patch(rng)

    stock = Mosaic(img_scale=(40, 40), pad_val=pad_val)
    fast = copy.deepcopy(stock)
    fast.__class__ = FastMosaic
    affine = fast._fp_then = RandomAffine()
    for _ in range(3):
        results = patch()
        results['mix_results'] = [patch() for _ in range(3)]
        state = np.random.get_state()
        with warnings.catch_warnings():
            warnings.simplefilter('error')  # (NaN's cast warns)
            try:
                want = affine.transform(
                    stock.transform(copy.deepcopy(results)))['img']
            except (ValueError, OverflowError, RuntimeWarning) as error:
                after = np.random.get_state()
                np.random.set_state(state)
                with pytest.raises(type(error)) as fast_error:
                    fast.transform(copy.deepcopy(results))
                assert str(fast_error.value) == str(error)
                fast_after = np.random.get_state()  # (raised before draws)
                assert after[2] == fast_after[2] and np.array_equal(
                    after[1], fast_after[1])
                continue
            np.random.set_state(state)
            got = affine.transform(fast.transform(
                copy.deepcopy(results)))['img']
        assert got.dtype == want.dtype and np.array_equal(got, want)
