"""Mosaic patches that RandomAffine never reads are not decoded
(``fast_parallel.pipeline.unread``): the warp's read box, the shape memo,
and stock's samples and draws through the mixing wrapper."""
import copy
import multiprocessing
import os
import time

import cv2
import numpy as np
import pytest
import torch
from mmdet.datasets.transforms import RandomAffine
from mmdet.structures.bbox import HorizontalBoxes
from mmdet.utils import register_all_modules
from transform_utils import (compare_mix_datasets, run_both, same_states,
                             set_states)

from fast_parallel.bench.pipeline import first_difference
from fast_parallel.bench.presets import load_preset
from fast_parallel.pipeline import COUNTS
from fast_parallel.pipeline.unread import (DeferredImage, ShapeMemo,
                                           affine_reads)

register_all_modules()

AFFINES = [
    dict(scaling_ratio_range=(0.1, 2), border=(-320, -320)),  # YOLOX-s
    dict(),  # mmdet's defaults
    dict(
        max_rotate_degree=180,
        max_shear_degree=30,
        max_translate_ratio=0.5,
        scaling_ratio_range=(0.05, 4),
        border=(-40, 25)),
]


@pytest.mark.parametrize('kwargs', AFFINES)
def test_the_read_box_holds_every_pixel_the_warp_reads(kwargs):
    """Pixels outside the box, changed at random, change no output byte;
    the peek leaves the draws to the warp's own call."""
    from fast_parallel.pipeline import rng_state
    affine = RandomAffine(**kwargs)
    rng = np.random.default_rng(0)
    np.random.seed(1)
    # (this numpy takes the memory copy)
    assert type(rng_state.save_numpy_state()).__name__ == '_SavedMemory'
    shapes = [(1280, 1280, 3), (720, 900, 3), (661, 1000, 3)]
    narrowed = 0
    for k in range(60):
        shape = shapes[k % len(shapes)]
        canvas = rng.integers(0, 256, shape, np.uint8)
        if k % 2:  # (a Gaussian kept by numpy's legacy state, or none)
            np.random.standard_normal()
        before = np.random.get_state()
        box = affine_reads(affine, shape)
        assert box is not None
        after = np.random.get_state()
        assert np.array_equal(before[1], after[1]) and before[2:] == after[2:]
        height = shape[0] + affine.border[1] * 2
        width = shape[1] + affine.border[0] * 2
        matrix = affine._get_random_homography_matrix(height, width)
        out = cv2.warpPerspective(
            canvas, matrix, (width, height), borderValue=affine.border_val)
        x0, y0, x1, y1 = box
        inside = np.zeros(shape[:2], bool)
        inside[max(y0, 0):max(y1, 0), max(x0, 0):max(x1, 0)] = True
        narrowed += inside.mean() < 0.75
        garbled = rng.integers(0, 256, shape, np.uint8)
        garbled[inside] = canvas[inside]
        again = cv2.warpPerspective(
            garbled, matrix, (width, height), borderValue=affine.border_val)
        assert np.array_equal(out, again), (k, box, matrix)
    assert narrowed > 0  # the box leaves some of the canvas out


@pytest.mark.parametrize('why', ['numpy < 1.25', 'another state layout'])
def test_the_peek_puts_numpys_state_back_the_slow_way(monkeypatch, why):
    """Without ``get_bit_generator``, or where copying the state's memory
    was found not to restore it, the peek uses get_state / set_state."""
    from fast_parallel.pipeline import rng_state
    assert rng_state.copies_state() is True  # (this numpy)
    affine = RandomAffine()
    np.random.seed(4)
    np.random.standard_normal()
    before = np.random.get_state()
    if why == 'numpy < 1.25':
        monkeypatch.delattr(np.random, 'get_bit_generator')
    else:
        monkeypatch.setattr(rng_state, '_COPIES_STATE', False)
    assert type(rng_state.save_numpy_state()) is tuple  # (get_state)
    assert affine_reads(affine, (1280, 1280, 3)) is not None
    after = np.random.get_state()
    assert np.array_equal(before[1], after[1]) and before[2:] == after[2:]


