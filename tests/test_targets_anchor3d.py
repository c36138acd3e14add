"""fast_parallel.step.targets.anchor3d: PointPillars' anchor targets for the
whole batch equal ``Anchor3DHead.anchor_target_3d``'s, bit for bit, in a
number of operations that does not grow with the batch or the gts."""
import copy
import functools
import math
import random
from typing import List, Optional, Sequence

import pytest
import torch
from mmengine.hub import get_config
from mmengine.structures import InstanceData

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.targets.anchor3d import targets as anchor3d
from fast_parallel.step.targets.anchor3d.targets import anchor3d_supported
from fast_parallel.step.targets.max_iou.assign import assign_batch
from fast_parallel.step.targets.stock_way import StockWay


def anchor_target_3d_batched(*args, **kwargs):
    """The batched targets and how many samples went the stock way."""
    way = StockWay()
    out = anchor3d.anchor_target_3d_batched(*args, stock_way=way, **kwargs)
    return out, way.samples


CAR = 'mmdet3d::pointpillars/pointpillars_hv_secfpn_8xb6-160e_kitti-3d-car.py'
THREE = ('mmdet3d::pointpillars/'
         'pointpillars_hv_secfpn_8xb6-160e_kitti-3d-3class.py')
X_MAX, Y_MAX = 69.12, 39.68  # the KITTI point cloud range, in x and +-y
#: Per class (Pedestrian, Cyclist, Car): anchor size and bottom z.
SIZES = [(0.8, 0.6, 1.73), (1.76, 0.6, 1.73), (3.9, 1.6, 1.56)]
Z = [-0.6, -0.6, -1.78]
SMALL_MAP = (24, 20)  # the properties below do not depend on the map size
FULL_MAP = (248, 216)  # the KITTI car recipe's feature map
CUDA = torch.cuda.is_available()
DEVICES = [
    'cpu',
    pytest.param(
        'cuda', marks=pytest.mark.skipif(not CUDA, reason='needs CUDA'))
]


@functools.lru_cache(maxsize=None)
def _config(name: str):
    from mmdet3d.utils import register_all_modules
    register_all_modules()
    return get_config(name)


def build_head(name: str, assigner: Optional[dict] = None, **head_changes):
    """The recipe's Anchor3DHead, with train_cfg, optionally changed."""
    from mmdet3d.registry import MODELS
    cfg = _config(name)
    train_cfg = copy.deepcopy(cfg.model.train_cfg)
    for one in (train_cfg.assigner if isinstance(train_cfg.assigner, list) else
                [train_cfg.assigner]):
        one.update(assigner or {})
    head_cfg = copy.deepcopy(cfg.model.bbox_head)
    head_cfg.update(
        train_cfg=train_cfg, test_cfg=cfg.model.test_cfg, **head_changes)
    return MODELS.build(head_cfg)


@functools.lru_cache(maxsize=None)
def head_of(name: str):
    return build_head(name)


@functools.lru_cache(maxsize=None)
def variant_head(variant: str):
    name, changes = VARIANTS[variant]
    return build_head(name, **changes)


def _boxes(rng: random.Random, n: int, num_classes: int, kind: str,
           anchors: torch.Tensor) -> torch.Tensor:
    """``n`` gt boxes (x, y, z, dx, dy, dz, yaw) of one kind, and labels."""
    rows, labels = [], []
    for _ in range(n):
        label = rng.randrange(num_classes)
        size = SIZES[label if num_classes == 3 else 2]
        dims = [s * rng.uniform(0.7, 1.3) for s in size]
        x, y = rng.uniform(-1, X_MAX + 1), rng.uniform(-Y_MAX - 1, Y_MAX + 1)
        z, yaw = Z[label if num_classes == 3 else 2], rng.uniform(-3.2, 3.2)
        if kind == 'edge':  # on the range's border or corner
            x = rng.choice([0.0, X_MAX, x])
            y = rng.choice([-Y_MAX, Y_MAX]) if x not in (0.0, X_MAX) else \
                rng.choice([-Y_MAX, Y_MAX, y])
        elif kind == 'aligned':  # an anchor itself: IoU 1, ties, thresholds
            row = anchors[rng.randrange(len(anchors))].tolist()
            x, y, z, dims, yaw = row[0], row[1], row[2], row[3:6], row[6]
            yaw += rng.choice([0.0, 0.0, math.pi])  # same BEV box
        elif kind == 'far':  # overlaps no anchor at all
            x = rng.choice([-30.0, X_MAX + 30])
        rows.append([x, y, z, *dims, yaw])
        labels.append(label)
    return torch.tensor(rows).view(-1, 7), torch.tensor(labels).long()


