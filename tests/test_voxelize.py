"""fast_parallel.step.voxelize: one pass of hard voxelisation for the whole
batch gives exactly what ``Det3DDataPreprocessor.voxelize`` gets from mmcv's
``Voxelization`` sample by sample: voxels, coordinates with the batch
column, point counts and centres, in the same order."""
import random
from typing import List

import pytest
import torch
import torch.nn.functional as F

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.compat import ITEM_OP
from fast_parallel.step.voxelize.hard import grid_size, hard_voxelize_batch

CUDA = torch.cuda.is_available()
DEVICES = [
    'cpu',
    pytest.param(
        'cuda', marks=pytest.mark.skipif(not CUDA, reason='needs CUDA'))
]
#: (voxel_size, point_cloud_range) of mmdet3d recipes, and a small grid.
GRIDS = [
    ([0.2, 0.2, 8], [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0]),  # CenterPoint
    ([0.16, 0.16, 4], [0, -39.68, -3, 69.12, 39.68, 1]),  # PointPillars
    ([0.05, 0.05, 0.1], [0, -40, -3, 70.4, 40, 1]),  # SECOND
    ([0.5, 0.5, 0.5], [-3, -3, -3, 3, 3, 3]),
]


def stock(points: List[torch.Tensor], layer) -> tuple:
    """mmdet3d 1.4.0's ``Det3DDataPreprocessor.voxelize`` (voxel_type
    'hard'), on these points."""
    voxels, coors, num_points, centers = [], [], [], []
    for i, res in enumerate(points):
        res_voxels, res_coors, res_num_points = layer(res)
        res_centers = (res_coors[:, [2, 1, 0]] + 0.5) * res_voxels.new_tensor(
            layer.voxel_size) + res_voxels.new_tensor(
                layer.point_cloud_range[0:3])
        res_coors = F.pad(res_coors, (1, 0), mode='constant', value=i)
        voxels.append(res_voxels)
        coors.append(res_coors)
        num_points.append(res_num_points)
        centers.append(res_centers)
    return (torch.cat(voxels), torch.cat(coors), torch.cat(num_points),
            torch.cat(centers))


def _cloud(rng: random.Random, gen: torch.Generator, n: int, pcr: list,
           channels: int, voxel_size: list) -> torch.Tensor:
    """``n`` points around the range: outside it, on its edges, on voxel
    boundaries, duplicated."""
    low, high = torch.tensor(pcr[:3]), torch.tensor(pcr[3:])
    xyz = low - 1 + torch.rand(n, 3, generator=gen) * (high - low + 2)
    if n and rng.random() < 0.5:  # duplicates
        k = n // 3
        xyz[:k] = xyz[k:2 * k]
    if n and rng.random() < 0.4:  # exactly on the range's edges
        k = min(n, 4)
        xyz[:k, 0] = high[0]
        xyz[k:2 * k, 1] = low[1]
        xyz[2 * k:3 * k, 2] = high[2] - 1e-6
    if n and rng.random() < 0.3:  # on voxel boundaries
        size = torch.tensor(voxel_size)
        xyz = torch.round(xyz / size) * size
    if n > 4 and rng.random() < 0.2:  # NaN and infinite coordinates
        xyz[1, rng.randrange(3)] = float('nan')
        xyz[3, rng.randrange(3)] = rng.choice([float('inf'), float('-inf')])
    features = torch.rand(n, channels - 3, generator=gen)
    return torch.cat([xyz, features], dim=1)


def _layer(voxel_size, pcr, max_points, max_voxels):
    from mmdet3d.models.data_preprocessors.voxelize import \
        VoxelizationByGridShape
    layer = VoxelizationByGridShape(
        voxel_size=voxel_size,
        point_cloud_range=pcr,
        max_num_points=max_points,
        max_voxels=(max_voxels, max_voxels + 7))
    return layer.train()


def assert_same(ref: tuple, out: tuple) -> None:
    for name, a, b in zip(('voxels', 'coors', 'num_points', 'centers'), ref,
                          out):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('seed', range(6))