@pytest.mark.parametrize('scale', [1e-46, 1e-5])
def test_no_box_where_the_warp_reads_from_nowhere_or_afar(scale):
    """A singular matrix (a scale float32 rounds to 0), or one whose output
    corners map past 10^6 canvas pixels (a warp that rounds its matrix to
    float32 could stray past the margin there): no box, so every patch is
    decoded; the draws are put back."""
    affine = RandomAffine(scaling_ratio_range=(scale, scale))
    state = np.random.get_state()
    assert affine_reads(affine, (1280, 1280, 3)) is None
    assert np.array_equal(state[1], np.random.get_state()[1])
    # (at scale 0.01 the corners map within 10^6 pixels: a box)
    wide = RandomAffine(scaling_ratio_range=(0.01, 0.01))
    assert affine_reads(wide, (1280, 1280, 3)) is not None


def test_no_box_where_the_output_is_empty():
    affine = RandomAffine(border=(-700, -700))
    state = np.random.get_state()
    assert affine_reads(affine, (1280, 1280, 3)) is None
    assert np.array_equal(state[1], np.random.get_state()[1])


def _results(path, index):
    return dict(img_path=str(path), sample_idx=index)


def test_the_shape_memo_follows_the_file(tmp_path):
    path = tmp_path / 'a.jpg'
    img = np.zeros((20, 30, 3), np.uint8)
    assert cv2.imwrite(str(path), img)
    memo = ShapeMemo(4)
    results = dict(_results(path, 2), img=img)
    assert memo.kept(results) is None
    memo.record(results, os.stat(path))
    assert memo.kept(_results(path, 2)) == ((20, 30, 3), np.uint8)
    assert memo.kept_colour(_results(path, 2)) == ((20, 30, 3), np.uint8)
    # another sample, another path at the same index, an index out of range
    assert memo.kept(_results(path, 1)) is None
    assert memo.kept(_results(tmp_path / 'b.jpg', 2)) is None
    assert memo.kept(_results(path, 4)) is None
    # a file written again (new mtime) is decoded again
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1000))
    assert memo.kept(_results(path, 2)) is None
    # a pathlib.Path (mmcv takes one) is the same file; a chmod (new
    # ctime: the file may be unreadable now) decodes again
    memo.record(dict(_results(path, 0), img=img), os.stat(path))
    assert memo.kept(dict(img_path=path,
                          sample_idx=0)) == ((20, 30, 3), np.uint8)
    memo.record(dict(img_path=path, sample_idx=1, img=img), os.stat(path))
    assert memo.kept(_results(path, 1)) == ((20, 30, 3), np.uint8)
    ctime = os.stat(path).st_ctime_ns
    for k in range(500):  # (until the kernel's ctime clock has ticked)
        os.chmod(path, 0o600 if k % 2 == 0 else 0o644)
        if os.stat(path).st_ctime_ns != ctime:
            break
        time.sleep(0.002)
    assert os.stat(path).st_ctime_ns != ctime
    assert memo.kept(_results(path, 0)) is None
    assert memo.kept(dict(img_path=None, sample_idx=0)) is None
    # a grayscale image is kept, but never left undecoded
    gray = dict(_results(path, 3), img=np.zeros((5, 5), np.uint8))
    memo.record(gray, os.stat(path))
    assert memo.kept(_results(path, 3)) == ((5, 5), np.uint8)
    assert memo.kept_colour(_results(path, 3)) is None


def _record_in_child(memo, path):
    img = np.zeros((7, 9, 3), np.uint8)
    memo.record(dict(_results(path, 0), img=img), os.stat(path))