def make_sample(rng: random.Random,
                n: int,
                num_classes: int,
                anchors: torch.Tensor,
                kinds: Sequence[str] = ('random', 'random', 'edge', 'aligned',
                                        'dup')):
    """One sample's gt InstanceData: ``n`` boxes of mixed kinds."""
    from mmdet3d.structures import LiDARInstance3DBoxes
    parts, labels, left = [], [], n
    while left > 0:
        kind, k = rng.choice(kinds), rng.randint(1, max(1, min(left, 8)))
        if kind == 'dup':  # boxes repeated: exact IoU ties across gts
            boxes, cls = _boxes(rng, 1, num_classes, 'random', anchors)
            boxes, cls = boxes.repeat(k, 1), cls.repeat(k)
        else:
            boxes, cls = _boxes(rng, k, num_classes, kind, anchors)
        parts.append(boxes)
        labels.append(cls)
        left -= k
    boxes = torch.cat(parts) if parts else torch.zeros(0, 7)
    cls = torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long)
    order = torch.randperm(
        len(boxes),
        generator=torch.Generator().manual_seed(rng.randrange(
            2**31)))  # duplicates interleaved with others
    return InstanceData(
        bboxes_3d=LiDARInstance3DBoxes(boxes[order]), labels_3d=cls[order])


def make_batch(seed: int,
               head,
               anchors: torch.Tensor,
               counts: Optional[List[int]] = None,
               **kw) -> list:
    """A seeded batch: 1..6 samples of 0, 1, a few or over 100 gts."""
    rng = random.Random(seed)
    if counts is None:
        size = rng.choice([1, 2, 3, 6])
        counts = [
            rng.choice([
                0, 1,
                rng.randint(2, 20),
                rng.randint(2, 20),
                rng.randint(101, 115) if seed % 4 == 0 else 3
            ]) for _ in range(size)
        ]
    return [
        make_sample(rng, n, head.num_classes, anchors, **kw) for n in counts
    ]


def _to(batch: list, device: str) -> list:
    return [
        InstanceData(
            bboxes_3d=x.bboxes_3d.to(device), labels_3d=x.labels_3d.to(device))
        for x in batch
    ]


def assert_same(ref, out) -> None:
    """Same structure, dtypes, shapes, strides and bits as stock's."""
    assert len(ref) == len(out) == 8
    for ref_levels, out_levels in zip(ref[:6], out[:6]):
        assert len(ref_levels) == len(out_levels)
        for a, b in zip(ref_levels, out_levels):
            assert (a.dtype, a.shape, a.stride(),
                    a.device) == (b.dtype, b.shape, b.stride(), b.device)
            if a.is_floating_point():  # bitwise, -0.0 and NaN included
                a, b = a.view(torch.int32), b.view(torch.int32)
            assert torch.equal(a, b)
    assert type(out[6]) is int and type(out[7]) is int
    assert ref[6:] == out[6:]


def run_both(head,
             batch: list,
             featmap=SMALL_MAP,
             device: str = 'cpu',
             ignore: Optional[list] = None):
    """Stock's and the batched targets of one batch (inputs copied)."""
    batch = _to(batch, device)
    mlvl = head.prior_generator.grid_anchors([featmap], device=device)
    metas = [dict() for _ in batch]
    args = (metas, copy.deepcopy(ignore), 1, head.num_classes, False)
    ref = head.anchor_target_3d([mlvl for _ in batch], copy.deepcopy(batch),
                                *args)
    out, num_stock = anchor_target_3d_batched(head, [mlvl for _ in batch],
                                              copy.deepcopy(batch), *args)
    return ref, out, num_stock


def flat_anchors(head, featmap=SMALL_MAP) -> torch.Tensor:
    return torch.cat(
        head.prior_generator.grid_anchors([featmap],
                                          device='cpu')).reshape(-1, 7)


