"""ATSSHead's losses over every level at once equal stock's per-level ones,
bit for bit, values and gradients (fast_parallel/step/targets/atss/losses.py).

Each case builds a batch (test_targets_atss's generator: images without
boxes, one box, more than a hundred, degenerate and duplicate boxes, boxes
past the image) and predictions from a seed, at logit scales from 1 to 40
(large logits reach the sigmoid's and BCE's saturated ends), and compares
the switched head's ``loss_by_feat`` with stock's ``ATSSHead.loss_by_feat``
on an unswitched twin: every level's three losses, then the gradients of
the summed loss with respect to every prediction, by bits. Levels as large
as 80 classes x 3,600 rows cross ATen's grain, so the CPU kernels split the
work between threads as they do in training.
"""
import random

import pytest
import torch
from mmengine.config import ConfigDict
from mmengine.logging import MessageHub
from mmengine.structures import InstanceData
from targets_utils import DEVICES
from test_targets_atss import (ATSS, GFL, TOOD, build_head, random_batch,
                               switched)

from fast_parallel.step.targets import atss, tood

pytestmark = pytest.mark.usefixtures('mmdet_scope')

CASES = 14


def twin_heads(num_classes: int = 80, config: str = ATSS, **head):
    """A stock head and a switched one of the same config."""
    stock = build_head(config, num_classes=num_classes, head=head)
    fast = switched(build_head(config, num_classes=num_classes, head=head))
    return stock, fast


def predictions(head,
                sizes,
                num_imgs: int,
                seed: int,
                scale: float,
                device: str,
                dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    anchors = head.num_base_priors

    def levels(channels):
        return [(torch.randn(num_imgs, channels, *size, generator=gen) *
                 scale).to(device, dtype) for size in sizes]

    if hasattr(head, 'integral'):  # GFL: a distribution per box side
        return (levels(anchors * head.cls_out_channels),
                levels(anchors * 4 * (head.reg_max + 1)))
    return (levels(anchors * head.cls_out_channels), levels(anchors * 4),
            levels(anchors))


def run(head, preds, gts, metas, loss_by_feat=None, sign=1.0):
    """The losses and the gradients of their sum (as mmengine's
    ``parse_losses`` adds them, times ``sign``: a negative upstream gradient
    makes stock's zero gradients negative zeros) for each prediction."""
    leaves = [[p.detach().clone().requires_grad_() for p in kind]
              for kind in preds]
    call = loss_by_feat or head.loss_by_feat
    losses = call(*leaves, gts, metas)
    total = sum(sum(v.mean() for v in value) for value in losses.values())
    (total * sign).backward()
    return losses, [[p.grad for p in kind] for kind in leaves]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def assert_same(ref, out) -> None:
    (ref_losses, ref_grads), (out_losses, out_grads) = ref, out
    assert sorted(ref_losses) == sorted(out_losses)
    for key, values in ref_losses.items():
        assert len(values) == len(out_losses[key]), key
        for level, (a, b) in enumerate(zip(values, out_losses[key])):
            assert a.dtype == b.dtype and a.shape == b.shape, (key, level)
            assert torch.equal(bits(a), bits(b)), (key, level, a, b)
    for kind, (ref_levels, out_levels) in enumerate(zip(ref_grads, out_grads)):
        for level, (a, b) in enumerate(zip(ref_levels, out_levels)):
            if a is None or b is None:  # a level no loss reads
                assert a is None and b is None, (kind, level)
                continue
            assert a.dtype == b.dtype and a.shape == b.shape, (kind, level)
            assert torch.equal(bits(a), bits(b)), (kind, level)


def stock_loss(head):
    return lambda *args: type(head).loss_by_feat(head, *args)


def compare(stock, fast, sizes, metas, gts, seed, scale, device='cpu'):
    preds = predictions(stock, sizes, len(metas), seed, scale, device)
    before = fast.fast_loss_stats.stock
    sign = -1.0 if seed % 2 else 1.0
    ref = run(stock, preds, gts, metas, stock_loss(stock), sign)
    out = run(fast, preds, gts, metas, sign=sign)
    assert_same(ref, out)
    return fast.fast_loss_stats.stock - before


HEADS = {}


def _heads(name):
    if name not in HEADS:
        HEADS[name] = {
            'atss':
            lambda: twin_heads(),
            'atss_options':
            lambda: twin_heads(
                num_classes=7,
                loss_cls=dict(
                    type='FocalLoss',
                    use_sigmoid=True,
                    gamma=1.5,
                    alpha=0.4,
                    loss_weight=0.7),
                loss_bbox=dict(type='GIoULoss', loss_weight=1.3, eps=1e-6),
                loss_centerness=dict(
                    type='CrossEntropyLoss', use_sigmoid=True, loss_weight=0.6)
            ),
            'gfl':
            lambda: twin_heads(config=GFL),
            'gfl_options':
            lambda: twin_heads(
                num_classes=9,
                config=GFL,
                reg_max=7,
                loss_cls=dict(
                    type='QualityFocalLoss',
                    use_sigmoid=True,
                    beta=1.5,
                    loss_weight=0.8),
                loss_dfl=dict(type='DistributionFocalLoss', loss_weight=0.3),
                loss_bbox=dict(type='GIoULoss', loss_weight=1.7),
                # strides that are not powers of two: divided per level
                anchor_generator=dict(
                    type='AnchorGenerator',
                    ratios=[1.0],
                    octave_base_scale=8,
                    scales_per_octave=1,
                    strides=[12, 24, 48, 96, 192])),
        }[name]()
    return HEADS[name]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name',
                         ['atss', 'atss_options', 'gfl', 'gfl_options'])
