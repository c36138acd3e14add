"""Batched Hungarian matching and DETR targets equal stock's, bit for bit
(fast_parallel/step/targets/hungarian/).

The heads are built from mmdet's own DINO, Deformable DETR and DETR configs.
Each generated batch (0, 1 and > 100 ground truths per image, more ground
truths than queries, duplicate and zero-width boxes, equal costs, mixed
counts, float16 / bfloat16 predictions) goes through stock's per-image code
and the batched one: targets, losses and the gradients they give must be
equal to the bit.
"""
import copy
import re
from typing import List

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from mmdet.utils import register_all_modules
from mmengine.hub import get_config
from mmengine.structures import InstanceData
from targets_utils import DEVICES, small_parity

from fast_parallel.step.targets import hungarian
from fast_parallel.step.targets.hungarian import match as match_module
from fast_parallel.step.targets.hungarian.costs import batch_costs
from fast_parallel.step.targets.hungarian.dn import dn_targets
from fast_parallel.step.targets.hungarian.match import (detr_targets,
                                                        image_factors)
from fast_parallel.step.targets.padding import pad_gts
from fast_parallel.step.targets.stats import TargetStats

register_all_modules()
DINO = 'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py'
DEFORMABLE = ('mmdet::deformable_detr/'
              'deformable-detr-refine-twostage_r50_16xb2-50e_coco.py')
DETR = 'mmdet::detr/detr_r18_8xb2-500e_coco.py'

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def build_head(config: str, device: str = 'cpu', **head) -> torch.nn.Module:
    """The config's bbox head with its train_cfg, switched like the hook."""
    model = get_config(config).model
    cfg = copy.deepcopy(dict(model.bbox_head, train_cfg=model.train_cfg))
    cfg.update(head)
    if cfg['type'] in ('DeformableDETRHead', 'DINOHead'):
        cfg.setdefault('share_pred_layer', False)
        cfg.setdefault('num_pred_layer', 7)
    built = MODELS.build(cfg).to(device)
    assert hungarian.supported(built) is None
    built.fast_target_stats = TargetStats(type(built).__name__, 'images')
    return built


def random_gts(gen: torch.Generator, counts: List[int], shapes: list,
               num_classes: int, device: str) -> List[InstanceData]:
    """Boxes inside each image, some duplicated, some of zero width."""
    out = []
    for count, (h, w) in zip(counts, shapes):
        xy = torch.rand(count, 2, generator=gen) * torch.tensor([w, h]) * 0.8
        wh = torch.rand(count, 2, generator=gen) * torch.tensor([w, h]) * 0.5
        boxes = torch.cat([xy, xy + wh], 1)
        if count > 2:
            boxes[1] = boxes[0]  # a duplicate
            boxes[2, 2] = boxes[2, 0]  # zero width
        labels = torch.randint(0, num_classes, (count, ), generator=gen)
        out.append(
            InstanceData(bboxes=boxes.to(device), labels=labels.to(device)))
    return out


def random_batch(seed: int,
                 num_queries: int,
                 num_classes: int,
                 device: str,
                 dtype=torch.float32,
                 ties: bool = False):
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 5, (1, ), generator=gen))
    pool = [0, 1, 3, 7, num_queries + 5, 120]
    counts = [
        pool[int(i)]
        for i in torch.randint(0, len(pool), (batch, ), generator=gen)
    ]
    shapes = [(int(h), int(w))
              for h, w in torch.randint(200, 1400, (batch, 2), generator=gen)]
    metas = [dict(img_shape=s) for s in shapes]
    gts = random_gts(gen, counts, shapes, num_classes, device)
    # float16's sigmoid is 1 past ~8.3, its focal cost then inf: keep most
    # batches finite there
    spread = 3 if dtype == torch.float32 else 1.5
    scores = torch.randn(
        batch, num_queries, num_classes, generator=gen) * spread
    boxes = torch.rand(batch, num_queries, 4, generator=gen)
    if ties:  # equal rows: equal costs for two queries of every image
        scores[:, 1] = scores[:, 0]
        boxes[:, 1] = boxes[:, 0]
    return (scores.to(device, dtype), boxes.to(device, dtype), gts, metas)


def bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.device == b.device
        assert torch.equal(bits(a), bits(b))
    else:
        assert a == b


def stock_targets(head, scores, boxes, gts, metas):
    out = type(head).get_targets(head, list(scores), list(boxes), gts, metas)
    return [torch.cat(t) for t in out[:4]] + list(out[4:])


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize(
    'config,num_classes', [(DINO, 80), (DINO, 7), (DETR, 80), (DETR, 6)],
    ids=['focal', 'focal-7', 'classification', 'classification-6'])
def test_targets_equal_stock(config, num_classes, device):
    head = build_head(config, device, num_classes=num_classes)
    for seed in range(12):
        queries = [30, 9, 450][seed % 3]
        scores, boxes, gts, metas = random_batch(
            seed, queries, num_classes, device, ties=seed % 4 == 1)
        stock = stock_targets(head, scores, boxes, gts, metas)
        fast = detr_targets(head, list(scores), boxes, gts, metas)
        for a, b in zip(stock, fast):
            assert_same(a, b)


def stock_cost(head, scores, boxes, gt, meta):
    """``HungarianAssigner.assign``'s matrix for one image: its costs on
    ``_get_targets_single``'s predictions, stacked and summed."""
    h, w = meta['img_shape']
    factor = boxes.new_tensor([w, h, w, h]).unsqueeze(0)
    pred = InstanceData(
        scores=scores, bboxes=bbox_cxcywh_to_xyxy(boxes) * factor)
    return torch.stack([
        cost(pred_instances=pred, gt_instances=gt, img_meta=meta)
        for cost in head.assigner.match_costs
    ]).sum(dim=0)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
@pytest.mark.parametrize('config', [DINO, DETR])
def test_cost_matrices_equal_stock(config, dtype, device):
    # 7 classes: an image's Q x C scores end in a scalar-loop tail on the
    # CPU (sigmoid's differs from the vector loop in the last bit), at other
    # places than the batch's; 4700 x 7 > 32768: images computed in chunks
    head = build_head(config, device, num_classes=7)
    for seed in range(8):
        queries = [30, 9, 4700, 333][seed % 4]
        scores, boxes, gts, metas = random_batch(200 + seed, queries, 7,
                                                 device, dtype)
        if not any(len(g) for g in gts):
            continue
        pad = pad_gts([g.bboxes for g in gts], [g.labels for g in gts],
                      torch.device(device), 1)
        factor = image_factors(boxes, metas)
        cost = batch_costs(head.assigner, list(scores),
                           bbox_cxcywh_to_xyxy(boxes) * factor, pad,
                           image_factors(pad.boxes, metas))
        for i, gt in enumerate(gts):
            if len(gt):
                assert_same(
                    stock_cost(head, scores[i], boxes[i], gt, metas[i]),
                    cost[i, :, :len(gt)].contiguous())