# ------------------------------------------------------------- coverage ---
def test_recipes_are_covered():
    assert anchor3d_supported(head_of(CAR)) is None
    assert anchor3d_supported(head_of(THREE)) is None


def test_what_is_not_covered_says_why():
    from mmdet3d.models.dense_heads import Anchor3DHead
    from mmdet3d.registry import TASK_UTILS
    head = copy.deepcopy(head_of(CAR))
    head.bbox_sampler = TASK_UTILS.build(
        dict(type='mmdet.RandomSampler', num=64, pos_fraction=0.5))
    assert 'PseudoSampler' in anchor3d_supported(head)
    head = copy.deepcopy(head_of(CAR))
    head.bbox_assigner.iou_calculator = TASK_UTILS.build(
        dict(type='BboxOverlaps3D', coordinate='lidar'))
    assert 'BboxOverlapsNearest3D' in anchor3d_supported(head)
    head = copy.deepcopy(head_of(THREE))
    head.bbox_assigner[1] = TASK_UTILS.build(
        dict(
            type='mmdet.MaxIoUAssigner',
            pos_iou_thr=0.5,
            neg_iou_thr=0.3,
            iou_calculator=dict(type='mmdet.BboxOverlaps2D')))
    assert 'Max3DIoUAssigner' in anchor3d_supported(head)
    head = copy.deepcopy(head_of(CAR))
    head.__class__ = type('MyHead', (Anchor3DHead, ), {})
    assert 'MyHead' in anchor3d_supported(head)
    head = copy.deepcopy(head_of(CAR))
    head.anchor_target_3d_single = lambda *a, **k: None
    assert 'replaced' in anchor3d_supported(head)


# ----------------------------------------------------------- equal bits ---
@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('seed', range(60))
def test_car_equals_stock(seed, device):
    head = head_of(CAR)
    batch = make_batch(seed, head, flat_anchors(head))
    ref, out, num_stock = run_both(head, batch, device=device)
    assert num_stock == 0
    assert_same(ref, out)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('seed', range(60))
def test_3class_equals_stock(seed, device):
    """A list of 3 assigners, one anchor set each; classes missing from
    samples (a sample's gts drawn from a subset of classes) included."""
    head = head_of(THREE)
    anchors = flat_anchors(head)
    batch = make_batch(seed, head, anchors)
    if seed % 3 == 0:  # only cars in this batch: two empty classes
        for x in batch:
            x.labels_3d = torch.full_like(x.labels_3d, 2)
    ref, out, num_stock = run_both(head, batch, device=device)
    assert num_stock == 0
    assert_same(ref, out)


VARIANTS = {
    # the low-quality step assigns one argmax anchor per gt, not all ties
    'argmax_only': (CAR, dict(assigner=dict(gt_max_assign_all=False))),
    'no_low_quality': (CAR, dict(assigner=dict(match_low_quality=False))),
    'neg_range': (CAR, dict(assigner=dict(neg_iou_thr=(0.1, 0.45)))),
    # every gt takes all anchors at its max IoU, even 0: the overwrite
    # order of the gts decides nearly every anchor
    'min_pos_0': (CAR, dict(assigner=dict(min_pos_iou=0.0))),
    'min_pos_0_argmax':
    (CAR, dict(assigner=dict(min_pos_iou=0.0, gt_max_assign_all=False))),
    'all_gts_per_class': (THREE, dict(assign_per_class=False)),
    '3class_min_pos_0': (THREE, dict(assigner=dict(min_pos_iou=0.0))),
}


@pytest.mark.parametrize('seed', range(6))
@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_assigner_options_equal_stock(variant, seed):
    head = variant_head(variant)
    kinds = ('random', 'aligned', 'dup', 'far', 'edge')
    batch = make_batch(seed, head, flat_anchors(head), kinds=kinds)
    ref, out, num_stock = run_both(head, batch)
    assert num_stock == 0
    assert_same(ref, out)


def test_pos_weight_equals_stock():
    head = copy.deepcopy(head_of(CAR))
    head.train_cfg.pos_weight = 2.5
    batch = make_batch(3, head, flat_anchors(head), counts=[4, 0, 9])
    ref, out, _ = run_both(head, batch)
    assert_same(ref, out)


