"""fast_parallel.step.targets.centerpoint: CenterPoint's targets for the
whole batch equal ``CenterHead.get_targets``'s, bit for bit (heatmaps,
``anno_box``, ``ind``, ``mask`` per task), in a number of operations that
does not grow with the objects."""
import copy
import functools
import random
from types import MethodType

import pytest
import torch
from mmengine.hub import get_config
from mmengine.structures import InstanceData

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.compat import ITEM_OP
from fast_parallel.step.targets import centerpoint
from fast_parallel.step.targets.stats import TargetStats

PILLAR = ('mmdet3d::centerpoint/'
          'centerpoint_pillar02_second_secfpn_8xb4-cyclic-20e_nus-3d.py')
CUDA = torch.cuda.is_available()
DEVICES = [
    'cpu',
    pytest.param(
        'cuda', marks=pytest.mark.skipif(not CUDA, reason='needs CUDA'))
]
HALF = 51.2  # the recipe's range is +-51.2 m in x and y


@functools.lru_cache(maxsize=None)
def _config():
    from mmdet3d.utils import register_all_modules
    register_all_modules()
    return get_config(PILLAR)


def build_head(**train_changes):
    """The recipe's CenterHead with its train_cfg (optionally changed)."""
    from mmdet3d.registry import MODELS
    cfg = _config()
    head_cfg = copy.deepcopy(cfg.model.pts_bbox_head)
    train_cfg = copy.deepcopy(cfg.model.train_cfg.pts)
    train_cfg.update(train_changes)
    head_cfg.update(train_cfg=train_cfg, test_cfg=cfg.model.test_cfg.pts)
    return MODELS.build(head_cfg)


def switched(head):
    """``head`` with the batched ``get_targets`` on the instance."""
    head.fast_target_stats = TargetStats('CenterHead', 'samples')
    head.get_targets = MethodType(centerpoint.get_targets, head)
    return head


