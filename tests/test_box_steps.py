"""The fast mixes' box steps in numpy (``box_steps``): the bits of stock's
``HorizontalBoxes`` steps (the Mosaic's deep copies, ``rescale_``,
``translate_``, ``cat``, ``clip_``, ``is_inside`` and pick; MixUp's
``rescale_``, ``clip_``, ``flip_``, ``clone``, ``translate_``, ``cat``,
``is_inside`` and pick) on every value, NaNs, infinities and signed zeros
included, or stock's steps where numpy's min / max may differ."""
import copy

import numpy as np
import pytest
import torch
from mmdet.structures.bbox import HorizontalBoxes
from test_mix_arithmetic import _stock as _stock_moves

from fast_parallel.pipeline import box_steps
from fast_parallel.pipeline.box_steps import (box_array, clean, mixed_boxes,
                                              mosaic_boxes)

_INTS = {torch.float32: torch.int32, torch.float64: torch.int64}
_SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, -1e-45, 1e-45, 3e38]


def _bits(t):
    return t.view(_INTS[t.dtype])


def _values(rng, n, dtype, case):
    """Boxes as users have them (in and around the image), with special
    values in some cases: NaN, infinities, signed zeros, tiny negatives
    (whose product underflows to -0.0), huge, or any bits."""
    values = rng.uniform(-60, 700, (n, 4))
    if case % 4 == 1 and n:
        picks = rng.integers(0, len(_SPECIAL), int(rng.integers(1, 4)))
        for p in picks:
            values[rng.integers(0, n), rng.integers(0, 4)] = _SPECIAL[p]
    tensor = torch.tensor(values, dtype=dtype)
    if case % 9 == 5 and n:
        raw = rng.integers(0, 2**32, (n, 4), dtype=np.uint64)
        tensor = torch.from_numpy(
            raw.astype(np.uint32).view(np.float32).copy()).to(dtype)
    return tensor


def _stock_mosaic(moves, shape, clip_border):
    joined = _stock_moves(moves)
    if clip_border:
        joined.clip_(list(shape))
    keep = joined.is_inside(list(shape)).numpy()
    return joined[keep], keep


def _stock_mixup(boxes, retrieved, ratio, origin, flip, offsets, target,
                 clip_border):
    retrieved = copy.deepcopy(retrieved)
    retrieved.rescale_([ratio, ratio])
    if clip_border:
        retrieved.clip_(list(origin))
    if flip:
        retrieved.flip_(list(origin), direction='horizontal')
    moved = retrieved.clone()
    moved.translate_([-offsets[0], -offsets[1]])
    if clip_border:
        moved.clip_(list(target))
    joined = moved.cat((boxes, moved), dim=0)
    keep = joined.is_inside(list(target)).numpy()
    return retrieved.tensor, joined[keep], keep