@pytest.mark.parametrize('seed', range(40))
def test_ties_resolve_like_stock(seed):
    """Quantised overlaps (many exact ties across gts and across anchors):
    the batched assignment equals ``assign_wrt_overlaps`` sample by sample.
    """
    rng = torch.Generator().manual_seed(seed)
    counts = [0, 1, 5, 17][:1 + seed % 4]
    num_anchors, num_gts = 50, max(max(counts), 1)
    overlaps = torch.randint(
        0, 5, (len(counts), num_gts, num_anchors), generator=rng).float() / 4
    valid = torch.arange(num_gts)[None] < torch.tensor(counts)[:, None]
    from mmdet3d.registry import TASK_UTILS
    for changes in (dict(),
                    dict(min_pos_iou=0.0), dict(gt_max_assign_all=False),
                    dict(neg_iou_thr=(0.25, 0.5))):
        assigner = TASK_UTILS.build(
            dict(_config(CAR).model.train_cfg.assigner, **changes))
        got, _ = assign_batch(assigner, overlaps, valid)
        for i, n in enumerate(counts):
            if n == 0:
                assert (got[i] == 0).all()
                continue
            ref = assigner.assign_wrt_overlaps(
                overlaps[i, :n].clone(), torch.zeros(n, dtype=torch.long))
            assert torch.equal(got[i], ref.gt_inds)


@pytest.mark.parametrize('device', DEVICES)
def test_full_feature_map_car(device):
    """The recipe's 248x216 map, batch 6, about 10 gts per sample; and a
    batch of 1 with more than 100 gts."""
    head = head_of(CAR)
    anchors = flat_anchors(head, FULL_MAP)
    for counts in ([10, 12, 0, 9, 11, 8], [105]):
        batch = make_batch(7, head, anchors, counts=counts)
        ref, out, num_stock = run_both(head, batch, FULL_MAP, device)
        assert num_stock == 0
        assert_same(ref, out)


@pytest.mark.parametrize('device', DEVICES)
def test_full_feature_map_3class(device):
    head = head_of(THREE)
    batch = make_batch(
        11, head, flat_anchors(head, FULL_MAP), counts=[15, 0, 6])
    batch[2].labels_3d = torch.zeros_like(batch[2].labels_3d)  # peds only
    ref, out, num_stock = run_both(head, batch, FULL_MAP, device)
    assert num_stock == 0
    assert_same(ref, out)


# ------------------------------------------------------------ fallbacks ---
def test_ignore_boxes_take_the_stock_path():
    head = build_head(CAR, assigner=dict(ignore_iof_thr=0.5))
    anchors = flat_anchors(head)
    batch = make_batch(5, head, anchors, counts=[6, 4, 7])
    boxes = make_sample(random.Random(1), 3, 1, anchors).bboxes_3d.tensor
    ignore = [None, InstanceData(bboxes_3d=boxes), None]
    ref, out, num_stock = run_both(head, batch, ignore=ignore)
    assert num_stock == 1
    assert_same(ref, out)


def test_other_gt_dtype_takes_the_stock_path():
    head = head_of(CAR)
    batch = make_batch(2, head, flat_anchors(head), counts=[5, 8])
    batch[1].bboxes_3d = batch[1].bboxes_3d.tensor.half()  # stock: ok
    ref, out, num_stock = run_both(head, batch)
    assert num_stock == 1
    assert_same(ref, out)


def test_anchors_not_shared_take_the_stock_path():
    head = head_of(THREE)
    batch = make_batch(4, head, flat_anchors(head), counts=[3, 2])
    mlvl = head.prior_generator.grid_anchors([SMALL_MAP], device='cpu')
    args = ([{}, {}], None, 1, 3, False)
    ref = head.anchor_target_3d([mlvl, mlvl], copy.deepcopy(batch), *args)
    out, num_stock = anchor_target_3d_batched(
        head, [mlvl, [a.clone() for a in mlvl]], copy.deepcopy(batch), *args)
    assert num_stock == 2
    assert_same(ref, out)


