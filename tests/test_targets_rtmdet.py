"""Batched RTMDet targets equal stock's, bit for bit
(fast_parallel/step/targets/rtmdet/: dsl.py, targets.py, __init__.py).

Each case builds a batch (image size, ground truths per image, logits and
decoded boxes) from a seed and compares
:func:`~fast_parallel.step.targets.rtmdet.targets.rtmdet_targets` with
stock's ``RTMDetHead.get_targets`` tensor by tensor: dtype, shape, strides
and bits. Ties are built on purpose: those images must be counted as taking
the stock way and still come out equal.
"""
import copy
import random
from typing import List, Tuple

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.hub import get_config
from mmengine.structures import InstanceData
from targets_utils import DEVICES

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.targets.rtmdet import loss_by_feat
from fast_parallel.step.targets.rtmdet.targets import (rtmdet_supported,
                                                       rtmdet_targets)
from fast_parallel.step.targets.stock_way import StockWay
from fast_parallel.step.targets.switch import switch_targets

register_all_modules()
CASES_PER_TEST = 8
RTMDET = 'mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py'

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def _head(num_classes: int = 80, sep_bn: bool = True, **train) -> torch.nn:
    """RTMDet-tiny's head (SepBN) or the plain RTMDetHead, with its
    train_cfg (``DynamicSoftLabelAssigner``, topk 13)."""
    cfg = get_config(RTMDET).model
    head = dict(cfg.bbox_head, num_classes=num_classes)
    if not sep_bn:
        head = dict(
            type='RTMDetHead',
            num_classes=num_classes,
            in_channels=96,
            feat_channels=96,
            anchor_generator=head['anchor_generator'],
            bbox_coder=head['bbox_coder'],
            loss_cls=head['loss_cls'],
            loss_bbox=head['loss_bbox'],
            with_objectness=False)
    train_cfg = copy.deepcopy(cfg.train_cfg).to_dict()
    for key, value in train.items():  # replaced, not merged
        train_cfg[key] = value
    return MODELS.build(dict(head, train_cfg=train_cfg))


HEADS = {80: _head(80), 3: _head(3, sep_bn=False)}