def test_losses_and_gradients_equal_stock(name, device):
    stock, fast = _heads(name)
    assert atss.loss_part(fast)[0].done
    stock_way = single = 0
    for seed in range(CASES):
        sizes, metas, gts = random_batch(seed, stock, device)
        scale = random.Random(seed).choice([1.0, 4.0, 12.0, 40.0])
        stock_way += compare(stock, fast, sizes, metas, gts, seed, scale,
                             device)
        single += len(metas) == 1
    # GFL's flattening of one image's scores is a strided view: stock's way
    assert single and stock_way == (single if 'gfl' in name else 0)


def test_levels_without_positives_and_a_batch_without_boxes():
    stock, fast = _heads('atss')
    sizes, metas, gts = random_batch(3, stock, 'cpu')
    # no box at all: every level takes stock's zero branch
    gts = [gt[gt.labels < 0] for gt in gts]
    assert compare(stock, fast, sizes, metas, gts, 0, 3.0) == 0
    # one small box: its positives are on the first levels only
    sizes, metas, gts = random_batch(5, stock, 'cpu')
    gts = [
        InstanceData(
            bboxes=torch.tensor([[10., 12., 30., 29.]])[:int(i == 0)],
            labels=torch.tensor([2])[:int(i == 0)]) for i in range(len(gts))
    ]
    assert compare(stock, fast, sizes, metas, gts, 1, 3.0) == 0


def level_positives(head, sizes, metas, gts):
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    labels = type(head).get_targets(head, anchors, valid, gts, metas)[1]
    return [int((level < head.num_classes).sum()) for level in labels]


