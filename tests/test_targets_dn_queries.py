"""DINO's denoising queries from ``FastCdnQueryGenerator`` are stock's
``CdnQueryGenerator``'s: the label and box queries, the attention mask,
``dn_meta`` and the random state after, over drawn batches (0, 1 and > 100
boxes per image, no box at all, mixed counts, fixed and dynamic groups,
non-integer image sizes, duplicate and zero-width boxes, float16 boxes);
what it does not cover goes stock's way, counted; CUDA variants skip
cleanly without a GPU."""
import copy
from types import SimpleNamespace

import pytest
import torch
from mmdet.models.layers.transformer import CdnQueryGenerator
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData
from targets_utils import DEVICES

from fast_parallel.step.targets.hungarian.queries import (
    FastCdnQueryGenerator, switch_queries)


def _generator(dynamic: bool, matching: int = 30) -> CdnQueryGenerator:
    torch.manual_seed(0)
    group_cfg = dict(dynamic=True, num_groups=None, num_dn_queries=100) \
        if dynamic else dict(dynamic=False, num_groups=3)
    return CdnQueryGenerator(
        num_classes=80,
        embed_dims=16,
        num_matching_queries=matching,
        label_noise_scale=0.5,
        box_noise_scale=1.0,
        group_cfg=group_cfg)


def _samples(gen: torch.Generator, counts, device, dtype=torch.float32):
    samples = []
    for i, n in enumerate(counts):
        h, w = [(480, 640), (333, 500), (427.5, 640.25)][i % 3]
        xy = torch.rand(n, 2, generator=gen) * 300
        wh = torch.rand(n, 2, generator=gen) * 200
        boxes = torch.cat([xy, xy + wh], 1)
        if n > 3:
            boxes[1] = boxes[0]  # a duplicate
            boxes[2, 2] = boxes[2, 0]  # zero width
        sample = DetDataSample(metainfo=dict(img_shape=(h, w)))
        sample.gt_instances = InstanceData(
            bboxes=boxes.to(device, dtype),
            labels=torch.randint(0, 80, (n, ), generator=gen).to(device))
        samples.append(sample)
    return samples


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)
        assert torch.equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def _run_both(stock, fast, samples):
    state = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() \
        else None
    outs, afters = [], []
    for generator in (stock, fast):
        torch.set_rng_state(state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        try:
            outs.append(generator(copy.deepcopy(samples)))
        except RuntimeError as error:  # stock's error must be fast's
            outs.append(f'{type(error).__name__}: {error}')
        afters.append(torch.get_rng_state())
    assert torch.equal(afters[0], afters[1])
    return outs[0], outs[1]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('case', range(12))
def test_fast_queries_are_stocks(device, case):
    gen = torch.Generator().manual_seed(case)
    counts = [[3], [0, 0], [1, 7, 0], [120, 5], [2, 2, 2, 2, 2, 2, 2, 2],
              [0, 130, 1], [9], [4, 0, 11, 1]][case % 8]
    stock = _generator(dynamic=case % 3 != 0).to(device)
    fast = copy.deepcopy(stock)
    assert switch_queries(torch.nn.ModuleList([fast])) is not None
    assert type(fast) is FastCdnQueryGenerator
    dtype = torch.float16 if case == 11 else torch.float32
    samples = _samples(gen, counts, device, dtype)
    out_stock, out_fast = _run_both(stock, fast, samples)
    _same(out_stock, out_fast)
    if case == 11:  # stock's index_put of float16 boxes raises
        assert out_stock.startswith('RuntimeError: Index put requires')
    assert fast.fast_cdn_stats.calls == 1 and fast.fast_cdn_stats.stock == 0


def test_the_mask_is_stocks_for_every_group_layout():
    stock, fast = _generator(True, matching=7), _generator(True, matching=7)
    switch_queries(torch.nn.ModuleList([fast]))
    for max_num_target in range(0, 12):
        for num_groups in range(1, 6):
            _same(
                stock.generate_dn_mask(max_num_target, num_groups, 'cpu'),
                fast.generate_dn_mask(max_num_target, num_groups, 'cpu'))


def test_what_it_does_not_cover_goes_stocks_way_counted():
    gen = torch.Generator().manual_seed(3)
    stock = _generator(True)
    fast = copy.deepcopy(stock)
    stats = switch_queries(torch.nn.ModuleList([fast]))
    three_dims = _samples(gen, [2, 3], 'cpu')
    three_dims[1].set_metainfo(dict(img_shape=(480, 640, 3)))
    mixed = _samples(gen, [2, 3], 'cpu')
    mixed[1].gt_instances.bboxes = mixed[1].gt_instances.bboxes.double()
    uneven = _samples(gen, [2, 1], 'cpu')  # equal totals, uneven counts
    uneven = [
        SimpleNamespace(
            img_shape=s.img_shape,
            gt_instances=SimpleNamespace(
                bboxes=s.gt_instances.bboxes, labels=labels))
        for s, labels in zip(uneven, (torch.tensor([3]), torch.tensor([4, 5])))
    ]
    for samples in (three_dims, mixed, [], uneven):
        torch.manual_seed(5)
        try:
            expected = stock(copy.deepcopy(samples))
        except Exception as error:  # stock's error is fast's
            with pytest.raises(type(error)) as raised:
                fast(copy.deepcopy(samples))
            assert str(raised.value) == str(error)
            continue
        torch.manual_seed(5)
        _same(expected, fast(copy.deepcopy(samples)))
    assert (stats.calls, stats.stock) == (4, 4)
    assert switch_queries(torch.nn.ModuleList([fast])) is stats  # once