def _sample(rng: random.Random, gen: torch.Generator, n: int, kind: str):
    """``n`` objects of one kind, with labels of all 10 classes and a few
    outside them (-1, 10: in no task)."""
    from mmdet3d.structures import LiDARInstance3DBoxes
    xy = torch.rand(n, 2, generator=gen) * 2 * (HALF + 4) - HALF - 4
    z = torch.rand(n, 1, generator=gen) * 4 - 3
    scale = {'tiny': 0.05, 'normal': 5.0, 'huge': 60.0, 'mixed': 10.0}[kind]
    dims = torch.rand(n, 3, generator=gen) * scale
    if kind == 'mixed' and n:
        dims[:n // 4, 0] = 0  # no length: not drawn
        dims[n // 4:n // 3, 1] = -1  # negative width: not drawn
    rot = torch.rand(n, 1, generator=gen) * 7 - 3.5
    vel = torch.randn(n, 2, generator=gen)
    boxes = torch.cat([xy, z, dims, rot, vel], 1)
    if n >= 6 and rng.random() < 0.5:
        boxes[1] = boxes[0]  # a duplicate: the same cell twice
        boxes[2, :2] = torch.tensor([HALF, -HALF])  # on the grid's edge
        boxes[3, :2] = torch.tensor([-HALF - 0.3, HALF - 0.01])  # -> cell 0
        boxes[4, :2] = torch.tensor([HALF + 0.2, 0.0])  # outside
        boxes[5, :2] = boxes[0, :2] + 0.3  # overlapping gaussians
    labels = torch.randint(-1, 11, (n, ), generator=gen)
    return InstanceData(
        bboxes_3d=LiDARInstance3DBoxes(boxes, box_dim=9), labels_3d=labels)


def batch(rng: random.Random, gen: torch.Generator, device: str = 'cpu'):
    gts = []
    for _ in range(rng.choice([1, 2, 4])):
        n = rng.choice([0, 1, 3, 40, 120])
        gt = _sample(rng, gen, n, rng.choice(['tiny', 'normal', 'mixed']))
        gts.append(gt.to(device))
    return gts


def assert_same(ref, out) -> None:
    for kind, (ref_kind, out_kind) in enumerate(zip(ref, out)):
        assert len(ref_kind) == len(out_kind)
        for task, (a, b) in enumerate(zip(ref_kind, out_kind)):
            assert a.dtype == b.dtype and a.shape == b.shape, (kind, task)
            assert torch.equal(a, b), (kind, task)


def run_both(head, gts):
    stock = type(head).get_targets(head, gts)
    if 'get_targets' not in vars(head):
        switched(head)
    before = head.fast_target_stats.stock
    out = head.get_targets(gts)
    return stock, out, head.fast_target_stats.stock - before


def test_the_recipe_is_covered():
    assert centerpoint.supported(build_head()) is None


def test_what_is_not_covered_says_why():
    from mmdet3d.models.dense_heads import CenterHead

    class MyCenterHead(CenterHead):
        pass

    head = build_head()
    head.__class__ = MyCenterHead
    assert centerpoint.supported(head) == 'MyCenterHead is not CenterHead'
    head = build_head(min_radius=2.0)
    assert centerpoint.supported(head) == 'train_cfg.min_radius is not an int'
    head = build_head()
    head.get_targets_single = head.get_targets_single
    assert centerpoint.supported(head) == \
        'get_targets_single replaced on the instance'


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('seed', range(4))
def test_equals_stock(seed, device):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    head = build_head().to(device)
    for _ in range(6):
        ref, out, stock_way = run_both(head, batch(rng, gen, device))
        assert_same(ref, out)
        assert stock_way == 0


VARIANTS = {
    'few max_objs': dict(max_objs=4),  # objects past it are not drawn
    'min_radius 0': dict(min_radius=0),  # radius 0: one pixel
    'coarse map': dict(out_size_factor=8, gaussian_overlap=0.7),
}


@pytest.mark.parametrize('norm_bbox', [True, False])
@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_options_equal_stock(variant, norm_bbox):
    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    head = build_head(**VARIANTS[variant])
    head.norm_bbox = norm_bbox
    for _ in range(4):
        ref, out, stock_way = run_both(head, batch(rng, gen))
        assert_same(ref, out)
        assert stock_way == 0


def test_huge_and_tiny_boxes_empty_tasks_and_samples():
    """Radius 0 and the min_radius clamp, gaussians wider than the map,
    an empty sample, samples whose objects fill no task."""
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    head = build_head()
    empty = _sample(rng, gen, 0, 'normal')
    no_task = _sample(rng, gen, 5, 'normal')
    no_task.labels_3d = torch.full((5, ), 10)
    gts = [
        _sample(rng, gen, 30, 'huge'), empty,
        _sample(rng, gen, 30, 'tiny'), no_task
    ]
    ref, out, stock_way = run_both(head, gts)
    assert_same(ref, out)
    assert stock_way == 0
    assert out[0][0][1].abs().sum() == 0 and out[3][0][3].sum() == 0


def test_undefined_values_are_computed_the_stock_way():
    """A box stock's own loop fails on (infinite size: ``int(radius)``
    raises) is not batched: its sample takes the stock path, which raises
    as stock does; the other samples stay batched."""
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    head = switched(build_head())
    bad = _sample(rng, gen, 3, 'normal')
    bad.bboxes_3d.tensor[0, 3] = float('inf')
    bad.labels_3d[0] = 0
    gts = [_sample(rng, gen, 8, 'normal'), bad]
    with pytest.raises((ValueError, OverflowError, RuntimeError)):
        type(head).get_targets(head, gts)
    with pytest.raises((ValueError, OverflowError, RuntimeError)):
        head.get_targets(gts)


def test_other_box_layouts_take_the_stock_path():
    from mmdet3d.structures import DepthInstance3DBoxes
    rng, gen = random.Random(2), torch.Generator().manual_seed(2)
    head = build_head()
    gts = [_sample(rng, gen, 20, 'normal') for _ in range(2)]
    gts[0].bboxes_3d = DepthInstance3DBoxes(gts[0].bboxes_3d.tensor, box_dim=9)
    ref, out, stock_way = run_both(head, gts)
    assert_same(ref, out)
    assert stock_way == len(gts)


def test_operations_do_not_grow_with_the_objects():
    rng, gen = random.Random(9), torch.Generator().manual_seed(9)
    head = switched(build_head())
    counts = []
    for n in (2, 200):
        gts = [_sample(rng, gen, n, 'normal') for _ in range(4)]
        with OpCounter() as ops:
            head.get_targets(gts)
        counts.append((ops.total, ops.ops[ITEM_OP]))
    stock_counts = []
    stock = build_head()
    for n in (2, 200):
        gts = [_sample(rng, gen, n, 'normal') for _ in range(4)]
        with OpCounter() as ops:
            stock.get_targets(gts)
        stock_counts.append(ops.total)
    assert counts[0] == counts[1]
    assert counts[1][1] == 0
    assert counts[1][0] * 20 < stock_counts[1]