@pytest.mark.parametrize('name', ['atss', 'gfl'])
def test_every_level_with_positives(name):
    """Large and small boxes on 640 px images: positives on all five
    levels (stock's coarse levels too), values and gradients by bits."""
    stock, fast = _heads(name)
    sizes = [torch.Size((640 // s, 640 // s)) for s in (8, 16, 32, 64, 128)]
    metas = [
        dict(
            img_shape=(640, 630),
            pad_shape=(640, 640),
            batch_input_shape=(640, 640))
    ] * 2
    # boxes of 40 to 1,020 px (one past the image: positives on P7)
    boxes = torch.tensor([[10., 20., 600., 630.], [100., 50., 500., 400.],
                          [5., 5., 60., 70.], [300., 300., 341., 330.],
                          [20., 200., 620., 560.], [200., 100., 330., 230.],
                          [1., 2., 639., 629.], [400., 420., 520., 600.],
                          [-190., -200., 830., 820.]])
    gts = [
        InstanceData(bboxes=boxes[:5], labels=torch.tensor([1, 5, 7, 2, 4])),
        InstanceData(
            bboxes=boxes[3:], labels=torch.tensor([3, 3, 9, 8, 0, 6]))
    ]
    assert all(level_positives(stock, sizes, metas, gts))
    for seed in (0, 1):  # a positive and a negative upstream gradient
        assert compare(stock, fast, sizes, metas, gts, seed, 5.0) == 0


def test_large_levels_cross_the_grain():
    """Levels of 3,600 rows x 80 classes (288,000 elements), over several
    threads: each level's sigmoid, BCE and sums as stock's."""
    stock, fast = _heads('atss')
    sizes, metas, gts = random_batch(11, stock, 'cpu')
    big = [torch.Size((60, 60)), torch.Size((30, 30)), torch.Size((15, 15))]
    sizes = big + sizes[3:]
    metas = [
        dict(
            m,
            pad_shape=(480, 480),
            batch_input_shape=(480, 480),
            img_shape=(470, 475)) for m in metas
    ]
    threads = torch.get_num_threads()
    try:
        for count in sorted({1, 2, 3, threads}):
            torch.set_num_threads(count)
            assert compare(stock, fast, sizes, metas, gts, count, 8.0) == 0
    finally:
        torch.set_num_threads(threads)


def _wrap_targets(head, change):
    """Puts a ``get_targets`` on ``head`` (this test's instance) that
    changes the batched targets' box targets with ``change``."""
    batched = head.get_targets

    def get_targets(*args, **kwargs):
        out = list(batched(*args, **kwargs))
        labels, boxes = out[1], out[3]
        out[3] = [
            change(level, label, box.clone())
            for level, (label, box) in enumerate(zip(labels, boxes))
        ]
        return tuple(out)

    head.get_targets = get_targets
    return batched


def test_zero_box_weights_take_stocks_branch_counted():
    """Every positive of a level with centerness 0 (its anchor's centre on
    the box's edge): stock's GIoULoss returns ``(pred * weight).sum()``;
    the level's losses are then computed the stock way, counted."""
    stock, fast = twin_heads(num_classes=5)
    sizes, metas, gts = random_batch(7, stock, 'cpu', kinds=['normal'])
    anchors = stock.prior_generator.grid_priors(sizes, device='cpu')

    def on_edge(level, labels, boxes):
        if level == 1:
            pos = (labels >= 0) & (labels < 5)
            centre_x = (anchors[level][:, 0] + anchors[level][:, 2]) / 2
            boxes[..., 0] = torch.where(pos, centre_x.expand_as(pos),
                                        boxes[..., 0])
        return boxes

    for head in (stock, fast):
        _wrap_targets(head, on_edge)
    preds = predictions(stock, sizes, len(metas), 0, 2.0, 'cpu')
    ref = run(stock, preds, gts, metas, stock_loss(stock))
    before = fast.fast_loss_stats.stock
    out = run(fast, preds, gts, metas)
    assert fast.fast_loss_stats.stock == before + 1
    assert_same(ref, out)
    assert ref[0]['loss_bbox'][1].item() == 0


def test_nan_box_targets_raise_stocks_assertion():
    stock, fast = twin_heads(num_classes=5)
    sizes, metas, gts = random_batch(2, stock, 'cpu', kinds=['normal'])

    def nan(level, labels, boxes):
        boxes[(labels >= 0) & (labels < 5)] = float('nan')
        return boxes

    for head in (stock, fast):
        _wrap_targets(head, nan)
    preds = predictions(stock, sizes, len(metas), 0, 2.0, 'cpu')
    with pytest.raises(AssertionError):
        run(stock, preds, gts, metas, stock_loss(stock))
    with pytest.raises(AssertionError):
        run(fast, preds, gts, metas)


def test_nan_predictions_give_stocks_bits():
    stock, fast = _heads('atss')
    sizes, metas, gts = random_batch(4, stock, 'cpu')
    preds = predictions(stock, sizes, len(metas), 4, 3.0, 'cpu')
    for kind in preds:
        kind[1].view(-1)[::97] = float('nan')
        kind[2].view(-1)[::31] = float('inf')
    ref = run(stock, preds, gts, metas, stock_loss(stock))
    out = run(fast, preds, gts, metas)
    assert_same(ref, out)


def test_inputs_and_options_not_covered_go_stocks_way_counted():
    stock, fast = _heads('atss')
    sizes, metas, gts = random_batch(1, stock, 'cpu')
    preds = predictions(stock, sizes, len(metas), 1, 2.0, 'cpu', torch.float64)
    before = fast.fast_loss_stats.stock
    assert_same(
        run(stock, preds, gts, metas, stock_loss(stock)),
        run(fast, preds, gts, metas))
    assert fast.fast_loss_stats.stock == before + 1
    # GFL reads its sizes from the scores: an extra box level is dropped
    gfl = _heads('gfl')
    sizes, metas, gts = random_batch(2, gfl[0], 'cpu')
    cls, boxes = predictions(gfl[0], sizes, len(metas), 3, 2.0, 'cpu')
    preds = (cls, boxes + [boxes[-1]])
    before = gfl[1].fast_loss_stats.stock
    assert_same(
        run(gfl[0], preds, gts, metas, stock_loss(gfl[0])),
        run(gfl[1], preds, gts, metas))
    assert gfl[1].fast_loss_stats.stock == before + 1
    iou = twin_heads(num_classes=3, loss_bbox=dict(type='IoULoss'))
    assert atss.loss_reason(iou[1]) == 'loss_bbox is not GIoULoss'
    sizes, metas, gts = random_batch(1, iou[0], 'cpu')
    assert compare(*iou, sizes, metas, gts, 2, 2.0) == 1
    ctr_clamp = build_head(
        ATSS,
        head=dict(
            bbox_coder=ConfigDict(
                type='DeltaXYWHBBoxCoder',
                target_means=[.0, .0, .0, .0],
                target_stds=[0.1, 0.1, 0.2, 0.2],
                add_ctr_clamp=True)))
    assert atss.loss_reason(ctr_clamp) == \
        'bbox_coder is not a plain DeltaXYWHBBoxCoder'
    hooked = build_head(ATSS)
    hooked.loss_cls.register_forward_hook(lambda *args: None)
    assert atss.loss_reason(hooked) == \
        'a loss module with hooks or its own forward'
    assert 'ATSSHead losses over levels at once' in str(
        atss.loss_part(fast)[0])


def tood_predictions(head, sizes, num_imgs: int, seed: int, scale: float):
    """Class probabilities (TOOD's head outputs them) and boxes in stride
    units around each location."""
    gen = torch.Generator().manual_seed(seed)
    probs, boxes = [], []
    for height, width in sizes:
        logits = torch.randn(
            num_imgs, head.num_classes, height, width, generator=gen) * scale
        probs.append(logits.sigmoid())
        ys, xs = torch.meshgrid(
            torch.arange(height), torch.arange(width), indexing='ij')
        centre = torch.stack([xs, ys]).float() + 0.5
        half = torch.rand(num_imgs, 2, height, width, generator=gen) * 3 + .2
        shift = torch.randn(num_imgs, 2, height, width, generator=gen) * .3
        boxes.append(
            torch.cat([centre + shift - half, centre + shift + half], 1))
    return probs, boxes


@pytest.mark.parametrize('epoch', [0, 4, 11])
def test_tood_losses_and_gradients_equal_stock_in_every_epoch(epoch):
    """TOODHead's focal loss on probabilities (initial epochs) and quality
    focal loss on the alignment metrics (then), and the GIoU of its
    positives, at once: stock's values and gradients."""
    stock, fast = twin_heads(num_classes=6, config=TOOD)
    assert tood.loss_part(fast)[0].done
    MessageHub.get_current_instance().update_info('epoch', epoch)
    stock_way = 0
    for seed in range(8):
        sizes, metas, gts = random_batch(seed, stock, 'cpu')
        preds = tood_predictions(stock, sizes, len(metas), seed,
                                 [1.0, 6.0, 40.0][seed % 3])
        before = fast.fast_loss_stats.stock
        sign = -1.0 if seed % 2 else 1.0
        ref = run(stock, preds, gts, metas, stock_loss(stock), sign)
        out = run(fast, preds, gts, metas, sign=sign)
        assert_same(ref, out)
        stock_way += fast.fast_loss_stats.stock - before
    assert fast.epoch == epoch and stock_way == 0