def test_installed_on_the_instance_falls_back_without_recursion():
    """As a hook would install it: ``head.anchor_target_3d`` replaced."""
    head = copy.deepcopy(head_of(CAR))
    head.anchor_target_3d = lambda *args: anchor_target_3d_batched(
        head, *args)[0]
    assert anchor3d_supported(head) is None
    batch = make_batch(12, head, flat_anchors(head), counts=[4, 6])
    mlvl = head.prior_generator.grid_anchors([SMALL_MAP], device='cpu')
    args = ([{}, {}], None, 1, 1, False)
    ref = type(head).anchor_target_3d(head, [mlvl, mlvl], copy.deepcopy(batch),
                                      *args)
    for anchor_list in ([mlvl, mlvl], [mlvl, [a.clone() for a in mlvl]]):
        out = head.anchor_target_3d(anchor_list, copy.deepcopy(batch), *args)
        assert_same(ref, out)


def test_cpu_log_loops_that_differ_take_the_stock_path(monkeypatch):

    def differ(name):
        raise anchor3d.PathModelError(f'{name}: vector and scalar differ')

    monkeypatch.setattr(anchor3d, 'require_same_paths', differ)
    head = head_of(CAR)
    batch = make_batch(8, head, flat_anchors(head), counts=[3, 0, 5])
    ref, out, num_stock = run_both(head, batch)
    assert num_stock == 3
    assert_same(ref, out)


@pytest.mark.skipif(not CUDA, reason='needs CUDA')
def test_gpu_assign_thr_takes_the_stock_path_on_cuda():
    """Stock computes such a sample's overlaps on the CPU (other rounding
    of ``x / pi`` than CUDA's ``x * (1 / pi)``)."""
    head = build_head(CAR, assigner=dict(gpu_assign_thr=5)).cuda()
    batch = make_batch(10, head, flat_anchors(head), counts=[3, 8, 5])
    ref, out, num_stock = run_both(head, batch, device='cuda')
    assert num_stock == 1
    assert_same(ref, out)


def test_inputs_change_as_stock_changes_them():
    """Stock swaps in the concatenated anchors and, with one assigner, the
    gt tensor for ``bboxes_3d``; so does the batched path."""
    for name in (CAR, THREE):
        head = head_of(name)
        batch = make_batch(6, head, flat_anchors(head), counts=[2, 0])
        mlvl = head.prior_generator.grid_anchors([SMALL_MAP], device='cpu')
        seen = []
        for fn in (head.anchor_target_3d,
                   functools.partial(anchor_target_3d_batched, head)):
            anchor_list, gts = [mlvl, mlvl], copy.deepcopy(batch)
            fn(anchor_list, gts, [{}, {}], None, 1, head.num_classes, False)
            seen.append(
                ([type(a)
                  for a in anchor_list], [type(x.bboxes_3d) for x in gts]))
        assert seen[0] == seen[1]


# ----------------------------------------------------------- op counts ---
def _count(fn, head, counts: List[int], featmap=SMALL_MAP) -> OpCounter:
    batch = make_batch(9, head, flat_anchors(head, featmap), counts=counts)
    mlvl = head.prior_generator.grid_anchors([featmap], device='cpu')
    with OpCounter() as counter:
        fn([mlvl for _ in batch], batch, [{} for _ in batch], None, 1,
           head.num_classes, False)
    return counter


@pytest.mark.parametrize('name', [CAR, THREE])
def test_op_count_does_not_grow_with_batch_or_gts(name):
    head = head_of(name)
    batched = functools.partial(anchor_target_3d_batched, head)
    _count(batched, head, [1])  # warm-up: the once-per-process CPU check
    shapes = ([0], [10], [10] * 6, [0, 1, 120, 3, 0, 7], [2] * 12)
    totals = {_count(batched, head, c).total for c in shapes}
    assert len(totals) == 1, totals
    for counts in ([10] * 6, [0, 1, 120]):
        fast = _count(batched, head, counts)
        stock = _count(head.anchor_target_3d, head, counts)
        assert fast.ops['_local_scalar_dense'] == 0
        assert stock.ops['_local_scalar_dense'] >= sum(counts)
        assert fast.total < stock.total