def test_equals_per_sample_voxelization(seed, device):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(25):
        voxel_size, pcr = rng.choice(GRIDS)
        max_points = rng.choice([1, 2, 5, 20, 35])
        max_voxels = rng.choice([1, 3, 40, 20000])  # caps reached and not
        channels = rng.choice([4, 5])
        # mmcv's deterministic CUDA kernel fails on an empty cloud (the
        # batched path leaves such a batch to it)
        sizes = [1, 9, 300, 4000] + ([0] if device == 'cpu' else [])
        points = [
            _cloud(rng, gen, rng.choice(sizes), pcr, channels,
                   voxel_size).to(device)
            for _ in range(rng.choice([1, 2, 3, 6]))
        ]
        layer = _layer(voxel_size, pcr, max_points, max_voxels)
        out = hard_voxelize_batch(points, voxel_size, pcr, max_points,
                                  max_voxels)
        assert_same(stock(points, layer), out)


def test_caps_and_edges_by_construction():
    """Every point in one voxel (cap reached), one point per voxel past
    ``max_voxels``, points on the range's upper edge (outside) and lower
    edge (inside), an empty sample between two full ones."""
    voxel_size, pcr = [1.0, 1.0, 1.0], [0, 0, 0, 4, 4, 4]
    same = torch.tensor([[0.5, 0.5, 0.5, 1.0]]).repeat(50, 1)
    same[:, 3] = torch.arange(50.)  # which 5 are kept shows the order
    grid = torch.stack(
        torch.meshgrid(
            torch.arange(4.),
            torch.arange(4.),
            torch.arange(4.),
            indexing='ij'), -1).reshape(-1, 3).flip(0) + 0.5
    many = torch.cat([grid, torch.arange(64.)[:, None]], 1)
    edges = torch.tensor([[4.0, 1, 1, 0], [0, 0, 0, 1], [1, 4.0, 1, 2],
                          [3.9999998, 3.9999998, 3.9999998, 3]])
    points = [same, torch.zeros(0, 4), many, edges]
    layer = _layer(voxel_size, pcr, 5, 10)
    ref = stock(points, layer)
    out = hard_voxelize_batch(points, voxel_size, pcr, 5, 10)
    assert_same(ref, out)
    assert out.num_points[0] == 5 and out.voxels[0, :, 3].tolist() == [
        0., 1., 2., 3., 4.
    ]
    assert out.coors[:, 0].tolist().count(2) == 10  # max_voxels reached


def test_grid_size_rounds_as_the_kernel():
    # (hi - lo) / size in float32, then C's round (halves away from zero)
    assert grid_size([0.2, 0.2, 8],
                     [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0]) == [512, 512, 1]
    assert grid_size([0.16, 0.16, 4],
                     [0, -39.68, -3, 69.12, 39.68, 1]) == [432, 496, 1]
    assert grid_size([2.0, 2.0, 2.0], [0, 0, 0, 5, 3, 1]) == [3, 2, 1]


def test_operations_do_not_grow_with_the_batch():
    voxel_size, pcr = GRIDS[1]
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    counts = []
    for batch in (1, 6):
        points = [
            _cloud(rng, gen, 2000, pcr, 4, voxel_size) for _ in range(batch)
        ]
        with OpCounter() as ops:
            hard_voxelize_batch(points, voxel_size, pcr, 32, 16000)
        counts.append((ops.total, ops.ops[ITEM_OP]))
    assert counts[0] == counts[1]
    assert counts[1][1] == 0  # no .item(): sizes come from nonzero


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('batch', [1, 2, 5])
def test_pillar_scatter_equals_stock_forward_and_gradients(batch, device):
    """PointPillarsScatter.forward_batch in one pass: the same canvas and
    the same gradient bits for the pillar features, -0.0 included (stock's
    mask-indexing backward adds each row into zeros: -0.0 becomes +0.0)."""
    from mmdet3d.models.middle_encoders import PointPillarsScatter

    from fast_parallel.step.voxelize.scatter import forward_batch
    voxel_size, pcr = [1.0, 1.0, 4.0], [0, -8, -3, 12, 8, 1]
    gen = torch.Generator().manual_seed(batch)
    rng = random.Random(batch)
    points = [
        _cloud(rng, gen, rng.choice([40, 400]), pcr, 4, voxel_size)
        for _ in range(batch)
    ]
    out = hard_voxelize_batch(points, voxel_size, pcr, 8, 60)
    coors = out.coors.to(device)
    scatter = PointPillarsScatter(in_channels=5, output_shape=[16, 12])
    features = torch.randn(coors.shape[0], 5, generator=gen)
    features[::3, 1] = -0.0  # in the canvas as they are
    upstream = torch.randn(batch, 5, 16, 12, generator=gen)
    upstream[..., ::2] = -0.0  # gradients of -0.0 reach the pillars
    grads, canvases = [], []
    for fn in (scatter.forward_batch, lambda *a: forward_batch(scatter, *a)):
        leaf = features.clone().to(device).requires_grad_()
        # as the detector: the last pillar's sample + 1
        size = int(coors[-1, 0]) + 1
        canvas = fn(leaf, coors, size)
        (canvas * upstream[:size].to(device)).sum().backward()
        canvases.append(canvas.detach())
        grads.append(leaf.grad)
    assert canvases[0].shape == canvases[1].shape
    assert canvases[0].is_contiguous() and canvases[1].is_contiguous()
    assert torch.equal(canvases[0].view(torch.int32),
                       canvases[1].view(torch.int32))
    assert torch.equal(grads[0].view(torch.int32), grads[1].view(torch.int32))
    # -0.0 reached some pillars' gradients, and stock made them +0.0
    c = out.coors.long()
    reaching = upstream[c[:, 0], :, c[:, 2], c[:, 3]]
    assert (reaching.view(torch.int32) == -2**31).any()
    assert not (grads[0].cpu().view(torch.int32) == -2**31).any()


