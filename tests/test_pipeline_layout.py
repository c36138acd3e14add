"""Flipped image views (``RandomFlip`` hands on ``np.flip`` views): copied
by OpenCV with the bytes and layout of numpy's copy, padded by ``FastPad``
as stock's ``Pad`` pads them, and handed on by the mixing wrapper as a
deep copy would."""
import copy

import numpy as np
import pytest

from fast_parallel.bench.pipeline import first_difference
from fast_parallel.pipeline.copies import (CV_NATIVE, as_deepcopied,
                                           flipped_copy)

DTYPES = (np.uint8, np.int8, np.uint16, np.int16, np.float32, np.float64,
          np.int32, np.float16, np.bool_)
SHAPES = ((1, 1), (5, 7), (1, 9, 3), (6, 1, 4), (4, 5, 2), (3, 3, 1),
          (4, 6, 5), (7, 4, 3))
FLIPS = ((slice(None), slice(None, None, -1)), (slice(None, None,
                                                      -1), slice(None)),
         (slice(None, None, -1), slice(None, None,
                                       -1)), (slice(None), slice(None)),
         (slice(None), slice(None, None,
                             -2)), (slice(None), slice(None, None, -1),
                                    slice(None, None, -1)))


def _views(rng, dtype, shape):
    """Views users' transforms give: of a whole image, of a crop, of a
    Fortran-ordered or transposed image, flipped every way."""
    image = (rng.random(shape) * 250 - (0 if dtype == np.bool_ else 20))
    image = image.astype(dtype)
    canvas = np.zeros((shape[0] + 3, shape[1] + 4) + shape[2:], dtype)
    canvas[1:1 + shape[0], 2:2 + shape[1]] = image
    bases = [
        image, canvas[1:1 + shape[0], 2:2 + shape[1]],
        np.asfortranarray(image)
    ]
    if image.ndim == 3:
        bases.append(image.transpose(1, 0, 2))
    for base in bases:
        for flip in FLIPS:
            yield base[flip[:base.ndim]]


def test_flipped_copy_is_numpys_copy_or_declines():
    rng = np.random.default_rng(0)
    made = 0
    for dtype in DTYPES:
        for shape in SHAPES:
            for view in _views(rng, dtype, shape):
                copied = flipped_copy(view)
                expected = view.copy(order='K')
                if copied is None:
                    continue
                made += 1
                assert np.dtype(dtype) in CV_NATIVE and view.ndim in (2, 3)
                assert (copied.dtype, copied.shape, copied.strides) == \
                    (expected.dtype, expected.shape, expected.strides)
                assert copied.tobytes() == expected.tobytes()
                assert copied.flags.owndata and copied.flags.writeable
                assert copied.base is None
    # at least: every OpenCV dtype, flipped three ways, whole and cropped,
    # 2-D and 2..4 channels
    assert made >= 6 * 3 * 2 * 6
    for dtype in DTYPES:
        image = np.zeros((4, 5, 3), dtype)
        taken = flipped_copy(image[::-1, ::-1]) is not None
        assert taken == (np.dtype(dtype) in CV_NATIVE)
        assert flipped_copy(image[:, ::-1, ::-1]) is None
        assert flipped_copy(image) is None  # nothing to flip
        assert flipped_copy(image[:, ::-2]) is None  # a step of 2
        assert flipped_copy(image.transpose(1, 0, 2)[::-1]) is None
        assert flipped_copy(image[..., :1][::-1]) is None  # 1 channel
        assert flipped_copy(np.zeros((4, 5, 5), dtype)[::-1]) is None
    # rows a byte count apart that is no whole number of elements (OpenCV
    # refuses them), and numpy subclasses (a copy keeps the subclass)
    raw = np.arange(4000, dtype=np.uint8)
    odd = np.ndarray((5, 6, 3), np.uint16, raw, 0, (37, 6, 2))[::-1]
    assert flipped_copy(odd) is None
    assert type(odd.copy(order='K')) is np.ndarray

    class Sub(np.ndarray):
        pass

    sub = np.zeros((4, 5, 3), np.uint8).view(Sub)[:, ::-1]
    assert flipped_copy(sub) is None
    assert type(as_deepcopied(dict(img=sub))['img']) is Sub


def test_a_flipped_view_is_handed_on_as_its_deep_copy():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
    results = dict(
        img=image[:, ::-1],
        gt_seg_map=image[::-1, :, 0],
        flip=True,
        img_shape=(6, 8))
    handed = as_deepcopied(results)
    assert first_difference(copy.deepcopy(results), handed) is None
    assert handed['img'].flags.owndata and handed['img'].base is None


