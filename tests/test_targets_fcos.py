"""Batched FCOS point targets equal stock's, bit for bit
(fast_parallel/step/targets/fcos/: targets.py, __init__.py).

Each case builds a batch (image size, ground truths per image) from a seed
and compares the switched head's ``get_targets`` with stock's
``FCOSHead.get_targets`` tensor by tensor: dtype, shape, strides and bits.
The boxes cover what users' data holds: images without boxes, one box,
more than a hundred, duplicates (equal areas: ties), zero-width and
zero-height boxes, boxes past the image, on both upstream heads (plain;
centre sampling with normalised boxes) and NASFCOS, with float32 and
float16 points (mixed precision).
"""
import random

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures.bbox import HorizontalBoxes
from mmdet.utils import register_all_modules
from mmengine.hub import get_config
from mmengine.structures import InstanceData
from targets_utils import DEVICES, small_parity

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.targets import fcos
from fast_parallel.step.targets.fcos.targets import image_groups
from fast_parallel.step.targets.switch import switch_targets

register_all_modules()
FCOS = 'mmdet::fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py'
FCOS_CENTER = ('mmdet::fcos/fcos_r50-caffe_fpn_gn-head-center-normbbox-'
               'centeronreg-giou_1x_coco.py')
NASFCOS = ('mmdet::nas_fcos/'
           'nas-fcos_r50-caffe_fpn_nashead-gn-head_4xb4-1x_coco.py')
CASES = 12

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def build_head(config: str, num_classes: int = 80):
    cfg = get_config(config).model
    return MODELS.build(dict(cfg.bbox_head, num_classes=num_classes))


HEADS = {
    'plain': build_head(FCOS),
    'center': build_head(FCOS_CENTER, num_classes=5),
    'nas': build_head(NASFCOS, num_classes=3),
}


def _boxes(rng: random.Random, gen: torch.Generator, num: int, height: int,
           width: int, kind: str) -> torch.Tensor:
    """``num`` boxes of one image; ``kind`` picks a corner case."""
    cxy = torch.rand(num, 2, generator=gen) * torch.tensor([width, height])
    wh = torch.exp(torch.rand(num, 2, generator=gen) * 6) + 1
    if kind == 'degenerate' and num:  # zero width or height
        wh[::2, rng.randrange(2)] = 0
    if kind == 'outside' and num:  # past the image's edges
        cxy = cxy * 1.6 - 0.3 * torch.tensor([width, height])
    if kind == 'grid' and num:  # on the points: integer corners
        cxy, wh = cxy.round(), (wh / 8).round() * 8
    boxes = torch.cat([cxy - wh / 2, cxy + wh / 2], 1)
    if kind == 'duplicates' and num > 1:  # equal boxes: equal areas
        boxes[1::2] = boxes[0::2][:boxes[1::2].shape[0]]
    return boxes