def _gts(rng: random.Random, gen: torch.Generator, num: int, height: int,
         width: int, num_classes: int, kind: str) -> InstanceData:
    """``num`` boxes of one image; ``kind`` picks a corner case."""
    cxy = torch.rand(num, 2, generator=gen) * torch.tensor([width, height])
    wh = torch.exp(torch.rand(num, 2, generator=gen) * 5.5) + 1
    if kind == 'huge' and num:  # the soft centre prior overflows to inf
        wh = wh + 4 * max(height, width)
    boxes = torch.cat([cxy - wh / 2, cxy + wh / 2], 1)
    boxes = torch.min(
        boxes.clamp(min=0),
        torch.tensor([width, height, width, height], dtype=torch.float32))
    labels = torch.randint(0, num_classes, (num, ), generator=gen)
    if kind == 'edge' and num:  # boxes on the image border
        boxes[:, 0] = 0.
        boxes[::2, 2] = float(width)
    elif kind == 'far' and num:  # no prior inside any box
        boxes = boxes - 4 * max(height, width)
    elif kind == 'tiny' and num:  # boxes between the priors: few valid
        boxes = torch.cat([cxy, cxy + 0.5], 1)
    elif kind == 'tie' and num:
        # the first box centred on a prior of every level: with every
        # prediction alike (see _predictions) its costs differ only by the
        # distance, and the 13th and 14th cheapest priors are equally far
        c = 32. * (min(height, width) // 64)
        boxes[0] = torch.tensor(
            [c - 0.75 * c, c - 0.75 * c, c + 0.75 * c, c + 0.75 * c])
    elif kind in ('dup', 'dup_label') and num:  # duplicated boxes
        pick = torch.randint(0, num, (max(1, num // 3), ), generator=gen)
        boxes = torch.cat([boxes, boxes[pick]])
        extra = labels[pick] if kind == 'dup' else torch.randint(
            0, num_classes, (pick.numel(), ), generator=gen)
        labels = torch.cat([labels, extra])
    return InstanceData(bboxes=boxes, labels=labels)


def _predictions(gen: torch.Generator, priors: torch.Tensor,
                 gts: List[InstanceData], num_classes: int,
                 tie: List[bool]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Logits and decoded boxes near the ground truths."""
    num_imgs, num_priors = len(gts), priors.shape[0]
    cls = torch.randn(num_imgs, num_priors, num_classes, generator=gen) * 3
    side = priors[:, 2:] * torch.exp(
        torch.randn(num_imgs, num_priors, 2, generator=gen))
    boxes = torch.cat([priors[:, :2] - side, priors[:, :2] + side], -1)
    for i, gt in enumerate(gts):
        if len(gt) == 0:
            continue
        near = torch.randint(0, len(gt), (num_priors, ), generator=gen)
        jitter = 1 + 0.2 * torch.randn(num_priors, 4, generator=gen)
        use = torch.rand(num_priors, generator=gen) < 0.6
        boxes[i][use] = (gt.bboxes[near] * jitter)[use]
        if tie[i]:  # every prior alike: costs tie everywhere
            cls[i], boxes[i] = 0.5, gt.bboxes[0]
    return cls, boxes


def _priors(head, height: int, width: int, device: str) -> list:
    sizes = [(height // s, width // s) for s in (8, 16, 32)]
    return sizes, head.prior_generator.grid_priors(
        sizes, device=device, with_stride=True)


def make_case(seed: int, device: str = 'cpu'):
    """A generated batch: (head, sizes, priors, cls, boxes, gts, metas,
    tie flags)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_classes = rng.choice([80, 80, 3])
    head = HEADS[num_classes]
    height, width = 32 * rng.randint(2, 10), 32 * rng.randint(2, 10)
    num_imgs = rng.randint(1, 4)
    gts, tie, metas = [], [], []
    for _ in range(num_imgs):
        num = rng.choice(
            [0, 1, 1, 3, 8, 20, 120 if height * width <= 256 * 256 else 30])
        kind = rng.choice(
            ['plain'] * 6 +
            ['edge', 'far', 'tiny', 'dup', 'dup_label', 'tie', 'huge'])
        gts.append(_gts(rng, gen, num, height, width, num_classes, kind))
        tie.append(kind == 'tie' and num > 0)
        # some images smaller than the padded batch: not all priors valid
        pad = (height - 32 * rng.randint(0, 1), width)
        metas.append(dict(img_shape=pad, pad_shape=pad))
    sizes, priors = _priors(head, height, width, 'cpu')
    cls, boxes = _predictions(gen, torch.cat(priors), gts, num_classes, tie)
    gts = [
        InstanceData(bboxes=g.bboxes.to(device), labels=g.labels.to(device))
        for g in gts
    ]
    priors = [p.to(device) for p in priors]
    return (head, sizes, priors, cls.to(device), boxes.to(device), gts, metas,
            tie)


def stock_targets(head, sizes, cls, boxes, gts, metas, ignore=None) -> tuple:
    """``RTMDetHead.get_targets``'s labels, weights, boxes and metrics."""
    anchors, valid = head.get_anchors(sizes, metas, device=cls.device)
    out = type(head).get_targets(head, cls, boxes, anchors, valid, gts, metas,
                                 ignore)
    return out[1:5]


def batched(head, sizes, priors, cls, boxes, gts, metas, ignore=None):
    way = StockWay()
    out = rtmdet_targets(head, cls, boxes, priors, sizes, gts, metas, ignore,
                         way)
    return out, way.samples


def assert_same(stock: tuple, fast: tuple, where: str) -> None:
    """Same levels, dtypes, shapes, strides and bits."""
    assert len(stock) == len(fast) == 4
    for k, (stock_levels, fast_levels) in enumerate(zip(stock, fast)):
        assert len(stock_levels) == len(fast_levels), where
        for level, (a, b) in enumerate(zip(stock_levels, fast_levels)):
            at = f'{where}: result {k}, level {level}'
            assert a.dtype == b.dtype and a.shape == b.shape, at
            assert a.stride() == b.stride() and a.device == b.device, at
            assert torch.equal(a, b), at
            if a.is_floating_point():  # the sign of zeros too
                assert torch.equal(a.contiguous().view(torch.int32),
                                   b.contiguous().view(torch.int32)), at


def _check(seed: int, device: str) -> int:
    head, sizes, priors, cls, boxes, gts, metas, tie = make_case(seed, device)
    stock = stock_targets(head, sizes, cls, boxes, gts, metas)
    fast, fallbacks = batched(head, sizes, priors, cls, boxes, gts, metas)
    assert_same(stock, fast, f'seed {seed}')
    assert fallbacks >= sum(tie), f'seed {seed}: a tie was not detected'
    assert fallbacks <= len(gts)
    return fallbacks


@pytest.mark.parametrize('block', range(20))
def test_matches_stock(block: int) -> None:
    """160 generated batches: 0 to 120 ground truths, duplicates, edge and
    far boxes, boxes too small for most priors, huge boxes (infinite soft
    centre priors), images not filling the padded batch, ties."""
    for seed in range(block * CASES_PER_TEST, (block + 1) * CASES_PER_TEST):
        _check(seed, 'cpu')


def test_most_images_are_batched() -> None:
    """Where no tie was built, the batched path decides (almost) all."""
    total = stock = 0
    for seed in range(40):
        head, sizes, priors, cls, boxes, gts, metas, tie = make_case(seed)
        if any(tie):
            continue
        _, fallbacks = batched(head, sizes, priors, cls, boxes, gts, metas)
        total, stock = total + len(gts), stock + fallbacks
    assert total > 40 and stock <= total // 10, (stock, total)


@pytest.mark.parametrize('device', DEVICES)
def test_constructed_ties_fall_back(device: str) -> None:
    """Equal costs everywhere, duplicated boxes: counted, and still equal."""
    head = HEADS[80]
    sizes, priors = _priors(head, 128, 160, device)
    gen = torch.Generator().manual_seed(1)
    box = torch.tensor([[16., 16., 112., 112.]])  # centred on a prior
    gts = [
        InstanceData(bboxes=box, labels=torch.tensor([3])),
        InstanceData(bboxes=box.repeat(2, 1), labels=torch.tensor([5, 5])),
        InstanceData(bboxes=box + 7, labels=torch.tensor([1]))
    ]
    cls, boxes = _predictions(gen,
                              torch.cat(priors).cpu(), gts, 80,
                              [True, False, False])
    gts = [
        InstanceData(bboxes=g.bboxes.to(device), labels=g.labels.to(device))
        for g in gts
    ]
    metas = [dict(img_shape=(128, 160), pad_shape=(128, 160))] * 3
    args = (cls.to(device), boxes.to(device), gts, metas)
    fast, fallbacks = batched(head, sizes, priors, *args)
    assert_same(stock_targets(head, sizes, *args), fast, 'ties')
    # image 0: equal costs at the top-k boundary, stock's way; image 1: two
    # equal ground truths, a prior's equal minima: torch's min(dim) takes
    # the first, in stock and in the padded batch alike (batched)
    assert fallbacks == 1


@pytest.mark.parametrize('device', DEVICES)
def test_no_ground_truth_and_no_valid_prior(device: str) -> None:
    """Stock's early branch, alone and mixed with normal images."""
    head = HEADS[80]
    sizes, priors = _priors(head, 96, 64, device)
    gen = torch.Generator().manual_seed(2)
    far = torch.tensor([[-900., -900., -880., -870.]])
    for boxes_per_image in ([0, 0], [0, 1], [far, 0], [far, 1, 0]):
        gts = [
            _gts(random.Random(0), gen, b, 96, 64, 80, 'plain') if isinstance(
                b, int) else InstanceData(bboxes=b, labels=torch.tensor([7]))
            for b in boxes_per_image
        ]
        cls, boxes = _predictions(gen,
                                  torch.cat(priors).cpu(), gts, 80,
                                  [False] * len(gts))
        gts = [
            InstanceData(
                bboxes=g.bboxes.to(device), labels=g.labels.to(device))
            for g in gts
        ]
        metas = [dict(img_shape=(96, 64), pad_shape=(96, 64))] * len(gts)
        args = (cls.to(device), boxes.to(device), gts, metas)
        fast, fallbacks = batched(head, sizes, priors, *args)
        assert_same(
            stock_targets(head, sizes, *args), fast, str(boxes_per_image))
        assert fallbacks == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_generated_cases_on_cuda() -> None:
    """The generated batches on the GPU: stock and batched both on CUDA."""
    for seed in range(20 * CASES_PER_TEST):
        _check(seed, 'cuda')


def test_ignore_boxes_and_pos_weight() -> None:
    """``DynamicSoftLabelAssigner`` never reads ignore boxes; a positive
    ``pos_weight`` and a border check (``allowed_border >= 0``) stay
    stock's numbers."""
    for seed in (3, 4, 5):
        head, sizes, priors, cls, boxes, gts, metas, _ = make_case(seed)
        gen = torch.Generator().manual_seed(seed)
        ignore = [
            InstanceData(
                bboxes=torch.cat([g.bboxes, torch.rand(3, 4) * 99]))
            for g in gts
        ]
        fast, _ = batched(head, sizes, priors, cls, boxes, gts, metas, ignore)
        assert_same(
            stock_targets(head, sizes, cls, boxes, gts, metas, ignore), fast,
            f'seed {seed}, ignore boxes')
        other = _head(
            cls.shape[2],
            sep_bn=cls.shape[2] == 80,
            pos_weight=2.5,
            allowed_border=int(torch.randint(0, 4, (1, ), generator=gen)))
        fast, _ = batched(other, sizes, priors, cls, boxes, gts, metas)
        assert_same(
            stock_targets(other, sizes, cls, boxes, gts, metas), fast,
            f'seed {seed}, pos_weight and border')


def test_uncovered_batches_take_the_stock_path() -> None:
    """Non-contiguous CPU logits: every image stock's way, stock's bits."""
    head, sizes, priors, cls, boxes, gts, metas, _ = make_case(7)
    strided = cls.transpose(1, 2).contiguous().transpose(1, 2)
    fast, fallbacks = batched(head, sizes, priors, strided, boxes, gts, metas)
    assert fallbacks == len(gts)
    assert_same(
        stock_targets(head, sizes, strided, boxes, gts, metas), fast,
        'non-contiguous')


def _features(head, num_imgs: int, size: int, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(num_imgs, 96, size // s, size // s, generator=gen)
        for s in (8, 16, 32)
    ]


def _batch(num_imgs: int, size: int, counts: List[int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    gts = [
        _gts(rng, gen, counts[i % len(counts)], size, size, 80, 'plain')
        for i in range(num_imgs)
    ]
    metas = [dict(img_shape=(size, size), pad_shape=(size, size))] * num_imgs
    return gts, metas


def test_loss_and_gradients_equal_stock() -> None:
    """The switched head's ``loss_by_feat``: the same losses and the same
    gradients of the head's outputs as the stock head's."""
    head = copy.deepcopy(HEADS[80])
    fast = copy.deepcopy(head)
    outcome, _ = switch_targets(fast)
    assert str(outcome) == \
        'targets: RTMDetSepBNHead/DynamicSoftLabelAssigner batched'
    feats = _features(head, 4, 256, 0)
    gts, metas = _batch(4, 256, [5, 0, 17, 2], 0)
    grads = []
    for module in (head, fast):
        outs = module(feats)
        for tensor in (*outs[0], *outs[1]):
            tensor.retain_grad()
        losses = module.loss_by_feat(*outs, copy.deepcopy(gts), metas)
        total = sum(sum(v) for v in losses.values())
        total.backward()
        grads.append(([t.grad for t in (*outs[0], *outs[1])], losses))
    (stock_grads, stock_losses), (fast_grads, fast_losses) = grads
    for key in stock_losses:
        for a, b in zip(stock_losses[key], fast_losses[key]):
            assert torch.equal(a, b), key
    for a, b in zip(stock_grads, fast_grads):
        assert torch.equal(a, b)
    assert fast.fast_target_stats.samples == 4
    assert fast.fast_target_stats.stock == 0


def test_operations_do_not_grow_with_the_batch() -> None:
    """The targets: a fixed number of operations whatever the batch and box
    counts, no ``.item()``; the stock targets grow with both."""
    head = copy.deepcopy(HEADS[80])
    fast = copy.deepcopy(head)
    switch_targets(fast)
    phase = []
    fast.fast_target_stats.observer = lambda entering: phase.append(
        (entering, counter.total))
    totals, stock = {}, {}
    for num_imgs, counts in ((1, [4]), (2, [0, 9]), (8, [3, 30, 1,
                                                         0]), (16, [7])):
        feats = _features(head, num_imgs, 256, 1)
        gts, metas = _batch(num_imgs, 256, counts, 1)
        outs = head(feats)
        with OpCounter() as counter:  # the first run calibrates cpu_paths
            loss_by_feat(fast, *outs, gts, metas)
        with OpCounter() as counter:
            phase.clear()
            loss_by_feat(fast, *outs, gts, metas)
        (_, start), (_, end) = phase
        totals[num_imgs] = end - start
        assert counter.ops['_local_scalar_dense'] <= 5  # 3 GIoU, 2 average
        sizes, priors = _priors(head, 256, 256, 'cpu')
        anchors, valid = head.get_anchors(sizes, metas, device='cpu')
        flat_cls = torch.cat(
            [c.permute(0, 2, 3, 1).reshape(num_imgs, -1, 80) for c in outs[0]],
            1)
        flat_boxes = torch.zeros(num_imgs, flat_cls.shape[1], 4)
        with OpCounter() as counter:
            type(head).get_targets(head, flat_cls, flat_boxes, anchors, valid,
                                   gts, metas)
        stock[num_imgs] = counter.total
    assert len(set(totals.values())) == 1, totals
    assert stock[16] > 4 * stock[2] > 4 * totals[2], (stock, totals)


def test_supported() -> None:
    """Stock RTMDet heads with DSL are covered; the rest says why not."""
    assert rtmdet_supported(HEADS[80]) is None
    assert rtmdet_supported(HEADS[3]) is None

    class MyHead(type(HEADS[80])):
        pass

    sub = copy.deepcopy(HEADS[80])
    sub.__class__ = MyHead
    assert 'not RTMDetHead' in rtmdet_supported(sub)
    fp16 = _head(
        assigner=dict(
            type='DynamicSoftLabelAssigner',
            topk=13,
            iou_calculator=dict(type='BboxOverlaps2D', dtype='fp16')))
    assert 'BboxOverlaps2D' in rtmdet_supported(fp16)
    patched = copy.deepcopy(HEADS[80])
    patched._get_targets_single = lambda *a: None
    assert 'replaced' in rtmdet_supported(patched)
    other = _head(assigner=dict(type='SimOTAAssigner'))
    assert 'not DynamicSoftLabelAssigner' in rtmdet_supported(other)