def _pad_results(rng, h, w, flip, seg):
    image = rng.integers(0, 255, (h + 2, w + 3, 3), dtype=np.uint8)
    image = image[1:1 + h, 2:2 + w]
    results = dict(
        img=np.flip(image, axis=flip) if flip is not None else image,
        img_shape=(h, w))
    if seg:
        results['gt_seg_map'] = rng.integers(0, 9, (h, w), dtype=np.uint8)
    return results


@pytest.mark.parametrize(
    'options',
    [
        dict(size=(64, 48), pad_val=dict(img=(114, 114, 114))),
        dict(size_divisor=32),
        dict(pad_to_square=True, pad_val=dict(img=(114.0, 114.0, 114.0))),
        dict(size=(70, 50), padding_mode='reflect'),
        dict(size=(70, 50), padding_mode='edge', pad_val=7),
        dict(size=(70, 50), pad_val=dict(img=(1, 2))),  # stock's error
    ])
def test_fast_pad_gives_stock_bytes(options):
    from mmdet.datasets.transforms import Pad

    from fast_parallel.pipeline.layout import FastPad
    stock = Pad(**options)
    fast = copy.deepcopy(stock)
    fast.__class__ = FastPad
    rng = np.random.default_rng(2)
    for case in range(24):
        h, w = int(rng.integers(1, 64)), int(rng.integers(1, 64))
        flip = (None, 0, 1, (0, 1))[case % 4]
        seed = int(rng.integers(1 << 30))
        outs = []
        for transform in (stock, fast):
            results = _pad_results(
                np.random.default_rng(seed), h, w, flip, case % 3 == 0)
            view = results['img']
            try:
                outs.append(('ok', transform(results)))
            except Exception as error:
                outs.append(('raised', f'{type(error).__name__}: {error}',
                             results['img'] is view))
        assert outs[0][0] == outs[1][0]
        if outs[0][0] == 'raised':
            # stock's error, and the sample's image left as stock leaves it
            assert outs[0] == outs[1] and outs[1][2]
        else:
            assert first_difference(outs[0][1], outs[1][1]) is None
            assert outs[1][1]['img'].flags.c_contiguous
    assert (outs[0][0] == 'raised') == (
        'pad_val' in options and len(options['pad_val']['img']) == 2
        if isinstance(options.get('pad_val'), dict) else False)


def _storage_kind(tensor):
    """Who allocated a tensor's memory: numpy's (or memory once lent to
    numpy) cannot be resized."""
    return 'torch' if tensor.untyped_storage().resizable() else 'numpy'


def test_fast_pack_gives_stock_tensors_and_samples():
    from mmdet.datasets.transforms import PackDetInputs

    from fast_parallel.pipeline.layout import FastPackDetInputs, chw_planes
    stock = PackDetInputs()
    fast = copy.deepcopy(stock)
    fast.__class__ = FastPackDetInputs
    rng = np.random.default_rng(3)
    kinds = set()
    for dtype in DTYPES + (np.int64, ):
        for shape in SHAPES + ((6, 8), (1, 2, 3), (2, 1, 3)):
            for view in _views(rng, dtype, shape):
                n = int(rng.integers(0, 4))
                results = dict(
                    img=view,
                    img_shape=view.shape[:2],
                    img_id=3,
                    gt_bboxes=rng.random((n, 4)).astype(np.float32),
                    gt_bboxes_labels=rng.integers(0, 9, n),
                    gt_ignore_flags=rng.random(n) < 0.3)
                base = view.base
                outs = []
                for transform in (stock, fast):
                    try:
                        outs.append(transform.transform(dict(results)))
                    except Exception as error:  # stock's error is fast's
                        outs.append(f'{type(error).__name__}: {error}')
                s_out, f_out = outs
                if isinstance(s_out, str):
                    assert s_out == f_out
                    continue
                assert list(s_out) == list(f_out)
                assert first_difference(s_out, f_out) is None
                s_img, f_img = s_out['inputs'], f_out['inputs']
                assert _storage_kind(s_img) == _storage_kind(f_img)
                # neither shares the image's memory, or both do
                shares = [
                    np.shares_memory(t.numpy(), view if base is None else base)
                    for t in (s_img, f_img)
                ]
                assert shares[0] == shares[1]
                if chw_planes(view) is not None:
                    kinds.add((view.flags.c_contiguous, view.strides[1] < 0))
                    assert not shares[1]
    # contiguous images, flipped views and crops all took cv2.split
    assert kinds == {(True, False), (False, True), (False, False)}


