"""Batched MaxIoUAssigner-family targets equal stock's, bit for bit
(fast_parallel/step/targets/max_iou/ and roi/).

RetinaNet's ``RetinaHead`` (``PseudoSampler``), Faster R-CNN's ``RPNHead``
(``RandomSampler``) and its ``StandardRoIHead`` (``RandomSampler``, the
ground truths added as proposals): each generated batch goes through stock's
per-image code and the batched one from the same global random state; the
targets, the sampling results field by field and the random state after
them must be equal.
"""
import collections
import copy
import random
from typing import List

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.config import ConfigDict
from mmengine.hub import get_config
from mmengine.structures import InstanceData
from targets_utils import DEVICES

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.compat.targets import SAMPLING_RESULT_FIELDS
from fast_parallel.step.targets import max_iou, roi
from fast_parallel.step.targets.max_iou.targets import anchor_head_targets
from fast_parallel.step.targets.priors import inside_flags
from fast_parallel.step.targets.roi.targets import sample_rois

register_all_modules()
RETINA = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
FASTER = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
CASES_PER_TEST = 6

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def _build(config: str, which: str, **train) -> torch.nn.Module:
    model = get_config(config).model
    if which == 'retina':
        cfg = dict(model.bbox_head, train_cfg=model.train_cfg)
    elif which == 'rpn':
        cfg = dict(model.rpn_head, train_cfg=model.train_cfg.rpn)
    else:
        cfg = dict(
            model.roi_head,
            train_cfg=model.train_cfg.rcnn,
            test_cfg=model.test_cfg.rcnn)
    cfg = copy.deepcopy(cfg)
    cfg['train_cfg'] = ConfigDict(dict(cfg['train_cfg'], **train))
    return MODELS.build(cfg)


HEADS = {
    'retina': _build(RETINA, 'retina'),
    'rpn': _build(FASTER, 'rpn'),
}


