"""mmdet3d's ``PointsRangeFilter`` and ``PointShuffle`` in their fast forms
give stock's points, masks, layouts and draws: drawn clouds (row- and
column-major, NaN, points on the range's faces, none kept, none at all),
instance and semantic masks, the points classes, and stock's way for what
they do not cover."""
import numpy as np
import pytest
import torch
from mmdet3d.datasets.transforms import PointShuffle, PointsRangeFilter
from mmdet3d.structures.points import CameraPoints, DepthPoints, LiDARPoints
from transform_utils import assert_same_run

from fast_parallel.pipeline import COUNTS
from fast_parallel.pipeline.point_filters import (FastPointShuffle,
                                                  FastPointsRangeFilter,
                                                  in_range_mask)

RANGE = [0, -39.68, -3, 69.12, 39.68, 1]


def _cloud(rng, n, dims, column_major):
    xyz = rng.uniform(-80, 80, (n, 3)).astype(np.float32)
    xyz[:, 2] = rng.uniform(-4, 2, n)
    edges = np.array(RANGE, np.float32)
    for k in range(min(n, 12)):  # points on the faces, exactly
        xyz[k, k % 3] = edges[k % 6]
    if n > 20:
        xyz[13, rng.integers(0, 3)] = np.nan
    rest = rng.uniform(0, 1, (n, dims - 3)).astype(np.float32)
    cloud = np.concatenate([xyz, rest], 1)
    if column_major:
        cloud = np.asfortranarray(cloud)
    return cloud


def _pair(point_cloud_range=RANGE):
    stock = PointsRangeFilter(point_cloud_range)
    fast = PointsRangeFilter(point_cloud_range)
    fast.__class__ = FastPointsRangeFilter
    return stock, fast


@pytest.mark.parametrize('case', range(40))
def test_range_filter_gives_stocks_points_and_masks(case):
    rng = np.random.default_rng(case)
    n = [0, 1, 7, 300, 5000][case % 5]
    dims = [3, 4, 5][case % 3]
    cloud = _cloud(rng, n, dims, column_major=case % 2 == 1)
    cls = [LiDARPoints, DepthPoints, CameraPoints][case % 3]
    attribute_dims = dict(intensity=3) if dims > 3 and case % 4 else None
    results = dict(
        points=cls(
            torch.from_numpy(cloud) if case % 3 else cloud,
            points_dim=dims,
            attribute_dims=attribute_dims))
    if case % 2:
        results['pts_instance_mask'] = rng.integers(0, 9, n)
        results['pts_semantic_mask'] = rng.integers(0, 5, n).astype(np.uint8)
    if case % 7 == 0:  # nothing in range
        results['points'].tensor[:, 0] = -100
    stock, fast = _pair()
    COUNTS.clear()
    assert_same_run(stock, fast, results)
    assert not COUNTS


def test_column_major_and_row_major_layouts_are_stocks():
    """The kept points' strides are what stock's boolean gather gives for
    each layout of the cloud (compared by ``first_difference``): row-major
    from either."""
    rng = np.random.default_rng(0)
    for column_major in (False, True):
        cloud = torch.from_numpy(_cloud(rng, 1000, 4, column_major))
        assert cloud.is_contiguous() is not column_major
        stock, fast = _pair()
        _, out = assert_same_run(stock, fast,
                                 dict(points=LiDARPoints(cloud, 4)))
        assert len(
            out['points']) > 0 and out['points'].tensor.stride() == (4, 1)


def test_mask_is_stocks_on_every_comparison():
    """The mask alone against ``in_range_3d`` on values around each bound:
    the float32 neighbours of every face, and NaN on each axis."""
    edges = np.array(RANGE, np.float32)
    values = []
    for v in edges:
        values += [
            np.nextafter(v, np.float32(-np.inf)), v,
            np.nextafter(v, np.float32(np.inf))
        ]
    values = np.array(values + [np.nan, np.inf, -np.inf], np.float32)
    grid = np.stack(np.meshgrid(values, values, values), -1).reshape(-1, 3)
    points = LiDARPoints(torch.from_numpy(grid), 3)
    expected = points.in_range_3d(edges).numpy()
    assert np.array_equal(in_range_mask(grid, edges), expected)
    assert 0 < expected.sum() < len(grid)