def _same_boxes(got, want):
    assert type(got) is HorizontalBoxes
    assert got.tensor.dtype == want.tensor.dtype
    assert got.tensor.shape == want.tensor.shape
    assert got.tensor.stride() == want.tensor.stride()
    assert torch.equal(_bits(got.tensor), _bits(want.tensor))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_the_mosaics_box_steps_are_stocks_bits(dtype):
    rng = np.random.default_rng(3)
    taken = 0
    for case in range(600):
        moves = []
        for _ in range(4):
            boxes = HorizontalBoxes(
                _values(rng, int(rng.integers(0, 7)), dtype, case))
            moves.append(
                (boxes, float(rng.uniform(0.05, 3)),
                 int(rng.integers(-700, 700)), int(rng.integers(-700, 700))))
        shape = (int(rng.choice([0, 1, 64,
                                 1280])), int(rng.choice([0, 1, 96, 1280])))
        clip_border = bool(case % 3)
        before = [_bits(m[0].tensor).clone() for m in moves]
        got = mosaic_boxes(moves, shape, clip_border)
        want, keep = _stock_mosaic(moves, shape, clip_border)
        for m, b in zip(moves, before):  # the patches' boxes untouched
            assert torch.equal(_bits(m[0].tensor), b)
        if got is None:  # only where a min / max may differ
            assert clip_border and case % 4 in (1, ) or case % 9 == 5, case
            continue
        taken += 1
        _same_boxes(got[0], want)
        assert got[1].dtype == np.bool_ and np.array_equal(got[1], keep)
    assert taken > 400


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_mixups_box_steps_are_stocks_bits(dtype):
    rng = np.random.default_rng(4)
    taken = 0
    for case in range(900):
        boxes = HorizontalBoxes(
            _values(rng, int(rng.integers(0, 6)), dtype, case))
        retrieved = HorizontalBoxes(
            _values(rng, int(rng.integers(1, 6)), dtype, case // 2))
        ratio = float(rng.uniform(0.05, 3)) if case % 5 else float(
            rng.choice([1.0, 1e-30, 0.5, 2.0]))
        origin = (int(rng.choice([1, 64, 640,
                                  900])), int(rng.choice([1, 96, 640, 1024])))
        target = (int(rng.choice([1, 64, 640])), int(rng.choice([1, 96, 640])))
        offsets = (int(rng.integers(0, 400)), int(rng.integers(0, 400)))
        flip, clip_border = bool(case % 2), bool(case % 3)
        before = [_bits(b.tensor).clone() for b in (boxes, retrieved)]
        got = mixed_boxes(boxes, retrieved, ratio, origin, flip, offsets,
                          target, clip_border)
        moved, want, keep = _stock_mixup(boxes, retrieved, ratio, origin, flip,
                                         offsets, target, clip_border)
        for b, kept in zip((boxes, retrieved), before):  # read only
            assert torch.equal(_bits(b.tensor), kept)
        if got is None:  # only where a min / max may differ
            with np.errstate(all='ignore'):
                assert not clean((retrieved.tensor * ratio).numpy()), case
            continue
        taken += 1
        assert got[0].dtype == retrieved.tensor.numpy().dtype
        assert torch.equal(_bits(torch.from_numpy(got[0])), _bits(moved))
        _same_boxes(got[1], want)
        assert got[2].dtype == np.bool_ and np.array_equal(got[2], keep)
    assert taken > 600


def test_a_negative_zero_takes_stocks_clip():
    """torch's ``clamp`` keeps a negative zero where numpy's ``clip`` makes
    it positive: such boxes (a NaN too) go to stock's steps."""
    boxes = HorizontalBoxes(torch.tensor([[-0.0, 5.0, 9.0, 7.0]]))
    stock = copy.deepcopy(boxes)
    stock.clip_([10, 10])
    assert torch.signbit(stock.tensor[0, 0])  # (what a blind clip breaks)
    assert not clean(boxes.tensor.numpy())
    assert not clean(np.array([[np.nan, 1, 2, 3]], np.float32))
    assert clean(np.array([[0.0, -1, np.inf, -np.inf]], np.float32))
    assert not clean(np.array([[0.0, -0.0, 1, 2]], np.float64))
    empty = HorizontalBoxes(torch.zeros(0, 4))
    assert mixed_boxes(empty, boxes, 2.0, (9, 9), False, (0, 0), (9, 9),
                       True) is None
    # (checked once, before the steps, with or without the clip)
    assert mixed_boxes(empty, boxes, 2.0, (9, 9), False, (0, 0), (9, 9),
                       False) is None
    # the Mosaic's sum with an int makes any zero positive; without the
    # clip its steps are IEEE arithmetic and comparisons alone
    moves = [(boxes, 1.0, 0, 0)] * 4
    got = mosaic_boxes(moves, (10, 10), False)
    _same_boxes(got[0], _stock_mosaic(moves, (10, 10), False)[0])


def test_what_numpy_cannot_match_goes_to_stocks_steps():
    f32 = HorizontalBoxes(torch.rand(3, 4) * 100)
    assert box_array(f32) is not None

    class MyBoxes(HorizontalBoxes):
        pass

    others = [
        HorizontalBoxes(torch.rand(3, 4).half()),
        HorizontalBoxes(torch.rand(3, 4).bfloat16()),
        MyBoxes(torch.rand(3, 4)),
        HorizontalBoxes(torch.rand(3, 4).requires_grad_()),
        np.zeros((3, 4), np.float32),
    ]
    neg = HorizontalBoxes(torch.rand(3, 4))
    neg.tensor = neg.tensor._neg_view()  # (its numpy() would raise)
    others.append(neg)
    for other in others:
        assert box_array(other) is None
        assert mixed_boxes(f32, other, 1.5, (9, 9), True, (1, 1), (9, 9),
                           True) is None
        assert mixed_boxes(other, f32, 1.5, (9, 9), True, (1, 1), (9, 9),
                           True) is None
        assert mosaic_boxes([(f32, 1.0, 0, 0), (other, 1.0, 0, 0)], (9, 9),
                            True) is None
    f64 = HorizontalBoxes(torch.rand(3, 4, dtype=torch.float64))
    # torch.cat promotes float32 with float64: stock's steps
    assert mixed_boxes(f32, f64, 1.5, (9, 9), True, (1, 1), (9, 9),
                       True) is None
    assert mosaic_boxes([(f32, 1.0, 0, 0), (f64, 1.0, 0, 0)], (9, 9),
                        True) is None
    far = box_steps.EXACT_INT + 1  # (float32 rounds it)
    for bad in [
            dict(origin=(far, 9)),
            dict(offsets=(far, 0)),
            dict(target=(9, np.int64(9))),
            dict(target=(9, 9.0)),
            dict(target=(-1, 9)),
            dict(ratio=np.float32(1.5)),
            dict(ratio=float('nan')),
            dict(ratio=1e39)
    ]:
        args = dict(ratio=1.5, origin=(9, 9), offsets=(1, 1), target=(9, 9))
        args.update(bad)
        assert mixed_boxes(f32, f32, args['ratio'], args['origin'], True,
                           args['offsets'], args['target'], True) is None
    for moves, shape in [([(f32, 1.0, far, 0)], (9, 9)),
                         ([(f32, 1, 0, 0)], (9, 9)),
                         ([(f32, 1.0, 0, 0)], (far, 9))]:
        assert mosaic_boxes(moves, shape, True) is None


def test_huge_boxes_warn_of_nothing_as_torchs_steps():
    """An overflow to infinity in numpy warns (an error under
    ``-W error``); torch's steps do not, so neither may these."""
    huge = HorizontalBoxes(torch.full((2, 4), 3e38))
    other = copy.deepcopy(huge)  # (one object for both: stock's steps)
    with np.errstate(all='raise'):
        got = mixed_boxes(other, huge, 3.0, (9, 9), True, (1, 1), (9, 9),
                          False)
        moved = mosaic_boxes([(huge, 3.0, 5, 5)] * 4, (9, 9), False)
    want = _stock_mixup(other, huge, 3.0, (9, 9), True, (1, 1), (9, 9), False)
    _same_boxes(got[1], want[1])
    _same_boxes(moved[0],
                _stock_mosaic([(huge, 3.0, 5, 5)] * 4, (9, 9), False)[0])


def _sample(rng, n, dtype, case):
    h, w = (int(v) for v in rng.integers(20, 90, 2))
    return dict(
        img=rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
        img_shape=(h, w),
        gt_bboxes=HorizontalBoxes(_values(rng, n, dtype, case) / 8),
        gt_bboxes_labels=rng.integers(0, 80, n).astype(np.int64),
        gt_ignore_flags=rng.random(n) < 0.2)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_the_fast_mixes_give_stocks_boxes_either_way(dtype, monkeypatch):
    """Through the transforms: the numpy steps, and stock's steps where the
    boxes hold a NaN or a negative zero, give stock's samples and draws."""
    from mmdet.datasets.transforms import CachedMixUp, MixUp, Mosaic

    from fast_parallel.pipeline import cached_mixes, mixes, mosaic
    from fast_parallel.pipeline.cached_mixes import FastCachedMixUp
    from fast_parallel.pipeline.mixes import FastMixUp
    from fast_parallel.pipeline.mosaic import FastMosaic
    from tests.transform_utils import assert_same_run
    ways = {}

    def tallied(module, name):
        steps = getattr(module, name)

        def run(*args):
            got = steps(*args)
            key = (module.__name__, got is None)
            ways[key] = ways.get(key, 0) + 1
            return got

        monkeypatch.setattr(module, name, run)

    tallied(mixes, 'mixed_boxes')
    tallied(cached_mixes, 'mixed_boxes')
    tallied(mosaic, 'mosaic_boxes')
    rng = np.random.default_rng(5)
    np.random.seed(5)  # (the transforms' own draws)
    pairs = []
    for stock, fast_class in ((MixUp(img_scale=(64, 48)), FastMixUp),
                              (Mosaic(img_scale=(48, 64)), FastMosaic)):
        fast = copy.deepcopy(stock)
        fast.__class__ = fast_class
        pairs.append((stock, fast))
    stock_cached = CachedMixUp(
        img_scale=(64, 48), prob=1.0, max_cached_images=4)
    fast_cached = copy.deepcopy(stock_cached)
    fast_cached.__class__ = FastCachedMixUp
    for case in range(90):
        results = _sample(rng, int(rng.integers(0, 5)), dtype, case)
        results['mix_results'] = [
            _sample(rng, int(rng.integers(1, 5)), dtype, case + k)
            for k in range(3)
        ]
        mixup, mosaic_pair = pairs
        assert_same_run(*mixup,
                        dict(results, mix_results=results['mix_results'][:1]))
        assert_same_run(*mosaic_pair, results)
        results.pop('mix_results')
        # (each cache takes the sample: they fill and pick alike)
        assert assert_same_run(stock_cached, fast_cached, results)[0] == 'ok'
    for module in (mixes, cached_mixes, mosaic):  # both ways, each
        assert ways.get((module.__name__, True), 0) >= 2, ways
        assert ways.get((module.__name__, False), 0) >= 10, ways


def _pair(stock):
    from fast_parallel.pipeline.cached_mixes import FastCachedMixUp
    from fast_parallel.pipeline.mixes import FastMixUp
    fast = copy.deepcopy(stock)
    fast.__class__ = {
        'MixUp': FastMixUp,
        'CachedMixUp': FastCachedMixUp
    }[type(stock).__name__]
    return stock, fast


def _run_kept(transform, results, seed):
    """(output or error text, the mix result's boxes after the call)."""
    results = copy.deepcopy(results)
    np.random.seed(seed)
    try:
        out = transform(results)
    except Exception as error:
        out = f'{type(error).__name__}: {error}'
    mix = results.get('mix_results', [{}])[0].get('gt_bboxes')
    return out, mix


@pytest.mark.parametrize('clip_border', [True, False])
def test_mixup_on_shared_odd_and_missing_boxes_as_stock(clip_border):
    """One boxes object for the sample and its mix result; a mix result's
    tensor of odd strides (left as stock leaves it: its strides, memory
    torch can resize); a sample without boxes (stock's error, after stock
    has moved the mix result's boxes), or without labels too."""
    from mmdet.datasets.transforms import MixUp

    from fast_parallel.bench.pipeline import first_difference
    from tests.transform_utils import assert_same_run
    rng = np.random.default_rng(6)
    stock, fast = _pair(
        MixUp(img_scale=(64, 48), bbox_clip_border=clip_border))
    for case in range(24):
        results = _sample(rng, 3, torch.float32, 0)
        mix = _sample(rng, 3, torch.float32, 0)
        if case % 3 == 0:
            mix['gt_bboxes'] = results['gt_bboxes']
        elif case % 3 == 1:  # (4, n) transposed, or one row of strides 1
            rows = int(rng.integers(1, 3))
            mix['gt_bboxes'] = HorizontalBoxes(torch.zeros(0, 4))
            mix['gt_bboxes'].tensor = (torch.rand(4, rows) * 40).t()
            mix['gt_bboxes_labels'] = mix['gt_bboxes_labels'][:rows]
            mix['gt_ignore_flags'] = mix['gt_ignore_flags'][:rows]
        results['mix_results'] = [mix]
        assert assert_same_run(stock, fast, results)[0] == 'ok'
        if case % 3 == 1:
            np.random.seed(case)
            got = fast(copy.deepcopy(results))
            np.random.seed(case)
            want = stock(copy.deepcopy(results))
            got_t = got['mix_results'][0]['gt_bboxes'].tensor
            want_t = want['mix_results'][0]['gt_bboxes'].tensor
            assert got_t.stride() == want_t.stride()
            got_t.resize_(7, 4)  # (stock's can be resized: so can this)
            want_t.resize_(7, 4)
            got['gt_bboxes'].tensor.resize_(9, 4)  # (the kept boxes too)
    for missing in (['gt_bboxes'], ['gt_bboxes', 'gt_bboxes_labels']):
        results = _sample(rng, 3, torch.float32, 0)
        mix = _sample(rng, 4, torch.float32, 0)
        results['mix_results'] = [mix]
        for key in missing:
            (results if key == 'gt_bboxes' else mix).pop(key)
        (s_out, s_mix), (f_out, f_mix) = (
            _run_kept(t, results, 1) for t in (stock, fast))
        assert isinstance(s_out, str) and s_out == f_out
        assert first_difference(s_mix, f_mix) is None


def test_cached_mixup_without_boxes_raises_stocks_error_first():
    """A sample with masks and no boxes, a picked entry without masks:
    stock's ``KeyError`` names the masks (read before the boxes)."""
    from mmdet.datasets.transforms import CachedMixUp
    rng = np.random.default_rng(8)
    stock, fast = _pair(
        CachedMixUp(
            img_scale=(64, 48),
            prob=1.0,
            max_cached_images=3,
            random_pop=False))
    for transform in (stock, fast):
        for _ in range(2):
            transform(_sample(rng, 3, torch.float32, 0))
    results = _sample(rng, 3, torch.float32, 0)
    results.pop('gt_bboxes')
    results['gt_masks'] = None
    outs = [_run_kept(t, results, 2)[0] for t in (stock, fast)]
    assert outs[0] == outs[1] and outs[0].startswith('KeyError')
