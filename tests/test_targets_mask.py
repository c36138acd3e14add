"""Batched Mask R-CNN mask targets equal stock's, bit for bit
(fast_parallel/step/targets/mask/).

Each case builds the sampling results of a batch (positive proposals, their
ground truths) and ``BitmapMasks`` padded to one size, as mmdet's data
preprocessor pads them (``pad_mask=True``), and compares the switched
``FCNMaskHead.get_targets`` with stock's: dtype, shape and bits. The cases
cover images without positives, without ground truths, empty masks, masks
touching the border, proposals past the image, tiny and degenerate
proposals, soft targets and other mask sizes.
"""
import random

import numpy as np
import pytest
import torch
from mmdet.models.task_modules.assigners import AssignResult
from mmdet.models.task_modules.samplers import SamplingResult
from mmdet.registry import MODELS
from mmdet.structures.mask import BitmapMasks, PolygonMasks
from mmengine.config import ConfigDict
from mmengine.hub import get_config
from mmengine.structures import InstanceData
from targets_utils import DEVICES, small_parity

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.targets import mask
from fast_parallel.step.targets.switch import switch_targets

MASK_RCNN = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def build_head():
    return MODELS.build(get_config(MASK_RCNN).model.roi_head.mask_head)


def _masks(rng: random.Random, gen: torch.Generator, num: int, height: int,
           width: int) -> np.ndarray:
    masks = np.zeros((num, height, width), dtype=np.uint8)
    for i in range(num):
        kind = rng.choice(['blob', 'empty', 'border', 'full'])
        if kind == 'blob':
            y0, x0 = rng.randrange(height), rng.randrange(width)
            masks[i, y0:y0 + rng.randrange(1, height),
                  x0:x0 + rng.randrange(1, width)] = 1
            masks[i] &= (torch.rand(height, width, generator=gen)
                         > 0.2).numpy().astype(np.uint8)
        elif kind == 'border':  # touching the image's edges
            masks[i, :, :rng.randrange(1, width)] = 1
            masks[i, -rng.randrange(1, height):, :] = 1
        elif kind == 'full':
            masks[i] = 1
    return masks