def random_batch(seed: int, head, device: str, points_dtype=torch.float32):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    height, width = rng.choice([(64, 96), (200, 152), (320, 320)])
    featmap_sizes = [(-(-height // s), -(-width // s)) for s in head.strides]
    points = head.prior_generator.grid_priors(
        featmap_sizes, dtype=points_dtype, device=device)
    gts = []
    for _ in range(rng.choice([1, 2, 3, 5])):
        num = rng.choice([0, 1, 2, 7, 30, 130])
        kind = rng.choice(
            ['normal', 'degenerate', 'outside', 'grid', 'duplicates'])
        boxes = _boxes(rng, gen, num, height, width, kind)
        labels = torch.randint(head.num_classes, (num, ), generator=gen)
        gts.append(
            InstanceData(bboxes=boxes.to(device), labels=labels.to(device)))
    return points, gts


def assert_same(ref, out) -> None:
    assert len(ref) == len(out) == 2
    for kind, (ref_levels, out_levels) in enumerate(zip(ref, out)):
        assert len(ref_levels) == len(out_levels)
        for level, (a, b) in enumerate(zip(ref_levels, out_levels)):
            where = (kind, level)
            assert a.dtype == b.dtype and a.shape == b.shape, where
            assert a.device == b.device, where
            if a.numel() > 1:  # one element: any stride is contiguous
                assert a.stride() == b.stride(), where
            if a.dtype.is_floating_point:  # bits: signed zeros, NaN
                a = a.view(torch.int16 if a.element_size() ==
                           2 else torch.int32)
                b = b.view(a.dtype)
            assert torch.equal(a, b), where


def switched(head):
    if 'get_targets' not in vars(head):
        fast_outcome, stats = switch_targets(torch.nn.Sequential(head))
        assert stats, fast_outcome
    return head


def run_both(head, points, gts):
    stock = type(head).get_targets(head, points, gts)
    switched(head)
    stats = head.fast_target_stats
    before = stats.stock
    out = head.get_targets(points, gts)
    return stock, out, stats.stock - before


def batched_like_stock(head, points, gts, where=None):
    """The switched head's targets: every image batched, equal to stock's."""
    stock, out, stock_way = run_both(head, points, gts)
    assert stock_way == 0, where
    assert_same(stock, out)
    return out


def test_the_upstream_heads_are_covered():
    for head in HEADS.values():
        assert fcos.supported(head) is None


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name', sorted(HEADS))
@pytest.mark.parametrize('points_dtype', [torch.float32, torch.float16])
def test_batched_targets_equal_stock(name, device, points_dtype):
    head = HEADS[name]
    for seed in range(CASES):
        points, gts = random_batch(seed, head, device, points_dtype)
        batched_like_stock(head, points, gts, seed)


def test_a_batch_without_any_box_and_one_giant_box():
    head = HEADS['center']
    points, gts = random_batch(3, head, 'cpu')
    gts = [
        InstanceData(
            bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
        for _ in range(3)
    ]
    out = batched_like_stock(head, points, gts)
    assert all((labels == head.num_classes).all() for labels in out[0])
    gts[1] = InstanceData(
        bboxes=torch.tensor([[-1e4, -1e4, 1e4, 1e4]]),
        labels=torch.tensor([2]))
    out = batched_like_stock(head, points, gts)
    assert any((labels == 2).any() for labels in out[0])


def test_boxes_larger_than_inf_next_to_padding():
    """A valid box whose area is over stock's INF (1e8), or infinite, in an
    image with fewer boxes than another: stock picks it; so must the batch
    (its padding columns must not come first)."""
    head = HEADS['plain']
    points, _ = random_batch(1, head, 'cpu')
    inf = float('inf')
    for giant in ([-2e4, -2e4, 2e4, 2e4], [-inf, -inf, inf, inf]):
        gts = [
            InstanceData(
                bboxes=torch.tensor([giant]), labels=torch.tensor([1])),
            InstanceData(
                bboxes=torch.tensor([giant, [0., 0., 10., 10.]]),
                labels=torch.tensor([1, 2])),
        ]
        batched_like_stock(head, points, gts)


@pytest.mark.parametrize('device', DEVICES)
def test_half_boxes_as_stock(device):
    """float16 points and boxes: stock's INF (1e8) is stored as inf."""
    head = HEADS['center']
    for seed in range(4):
        points, gts = random_batch(seed, head, device, torch.float16)
        gts = [
            InstanceData(bboxes=g.bboxes.half(), labels=g.labels) for g in gts
        ]
        batched_like_stock(head, points, gts)


def test_nan_and_inf_boxes_as_stock():
    head = HEADS['plain']
    points, gts = random_batch(5, head, 'cpu')
    gts[0] = InstanceData(
        bboxes=torch.tensor([[float('nan'), 0., 10., 10.],
                             [0., 0., float('inf'), 40.], [0., 0., 40., 40.]]),
        labels=torch.tensor([1, 2, 3]))
    batched_like_stock(head, points, gts)


@pytest.mark.parametrize('budget', [1, 5000, 1 << 40])
def test_image_groups_cover_the_batch_in_order(budget):
    counts = [0, 3, 130, 1, 0, 7]
    groups = image_groups(counts, 100, budget)
    assert groups[0][0] == 0 and groups[-1][1] == len(counts)
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
    for start, end in groups:
        width = max(max(counts[start:end]), 1)
        assert end - start == 1 or (end - start) * 100 * width <= budget
    assert len(groups) == (
        len(counts)
        if budget == 1 else 1 if budget == 1 << 40 else len(groups))


def test_grouped_images_give_stock_targets(monkeypatch):
    from fast_parallel.step.targets.fcos import targets
    monkeypatch.setattr(targets, 'GRID_BUDGET', 3000)
    head = HEADS['center']
    points, gts = random_batch(7, head, 'cpu')
    assert len(
        image_groups([len(g) for g in gts], sum(p.shape[0] for p in points),
                     3000)) > 1
    batched_like_stock(head, points, gts)


def test_other_layouts_take_the_stock_path_counted():
    head = HEADS['plain']
    points, gts = random_batch(2, head, 'cpu')
    gts[0] = InstanceData(
        bboxes=HorizontalBoxes(gts[0].bboxes), labels=gts[0].labels)
    assert fcos.batch_reason(head, points, gts) == \
        'boxes are not a float tensor'
    points, gts = random_batch(2, head, 'cpu')
    gts[-1].labels = gts[-1].labels.float()
    stock, out, stock_way = run_both(head, points, gts)
    assert stock_way == len(gts)
    assert_same(stock, out)


def test_stock_errors_stay_stock():
    head = HEADS['plain']
    points, gts = random_batch(2, head, 'cpu')
    with pytest.raises(AssertionError):
        type(head).get_targets(head, points[:-1], gts)
    switched(head)
    with pytest.raises(AssertionError):
        head.get_targets(points[:-1], gts)


def test_operations_do_not_grow_with_the_batch():
    head = switched(HEADS['center'])
    counts = []
    for images in (2, 16):
        points, _ = random_batch(0, head, 'cpu')
        gts = [
            InstanceData(
                bboxes=torch.tensor([[4., 4., 60., 50.]]).repeat(i % 3, 1),
                labels=torch.zeros(i % 3, dtype=torch.long))
            for i in range(images)
        ]
        before = head.fast_target_stats.stock
        with OpCounter() as ops:
            head.get_targets(points, gts)
        assert head.fast_target_stats.stock == before  # all batched
        counts.append(ops.total)
    assert counts[0] == counts[1], counts


def test_heads_with_their_own_targets_stay_stock():
    cfg = get_config(FCOS).model.bbox_head
    head = MODELS.build(dict(cfg, type='AutoAssignHead', num_classes=3))
    assert 'AutoAssignHead' in fcos.supported(head)
    head = build_head(FCOS)
    head._get_targets_single = head._get_targets_single
    assert fcos.supported(head) == \
        '_get_targets_single replaced on the instance'


def test_fcos_parity_through_the_runner(sample_data, tmp_path, capsys):
    """tools/parity.py on mmdet's FCOS config with centre sampling (the
    sample COCO images at 320 px, batch 2): stock and fast train to the
    same losses, gradient norms and parameters, every image's targets
    batched."""
    logs = small_parity(FCOS_CENTER, [
        "dict(type='Resize', scale=(320, 320), keep_ratio=True)",
        "dict(type='RandomFlip', prob=0.5)"
    ], sample_data, tmp_path, capsys)
    assert 'targets: FCOSHead batched' in logs
    # 8 convolutions with biases (conv_bias=True) and 8 group norms (2
    # weights each), 3 output convolutions (2), 5 scales: 43
    assert ('shared head weights: FCOSHead 43 weights summed per level by '
            'foreach') in logs
    assert 'FCOSHead batched for 4 of 4 images, 0 computed the stock way' \
        in logs
