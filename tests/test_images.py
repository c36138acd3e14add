"""The data preprocessor's image step for the whole batch
(``fast_parallel/step/images.py``): stock's batch and data samples, bit for
bit, over generated batches and options; stock's errors; the way taken."""
import copy
import math
import pickle
import random

import numpy as np
import pytest
import torch
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmdet.structures import DetDataSample
from mmengine.logging import MessageHub
from mmengine.structures import InstanceData
from torch import nn

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.det_preprocessor import FastDetDataPreprocessor
from fast_parallel.step.images import switch_images

DTYPES = (torch.uint8, torch.int16, torch.int64, torch.float32, torch.float64,
          torch.float16)
MEANS = (None, ([127.5], [57.3]), ([123.675, 116.28,
                                    103.53], [58.395, 57.12,
                                              57.375]), ([0, 0, 0], [1, 1, 1]))


class _Model(nn.Module):

    def __init__(self, pre: nn.Module) -> None:
        super().__init__()
        self.data_preprocessor = pre


def _pair(**kwargs):
    """A stock preprocessor and a switched one, same arguments."""
    stock = DetDataPreprocessor(**kwargs)
    fast = DetDataPreprocessor(**kwargs)
    outcome = switch_images(_Model(fast))
    assert outcome.done and type(fast) is FastDetDataPreprocessor
    return stock, fast


def _data(images):
    samples = []
    for image in images:
        sample = DetDataSample()
        sample.set_metainfo(dict(img_shape=tuple(image.shape[1:])))
        samples.append(sample)
    return dict(inputs=list(images), data_samples=samples)


def _bits(t: torch.Tensor) -> torch.Tensor:
    view = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
    return t.contiguous().view(view[t.element_size()])


def _same(a: dict, b: dict) -> None:
    x, y = a['inputs'], b['inputs']
    assert x.dtype == y.dtype and x.shape == y.shape and y.is_contiguous()
    assert torch.equal(_bits(x), _bits(y))
    for s, f in zip(a['data_samples'], b['data_samples']):
        assert s.metainfo == f.metainfo


def _images(rng, count, channels, dtype, same, side=(1, 40)):
    shape = tuple(rng.integers(*side, size=2))
    images = []
    for _ in range(count):
        h, w = shape if same else rng.integers(*side, size=2)
        if dtype.is_floating_point:
            x = torch.from_numpy(rng.normal(100, 80, (channels, h, w)))
        else:
            x = torch.from_numpy(rng.integers(0, 256, (channels, h, w)))
        images.append(x.to(dtype))
    return images


@pytest.mark.parametrize('seed', range(6))
def test_generated_batches_are_stocks_bits(seed):
    rng = np.random.default_rng(seed)
    batched = stock_way = 0
    for case in range(60):
        mean = MEANS[rng.integers(len(MEANS))]
        flip = bool(rng.integers(2))
        kwargs = dict(
            pad_size_divisor=int(rng.choice([1, 7, 32])),
            pad_value=[0, 114, -3.5, 0.1][rng.integers(4)],
            bgr_to_rgb=flip)
        if mean is not None:
            kwargs.update(mean=mean[0], std=mean[1])
        channels = 3 if (flip or mean is not None and len(mean[0]) == 3) \
            else int(rng.choice([1, 3, 4]))
        if flip and rng.integers(4) == 0:
            channels = 4  # stock keeps 3 of them
        dtype = DTYPES[rng.integers(len(DTYPES))]
        images = _images(rng, int(rng.integers(1, 6)), channels, dtype,
                         bool(rng.integers(3) == 0))
        if rng.integers(6) == 0:  # one image of another dtype: stock's way
            images.append(images[0].to(
                torch.int32 if dtype.is_floating_point else torch.float64))
        stock, fast = _pair(**kwargs)
        _same(stock(_data(images), True), fast(_data(images), bool(case % 2)))
        stock_way += fast.fast_images_stock
        batched += 1 - fast.fast_images_stock
    assert batched > 30 and stock_way > 0  # both ways were taken


def test_nan_and_inf_in_float_images_stay_where_stock_has_them():
    stock, fast = _pair(mean=[1, 2, 3], std=[2, 3, 4], pad_size_divisor=4)
    images = [torch.full((3, 8, 8), 5.0), torch.full((3, 8, 8), 7.0)]
    images[0][1, 2, 3] = math.nan
    images[1][0, 0, 0] = math.inf
    images[1][2, 7, 7] = -math.inf
    _same(stock(_data(images), True), fast(_data(images), True))
    images.append(torch.full((3, 5, 6), math.nan))  # and padded
    _same(stock(_data(images), True), fast(_data(images), True))
    assert fast.fast_images_stock == 0