def test_op_figures_car_full_map(capsys):
    """The figures of the report: car recipe, 248x216, ~10 gts a sample."""
    head = head_of(CAR)
    batched = functools.partial(anchor_target_3d_batched, head)
    _count(batched, head, [1])  # warm-up: the once-per-process CPU check
    rows = []
    for counts in ([10], [10, 9, 11, 10, 12, 8]):
        for arm, fn in (('stock', head.anchor_target_3d), ('batched',
                                                           batched)):
            c = _count(fn, head, counts, FULL_MAP)
            rows.append(f'batch {len(counts)} {arm}: {c.total} ops, '
                        f"{c.ops['_local_scalar_dense']} .item()")
    with capsys.disabled():
        print('\n' + '\n'.join(rows))
    assert rows[1].split()[3] == rows[3].split()[3]  # batched: same count


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_outputs_are_batched_and_equal_stock(dtype):
    """Under AMP the head's outputs are half; its anchors (made in float32
    by ``get_anchors``) and the ground truths are not, so the targets are the
    float32 ones: every sample batched, losses and gradients stock's bits."""
    from fast_parallel.step.targets.switch import switch_targets
    torch.manual_seed(0)
    stock_head = build_head(CAR)
    fast_head = copy.deepcopy(stock_head)
    _, (stats, ) = switch_targets(fast_head)
    anchors = flat_anchors(stock_head)
    gen = torch.Generator().manual_seed(4)
    for seed in range(3):
        batch = make_batch(seed, stock_head, anchors, counts=[0, 3, 12, 1])
        feats = [torch.randn(4, 384, *SMALL_MAP[::-1], generator=gen)]
        metas = [dict(box_type_3d=type(g.bboxes_3d)) for g in batch]
        results = []
        for head in (stock_head, fast_head):
            head.zero_grad()
            outs = [[o.to(dtype) for o in level] for level in head(feats)]
            losses = head.loss_by_feat(*outs, copy.deepcopy(batch), metas)
            total = sum(
                v if isinstance(v, torch.Tensor) else sum(v)
                for v in losses.values())
            total.backward()
            results.append((losses, {
                n: p.grad.clone()
                for n, p in head.named_parameters() if p.grad is not None
            }))
        (stock_losses, stock_grads), (fast_losses, fast_grads) = results
        for name, value in stock_losses.items():
            for a, b in zip(
                    value if isinstance(value, list) else [value],
                    fast_losses[name]
                    if isinstance(value, list) else [fast_losses[name]]):
                assert a.dtype == b.dtype and torch.equal(a, b), name
        for name, grad in stock_grads.items():
            assert torch.equal(grad, fast_grads[name]), name
    assert (stats.samples, stats.stock) == (12, 0)


@pytest.mark.parametrize('all_stock', [True, False])
def test_nine_wide_boxes_when_samples_take_the_stock_path(all_stock):
    # nuScenes-style anchors and boxes (velocity: 9 columns); samples sent
    # the stock way sit in the batch as samples without gts, as wide as the
    # anchors even where no sample is batched
    from mmdet3d.structures import LiDARInstance3DBoxes
    head = build_head(
        CAR,
        assigner=dict(ignore_iof_thr=0.5),  # ignore boxes: the stock way
        anchor_generator=dict(
            type='AlignedAnchor3DRangeGenerator',
            ranges=[[0, -39.68, -1.78, 69.12, 39.68, -1.78]],
            sizes=[[3.9, 1.6, 1.56]],
            rotations=[0, 1.57],
            custom_values=[0, 0],
            reshape_out=True),
        bbox_coder=dict(type='DeltaXYZWLHRBBoxCoder', code_size=9))
    anchors = torch.cat(
        head.prior_generator.grid_anchors([SMALL_MAP],
                                          device='cpu')).reshape(-1, 9)[:, :7]
    batch = make_batch(7, head, anchors, counts=[5, 3])
    for sample in batch:
        boxes = sample.bboxes_3d.tensor
        sample.bboxes_3d = LiDARInstance3DBoxes(
            torch.cat([boxes, torch.zeros(len(boxes), 2)], 1), box_dim=9)
    none = InstanceData(bboxes_3d=torch.zeros(0, 9))
    ignore = [none, copy.deepcopy(none) if all_stock else None]
    ref, out, num_stock = run_both(head, batch, ignore=ignore)
    assert num_stock == (2 if all_stock else 1)
    assert_same(ref, out)
