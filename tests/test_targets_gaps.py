"""Inputs where the batched targets must follow stock exactly: RTMDet with
ground-truth masks, and images without a prior / anchor inside them
(``allowed_border >= 0``), where stock raises.

Each case runs stock's head and a copy switched with ``switch_targets`` on
the same inputs: the losses and every gradient must be equal bit for bit,
or both must raise the same exception type with the same message.
"""
import copy
import random

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.config import ConfigDict
from mmengine.hub import get_config
from mmengine.structures import InstanceData

from fast_parallel.step.targets.switch import switch_targets

register_all_modules()
RTMDET = 'mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py'
RETINA = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
FASTER = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def _build(which: str, num_classes: int = 1, **train) -> torch.nn.Module:
    if which in ('rtmdet', 'retina'):
        model = get_config(RTMDET if which == 'rtmdet' else RETINA).model
        cfg = dict(
            model.bbox_head,
            num_classes=num_classes,
            train_cfg=model.train_cfg)
    else:
        model = get_config(FASTER).model
        cfg = dict(model.rpn_head, train_cfg=model.train_cfg.rpn)
    cfg = copy.deepcopy(cfg)
    cfg['train_cfg'] = ConfigDict(dict(cfg['train_cfg'], **train))
    torch.manual_seed(0)
    return MODELS.build(cfg)


def _switched(head):
    fast = copy.deepcopy(head)
    _, stats = switch_targets(fast)
    assert len(stats) == 1, 'the head was not switched'
    return fast, stats[0]


def _outcome(head, cls_scores, bbox_preds, gts, metas):
    """Losses and gradients, or the exception's type and message."""
    cls = [c.clone().requires_grad_() for c in cls_scores]
    box = [b.clone().requires_grad_() for b in bbox_preds]
    random.seed(1)
    torch.manual_seed(1)
    try:
        losses = head.loss_by_feat(cls, box, copy.deepcopy(gts), metas)
    except Exception as e:  # noqa: BLE001 - compared with stock's
        return ('raised', type(e), str(e))
    total = sum(
        sum(v) if isinstance(v, (list, tuple)) else v for v in losses.values())
    total.backward()
    return losses, [t.grad for t in cls + box]


def _bits(t):
    return t.detach().contiguous().view(-1).view(torch.int32) \
        if t.dtype == torch.float32 else t


def assert_same_outcome(stock, fast):
    if stock[0] == 'raised' or fast[0] == 'raised':
        assert fast == stock
        return
    (stock_losses, stock_grads), (fast_losses, fast_grads) = stock, fast
    assert list(stock_losses) == list(fast_losses)
    for key in stock_losses:
        a, b = stock_losses[key], fast_losses[key]
        a = a if isinstance(a, (list, tuple)) else [a]
        b = b if isinstance(b, (list, tuple)) else [b]
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(_bits(x), _bits(y)), key
    for x, y in zip(stock_grads, fast_grads):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(_bits(x), _bits(y))