@pytest.mark.parametrize('mean,std', [([1, 2, 3], [1, 0, 1]),
                                      ([1, math.inf, 3], [1, 1, 1]),
                                      ([1, 2, 3], [1, math.inf, 1]),
                                      ([math.nan, 2, 3], [1, 1, 1])])
def test_mean_or_std_not_finite_or_zero(mean, std):
    """NaN and infinities from the normalisation itself (0 / 0, inf / inf)
    stay in the image; the padded cells are pad_value."""
    stock, fast = _pair(mean=mean, std=std, pad_size_divisor=8, pad_value=3)
    images = [
        torch.full((3, 5, 6), 2, dtype=torch.uint8),
        torch.arange(3 * 9 * 7).reshape(3, 9, 7).to(torch.uint8)
    ]
    _same(stock(_data(images), True), fast(_data(images), True))
    assert fast.fast_images_stock == 0


@pytest.mark.parametrize('change', ['in place', 'data in place', 'data'])
def test_buffers_changed_between_batches(change):
    stock, fast = _pair(
        mean=[0, 2, 0], std=[1, 1, 1], pad_size_divisor=8, pad_value=3)
    images = [
        torch.full((3, 5, 6), 2, dtype=torch.uint8),
        torch.full((3, 9, 7), 3, dtype=torch.uint8)
    ]
    _same(stock(_data(images), True), fast(_data(images), True))
    for pre in (stock, fast):  # then (2 - 2) / 0 = NaN in the image
        if change == 'in place':
            pre.std[1] = 0
        elif change == 'data in place':
            pre.std.data.zero_()
        else:
            pre.std.data = torch.zeros(3, 1, 1)
    _same(stock(_data(images), True), fast(_data(images), True))
    assert fast.fast_images_stock == 0


def test_buffers_made_under_inference_mode():
    stock, fast = _pair(
        mean=[0., 0., 0.], std=[1., 1., 1.], pad_size_divisor=8)
    with torch.inference_mode():
        stock.half()
        fast.half()
    images = [
        torch.zeros((3, 5, 6), dtype=torch.uint8),
        torch.ones((3, 4, 7), dtype=torch.uint8)
    ]
    _same(stock(_data(images), True), fast(_data(images), True))
    with torch.inference_mode():
        _same(stock(_data(images), True), fast(_data(images), True))


@pytest.mark.parametrize('normalize', [False, True])
@pytest.mark.parametrize(
    'pad_value',
    [1e40, -1e40, 2**64, 2**60 + 2**36 + 1, -0.0, math.inf, math.nan])
def test_pad_values_convert_and_fail_as_stocks(normalize, pad_value):
    """F.pad takes the value as a Python float and checks it against the
    tensor's dtype (float64 where the buffers are: no overflow there)."""
    kwargs = dict(pad_size_divisor=8, pad_value=pad_value)
    if normalize:
        kwargs.update(mean=[1., 2., 3.], std=[1., 2., 3.])
    stock, fast = _pair(**kwargs)
    images = [
        torch.zeros((3, 5, 6), dtype=torch.uint8),
        torch.ones((3, 4, 7), dtype=torch.uint8)
    ]
    for _ in range(2):
        try:
            expected = stock(_data(images), True)
        except RuntimeError as error:
            with pytest.raises(RuntimeError, match=str(error)):
                fast(_data(images), True)
        else:
            _same(expected, fast(_data(images), True))
        stock.double()
        fast.double()
    assert fast.fast_images_stock == 0


@pytest.mark.parametrize('kwargs,channels,error', [
    (dict(bgr_to_rgb=True), 1, IndexError),
    (dict(mean=[1, 2, 3], std=[1, 2, 3]), 1, AssertionError),
])
def test_stocks_errors(kwargs, channels, error):
    stock, fast = _pair(**kwargs)
    images = [torch.zeros((channels, 4, 4), dtype=torch.uint8)]
    with pytest.raises(error) as stock_error:
        stock(_data(images), True)
    with pytest.raises(error) as fast_error:
        fast(_data(images), True)
    assert str(stock_error.value) == str(fast_error.value)
    assert fast.fast_images_stock == 1