def test_workers_share_one_memo(tmp_path):
    path = tmp_path / 'a.png'
    assert cv2.imwrite(str(path), np.zeros((7, 9, 3), np.uint8))
    memo = ShapeMemo(1)
    child = multiprocessing.get_context('fork').Process(
        target=_record_in_child, args=(memo, path))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert memo.kept(_results(path, 0)) == ((7, 9, 3), np.uint8)
    assert copy.deepcopy(memo) is memo


def test_a_decode_that_changed_says_which_file(tmp_path):
    from fast_parallel.pipeline.cache import FastLoadImageFromFile
    path = tmp_path / 'a.png'
    assert cv2.imwrite(str(path), np.zeros((7, 9, 3), np.uint8))
    load = FastLoadImageFromFile()
    assert DeferredImage(load, str(path), (7, 9, 3),
                         np.dtype(np.uint8)).decoded().shape == (7, 9, 3)
    with pytest.raises(RuntimeError, match='a.png: decoded as'):
        DeferredImage(load, str(path), (9, 7, 3), np.dtype(np.uint8)).decoded()


def _dataset_cfg(data, mosaic_prob=1.0, between=None):
    cfg = copy.deepcopy(load_preset('yolox_s', data).train_dataloader.dataset)
    cfg.pipeline[0]['prob'] = mosaic_prob
    if between is not None:
        cfg.pipeline.insert(1, between)
    return cfg


def _compare(cfg, samples, cache_inputs=None, skip=None):
    """Stock and fast samples and draws (``transform_utils``), the fast
    memo warmed by one load of every image first."""
    return compare_mix_datasets(
        cfg, samples, skip, cache_inputs=cache_inputs, warm=True)


@pytest.mark.parametrize('cache_inputs', [None, 'auto'])
def test_unread_patches_are_not_decoded_and_samples_are_stock(
        sample_data, cache_inputs):
    outcome = _compare(_dataset_cfg(sample_data), 60, cache_inputs)
    assert 'Mosaic decodes only the patches RandomAffine reads' in str(outcome)
    assert COUNTS['deferred decodes'] == 4 * 60  # every patch was known
    assert COUNTS['deferred decodes: never read'] > 10
    assert COUNTS['deferred decodes: never read'] + COUNTS[
        'deferred decodes: decoded'] == 4 * 60


def test_a_mosaic_drawn_off_hands_on_the_decoded_image(sample_data):
    _compare(_dataset_cfg(sample_data, mosaic_prob=0.5), 30)
    assert 0 < COUNTS['deferred decodes: decoded'] < 4 * 30
    assert COUNTS['deferred decodes: never read'] > 0


@pytest.mark.parametrize('case', ['between', 'skip'])
def test_nothing_is_left_undecoded_unless_random_affine_comes_next(
        sample_data, case):
    if case == 'between':
        cfg = _dataset_cfg(
            sample_data, between=dict(type='RandomFlip', prob=0.5))
        _compare(cfg, 12)
    else:
        _compare(_dataset_cfg(sample_data), 12, skip=['RandomAffine'])
    assert COUNTS['deferred decodes'] == 0
    assert COUNTS['samples'] == 12


CASES = {
    'plain': dict(),
    'float img_scale': dict(img_scale=(640., 640.)),
    'centre 1.5-2.5': dict(center_ratio_range=(1.5, 2.5)),
    'centre -0.5-0.5': dict(center_ratio_range=(-0.5, 0.5)),
    'centre 2.1-3.0': dict(center_ratio_range=(2.1, 3.0)),
    'numpy boxes, a gray patch': dict(),
    'numpy boxes, no flags': dict(),
}