def _gts(rng: random.Random, gen: torch.Generator, num: int, height: int,
         width: int, num_classes: int, kind: str) -> InstanceData:
    cxy = torch.rand(num, 2, generator=gen) * torch.tensor([width, height])
    wh = torch.exp(torch.rand(num, 2, generator=gen) * 5.5) + 2
    boxes = torch.cat([cxy - wh / 2, cxy + wh / 2], 1)
    boxes = torch.min(
        boxes.clamp(min=0),
        torch.tensor([width, height, width, height], dtype=torch.float32))
    labels = torch.randint(0, num_classes, (num, ), generator=gen)
    if kind == 'edge' and num:
        boxes[:, 0] = 0.
        boxes[::2, 2] = float(width)
    elif kind == 'far' and num:  # overlaps no anchor (IoU 0 everywhere)
        boxes = boxes - 8 * max(height, width)
    elif kind in ('dup', 'dup_label') and num:  # equal IoUs: argmax ties
        pick = torch.randint(0, num, (max(1, num // 3), ), generator=gen)
        boxes = torch.cat([boxes, boxes[pick]])
        extra = labels[pick] if kind == 'dup' else torch.randint(
            0, num_classes, (pick.numel(), ), generator=gen)
        labels = torch.cat([labels, extra])
    return InstanceData(bboxes=boxes, labels=labels)


def make_case(seed: int, which: str, device: str = 'cpu'):
    """(head, featmap sizes, gts, metas) of a generated batch."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    head = HEADS[which]
    height, width = 32 * rng.randint(3, 10), 32 * rng.randint(3, 10)
    strides = [s[0] for s in head.prior_generator.strides]
    sizes = [(height // s, width // s) for s in strides]
    gts, metas = [], []
    for _ in range(rng.randint(1, 4)):
        num = rng.choice([0, 1, 1, 3, 8, 20, 120])
        kind = rng.choice(['plain'] * 5 + ['edge', 'far', 'dup', 'dup_label'])
        gts.append(
            _gts(rng, gen, num, height, width, max(head.num_classes, 1), kind))
        pad = (height - 32 * rng.randint(0, 1), width)
        img = (pad[0] - rng.randint(0, 20), pad[1])
        metas.append(dict(img_shape=img, pad_shape=pad))
    gts = [
        InstanceData(bboxes=g.bboxes.to(device), labels=g.labels.to(device))
        for g in gts
    ]
    return head, sizes, gts, metas


def stock_targets(head, sizes, gts, metas, device='cpu'):
    anchors, valid = head.get_anchors(sizes, metas, device=device)
    out = type(head).get_targets(
        head, anchors, valid, gts, metas, None, return_sampling_results=True)
    return out[:5], out[5]


def fast_targets(head, sizes, gts, metas, device='cpu'):
    mlvl = head.prior_generator.grid_priors(sizes, device=device)
    anchors = torch.cat(mlvl)
    inside = inside_flags(head, anchors, sizes, metas)
    return anchor_head_targets(head, anchors, inside,
                               [a.shape[0] for a in mlvl], gts)


def assert_tensor(a: torch.Tensor, b: torch.Tensor, at: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, at
    assert a.device == b.device, at
    assert torch.equal(a, b), at
    if a.is_floating_point():  # the sign of zeros too
        assert torch.equal(a.contiguous().view(torch.int32),
                           b.contiguous().view(torch.int32)), at


def assert_same_targets(stock: tuple, fast: tuple, where: str) -> None:
    for k in range(4):
        assert len(stock[k]) == len(fast[k]), where
        for level, (a, b) in enumerate(zip(stock[k], fast[k])):
            assert a.stride() == b.stride(), f'{where}: {k}, {level}'
            assert_tensor(a, b, f'{where}: result {k}, level {level}')
    assert type(fast[4]) is type(stock[4]) and fast[4] == stock[4], where


FIELDS = ('pos_inds', 'neg_inds', 'pos_priors', 'neg_priors', 'pos_is_gt',
          'pos_assigned_gt_inds', 'pos_gt_labels', 'pos_gt_bboxes')


def assert_same_sampling(stock: list, fast: list, where: str) -> None:
    assert len(stock) == len(fast), where
    for i, (a, b) in enumerate(zip(stock, fast)):
        for name in FIELDS:
            assert_tensor(
                getattr(a, name), getattr(b, name), f'{where}: {i} {name}')
        for name in ('num_pos', 'num_neg', 'avg_factor', 'num_gts',
                     'avg_factor_with_neg'):
            assert getattr(a, name) == getattr(b, name), f'{where}: {name}'


def _check(seed: int, which: str, device: str) -> None:
    head, sizes, gts, metas = make_case(seed, which, device)
    torch.manual_seed(seed)
    stock, stock_results = stock_targets(head, sizes, gts, metas, device)
    stock_rng = torch.get_rng_state()
    torch.manual_seed(seed)
    fast, results = fast_targets(head, sizes, gts, metas, device)
    assert torch.equal(torch.get_rng_state(), stock_rng), 'random draws'
    assert_same_targets(stock, fast, f'{which} seed {seed}')
    assert_same_sampling(stock_results, list(results), f'{which} seed {seed}')


@pytest.mark.parametrize('block', range(8))
@pytest.mark.parametrize('which', ['retina', 'rpn'])
def test_anchor_heads_match_stock(which: str, block: int) -> None:
    """48 generated batches per head: 0 to 120 ground truths, duplicates
    (argmax ties), edge and far boxes, images smaller than the padded batch
    (invalid anchors); RPN's RandomSampler draws the same permutations."""
    for seed in range(block * CASES_PER_TEST, (block + 1) * CASES_PER_TEST):
        _check(seed, which, 'cpu')


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('which', ['retina', 'rpn'])
def test_anchor_heads_match_stock_on_cuda(which: str) -> None:
    for seed in range(8 * CASES_PER_TEST):
        _check(seed, which, 'cuda')


def test_border_check_and_options() -> None:
    """``allowed_border >= 0`` (anchors outside the image skipped), a
    positive ``pos_weight``, ``gt_max_assign_all=False``, ``reg_decoded_bbox``
    and ``neg_pos_ub``: stock's numbers still."""
    for seed in (1, 2, 3):
        for train in (dict(allowed_border=0, pos_weight=2.0),
                      dict(
                          assigner=dict(
                              type='MaxIoUAssigner',
                              pos_iou_thr=0.5,
                              neg_iou_thr=(0.1, 0.4),
                              min_pos_iou=0.1,
                              gt_max_assign_all=False))):
            head = _build(RETINA, 'retina', **train)
            _, sizes, gts, metas = make_case(seed, 'retina')
            stock, _ = stock_targets(head, sizes, gts, metas)
            fast, _ = fast_targets(head, sizes, gts, metas)
            assert_same_targets(stock, fast, f'{train} {seed}')
        head = _build(
            FASTER,
            'rpn',
            sampler=dict(
                type='RandomSampler',
                num=64,
                pos_fraction=0.25,
                neg_pos_ub=3,
                add_gt_as_proposals=False))
        head.reg_decoded_bbox = True
        _, sizes, gts, metas = make_case(seed, 'rpn')
        torch.manual_seed(seed)
        stock, _ = stock_targets(head, sizes, gts, metas)
        torch.manual_seed(seed)
        fast, _ = fast_targets(head, sizes, gts, metas)
        assert_same_targets(stock, fast, f'rpn options {seed}')


@pytest.mark.parametrize('dtype',
                         [torch.float32, torch.float16, torch.bfloat16])
def test_loss_by_feat_and_positive_infos(dtype) -> None:
    """The switched heads' losses equal stock's; ``_raw_positive_infos``
    holds sampling results equal to stock's. Also with half outputs, as
    under AMP: the anchors (float32) and ground truths decide the targets,
    so every image is batched."""
    for which, config in (('retina', RETINA), ('rpn', FASTER)):
        head = _build(config, which)
        fast = copy.deepcopy(head)
        assert max_iou.supported(fast) is None
        from fast_parallel.step.targets.switch import switch_targets
        switch_targets(fast)
        _, sizes, gts, metas = make_case(4, which)
        gen = torch.Generator().manual_seed(4)
        strides = [s[0] for s in head.prior_generator.strides]
        height, width = sizes[0][0] * strides[0], sizes[0][1] * strides[0]
        feats = [
            torch.randn(
                len(gts),
                head.in_channels,
                height // s,
                width // s,
                generator=gen) for s in strides
        ]
        outs = [[o.to(dtype) for o in level] for level in head(feats)]
        torch.manual_seed(0)
        stock = head.loss_by_feat(*outs, gts, metas)
        stock_infos = head._raw_positive_infos['sampling_results']
        torch.manual_seed(0)
        mine = fast.loss_by_feat(*outs, gts, metas)
        assert list(stock) == list(mine)
        for key in stock:
            for a, b in zip(stock[key], mine[key]):
                assert_tensor(a, b, f'{which} {key}')
        assert_same_sampling(
            stock_infos, list(fast._raw_positive_infos['sampling_results']),
            which)
        assert fast.fast_target_stats.stock == 0


ROI = _build(FASTER, 'roi')


def _proposals(gen: torch.Generator, gts: List[InstanceData], height: int,
               width: int, count: int) -> List[torch.Tensor]:
    """Proposals around the ground truths and elsewhere, as an RPN gives."""
    out = []
    for gt in gts:
        cxy = torch.rand(
            count, 2, generator=gen) * torch.tensor([width, height])
        wh = torch.exp(torch.rand(count, 2, generator=gen) * 5) + 2
        boxes = torch.cat([cxy - wh / 2, cxy + wh / 2], 1)
        if len(gt):
            near = torch.randint(0, len(gt), (count // 2, ), generator=gen)
            jitter = 1 + 0.1 * torch.randn(count // 2, 4, generator=gen)
            boxes[:count // 2] = gt.bboxes[near] * jitter
        out.append(boxes)
    return out


def _roi_case(seed: int, device: str = 'cpu'):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    height, width = 32 * rng.randint(4, 20), 32 * rng.randint(4, 20)
    gts = [
        _gts(rng, gen, rng.choice([0, 1, 5, 30, 130]), height, width, 80,
             rng.choice(['plain', 'plain', 'dup', 'edge', 'far']))
        for _ in range(rng.randint(1, 4))
    ]
    props = _proposals(gen, gts, height, width, rng.choice([0, 7, 300, 1000]))
    gts = [
        InstanceData(bboxes=g.bboxes.to(device), labels=g.labels.to(device))
        for g in gts
    ]
    return gts, [p.to(device) for p in props]


def _stock_rois(head, props, gts):
    results = []
    for p, gt in zip(props, gts):
        pred = InstanceData(priors=p)
        assign = head.bbox_assigner.assign(pred, gt, None)
        results.append(head.bbox_sampler.sample(assign, pred, gt))
    return results


@pytest.mark.parametrize('device', DEVICES)
def test_roi_sampling_matches_stock(device: str) -> None:
    """60 generated batches: each image's SamplingResult field by field,
    and the global random state after the draws."""
    for seed in range(60):
        gts, props = _roi_case(seed, device)
        torch.manual_seed(seed)
        stock = _stock_rois(ROI, props, gts)
        state = torch.get_rng_state()
        torch.manual_seed(seed)
        fast = sample_rois(ROI, props, gts)
        assert torch.equal(torch.get_rng_state(), state), f'seed {seed}'
        assert_same_sampling(stock, fast, f'roi seed {seed}')


def test_sampling_results_have_stock_fields() -> None:
    """The fields the batched RoI families set are exactly those stock's
    ``SamplingResult.__init__`` sets, in its order."""
    gts, props = _roi_case(3)
    stock = _stock_rois(ROI, props, gts)
    assert all(
        tuple(vars(r)) == SAMPLING_RESULT_FIELDS
        for r in stock + sample_rois(ROI, props, gts))


def test_roi_operations_do_not_grow_much_with_the_batch() -> None:
    """Stock's ops grow by a whole assign + sample per image; the batched
    ones only by the sampler's own draws (one ``randperm`` per image where
    it has more candidates than it keeps, in stock's order): each image's
    ``SamplingResult`` holds views of batch-wide tensors."""
    counts, ops = {}, {}
    for num_imgs in (2, 8):
        rng = random.Random(0)
        gen = torch.Generator().manual_seed(0)
        gts = [
            _gts(rng, gen, 6, 512, 512, 80, 'plain') for _ in range(num_imgs)
        ]
        props = _proposals(gen, gts, 512, 512, 1000)
        for name, run in (('stock', _stock_rois), ('fast', sample_rois)):
            with OpCounter() as counter:
                run(ROI, props, gts)
            counts[name, num_imgs] = counter.total
            ops[name, num_imgs] = counter.ops
    grow = {n: (counts[n, 8] - counts[n, 2]) / 6 for n in ('stock', 'fast')}
    assert grow['fast'] <= 2 < 36 <= grow['stock'], (counts, grow)
    more = collections.Counter(ops['fast', 8])
    more.subtract(ops['fast', 2])
    assert {op for op, n in more.items() if n} == {'randperm'}, more
    assert roi.supported(ROI) is None


def test_supported() -> None:
    assert max_iou.supported(HEADS['retina']) is None
    assert max_iou.supported(HEADS['rpn']) is None
    other = _build(
        RETINA, 'retina', assigner=dict(type='ATSSAssigner', topk=9))
    assert 'not MaxIoUAssigner' in max_iou.supported(other)
    ohem = _build(
        FASTER,
        'roi',
        sampler=dict(type='OHEMSampler', num=512, pos_fraction=0.25))
    assert 'not PseudoSampler or RandomSampler' in roi.supported(ohem)
    patched = copy.deepcopy(HEADS['retina'])
    patched.get_targets = lambda *a: None
    assert 'replaced' in max_iou.supported(patched)
    fp16 = _build(
        RETINA,
        'retina',
        assigner=dict(
            type='MaxIoUAssigner',
            pos_iou_thr=0.5,
            neg_iou_thr=0.4,
            iou_calculator=dict(type='BboxOverlaps2D', dtype='fp16')))
    assert 'BboxOverlaps2D' in max_iou.supported(fp16)


def test_image_without_anchor_decided_on_the_host_without_border_check(
) -> None:
    """Without a border check the flags stock assigns by are the valid flags
    of each ``pad_shape``: whether an image has none is read on the host (no
    ``.item()``), and agrees with the flags themselves, also for pad shapes
    that leave a level, or every level, without a valid row or column. With
    a border check one host copy decides."""
    from fast_parallel.compat import ITEM_OP
    from fast_parallel.step.targets.max_iou import _image_without_anchor
    rng = random.Random(0)
    for which, config in (('retina', RETINA), ('rpn', FASTER)):
        for border in (-1, 0):
            head = _build(config, which, allowed_border=border)
            for case in range(20):
                height, width = 32 * rng.randint(2, 6), 32 * rng.randint(2, 6)
                strides = [s[0] for s in head.prior_generator.strides]
                sizes = [(height // s, width // s) for s in strides]
                metas = []
                for _ in range(rng.randint(1, 3)):
                    pad = (rng.choice([0, 1, 5, 17,
                                       height]), rng.choice([0, 3, 33, width]))
                    metas.append(dict(pad_shape=pad, img_shape=pad))
                anchors = torch.cat(
                    head.prior_generator.grid_priors(sizes, device='cpu'))
                inside = inside_flags(head, anchors, sizes, metas)
                if inside is None:  # every prior valid: nothing to decide
                    assert border < 0
                    continue
                expected = not bool(inside.any(1).all())
                with OpCounter() as counter:
                    got = _image_without_anchor(head, inside, sizes, metas)
                assert got is expected, (which, border, metas)
                assert counter.ops[ITEM_OP] == (0 if border < 0 else 1)