def _pointpillars():
    """The PointPillars Car recipe's detector (no weights loaded)."""
    from mmdet3d.registry import MODELS
    from mmdet3d.utils import register_all_modules
    from mmengine.hub import get_config
    register_all_modules()
    cfg = get_config('mmdet3d::pointpillars/'
                     'pointpillars_hv_secfpn_8xb6-160e_kitti-3d-car.py')
    return MODELS.build(cfg.model)


def test_switch_names_what_it_batched_and_what_not():
    """The start line's part; a batch of other dtypes is voxelised the
    stock way, counted and logged once; no gradient reaches the points (as
    stock's voxelize runs under no_grad); a grid several voxels high keeps
    the stock scatter, with why."""
    from fast_parallel.step.voxelize import switch_voxelize
    model = _pointpillars()
    outcome = switch_voxelize(model)
    assert str(outcome) == ('voxels: Det3DDataPreprocessor batched, '
                            'PointPillarsScatter batched')
    assert str(switch_voxelize(model)) == str(outcome)  # switched already
    pre = model.data_preprocessor
    gen = torch.Generator().manual_seed(0)
    points = [_cloud(random.Random(0), gen, 500, GRIDS[1][1], 4, GRIDS[1][0])]
    points[0].requires_grad_()
    out = pre.voxelize(points, None)
    assert not out['voxels'].requires_grad
    ref = type(pre).voxelize(pre, [points[0].double()], None)
    got = pre.voxelize([points[0].double()], None)
    assert pre.fast_voxelize_stock == 1
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    tall = _pointpillars()
    tall.data_preprocessor.voxel_layer.voxel_size = [0.16, 0.16, 1]
    assert str(switch_voxelize(tall)) == (
        'voxels: Det3DDataPreprocessor batched, PointPillarsScatter stock '
        '(its voxel grid has more than one z layer (pillars share cells))')
    assert 'forward_batch' not in vars(tall.middle_encoder)
    assert switch_voxelize(tall, enabled=False) is not None


def test_someone_elses_instance_method_keeps_both_stock():
    """A ``voxelize``, layer ``forward`` or scatter ``forward_batch`` set on
    the instance by someone else keeps that part stock, named; ours is
    not taken for someone else's."""
    from types import MethodType

    from fast_parallel.step.voxelize import switch_voxelize
    model = _pointpillars()
    pre, scatter = model.data_preprocessor, model.middle_encoder
    theirs = MethodType(type(pre).voxelize, pre)
    pre.voxelize = theirs
    assert str(switch_voxelize(model)) == (
        'voxels: Det3DDataPreprocessor stock (voxelize replaced on the '
        'instance), PointPillarsScatter stock (its voxels are not hard '
        'voxels of Det3DDataPreprocessor)')
    assert pre.voxelize is theirs and 'forward_batch' not in vars(scatter)
    model = _pointpillars()
    layer = model.data_preprocessor.voxel_layer
    layer.forward = MethodType(type(layer).forward, layer)
    model.middle_encoder.forward_batch = MethodType(
        type(model.middle_encoder).forward_batch, model.middle_encoder)
    assert str(switch_voxelize(model)) == (
        'voxels: Det3DDataPreprocessor stock (forward replaced on the '
        'instance), PointPillarsScatter stock (forward_batch replaced on the '
        'instance)')