@pytest.mark.parametrize('case', list(CASES))
def test_undecoded_patches_keep_stocks_samples_and_errors(tmp_path, case):
    """Mosaic then RandomAffine on the same patches, stock with decoded
    images, fast with undecoded ones: the same outputs, errors (type,
    message, and so which patch raised first) and random states."""
    from mmdet.datasets.transforms import Mosaic

    from fast_parallel.pipeline.cache import FastLoadImageFromFile
    from fast_parallel.pipeline.mosaic import FastMosaic
    rng = np.random.default_rng(0)
    files = []
    for k in range(6):
        path = tmp_path / f'{k}.png'
        shape = (int(rng.integers(300, 640)), int(rng.integers(300, 640)))
        if case.startswith('numpy') and k == 5:
            shape = shape[:1] * 2  # (a 2-D image)
        assert cv2.imwrite(
            str(path),
            rng.integers(0, 256, shape + (3, ), np.uint8)[..., 0] if len(
                set(shape)) == 1 else rng.integers(0, 256, shape +
                                                   (3, ), np.uint8))
        files.append(str(path))
    load = FastLoadImageFromFile(color_type='unchanged')
    stock = Mosaic(**CASES[case])
    fast = copy.deepcopy(stock)
    fast.__class__ = FastMosaic
    affine = RandomAffine(scaling_ratio_range=(0.1, 2), border=(-320, -320))

    def sample(path, deferred, seed):
        r = load.decode_now(dict(img_path=path))
        if deferred and r['img'].ndim == 3:
            r['img'] = DeferredImage(load, path, r['img'].shape,
                                     r['img'].dtype)
        boxes_rng = np.random.default_rng(seed)  # (the same in both arms)
        n = int(boxes_rng.integers(0, 5))
        boxes = np.sort(
            boxes_rng.uniform(0, 300, (n, 4)).astype(np.float32), 1)
        # (the mix samples' numpy boxes stay numpy where the sample's are
        # boxes: mmdet's autocast converts them only with the sample's)
        r['gt_bboxes'] = boxes if case.startswith('numpy') and seed else \
            HorizontalBoxes(torch.from_numpy(boxes))
        r['gt_bboxes_labels'] = np.zeros(n, np.int64)
        if not (case.endswith('no flags') and seed == 1):
            r['gt_ignore_flags'] = np.zeros(n, bool)
        return r

    def run(transform, picks, deferred):
        r = sample(picks[0], deferred, 0)
        r['mix_results'] = [
            sample(p, deferred, i + 1) for i, p in enumerate(picks[1:])
        ]
        transform._fp_then = affine if deferred else None
        r = transform.transform(r)
        r.pop('mix_results')
        return affine.transform(r)

    np.random.seed(0)
    COUNTS.clear()
    outcomes = set()
    for k in range(30):
        picks = [files[i] for i in rng.choice(6, 4)]
        if case.startswith('numpy'):
            picks[2] = files[5]  # the bottom-left patch
        (s_kind, s_out, s_states), (f_kind, f_out, f_states) = run_both(
            lambda r: run(stock, picks, False),
            lambda r: run(fast, picks, True), None)
        assert s_kind == f_kind, (k, s_out, f_out)
        if s_kind == 'raised':
            assert s_out == f_out, k
        else:
            assert first_difference(s_out, f_out) is None, k
        assert same_states(s_states, f_states), k
        set_states(s_states)
        outcomes.add(s_kind)
    if case == 'plain':
        assert outcomes == {'ok'}
        assert COUNTS['deferred decodes: never read'] > 10
    if case.startswith('numpy') or case == 'float img_scale':
        assert 'raised' in outcomes
    if case.endswith('gray patch'):  # the first move of numpy boxes, first
        assert s_out.startswith('AttributeError'), s_out
    if case.endswith('no flags'):  # the flags read before that move
        assert s_out.startswith('KeyError'), s_out
    if case.startswith('centre'):  # stock raised, or read the patches
        assert 'raised' in outcomes or COUNTS['deferred decodes: never read']