def random_batch(seed: int, device: str):
    """Sampling results and ground truths (masks padded to one size)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    height, width = rng.choice([(48, 64), (96, 80)])
    results, gts = [], []
    for _ in range(rng.choice([1, 2, 3, 5])):
        num_gt = rng.choice([0, 1, 3, 12])
        xy = torch.rand(
            num_gt, 2, generator=gen) * torch.tensor([width, height])
        boxes = torch.cat([xy, xy + torch.rand(num_gt, 2, generator=gen) * 30],
                          1)
        gt = InstanceData(
            bboxes=boxes.to(device),
            labels=torch.randint(80, (num_gt, ), generator=gen).to(device),
            masks=BitmapMasks(
                _masks(rng, gen, num_gt, height, width), height, width))
        num = rng.choice([0, 1, 5, 40]) if num_gt else 0
        priors = torch.rand(
            num + 7, 2, generator=gen) * torch.tensor(
                [width * 1.4, height * 1.4]) - 10
        priors = torch.cat(
            [priors, priors + torch.rand(num + 7, 2, generator=gen) * 50], 1)
        if num > 1:  # a zero-width and a tiny proposal
            priors[0, 2] = priors[0, 0]
            priors[1, 2:] = priors[1, :2] + 0.25
        gt_inds = torch.zeros(num + 7, dtype=torch.long)
        gt_inds[:num] = torch.randint(1, num_gt + 1, (num, ), generator=gen) \
            if num else gt_inds[:0]
        assign = AssignResult(num_gt, gt_inds.to(device),
                              torch.rand(num + 7).to(device),
                              torch.full((num + 7, ), -1).to(device))
        results.append(
            SamplingResult(
                pos_inds=torch.arange(num).to(device),
                neg_inds=torch.arange(num, num + 7).to(device),
                priors=priors.to(device),
                gt_bboxes=gt.bboxes,
                assign_result=assign,
                gt_flags=torch.zeros(num + 7, dtype=torch.uint8).to(device)))
        gts.append(gt)
    return results, gts


def train_cfg(**options):
    return ConfigDict(get_config(MASK_RCNN).model.train_cfg.rcnn, **options)


def switched(head):
    if 'get_targets' not in vars(head):
        outcome, stats = switch_targets(torch.nn.Sequential(head))
        assert stats, outcome
    return head


def run_both(head, results, gts, cfg):
    stock = type(head).get_targets(head, results, gts, cfg)
    switched(head)
    before = head.fast_target_stats.stock
    out = head.get_targets(results, gts, cfg)
    return stock, out, head.fast_target_stats.stock - before


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    assert a.is_contiguous() and b.is_contiguous()
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_upstream_head_is_covered():
    assert mask.supported(build_head()) is None


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize(
    'options', [{}, dict(soft_mask_target=True),
                dict(mask_size=(14, 21))])
def test_batched_targets_equal_stock(device, options):
    head = build_head()
    cfg = train_cfg(**options)
    positives = 0
    for seed in range(12):
        results, gts = random_batch(seed, device)
        stock, out, stock_way = run_both(head, results, gts, cfg)
        assert stock_way == 0, seed
        assert_same(stock, out)
        positives += out.shape[0]
    assert positives > 100


def test_other_masks_take_the_stock_path_counted():
    head = build_head()
    cfg = train_cfg()
    results, gts = random_batch(3, 'cpu')
    gts[0].masks = BitmapMasks(
        np.pad(gts[0].masks.masks, ((0, 0), (0, 4), (0, 0))),
        gts[0].masks.height + 4, gts[0].masks.width)
    stock, out, stock_way = run_both(head, results, gts, cfg)
    assert stock_way == len(gts)
    assert_same(stock, out)
    results, gts = random_batch(3, 'cpu')
    gts[0].masks = PolygonMasks([[np.array([0., 0., 10., 0., 10., 10.])]
                                 for _ in range(len(gts[0].bboxes))], 48, 64)
    assert mask.batch_reason(results, gts, cfg) == \
        'masks are not BitmapMasks'


def test_stock_errors_stay_stock():
    """A proposal of negative width: mmcv's ``roi_align`` raises, for stock
    and for the batch."""
    head = build_head()
    cfg = train_cfg()
    results, gts = next(
        batch for batch in (random_batch(seed, 'cpu') for seed in range(20))
        if any(len(r.pos_priors) for r in batch[0]))
    first = next(r for r in results if len(r.pos_priors))
    first.pos_priors[0] = torch.tensor([10., 10., 5., 20.])
    with pytest.raises(RuntimeError, match='non-negative size'):
        type(head).get_targets(head, results, gts, cfg)
    switched(head)
    with pytest.raises(RuntimeError, match='non-negative size'):
        head.get_targets(results, gts, cfg)


def test_operations_do_not_grow_with_the_batch():
    head = switched(build_head())
    cfg = train_cfg()
    counts, sizes = [], set()
    for seed in range(40):  # batches of other sizes, with positives
        results, gts = random_batch(seed, 'cpu')
        if len(gts) in sizes or not sum(len(r.pos_priors) for r in results):
            continue
        sizes.add(len(gts))
        with OpCounter() as ops:
            head.get_targets(results, gts, cfg)
        counts.append((len(gts), ops.total))
    assert len(counts) >= 3
    assert len({ops for _, ops in counts}) == 1, counts


def test_mask_rcnn_parity_through_the_runner(sample_data, tmp_path, capsys):
    """tools/parity.py on mmdet's Mask R-CNN config (the sample COCO images
    with their polygons as bitmaps at 320 px, batch 2): stock and fast
    train to the same losses, gradient norms and parameters, the mask
    targets batched."""
    logs = small_parity(
        MASK_RCNN, [
            "dict(type='Resize', scale=(320, 320), keep_ratio=True)",
            "dict(type='RandomFlip', prob=0.5)"
        ],
        sample_data,
        tmp_path,
        capsys,
        load="dict(type='LoadAnnotations', with_bbox=True, with_mask=True)")
    assert 'FCNMaskHead batched' in logs
    assert 'shared head weights: RPNHead ' in logs
    assert 'FCNMaskHead batched for 4 of 4 images, 0 computed the stock way' \
        in logs
