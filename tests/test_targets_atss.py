"""Batched ATSS / GFL targets equal stock's, bit for bit
(fast_parallel/step/targets/atss/: assign.py, threshold.py, targets.py).

Each case builds a batch (image and pad sizes, ground truths per image) from
a seed and compares the switched head's ``get_targets`` with stock's
``ATSSHead.get_targets`` / ``GFLHead.get_targets`` tensor by tensor: dtype,
shape, strides and bits, and the ``avg_factor``. The boxes cover what users'
data holds: images without boxes, one box, more than a hundred, duplicates
(equal IoUs), zero-width boxes, boxes past the image, boxes on the anchor
grid (equal distances: ties, computed stock's way and counted), images too
small for ``topk`` anchors on a level, with and without a border check.
"""
import random

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.hub import get_config
from mmengine.logging import MessageHub
from mmengine.structures import InstanceData
from targets_utils import DEVICES, small_parity

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.targets import atss, tood
from fast_parallel.step.targets.atss.threshold import calibrate, thresholds
from fast_parallel.step.targets.switch import switch_targets

ATSS = 'mmdet::atss/atss_r50_fpn_1x_coco.py'
GFL = 'mmdet::gfl/gfl_r50_fpn_1x_coco.py'
TOOD = 'mmdet::tood/tood_r50_fpn_1x_coco.py'
CASES = 10

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def build_head(config: str, num_classes: int = 80, head=None, **train):
    model = get_config(config).model
    train_cfg = dict(model.train_cfg, **train)
    return MODELS.build(
        dict(
            model.bbox_head,
            num_classes=num_classes,
            train_cfg=train_cfg,
            **(head or {})))


#: Anchors small enough for images of this size to hold ``topk`` of them
#: on every level, inside a border check.
SMALL_ANCHORS = dict(
    anchor_generator=dict(
        type='AnchorGenerator',
        ratios=[1.0],
        octave_base_scale=2,
        scales_per_octave=1,
        strides=[8, 16, 32]))


def heads():
    return {
        'atss':
        build_head(ATSS),
        'atss_border':
        build_head(ATSS, num_classes=5, head=SMALL_ANCHORS, allowed_border=0),
        'atss_decoded':
        build_head(ATSS, num_classes=3, pos_weight=0.5),
        'gfl':
        build_head(GFL, num_classes=7),
    }


HEADS = heads()
HEADS['atss_decoded'].reg_decoded_bbox = True


def _boxes(rng: random.Random, gen: torch.Generator, num: int, height: int,
           width: int, kind: str) -> torch.Tensor:
    """``num`` boxes of one image; ``kind`` picks a corner case."""
    cxy = torch.rand(num, 2, generator=gen) * torch.tensor([width, height])
    wh = torch.exp(torch.rand(num, 2, generator=gen) * 5.5) + 1
    if kind == 'degenerate' and num:  # zero width or height
        wh[::2, rng.randrange(2)] = 0
    if kind == 'outside' and num:  # past the image's edges
        cxy = cxy * 1.6 - 0.3 * torch.tensor([width, height])
    if kind == 'grid' and num:  # centres on the anchor grid: equal distances
        cxy, wh = (cxy / 8).round() * 8, (wh / 8).round() * 16
    boxes = torch.cat([cxy - wh / 2, cxy + wh / 2], 1)
    if kind == 'duplicates' and num > 1:  # equal boxes: equal IoUs
        boxes[1::2] = boxes[0::2][:boxes[1::2].shape[0]]
    return boxes