def _losses_and_grads(fn, head, scores, boxes, *args):
    """The losses and gradients, or the error raised (stock's, e.g. scipy's
    for a float16 cost matrix that overflowed)."""
    scores = scores.clone().requires_grad_()
    boxes = boxes.clone().requires_grad_()
    try:
        losses = fn(head, scores, boxes, *args)
    except (ValueError, RuntimeError) as error:
        return [type(error), str(error)]
    sum(losses).backward()
    return [*losses, scores.grad, boxes.grad]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('dtype',
                         [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize('config', [DINO, DEFORMABLE, DETR])
def test_loss_by_feat_single_equals_stock(config, dtype, device):
    head = build_head(config, device, num_classes=7)
    classes = head.cls_out_channels
    raised = 0
    for seed in range(4):
        scores, boxes, gts, metas = random_batch(100 + seed, 25, classes,
                                                 device, dtype, seed == 2)
        stock = _losses_and_grads(
            type(head).loss_by_feat_single, head, scores, boxes, gts, metas)
        stats = head.fast_target_stats
        before = stats.stock
        fast = _losses_and_grads(hungarian.loss_by_feat_single, head, scores,
                                 boxes, gts, metas)
        assert stats.stock == before  # every image batched
        assert len(stock) == len(fast)
        for a, b in zip(stock, fast):
            assert_same(a, b)
        raised += len(stock) == 2
    assert raised < 4  # losses were compared


@pytest.mark.parametrize('device', DEVICES)
def test_dn_targets_and_loss_equal_stock(device):
    head = build_head(DINO, device)
    for seed in range(8):
        gen = torch.Generator().manual_seed(seed)
        batch = 1 + seed % 4
        counts = [[0, 1, 5, 120][int(i)]
                  for i in torch.randint(0, 4, (batch, ), generator=gen)]
        shapes = [(300 + 37 * i, 500 - 11 * i) for i in range(batch)]
        metas = [dict(img_shape=s) for s in shapes]
        gts = random_gts(gen, counts, shapes, 80, device)
        most = max(counts)
        groups = max(1, 100 // max(most, 1))
        dn_meta = dict(
            num_denoising_queries=2 * most * groups,
            num_denoising_groups=groups)
        stock = type(head).get_dn_targets(head, gts, metas, dn_meta)
        stock = [torch.cat(t) for t in stock[:4]] + list(stock[4:])
        fast = dn_targets(head, gts, metas, dn_meta)
        for a, b in zip(stock, fast):
            assert_same(a, b)
        queries = dn_meta['num_denoising_queries']
        scores = torch.randn(batch, queries, 80, generator=gen).to(device)
        boxes = torch.rand(batch, queries, 4, generator=gen).to(device)
        stock = _losses_and_grads(
            type(head)._loss_dn_single, head, scores, boxes, gts, metas,
            dn_meta)
        fast = _losses_and_grads(hungarian.loss_dn_single, head, scores, boxes,
                                 gts, metas, dn_meta)
        for a, b in zip(stock, fast):
            assert_same(a, b)


def test_nan_costs_raise_stocks_error():
    head = build_head(DINO)
    scores, boxes, gts, metas = random_batch(3, 20, 80, 'cpu')
    while not len(gts[0]):
        scores, boxes, gts, metas = random_batch(4, 20, 80, 'cpu')
    scores[0, 3, 0] = float('nan')
    scores[0, 3] = float('nan')
    errors = []
    for fn in (type(head).loss_by_feat_single, hungarian.loss_by_feat_single):
        with pytest.raises(ValueError) as info:
            fn(head, scores, boxes, gts, metas)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def _all_layers(seed: int,
                head,
                layers: int,
                queries: int,
                dn: int,
                dtype=torch.float32):
    """A head's ``loss_by_feat`` inputs: every layer's outputs (``dn``
    denoising queries first), the encoder's, ground truths and metas."""
    scores, boxes, gts, metas = random_batch(seed, queries + dn,
                                             head.cls_out_channels, 'cpu',
                                             dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    batch = scores.shape[0]
    noise = torch.randn(layers, 1, 1, 1, generator=gen).to(dtype)
    all_scores = scores[None] + noise
    all_boxes = (boxes[None] + noise.abs() * 0.01).clamp(0, 1)
    enc = (torch.randn(batch, queries, head.cls_out_channels,
                       generator=gen).to(dtype),
           torch.rand(batch, queries, 4, generator=gen).to(dtype))
    return all_scores, all_boxes, enc, gts, metas


def _head_losses(head, args):
    tensors = sum(isinstance(a, torch.Tensor) for a in args)
    leaves = [a.clone().requires_grad_() for a in args[:tensors]]
    losses = head.loss_by_feat(*leaves, *args[tensors:])
    sum(losses.values()).backward()
    return losses, [t.grad for t in leaves]


@pytest.mark.parametrize('config', [DINO, DEFORMABLE, DETR])
def test_loss_by_feat_plans_every_layer_and_equals_stock(config, monkeypatch):
    """The switched head (its loss_by_feat plans the layers' matching in one
    host copy) against an untouched copy of it: every loss and gradient."""
    from fast_parallel.step.targets.hungarian.layers import (_layers,
                                                             plan_layers)
    from fast_parallel.step.targets.switch import COVERED, install
    stock_head = build_head(config, num_classes=7)
    del stock_head.fast_target_stats
    head = copy.deepcopy(stock_head)
    install(head, next(c for c in COVERED if c.head == type(head).__name__))
    dino = type(head).__name__ == 'DINOHead'
    for seed in range(3):
        all_scores, all_boxes, enc, gts, metas = _all_layers(
            300 + seed, head, 6, 20, 12 if dino else 0)
        if dino:
            dn_meta = dict(num_denoising_queries=12, num_denoising_groups=2)
            gts = [g[:6] for g in gts]  # at most half a group each
            args = (all_scores, all_boxes, *enc, gts, metas, dn_meta)
        elif 'Deformable' in type(head).__name__:
            args = (all_scores, all_boxes, *enc, gts, metas)
        else:
            args = (all_scores, all_boxes, gts, metas)
        stock = _head_losses(stock_head, args)
        before = head.fast_target_stats.stock
        with monkeypatch.context() as patch:
            if 'Deformable' not in type(head).__name__:  # its encoder's
                # proposals have other labels: matched on their own
                patch.setattr(match_module, 'hungarian_match', _unplanned)
            fast = _head_losses(head, args)
        assert head.fast_target_stats.stock == before
        assert list(stock[0]) == list(fast[0])
        for key in stock[0]:
            assert_same(stock[0][key], fast[0][key])
        for a, b in zip(stock[1], fast[1]):
            assert_same(a, b)
        # the plan holds every layer (and DINO's encoder), each match the
        # one a layer's own matching finds
        names = signature_names(type(head).loss_by_feat)
        layers = _layers(head, dict(zip(names, (head, ) + args)))
        plan = plan_layers(head, layers, gts, metas)
        if any(len(g) for g in gts):
            assert len(plan.matches) == len(layers) == 6 + dino
        for scores, boxes in layers:
            planned = plan.match(scores, boxes, gts)
            if planned is None:
                continue
            alone = detr_targets(head, list(scores), boxes, gts, metas)
            joint = detr_targets(head, list(scores), boxes, gts, metas,
                                 plan.pad, planned)
            for a, b in zip(alone, joint):
                assert_same(a, b)


def _unplanned(*args):
    raise AssertionError('a layer was matched outside the plan')


def signature_names(fn) -> list:
    import inspect
    return list(inspect.signature(fn).parameters)


def test_dino_parity_through_the_runner(sample_data, tmp_path, capsys):
    """tools/parity.py on mmdet's DINO config (the sample COCO images at
    320 px, batch 2): stock and fast train to the same losses, gradient
    norms and parameters, the head's targets batched for every image."""
    logs = small_parity(DINO, [
        "dict(type='RandomFlip', prob=0.5)",
        "dict(type='Resize', scale=(320, 320), keep_ratio=True)"
    ], sample_data, tmp_path, capsys)
    assert 'targets: DINOHead/HungarianAssigner batched' in logs
    # per layer and decoder call: 6 layers + the encoder's proposals + 6
    # denoising layers, 2 images each, 2 iterations
    assert ('DINOHead/HungarianAssigner batched for 52 of 52 images, 0 '
            'computed the stock way') in logs
    # the detector's denoising queries: 2 iterations of one batch each
    assert 'CdnQueryGenerator batched' in logs
    assert ('CdnQueryGenerator batched for 2 of 2 batches, 0 computed the '
            'stock way') in logs


@pytest.mark.parametrize('config, head', [(DEFORMABLE, 'DeformableDETRHead'),
                                          (DETR, 'DETRHead')])
def test_deformable_detr_and_detr_parity_through_the_runner(
        config, head, sample_data, tmp_path, capsys):
    """tools/parity.py on mmdet's two-stage refined Deformable DETR and
    DETR R-18 configs, as the DINO run: IDENTICAL, every image batched."""
    logs = small_parity(config, [
        "dict(type='RandomFlip', prob=0.5)",
        "dict(type='Resize', scale=(320, 320), keep_ratio=True)"
    ], sample_data, tmp_path, capsys)
    assert f'targets: {head}/HungarianAssigner batched' in logs
    assert re.search(
        f'{head}/HungarianAssigner batched for ([0-9]+) of \\1 images, 0 '
        'computed the stock way', logs), logs[-2000:]


def test_loss_modules_with_hooks_are_called_as_modules():
    """The GIoU / L1 losses' own device syncs are decided on the host only
    where calling the module would run nothing but its forward."""
    head = build_head(DINO, num_classes=7)
    seen = []
    handle = head.loss_iou.register_forward_hook(
        lambda module, args, out: seen.append(out))
    try:
        scores, boxes, gts, metas = random_batch(5, 20, 7, 'cpu')
        stock = _losses_and_grads(
            type(head).loss_by_feat_single, head, scores, boxes, gts, metas)
        fast = _losses_and_grads(hungarian.loss_by_feat_single, head, scores,
                                 boxes, gts, metas)
    finally:
        handle.remove()
    assert len(seen) == 2  # once for stock, once for the batched path
    for a, b in zip(stock, fast):
        assert_same(a, b)
    from fast_parallel.compat.targets import runs_forward_only
    assert runs_forward_only(head.loss_iou)
    head.loss_bbox.forward = head.loss_bbox.forward
    assert not runs_forward_only(head.loss_bbox)


@pytest.mark.parametrize('config', [DINO, DETR])
def test_a_batch_without_ground_truths_equals_stock(config):
    """No image has a ground truth: no matching; every query background,
    the box losses stock's zero sums (no positive weight)."""
    head = build_head(config, num_classes=7)
    scores, boxes, _, metas = random_batch(9, 12, head.cls_out_channels, 'cpu')
    gts = [
        InstanceData(
            bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
        for _ in metas
    ]
    stock = _losses_and_grads(
        type(head).loss_by_feat_single, head, scores, boxes, gts, metas)
    fast = _losses_and_grads(hungarian.loss_by_feat_single, head, scores,
                             boxes, gts, metas)
    assert len(stock) == 5
    for a, b in zip(stock, fast):
        assert_same(a, b)


def test_negative_labels_count_from_the_last_score_column():
    """Stock's ``scores[:, labels]``: label -1 reads the last column (on
    CUDA mmcv's focal loss trains on such labels); out of ``[-C, C)``
    stock raises, and so does the batched path, by going stock's way."""
    head = build_head(DINO, num_classes=7)
    scores, boxes, gts, metas = random_batch(11, 15, 7, 'cpu')
    while not len(gts[0]):
        scores, boxes, gts, metas = random_batch(12, 15, 7, 'cpu')
    gts[0].labels[0] = -1
    if len(gts[0]) > 1:
        gts[0].labels[1] = -7
    for i, gt in enumerate(gts):
        if len(gt):
            pad = pad_gts([g.bboxes for g in gts], [g.labels for g in gts],
                          torch.device('cpu'), 1)
            cost = batch_costs(
                head.assigner, list(scores),
                bbox_cxcywh_to_xyxy(boxes) * image_factors(boxes, metas), pad,
                image_factors(pad.boxes, metas))
            assert_same(
                stock_cost(head, scores[i], boxes[i], gt, metas[i]),
                cost[i, :, :len(gt)].contiguous())
    stock = stock_targets(head, scores, boxes, gts, metas)
    fast = detr_targets(head, list(scores), boxes, gts, metas)
    for a, b in zip(stock, fast):
        assert_same(a, b)
    gts[0].labels[0] = 7  # past the last column: stock's IndexError
    errors = []
    for fn in (type(head).loss_by_feat_single, hungarian.loss_by_feat_single):
        with pytest.raises(IndexError) as info:
            fn(head, scores, boxes, gts, metas)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_layers_sharing_scores_keep_their_own_boxes():
    """Two layers whose scores are one tensor (an expanded view) but whose
    boxes differ: each layer is matched with its own boxes."""
    from fast_parallel.step.targets.hungarian.layers import plan_layers
    head = build_head(DETR, num_classes=7)
    scores, boxes, gts, metas = random_batch(13, 20, head.cls_out_channels,
                                             'cpu')
    while not any(len(g) for g in gts):
        scores, boxes, gts, metas = random_batch(14, 20, head.cls_out_channels,
                                                 'cpu')
    layered = scores[None].expand(3, *scores.shape)
    other = torch.rand(boxes.shape, generator=torch.Generator().manual_seed(1))
    all_boxes = torch.stack([boxes, other, boxes.flip(1)])
    layers = [(layered[n], all_boxes[n]) for n in range(3)]
    plan = plan_layers(head, layers, gts, metas)
    for s_, b_ in layers:
        planned = plan.match(s_, b_, gts)
        assert planned is not None
        alone = detr_targets(head, list(s_), b_, gts, metas)
        joint = detr_targets(head, list(s_), b_, gts, metas, plan.pad, planned)
        for a, b in zip(alone, joint):
            assert_same(a, b)


def test_img_shape_and_label_dtypes_as_stock():
    head = build_head(DINO, num_classes=7)
    scores, boxes, gts, metas = random_batch(15, 10, 7, 'cpu')
    three = [dict(img_shape=(*m['img_shape'], 3)) for m in metas]
    errors = []
    for fn in (type(head).loss_by_feat_single, hungarian.loss_by_feat_single):
        with pytest.raises(ValueError) as info:
            fn(head, scores, boxes, gts, three)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    from fast_parallel.step.targets.hungarian.match import gts_reason
    for dtype in (torch.uint8, torch.int8, torch.int16):
        odd = [
            InstanceData(bboxes=g.bboxes, labels=g.labels.to(dtype))
            for g in gts
        ]
        assert gts_reason(odd, torch.device('cpu')) == 'label dtype'
    as_int32 = [
        InstanceData(bboxes=g.bboxes, labels=g.labels.int()) for g in gts
    ]
    assert gts_reason(as_int32, torch.device('cpu')) is None


def test_dn_targets_without_queries_per_group_go_stock():
    head = build_head(DINO, num_classes=7)
    gts = [
        InstanceData(
            bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
    ]
    metas = [dict(img_shape=(100, 120))]
    dn_meta = dict(num_denoising_queries=1, num_denoising_groups=2)
    scores, boxes = torch.randn(1, 1, 7), torch.rand(1, 1, 4)
    before = head.fast_target_stats.stock
    stock = _losses_and_grads(
        type(head)._loss_dn_single, head, scores, boxes, gts, metas, dn_meta)
    fast = _losses_and_grads(hungarian.loss_dn_single, head, scores, boxes,
                             gts, metas, dn_meta)
    assert head.fast_target_stats.stock == before + 1
    for a, b in zip(stock, fast):
        assert_same(a, b)


def test_cls_avg_factor_rounds_as_new_tensor():
    """``new_tensor([v])`` in float16 rounds through float32 (twice): just
    below 1 it can hold 1.0, and then ``max(t, 1)`` is the tensor."""
    from fast_parallel.step.targets.hungarian.losses import cls_avg_factor
    head = build_head(DETR, num_classes=7, sync_cls_avg_factor=True)
    head.bg_cls_weight = 1 - 2**-12 - 2**-40
    like = torch.zeros(1, dtype=torch.float16)
    stock = max(like.new_tensor([head.bg_cls_weight]), 1)
    fast = cls_avg_factor(head, like, 0, 1)
    assert type(stock) is type(fast) and torch.equal(stock, fast)