def _levels(strides, pad, channels, value, batch=1):
    return [
        torch.full((batch, channels, -(-pad // s), -(-pad // s)), value)
        for s in strides
    ]


def _meta(img, pad):
    return dict(
        img_shape=(img, img),
        pad_shape=(pad, pad),
        batch_input_shape=(pad, pad))


def test_rtmdet_with_gt_masks_centres_them_as_stock():
    # issue 37's reproduction: the masks' centre of mass, not the box's
    head = _build('rtmdet', num_classes=1)
    fast, stats = _switched(head)
    mask = torch.zeros(1, 64, 64, dtype=torch.bool)
    mask[0, 8:40, 8:16] = True
    gts = [
        InstanceData(
            bboxes=torch.tensor([[8., 8., 40., 40.]]),
            labels=torch.tensor([0]),
            masks=mask)
    ]
    cls = _levels((8, 16, 32), 64, 1, 0.)
    box = _levels((8, 16, 32), 64, 4, 16.)
    stock = _outcome(head, cls, box, gts, [_meta(64, 64)])
    assert stock[0] != 'raised'
    assert_same_outcome(stock, _outcome(fast, cls, box, gts, [_meta(64, 64)]))
    assert (stats.samples, stats.stock) == (1, 1)  # that image, counted


@pytest.mark.parametrize('seed', range(6))
def test_rtmdet_batches_mixing_masked_and_plain_images(seed):
    gen = torch.Generator().manual_seed(seed)
    head = _build('rtmdet', num_classes=3)
    fast, _ = _switched(head)
    gts, metas = [], []
    for i in range(3):
        n = int(torch.randint(0, 4, (1, ), generator=gen))
        xy = torch.rand(n, 2, generator=gen) * 40
        boxes = torch.cat([xy, xy + 4 + torch.rand(n, 2, generator=gen) * 20],
                          1)
        gt = InstanceData(
            bboxes=boxes, labels=torch.randint(0, 3, (n, ), generator=gen))
        if i != seed % 3:
            gt.masks = torch.rand(n, 64, 64, generator=gen) > 0.7
        gts.append(gt)
        metas.append(_meta(64, 64))
    cls = [
        torch.randn(3, 3, 64 // s, 64 // s, generator=gen) for s in (8, 16, 32)
    ]
    box = [
        torch.rand(3, 4, 64 // s, 64 // s, generator=gen) * 30 + 1
        for s in (8, 16, 32)
    ]
    assert_same_outcome(
        _outcome(head, cls, box, gts, metas),
        _outcome(fast, cls, box, gts, metas))


@pytest.mark.parametrize('img', [6, 24, 64])
def test_rtmdet_image_without_a_prior_inside_raises_as_stock(img):
    head = _build('rtmdet', num_classes=1, allowed_border=0)
    fast, _ = _switched(head)
    gts = [
        InstanceData(
            bboxes=torch.tensor([[1., 1., 5., 5.]]), labels=torch.tensor([0]))
    ]
    cls = _levels((8, 16, 32), 64, 1, 0.)
    box = _levels((8, 16, 32), 64, 4, 16.)
    stock = _outcome(head, cls, box, gts, [_meta(img, 64)])
    # RTMDet's priors are (x, y, stride, stride): inside needs stride < 6
    assert (stock[0] == 'raised') == (img == 6)
    assert_same_outcome(stock, _outcome(fast, cls, box, gts, [_meta(img, 64)]))


@pytest.mark.parametrize('which', ['retina', 'rpn'])
@pytest.mark.parametrize('img', [20, 64])
def test_anchor_heads_without_an_anchor_inside_raise_as_stock(which, img):
    head = _build(which, allowed_border=0)
    fast, _ = _switched(head)
    strides = head.prior_generator.strides
    anchors = head.num_base_priors
    gts = [
        InstanceData(
            bboxes=torch.tensor([[2., 2., 18., 18.]]),
            labels=torch.tensor([0]))
    ]
    cls = _levels([s[0] for s in strides], 64, anchors * head.cls_out_channels,
                  0.)
    box = _levels([s[0] for s in strides], 64, anchors * 4, 0.1)
    metas = [_meta(img, 64)]
    stock = _outcome(head, cls, box, gts, metas)
    if img == 20:
        assert stock[0] == 'raised' and stock[1] is ValueError
    assert_same_outcome(stock, _outcome(fast, cls, box, gts, metas))


@pytest.mark.parametrize('label', [5, -1, 1])
@pytest.mark.parametrize('far', [False, True])
def test_rtmdet_labels_out_of_range_raise_where_stock_one_hots(label, far):
    # stock one-hots the labels of an image with a prior inside a ground
    # truth (and raises for one outside [0, C)); an image without one never
    # reads them
    head = _build('rtmdet', num_classes=2)
    fast, _ = _switched(head)
    box = [[8., 8., 40., 40.]] if not far else [[300., 300., 340., 340.]]
    gts = [
        InstanceData(
            bboxes=torch.tensor([[4., 4., 30., 30.]]),
            labels=torch.tensor([0])),
        InstanceData(bboxes=torch.tensor(box), labels=torch.tensor([label]))
    ]
    gen = torch.Generator().manual_seed(3)
    cls = [
        torch.randn(2, 2, 64 // s, 64 // s, generator=gen) for s in (8, 16, 32)
    ]
    boxes = [
        torch.rand(2, 4, 64 // s, 64 // s, generator=gen) * 30 + 1
        for s in (8, 16, 32)
    ]
    metas = [_meta(64, 64)] * 2
    stock = _outcome(head, cls, boxes, gts, metas)
    assert (stock[0] == 'raised') == (label != 1 and not far)
    assert_same_outcome(stock, _outcome(fast, cls, boxes, gts, metas))


@pytest.mark.parametrize('which', ['rtmdet', 'retina', 'rpn'])
def test_metas_without_img_shape_raise_as_stock(which):
    head = _build(which)
    fast, _ = _switched(head)
    gts = [
        InstanceData(
            bboxes=torch.tensor([[2., 2., 18., 18.]]),
            labels=torch.tensor([0]))
    ]
    if which == 'rtmdet':
        strides, channels = (8, 16, 32), (1, 4)
    else:
        strides = [s[0] for s in head.prior_generator.strides]
        channels = (head.num_base_priors * head.cls_out_channels,
                    head.num_base_priors * 4)
    cls = _levels(strides, 64, channels[0], 0.)
    box = _levels(strides, 64, channels[1], 1.)
    metas = [dict(pad_shape=(64, 64), batch_input_shape=(64, 64))]
    stock = _outcome(head, cls, box, gts, metas)
    assert stock[0] == 'raised' and stock[1] is KeyError
    assert_same_outcome(stock, _outcome(fast, cls, box, gts, metas))
