"""Batched Cascade R-CNN RoI sampling equals stock's, bit for bit
(fast_parallel/step/targets/cascade/, with roi/targets.py).

Each stage of ``CascadeRoIHead`` assigns with its own ``MaxIoUAssigner``
(IoU thresholds 0.5, 0.6, 0.7) and samples with its own ``RandomSampler``.
The stage's batched sampling results are compared field by field with
stock's per-image ``assign`` + ``sample`` from the same global random
state, and the state after them; the whole ``loss`` (three stages, the
refinement between them, Cascade Mask R-CNN's masks) is compared loss by
loss; and ``tools/parity.py`` runs the upstream Cascade R-CNN config.
"""
import copy

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.utils import register_all_modules
from mmengine.hub import get_config
from mmengine.structures import InstanceData
from targets_utils import DEVICES, small_parity
from test_targets_max_iou import _roi_case, assert_same_sampling

from fast_parallel.step.targets import cascade, htc
from fast_parallel.step.targets.roi.targets import sample_rois
from fast_parallel.step.targets.switch import switch_targets

register_all_modules()
CASCADE = 'mmdet::cascade_rcnn/cascade-rcnn_r50_fpn_1x_coco.py'
CASCADE_MASK = 'mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py'
HTC = 'mmdet::htc/htc-without-semantic_r50_fpn_1x_coco.py'

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def build_roi_head(config: str, num_classes: int = 80):
    model = get_config(config).model
    head = copy.deepcopy(model.roi_head)
    for bbox_head in head.bbox_head:
        bbox_head.num_classes = num_classes
    if 'mask_head' in head:
        masks = head.mask_head
        for mask_head in masks if isinstance(masks, list) else [masks]:
            mask_head.num_classes = num_classes
    return MODELS.build(
        dict(
            head, train_cfg=model.train_cfg.rcnn,
            test_cfg=model.test_cfg.rcnn))


HEAD = build_roi_head(CASCADE)


def _stock_stage(head, stage, props, gts):
    results = []
    for p, gt in zip(props, gts):
        pred = InstanceData(priors=p)
        assign = head.bbox_assigner[stage].assign(pred, gt, None)
        results.append(head.bbox_sampler[stage].sample(assign, pred, gt))
    return results


def test_the_upstream_heads_are_covered():
    assert cascade.supported(HEAD) is None
    assert cascade.supported(build_roi_head(CASCADE_MASK)) is None
    assert htc.supported(build_roi_head(HTC)) is None
    assert [a.pos_iou_thr for a in HEAD.bbox_assigner] == [0.5, 0.6, 0.7]


@pytest.mark.parametrize('device', DEVICES)
def test_each_stage_samples_as_stock(device):
    """30 generated batches, every stage: each image's SamplingResult field
    by field and the global random state after the draws."""
    for seed in range(30):
        gts, props = _roi_case(seed, device)
        for stage in range(HEAD.num_stages):
            torch.manual_seed(seed)
            stock = _stock_stage(HEAD, stage, props, gts)
            state = torch.get_rng_state()
            torch.manual_seed(seed)
            fast = sample_rois(HEAD, props, gts, stage)
            assert torch.equal(torch.get_rng_state(), state), (seed, stage)
            assert_same_sampling(stock, fast, f'seed {seed} stage {stage}')


def _batch(seed: int, num_imgs: int, with_mask: bool):
    gen = torch.Generator().manual_seed(seed)
    height, width = 96, 128
    x = tuple(
        torch.randn(num_imgs, 256, height // s, width // s, generator=gen)
        for s in (4, 8, 16, 32))
    samples, proposals = [], []
    for i in range(num_imgs):
        num = (0, 3, 12)[(seed + i) % 3]
        xy = torch.rand(num, 2, generator=gen) * torch.tensor([width, height])
        wh = torch.rand(num, 2, generator=gen) * 40 + 4
        boxes = torch.cat([xy, (xy + wh).clamp(max=width)], 1)
        gt = InstanceData(
            bboxes=boxes, labels=torch.randint(80, (num, ), generator=gen))
        if with_mask:
            from mmdet.structures.mask import BitmapMasks
            masks = (torch.rand(num, height, width, generator=gen)
                     > 0.5).numpy()
            gt.masks = BitmapMasks(masks, height, width)
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(height, width), pad_shape=(height, width)))
        sample.gt_instances = gt
        samples.append(sample)
        near = boxes.repeat(4, 1) + torch.randn(4 * num, 4, generator=gen)
        xy = torch.rand(60, 2, generator=gen) * torch.tensor([width, height])
        far = torch.cat([xy, xy + torch.rand(60, 2, generator=gen) * 30 + 2],
                        1)
        proposals.append(torch.cat([near, far]))
    return x, proposals, samples


def _loss(head, method, x, proposals, samples, seed):
    torch.manual_seed(seed)
    rpn = [InstanceData(bboxes=p.clone()) for p in proposals]
    losses = method(head, x, rpn, samples)
    return losses, torch.get_rng_state()


@pytest.mark.parametrize('config', [CASCADE, CASCADE_MASK, HTC])
def test_the_whole_loss_equals_stock(config):
    """The switched head's loss (every stage's assign + sample batched, and
    the mask targets) against an untouched copy's."""
    head = build_roi_head(config)
    stock_head = copy.deepcopy(head)
    switch_targets(torch.nn.Sequential(head))
    assert 'loss' in vars(head)
    with_mask = 'mask' in config or 'htc' in config
    if with_mask:
        masks = head.mask_head
        assert all('get_targets' in vars(m) for m in masks)
    for seed in range(3):
        x, proposals, samples = _batch(seed, 3, with_mask)
        stock, stock_rng = _loss(stock_head,
                                 type(stock_head).loss, x, proposals, samples,
                                 seed)
        before = head.fast_target_stats.stock
        fast, fast_rng = _loss(head, lambda h, *a: h.loss(*a), x, proposals,
                               samples, seed)
        assert head.fast_target_stats.stock == before  # every stage batched
        assert torch.equal(stock_rng, fast_rng)
        assert list(stock) == list(fast)
        for name in stock:
            a, b = stock[name], fast[name]
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert torch.equal(a, b), (seed, name)


def test_other_samplers_stay_stock():
    model = get_config(CASCADE).model
    train = copy.deepcopy(model.train_cfg.rcnn)
    train[1].sampler = dict(type='OHEMSampler', num=512, pos_fraction=0.25)
    head = MODELS.build(dict(model.roi_head, train_cfg=train))
    assert cascade.supported(head).startswith('stage 1: sampler OHEMSampler')
    no_train = MODELS.build(model.roi_head)
    assert 'no assigner and sampler per stage' in cascade.supported(no_train)


def test_cascade_parity_through_the_runner(sample_data, tmp_path, capsys):
    """tools/parity.py on mmdet's Cascade R-CNN config (the sample COCO
    images at 320 px, batch 2): stock and fast train to the same losses,
    gradient norms and parameters, every stage of every image batched."""
    logs = small_parity(CASCADE, [
        "dict(type='Resize', scale=(320, 320), keep_ratio=True)",
        "dict(type='RandomFlip', prob=0.5)"
    ], sample_data, tmp_path, capsys)
    assert 'CascadeRoIHead/MaxIoUAssigner batched' in logs
    # three stages of two images, two iterations
    assert ('CascadeRoIHead/MaxIoUAssigner batched for 12 of 12 images, 0 '
            'computed the stock way') in logs