def test_mixed_dtypes_or_sizes_of_channels_take_stocks_way():
    stock, fast = _pair(pad_size_divisor=4)
    images = [
        torch.zeros((3, 4, 5), dtype=torch.uint8),
        torch.ones((3, 6, 5), dtype=torch.int16)
    ]
    _same(stock(_data(images), True), fast(_data(images), True))
    assert fast.fast_images_stock == 1


def test_operations_do_not_grow_with_the_batch_but_by_one_copy():
    """Stock: a flip, a conversion, two normalising operations and a pad
    per image; batched: one copy per image where images are padded, else
    none."""
    kwargs = dict(
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=32)
    stock, fast = _pair(**kwargs)
    counts = {}
    for batch in (2, 8, 16):
        for same in (False, True):
            images = [
                torch.zeros(
                    (3, 640, 640) if same else (3, 600 + i, 500 + 3 * i),
                    dtype=torch.uint8) for i in range(batch)
            ]
            fast(_data(images), True)  # the buffers' check, once
            with OpCounter() as s:
                stock(_data(images), True)
            with OpCounter() as f:
                fast(_data(images), True)
            counts[batch, same] = (s.total, f.total, f.ops['copy_'])
    for (batch, same), (stock_ops, fast_ops, copies) in counts.items():
        assert stock_ops >= (4 if same else 5) * batch
        assert copies == (0 if same else batch)
        assert fast_ops - copies <= 7
    assert counts[16, True][1] == counts[2, True][1]


def test_batch_augments_and_pad_shapes_run_as_stocks():
    kwargs = dict(
        pad_size_divisor=32,
        pad_value=114,
        batch_augments=[
            dict(
                type='BatchSyncRandomResize',
                random_size_range=(320, 640),
                size_divisor=32,
                interval=1)
        ])
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    stock, fast = _pair(**kwargs)
    rng = np.random.default_rng(3)
    hub = MessageHub.get_current_instance()
    for it in range(4):
        hub.update_info('iter', it)
        images = _images(rng, 3, 3, torch.uint8, False, side=(20, 90))
        outs = []
        for pre in (stock, fast):
            random.seed(it)
            data = _data(images)
            for sample in data['data_samples']:
                sample.gt_instances = InstanceData(
                    bboxes=torch.tensor([[1.0, 2.0, 10.0, 12.0]]),
                    labels=torch.tensor([0]))
            outs.append(pre(data, True))
        _same(*outs)
        for s, f in zip(outs[0]['data_samples'], outs[1]['data_samples']):
            assert torch.equal(s.gt_instances.bboxes, f.gt_instances.bboxes)


def test_switch_keeps_state_dict_copies_and_pickles():
    stock = DetDataPreprocessor(mean=[1, 2, 3], std=[4, 5, 6])
    fast = DetDataPreprocessor(mean=[1, 2, 3], std=[4, 5, 6])
    model = _Model(fast)
    assert str(switch_images(model)) == \
        'images: DetDataPreprocessor batched'
    assert switch_images(model).done  # a second run: still batched
    assert list(fast.state_dict()) == list(stock.state_dict())
    for other in (copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))):
        assert type(other) is FastDetDataPreprocessor
        images = [
            torch.ones((3, 4, 4), dtype=torch.uint8),
            torch.ones((3, 2, 3), dtype=torch.uint8)
        ]
        _same(stock(_data(images)), other(_data(images)))


def test_what_stays_stock_is_named():
    off = _Model(DetDataPreprocessor())
    assert not switch_images(off, enabled=False).done
    assert type(off.data_preprocessor) is DetDataPreprocessor

    class Mine(DetDataPreprocessor):
        pass

    outcome = switch_images(_Model(Mine()))
    assert not outcome.done and 'Mine is not DetDataPreprocessor' in str(
        outcome)
    replaced = DetDataPreprocessor()
    replaced.forward = lambda data, training=False: data
    outcome = switch_images(_Model(replaced))
    assert not outcome.done and 'forward replaced on the instance' in str(
        outcome)
    assert type(replaced) is DetDataPreprocessor
    from mmdet3d.models.data_preprocessors import Det3DDataPreprocessor
    assert switch_images(_Model(Det3DDataPreprocessor())) is None
    assert switch_images(nn.Linear(1, 1)) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_batches_are_stocks_bits():
    stock, fast = _pair(
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=32)
    stock.cuda()
    fast.cuda()
    rng = np.random.default_rng(0)
    for same in (False, True):
        images = _images(rng, 4, 3, torch.uint8, same, side=(30, 300))
        _same(stock(_data(images), True), fast(_data(images), True))
    assert fast.fast_images_stock == 0