def random_batch(seed: int, head, device: str, kinds=None):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    height, width = rng.choice([(320, 320), (256, 384), (200, 152)])
    metas, gts = [], []
    for _ in range(rng.choice([1, 2, 3, 5])):
        img_h, img_w = rng.randint(height // 2,
                                   height), rng.randint(width // 2, width)
        pad = rng.choice([(img_h, img_w), (height, width)])
        metas.append(
            dict(
                img_shape=(img_h, img_w),
                pad_shape=pad,
                batch_input_shape=(height, width)))
        num = rng.choice([0, 1, 2, 7, 30, 130])
        kind = rng.choice(kinds
                          or ['normal', 'degenerate', 'outside', 'duplicates'])
        boxes = _boxes(rng, gen, num, img_h, img_w, kind)
        labels = torch.randint(head.num_classes, (num, ), generator=gen)
        gts.append(
            InstanceData(bboxes=boxes.to(device), labels=labels.to(device)))
    sizes = [
        torch.Size((-(-height // s), -(-width // s)))
        for s, _ in head.prior_generator.strides
    ]
    return sizes, metas, gts


def assert_same(ref, out) -> None:
    assert len(ref) == len(out) == 6
    assert ref[5] == out[5] and type(ref[5]) is type(out[5])  # avg_factor
    for kind, (ref_levels, out_levels) in enumerate(zip(ref[:5], out[:5])):
        assert len(ref_levels) == len(out_levels)
        for level, (a, b) in enumerate(zip(ref_levels, out_levels)):
            where = (kind, level)
            assert a.dtype == b.dtype and a.shape == b.shape, where
            assert a.device == b.device and a.stride() == b.stride(), where
            if a.dtype.is_floating_point:  # bits: signed zeros, NaN
                a, b = a.view(torch.int32), b.view(torch.int32)
            assert torch.equal(a, b), where


def switched(head):
    if 'get_targets' not in vars(head):
        fast_outcome, stats = switch_targets(torch.nn.Sequential(head))
        assert stats, fast_outcome
    return head


def run_both(head, sizes, metas, gts, device='cpu'):
    """Stock's and the switched head's targets, and how many images the
    switched one computed the stock way."""
    anchors, valid = head.get_anchors(sizes, metas, device=device)
    stock = type(head).get_targets(head, anchors, valid, gts, metas)
    switched(head)
    stats = head.fast_target_stats
    before = stats.stock
    anchors, valid = head.get_anchors(sizes, metas, device=device)
    out = head.get_targets(anchors, valid, gts, metas)
    return stock, out, stats.stock - before


def test_the_upstream_heads_are_covered():
    for head in heads().values():
        assert atss.supported(head) is None


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name', sorted(HEADS))
def test_batched_targets_equal_stock(name, device):
    head = HEADS[name]
    batched = 0
    for seed in range(CASES):
        sizes, metas, gts = random_batch(seed, head, device)
        stock, out, stock_way = run_both(head, sizes, metas, gts, device)
        assert_same(stock, out)
        batched += len(gts) - stock_way
    assert batched > 0


@pytest.mark.parametrize('device', DEVICES)
def test_anchors_and_valid_flags_as_stock(device):
    head = switched(build_head(ATSS))
    for seed in range(4):
        sizes, metas, _ = random_batch(seed, head, device)
        anchors, valid = type(head).get_anchors(head, sizes, metas, device)
        out_anchors, out_valid = head.get_anchors(sizes, metas, device)
        assert len(out_anchors) == len(out_valid) == len(metas)
        assert all(a is out_anchors[0] for a in out_anchors)
        for ref, out in zip(anchors + valid, out_anchors + out_valid):
            for a, b in zip(ref, out):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert a.stride() == b.stride() and a.device == b.device
                assert torch.equal(a, b)


def test_ties_and_small_images_go_the_stock_way_counted():
    """Boxes centred on the anchor grid have equidistant anchors (stock's
    pick among them is topk's); an image of fewer than topk anchors on a
    level has fewer candidates: both computed by stock, counted."""
    head = HEADS['atss']
    total = 0
    for seed in range(6):
        sizes, metas, gts = random_batch(seed, head, 'cpu', kinds=['grid'])
        stock, out, stock_way = run_both(head, sizes, metas, gts)
        assert_same(stock, out)
        total += stock_way
    assert total > 0
    sizes, metas, gts = random_batch(0, head, 'cpu', kinds=['normal'])
    metas = [dict(m, img_shape=(100, 90), pad_shape=(100, 90)) for m in metas]
    stock, out, stock_way = run_both(head, sizes, metas, gts)
    assert_same(stock, out)
    assert stock_way == sum(1 for g in gts if len(g))


def test_a_batch_without_any_box():
    head = HEADS['gfl']
    sizes, metas, gts = random_batch(1, head, 'cpu')
    gts = [
        InstanceData(
            bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
        for _ in gts
    ]
    stock, out, stock_way = run_both(head, sizes, metas, gts)
    assert_same(stock, out)
    assert stock_way == 0
    assert all((labels == head.num_classes).all() for labels in out[1])


def test_nan_boxes_go_the_stock_way():
    head = HEADS['atss']
    sizes, metas, gts = random_batch(4, head, 'cpu')
    gts[0] = InstanceData(
        bboxes=torch.tensor([[float('nan'), 0., 10., 10.], [0., 0., 40.,
                                                            40.]]),
        labels=torch.tensor([1, 2]))
    stock, out, stock_way = run_both(head, sizes, metas, gts)
    assert_same(stock, out)
    assert stock_way == 1


@pytest.mark.parametrize('device', DEVICES)
def test_thresholds_are_stock_mean_plus_std(device):
    """The batched mean + std of each image's (K, n) candidate IoUs equals
    stock's ``mean(0) + std(0)`` on that image's own matrix, for every
    count around ATen's block sizes (the sum's order changes there)."""
    if device == 'cpu':
        assert calibrate(45) is not None
    gen = torch.Generator().manual_seed(0)
    counts = [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 32, 33, 64, 65, 100, 129, 0]
    parts = [counts[start:start + 4] for start in range(0, len(counts), 4)]
    parts.append([130] * 8)  # over one thread's share: several sums
    for k in (45, 9, 27):
        for part in parts:
            cand = torch.rand((len(part), k, max(*part, 1)), generator=gen)
            cand = cand.to(device)
            thr = thresholds(cand, part)
            for i, count in enumerate(part):
                own = cand[i, :, :count].contiguous()
                assert torch.equal(thr[i, :count],
                                   own.mean(0) + own.std(0)), (k, count)


def test_no_anchor_inside_raises_stocks_error():
    head = HEADS['atss_border']
    sizes, metas, gts = random_batch(2, head, 'cpu')
    metas[0] = dict(metas[0], img_shape=(4, 4))
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    with pytest.raises(ValueError, match='no valid anchor inside'):
        type(head).get_targets(head, anchors, valid, gts, metas)
    switched(head)
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    with pytest.raises(ValueError, match='no valid anchor inside'):
        head.get_targets(anchors, valid, gts, metas)


def test_ignored_instances_without_boxes_raise_as_stock():
    head = HEADS['atss']
    sizes, metas, gts = random_batch(3, head, 'cpu')
    ignores = [InstanceData()] * len(gts)
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    with pytest.raises(AttributeError):
        type(head).get_targets(head, anchors, valid, gts, metas, ignores)
    switched(head)
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    with pytest.raises(AttributeError):
        head.get_targets(anchors, valid, gts, metas, ignores)


def test_operations_do_not_grow_with_the_batch():
    head = switched(build_head(GFL))
    counts = []
    for images in (2, 16):
        sizes, metas, _ = random_batch(0, head, 'cpu')
        metas = [metas[0]] * images
        gts = [
            InstanceData(
                bboxes=torch.tensor([[4.3, 4.1, 60.2, 50.7]]).repeat(i % 3, 1)
                + torch.arange(i % 3)[:, None] * 3.7,
                labels=torch.zeros(i % 3, dtype=torch.long))
            for i in range(images)
        ]
        anchors, valid = head.get_anchors(sizes, metas, device='cpu')
        head.get_targets(anchors, valid, gts, metas)  # calibrated once
        before = head.fast_target_stats.stock
        with OpCounter() as ops:
            head.get_targets(anchors, valid, gts, metas)
        assert head.fast_target_stats.stock == before  # all batched
        counts.append(ops.total)
    assert counts[0] == counts[1], counts


def test_tood_boundary_ties_go_the_stock_way():
    """Equal predictions give equal alignment metrics: a tie at TaskAligned's
    top-k boundary (stock's pick is topk's), computed stock's way, counted;
    zero metrics tie without consequence (never positive)."""
    head = build_head(TOOD, num_classes=4)
    MessageHub.get_current_instance().update_info('epoch', head.initial_epoch)
    sizes, metas, gts = random_batch(2, head, 'cpu', kinds=['normal'])
    scores, boxes = _tood_inputs(head, sizes, metas)
    scores[:] = 0.5
    boxes[:] = gts[0].bboxes[0] if len(gts[0].bboxes) else boxes[0, 0]
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    stock = type(head).get_targets(head, scores, boxes, anchors, valid, gts,
                                   metas)
    switched(head)
    before = head.fast_target_stats.stock
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    out = head.get_targets(scores, boxes, anchors, valid, gts, metas)
    assert_same((*stock, 0), (*out, 0))
    assert head.fast_target_stats.stock - before == sum(1 for g in gts
                                                        if len(g.bboxes))


def _tood_both(head, sizes, metas, gts, error=None, match=None):
    """Stock's and the switched head's targets (and the images it computed
    stock's way), or both raising ``error``."""
    scores, boxes = _tood_inputs(head, sizes, metas)
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    if error is not None:
        with pytest.raises(error, match=match):
            type(head).get_targets(head, scores, boxes, anchors, valid, gts,
                                   metas)
    else:
        stock = type(head).get_targets(head, scores, boxes, anchors, valid,
                                       gts, metas)
    switched(head)
    before = head.fast_target_stats.stock
    anchors, valid = head.get_anchors(sizes, metas, device='cpu')
    if error is not None:
        with pytest.raises(error, match=match):
            head.get_targets(scores, boxes, anchors, valid, gts, metas)
        return None
    out = head.get_targets(scores, boxes, anchors, valid, gts, metas)
    return stock, out, head.fast_target_stats.stock - before


def test_tood_labels_stock_indexes_by_go_the_stock_way():
    """TaskAligned indexes the scores by label: -1 wraps to the last class
    in stock (found by a review: the batch read class 0), a label past the
    classes raises stock's IndexError; no anchor inside raises stock's
    ValueError."""
    head = build_head(
        TOOD, num_classes=4, head=SMALL_ANCHORS, allowed_border=0)
    MessageHub.get_current_instance().update_info('epoch', head.initial_epoch)
    sizes, metas, gts = random_batch(3, head, 'cpu', kinds=['normal'])
    gts = [g for g in gts if len(g.bboxes)] or gts
    labels = gts[0].labels.clone()
    labels[0] = -1
    gts[0] = InstanceData(bboxes=gts[0].bboxes, labels=labels)
    stock, out, stock_way = _tood_both(head, sizes, metas, gts)
    assert_same((*stock, 0), (*out, 0))
    assert stock_way >= 1
    labels[0] = head.num_classes
    _tood_both(head, sizes, metas, gts, IndexError)
    labels[0] = 0
    metas[0] = dict(metas[0], img_shape=(4, 4))
    _tood_both(head, sizes, metas, gts, ValueError, 'no valid anchor inside')


def test_inputs_stock_rejects_raise_as_stock():
    """int32 labels (stock's index put raises) and an empty list of ignored
    instances (stock's ``multi_apply`` unpacks nothing)."""
    head = HEADS['gfl']
    sizes, metas, gts = random_batch(5, head, 'cpu', kinds=['normal'])
    gts = [InstanceData(bboxes=g.bboxes, labels=g.labels.int()) for g in gts]
    for ignores, error in ((None, RuntimeError), ([], ValueError)):
        anchors, valid = head.get_anchors(sizes, metas, device='cpu')
        with pytest.raises(error):
            type(head).get_targets(head, anchors, valid, gts, metas, ignores)
        switched(head)
        anchors, valid = head.get_anchors(sizes, metas, device='cpu')
        with pytest.raises(error):
            head.get_targets(anchors, valid, gts, metas, ignores)


def test_heads_and_options_not_covered_stay_stock():
    model = get_config(ATSS).model
    ddod = MODELS.build(
        dict(
            model.bbox_head,
            train_cfg=dict(
                model.train_cfg,
                assigner=dict(type='ATSSAssigner', topk=9, alpha=0.8))))
    assert 'alpha' in atss.supported(ddod)
    assert 'TOODHead' in atss.supported(build_head(TOOD))
    head = build_head(ATSS)
    head._get_targets_single = head._get_targets_single
    assert atss.supported(head) == \
        '_get_targets_single replaced on the instance'


def _tood_inputs(head, sizes, metas, device='cpu'):
    gen = torch.Generator().manual_seed(len(metas))
    num = sum(s[0] * s[1] for s in sizes)
    scores = torch.rand(len(metas), num, head.num_classes, generator=gen)
    xy = torch.rand(len(metas), num, 2, generator=gen) * 200
    boxes = torch.cat([xy, xy + torch.rand(len(metas), num, 2) * 80], -1)
    return scores.to(device), boxes.to(device)


@pytest.mark.parametrize('device', DEVICES)
def test_tood_targets_equal_stock_in_every_epoch(device):
    """TOODHead's targets in its initial epochs (ATSSAssigner) and after
    (TaskAlignedAssigner, on the predictions) are batched and stock's."""
    head = build_head(TOOD, num_classes=4)
    assert tood.supported(head) is None
    hub = MessageHub.get_current_instance()
    for epoch in (0, head.initial_epoch - 1, head.initial_epoch, 11):
        hub.update_info('epoch', epoch)
        batched_images = positives = 0
        for seed in range(4):
            sizes, metas, gts = random_batch(seed, head, device)
            scores, boxes = _tood_inputs(head, sizes, metas, device)
            anchors, valid = head.get_anchors(sizes, metas, device=device)
            stock = type(head).get_targets(head, scores, boxes, anchors, valid,
                                           gts, metas)
            switched(head)
            before = head.fast_target_stats.stock
            anchors, valid = head.get_anchors(sizes, metas, device=device)
            out = head.get_targets(scores, boxes, anchors, valid, gts, metas)
            stock_way = head.fast_target_stats.stock - before
            assert head.epoch == epoch
            assert len(out) == len(stock) == 5
            assert_same((*stock, 0), (*out, 0))
            batched_images += len(gts) - stock_way
            positives += sum(
                int((lv < head.num_classes).sum()) for lv in out[1])
        assert batched_images > 0 and positives > 0, epoch


def test_atss_parity_through_the_runner(sample_data, tmp_path, capsys):
    """tools/parity.py on mmdet's ATSS config (the sample COCO images at
    320 px, batch 2): stock and fast train to the same losses, gradient
    norms and parameters, with the targets batched."""
    logs = small_parity(ATSS, [
        "dict(type='Resize', scale=(320, 320), keep_ratio=True)",
        "dict(type='RandomFlip', prob=0.5)"
    ], sample_data, tmp_path, capsys)
    assert 'targets: ATSSHead/ATSSAssigner batched' in logs
    assert ('ATSSHead/ATSSAssigner batched for 4 of 4 images, 0 computed '
            'the stock way') in logs
    # and the losses of every level at once (atss/losses.py)
    assert 'ATSSHead losses over levels at once' in logs
    assert 'shared head weights: ATSSHead ' in logs
    assert ('ATSSHead losses batched for 2 of 2 batches, 0 computed the '
            'stock way') in logs


def test_gfl_parity_through_the_runner(sample_data, tmp_path, capsys):
    """tools/parity.py on mmdet's GFL config: the batched targets and the
    quality / distribution focal losses of every level at once train to
    stock's losses, gradient norms and parameters."""
    logs = small_parity(GFL, [
        "dict(type='Resize', scale=(320, 320), keep_ratio=True)",
        "dict(type='RandomFlip', prob=0.5)"
    ], sample_data, tmp_path, capsys)
    assert 'targets: GFLHead/ATSSAssigner batched' in logs
    assert 'GFLHead losses over levels at once' in logs
    assert ('GFLHead losses batched for 2 of 2 batches, 0 computed the '
            'stock way') in logs


def test_tood_aligned_parity_through_the_runner(sample_data, tmp_path, capsys):
    """tools/parity.py on mmdet's TOOD config with ``initial_epoch=0`` (the
    TaskAlignedAssigner from the first iteration): the same losses,
    gradient norms and parameters as stock."""
    logs = small_parity(
        TOOD, [
            "dict(type='Resize', scale=(320, 320), keep_ratio=True)",
            "dict(type='RandomFlip', prob=0.5)"
        ],
        sample_data,
        tmp_path,
        capsys,
        model=', train_cfg=dict(initial_epoch=0)')
    assert 'targets: TOODHead/ATSSAssigner batched' in logs
    assert ('TOODHead/ATSSAssigner batched for 4 of 4 images, 0 computed '
            'the stock way') in logs
    assert 'TOODHead losses over levels at once' in logs
    assert ('TOODHead losses batched for 2 of 2 batches, 0 computed the '
            'stock way') in logs