def test_what_it_does_not_cover_goes_stocks_way():
    rng = np.random.default_rng(1)
    cloud = _cloud(rng, 200, 4, False)
    # a range the user replaced by float64 values
    stock, fast = _pair()
    stock.pcd_range = fast.pcd_range = np.array(RANGE, np.float64)
    COUNTS.clear()
    assert_same_run(stock, fast, dict(points=LiDARPoints(cloud, 4)))
    assert COUNTS == {
        'stock: PointsRangeFilter: a range other than six float32 values': 1
    }
    # points as a float64 tensor set on the object
    points = LiDARPoints(cloud, 4)
    points.tensor = points.tensor.double()
    stock, fast = _pair()
    COUNTS.clear()
    assert_same_run(stock, fast, dict(points=points))
    assert COUNTS['stock: PointsRangeFilter: points not a float32 CPU '
                  'matrix'] == 1
    # stock's error for a missing key, alike
    assert_same_run(stock, fast, dict())


def _shuffles():
    stock = PointShuffle()
    fast = PointShuffle()
    fast.__class__ = FastPointShuffle
    return stock, fast


@pytest.mark.parametrize('case', range(30))
def test_shuffle_gives_stocks_points_masks_and_draws(case):
    """Stock's ``randperm`` draw (torch's state after it compared) and
    rows, for clouds of every size, layout, dtype and points class."""
    rng = np.random.default_rng(case)
    n = [0, 1, 7, 300, 5000][case % 5]
    dims = [3, 4, 5][case % 3]
    cloud = torch.from_numpy(_cloud(rng, n, dims + 2, case % 2 == 1))
    cloud = cloud[:, :dims] if case % 4 == 3 else cloud[:, 2:]
    if case % 6 == 5:
        cloud = cloud.double()
    cls = [LiDARPoints, DepthPoints, CameraPoints][case % 3]
    results = dict(points=cls(cloud, points_dim=dims))
    results['points'].tensor = cloud  # (the layout kept as it is)
    if case % 2:
        results['pts_instance_mask'] = rng.integers(0, 9, n)
        results['pts_semantic_mask'] = rng.integers(0, 5, n).astype(np.uint8)
    torch.manual_seed(case)
    stock, fast = _shuffles()
    COUNTS.clear()
    _, out = assert_same_run(stock, fast, results)
    assert not COUNTS
    assert out['points'].tensor.stride() == ((dims, 1) if n > 1 else
                                             out['points'].tensor.stride())


def test_shuffle_of_what_it_does_not_cover_goes_stocks_way():

    class MyPoints(LiDARPoints):
        pass

    rng = np.random.default_rng(2)
    cloud = torch.from_numpy(_cloud(rng, 50, 4, False))
    grad = LiDARPoints(cloud.clone(), 4)
    grad.tensor.requires_grad_()
    for points in (MyPoints(cloud.clone(), 4), grad):
        stock, fast = _shuffles()
        COUNTS.clear()
        _, out = assert_same_run(stock, fast, dict(points=points))
        assert COUNTS == {
            'stock: PointShuffle: another points class or shuffle, '
            'or not a CPU matrix':
            1
        }
    stock, fast = _shuffles()  # stock's error for a missing key, alike
    assert assert_same_run(stock, fast, dict())[0] == 'raised'


def test_a_users_shuffle_is_called_as_on_stock(monkeypatch):
    """A ``shuffle`` replaced on mmdet3d's class, or on one points object,
    is what stock calls: the fast form takes stock's ``transform``."""
    from mmdet3d.structures.points import BasePoints

    def reversed_order(self):
        idx = torch.arange(len(self) - 1, -1, -1)
        self.tensor = self.tensor[idx]
        return idx

    cloud = torch.arange(12.0).view(3, 4)
    own = LiDARPoints(cloud.clone(), 4)
    own.shuffle = reversed_order.__get__(own)
    for points in (own, None):
        if points is None:
            monkeypatch.setattr(BasePoints, 'shuffle', reversed_order)
            points = LiDARPoints(cloud.clone(), 4)
        stock, fast = _shuffles()
        COUNTS.clear()
        _, out = assert_same_run(stock, fast, dict(points=points))
        assert torch.equal(out['points'].tensor, cloud.flip(0))
        assert COUNTS == {
            'stock: PointShuffle: another points class or shuffle, '
            'or not a CPU matrix':
            1
        }