@pytest.mark.parametrize('img_scale, pad_val, gray, affine', [
    ((640, 640), 114.0, False, 0),
    ((320, 192), 7, False, 1),
    ((200, 260), (1, 2, 3), False, 2),
    ((256, 256), 114.0, True, 2),
])
def test_the_mosaic_writes_its_canvas_only_where_the_affine_reads(
        img_scale, pad_val, gray, affine):
    """Before a RandomAffine, the fast Mosaic fills and pastes only the box
    the warp reads: with whatever its memory held elsewhere (garbage here),
    the warped samples are stock's; without an affine the canvas is whole.
    Square and other scales, an int, a float and a three-value pad, colour
    and gray patches (whose pastes stay whole), three affine settings."""
    from mmdet.datasets.transforms import Mosaic

    from fast_parallel.pipeline.mosaic import FastMosaic
    from fast_parallel.pipeline.scratch import owned_scratch
    rng = np.random.default_rng(5)
    stock = Mosaic(img_scale=img_scale, pad_val=pad_val)
    fast = copy.deepcopy(stock)
    fast.__class__ = FastMosaic
    affine = RandomAffine(**AFFINES[affine])
    channels = () if gray else (3, )
    shape = (img_scale[1] * 2, img_scale[0] * 2) + channels

    def sample(seed):
        r = np.random.default_rng(seed)
        h, w = int(r.integers(40, 700)), int(r.integers(40, 700))
        n = int(r.integers(0, 5))
        boxes = np.sort(r.uniform(0, 200, (n, 4)).astype(np.float32), 1)
        return dict(
            img=r.integers(0, 256, (h, w) + channels, np.uint8),
            gt_bboxes=HorizontalBoxes(torch.from_numpy(boxes)),
            gt_bboxes_labels=np.zeros(n, np.int64),
            gt_ignore_flags=np.zeros(n, bool))

    def run(transform, seeds, then):
        r = sample(seeds[0])
        r['mix_results'] = [sample(s) for s in seeds[1:]]
        transform._fp_then = then
        r = transform.transform(r)
        r.pop('mix_results')
        return r

    np.random.seed(0)
    left_alone = 0
    for k in range(20):
        seeds = [int(s) for s in rng.integers(0, 1000, 4)]
        canvas = owned_scratch('mosaic', shape, np.uint8)
        canvas[...] = rng.integers(0, 256, canvas.shape, np.uint8)
        garbage = canvas.copy()
        (s_kind, s_out, s_states), (f_kind, f_out, f_states) = run_both(
            lambda r: affine.transform(run(stock, seeds, None)),
            lambda r: affine.transform(run(fast, seeds, affine)), None)
        assert s_kind == f_kind == 'ok', (k, s_out, f_out)
        assert first_difference(s_out, f_out) is None, k
        assert same_states(s_states, f_states), k
        left_alone += np.array_equal(canvas[0], garbage[0]) or \
            np.array_equal(canvas[-1], garbage[-1])
        set_states(s_states)
        # without an affine after it, the whole canvas is stock's
        state = np.random.get_state()
        want = run(stock, seeds, None)
        np.random.set_state(state)
        got = run(fast, seeds, None)
        assert np.array_equal(got['img'], want['img']), k
    # rows the warp never reads kept the garbage (a three-value pad is
    # filled whole, for np.full's broadcast and its error)
    assert (left_alone > 0) == (type(pad_val) is not tuple)


def test_a_mosaic_met_again_after_the_affine_makes_a_whole_canvas(sample_data):
    """The wrapper tells the Mosaic its affine for that first call only:
    the same Mosaic instance again later in the pipeline (its output no
    longer read by the warp alone) makes stock's whole canvas."""
    cfg = copy.deepcopy(
        load_preset('yolox_s', sample_data).train_dataloader.dataset)
    cfg.pipeline = [cfg.pipeline[0], cfg.pipeline[1], cfg.pipeline[0]]

    def the_same_mosaic_twice(dataset):
        dataset.pipeline[2] = dataset.pipeline[0]

    compare_mix_datasets(cfg, 8, edit=the_same_mosaic_twice, warm=True)
    assert COUNTS['deferred decodes: never read'] > 0