def test_fast_pack_keeps_stocks_errors_and_keys():
    from mmdet.datasets.transforms import PackDetInputs

    from fast_parallel.pipeline.layout import FastPackDetInputs, chw_planes
    image = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    read_only = image.copy()
    read_only.flags.writeable = False
    raw = np.zeros(4000, np.uint8)
    odd_rows = np.ndarray((5, 6, 3), np.float32, raw, 0, (74, 12, 4))
    # torch warns once for a read-only array (stock's from_numpy), and
    # OpenCV refuses rows apart by no whole number of elements: stock's way
    assert chw_planes(read_only) is None and chw_planes(odd_rows) is None
    cases = [(dict(), read_only), (dict(), odd_rows),
             (dict(meta_keys=('img_id', 'img')), image),
             (dict(meta_keys=None), image)]
    for options, img in cases:
        outs = []
        for cls in (PackDetInputs, FastPackDetInputs):
            stock = PackDetInputs(**options)
            stock.__class__ = cls
            try:
                out = stock.transform(dict(img=img, img_id=3))
            except Exception as error:
                out = f'{type(error).__name__}: {error}'
            outs.append(out)
        if isinstance(outs[0], str):
            assert outs[0] == outs[1]
        else:
            assert first_difference(*outs) is None
    # a generator of keys: read once, by stock's loop
    outs = [
        cls(meta_keys=(k for k in ('img_id', 'img_shape'))).transform(
            dict(img=image, img_id=3, img_shape=(4, 5)))
        for cls in (PackDetInputs, FastPackDetInputs)
    ]
    assert first_difference(*outs) is None
    assert outs[1]['data_samples'].img_id == 3


def test_plain_data_is_told_apart():
    import threading

    import torch

    from fast_parallel.pipeline.copies import holds_only_plain
    looped = []
    looped.append(looped)
    plain = dict(
        a=[1, 2.5, 'x', None, (b'y', np.float32(1))],
        b=np.zeros((2, 3)),
        c={'d': [[0.5, 1.5], []]})
    assert holds_only_plain(plain) and holds_only_plain([]) and \
        holds_only_plain(np.int64(3))
    others = (threading.Lock(), torch.zeros(2), np.array([None]), {
        frozenset(): 2
    }, looped, [plain, object()], {
        'k': {3}
    })
    for other in others:
        assert not holds_only_plain(other), other
    assert holds_only_plain([{'k': torch.zeros(2)}], frozenset({torch.Tensor}))


def test_a_plain_container_is_looked_through_once_a_sample(monkeypatch):
    """A container of scalars (an info's instances) found plain in one of a
    sample's walks is handed over as it is in the sample's later walks,
    without being looked through again; a new one is looked through."""
    import fast_parallel.pipeline.copies as copies
    looked = []
    real = copies._scalar_tree

    def counting(value, depth):
        looked.append(id(value))
        return real(value, depth)

    monkeypatch.setattr(copies, '_scalar_tree', counting)
    instances = [
        dict(
            bbox=[1.0, 2.0, 5.0, 6.0],
            bbox_label=3,
            ignore_flag=0,
            mask=[[1.0, 2.0, 5.0, 2.0, 5.0, 6.0]]) for _ in range(3)
    ]
    results = dict(
        instances=instances,
        img=np.zeros((4, 4, 3), np.uint8),
        img_shape=(4, 4),
        img_path='a.jpg')
    plain: dict = {}
    first = as_deepcopied(results, plain=plain)
    assert first['instances'] is instances
    assert first_difference(first, copy.deepcopy(results)) is None
    assert id(instances) in looked
    before = len(looked)
    second = as_deepcopied(results, plain=plain)
    assert second['instances'] is instances and len(looked) == before
    assert first_difference(second, copy.deepcopy(results)) is None
    results['instances'] = [dict(bbox=[0.0, 0.0, 1.0, 1.0])]  # a new one
    third = as_deepcopied(results, plain=plain)
    assert third['instances'] is results['instances']
    assert id(results['instances']) in looked[before:]
    before = len(looked)
    as_deepcopied(results)  # (another sample: looked through again)
    assert id(results['instances']) in looked[before:]
    # the memo holds what it remembers: no id of a dropped container is
    # taken by a new one holding a view (which a deep copy copies)
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for _ in range(100):
        results['instances'] = [[1.0, 2.0], (3, 4)]
        as_deepcopied(results, plain=plain)
        results['instances'] = [base[:, ::2], 1.0]  # (the old one dropped)
        handed = as_deepcopied(results, plain=plain)
        assert first_difference(handed, copy.deepcopy(results)) is None
        assert not np.shares_memory(handed['instances'][0], base)
