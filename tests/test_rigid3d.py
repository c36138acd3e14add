"""mmdet3d's ``GlobalRotScaleTrans`` and ``ObjectRangeFilter`` in their fast
forms give stock's points, boxes, labels, matrices and random states: drawn
LiDAR boxes (7 and 9 columns, none, empty), every points class, a preset
scale factor, ``shift_height``, boxes on the range's edges, NaN centres,
camera and depth boxes, and stock's way (counted) for what they do not
cover."""
import numpy as np
import pytest
import torch
from mmdet3d.datasets.transforms import GlobalRotScaleTrans, ObjectRangeFilter
from mmdet3d.structures import (CameraInstance3DBoxes, DepthInstance3DBoxes,
                                LiDARInstance3DBoxes)
from mmdet3d.structures.points import CameraPoints, DepthPoints, LiDARPoints
from transform_utils import assert_same_run

from fast_parallel.pipeline import COUNTS
from fast_parallel.pipeline.rigid3d import (FastGlobalRotScaleTrans,
                                            FastObjectRangeFilter)

RANGE = [0, -39.68, -3, 69.12, 39.68, 1]


def _pair(cls, fast_cls, **kwargs):
    stock, fast = cls(**kwargs), cls(**kwargs)
    fast.__class__ = fast_cls
    return stock, fast


def _boxes(rng, n, cls=LiDARInstance3DBoxes, dims=7):
    t = rng.uniform(-80, 80, (n, dims)).astype(np.float32)
    t[:, 3:6] = rng.uniform(0.5, 5, (n, 3))
    t[:, 6] = rng.uniform(-7, 7, n)  # yaws beyond [-pi, pi)
    edges = np.array(RANGE, np.float32)[[0, 1, 3, 4]]
    for k in range(min(n, 4)):  # centres on the range's edges, exactly
        t[k, k % 2] = edges[k]
    return cls(torch.from_numpy(t), box_dim=dims)


def _points(rng, n, cls=LiDARPoints, dims=4, height=False):
    cloud = rng.uniform(-80, 80, (n, dims)).astype(np.float32)
    attribute_dims = dict(height=3) if height else None
    return cls(torch.from_numpy(cloud), dims, attribute_dims=attribute_dims)


@pytest.mark.parametrize('case', range(24))
def test_rot_scale_trans_gives_stocks_sample(case):
    rng = np.random.default_rng(case)
    n = [0, 1, 9, 40][case % 4]
    results = dict(
        points=_points(
            rng, [0, 5, 3000][case % 3],
            cls=[LiDARPoints, DepthPoints, CameraPoints][case % 3] if case %
            4 == 3 else LiDARPoints,
            height=case % 5 == 0))
    if case % 6 != 5:  # else no boxes at all
        results['gt_bboxes_3d'] = _boxes(rng, n, dims=9 if case % 2 else 7)
    if case % 7 == 0:
        results['pcd_scale_factor'] = 1.25
    if case % 8 == 1:
        results['transformation_3d_flow'] = ['HF']
    stock, fast = _pair(
        GlobalRotScaleTrans,
        FastGlobalRotScaleTrans,
        rot_range=[-0.78539816, 0.78539816],
        scale_ratio_range=[0.95, 1.05],
        translation_std=[0.2, 0.2, 0.2] if case % 3 else [0, 0, 0],
        shift_height=case % 5 == 0)
    COUNTS.clear()
    assert_same_run(stock, fast, results)
    assert not COUNTS


@pytest.mark.parametrize('case', range(24))
def test_range_filter_gives_stocks_boxes_and_labels(case):
    rng = np.random.default_rng(100 + case)
    n = [0, 1, 12, 300][case % 4]
    cls = [LiDARInstance3DBoxes, DepthInstance3DBoxes,
           CameraInstance3DBoxes][case % 3]
    boxes = _boxes(rng, n, cls=cls, dims=9 if case % 2 else 7)
    if n > 5 and case % 5 == 0:
        boxes.tensor[5, 0] = np.nan
        boxes.tensor[4, 6] = np.nan
    results = dict(
        gt_bboxes_3d=boxes,
        gt_labels_3d=rng.integers(0, 3, n).astype(np.int64))
    stock, fast = _pair(
        ObjectRangeFilter, FastObjectRangeFilter, point_cloud_range=RANGE)
    COUNTS.clear()
    assert_same_run(stock, fast, results)
    assert not COUNTS


class _MyBoxes(LiDARInstance3DBoxes):
    """A user's box class: its methods may differ from LiDAR's."""


def test_what_they_do_not_cover_goes_stocks_way_counted():
    rng = np.random.default_rng(7)
    cases = [
        (dict(
            points=_points(rng, 50),
            gt_bboxes_3d=_boxes(rng, 4, cls=DepthInstance3DBoxes)),
         'GlobalRotScaleTrans: boxes other than LiDARInstance3DBoxes'),
        (dict(points=_points(rng, 50), gt_bboxes_3d=None),
         'GlobalRotScaleTrans: boxes other than LiDARInstance3DBoxes'),
        (dict(points=_points(rng, 50).tensor),
         'GlobalRotScaleTrans: points not of an mmdet3d points class'),
        (dict(gt_bboxes_3d=_boxes(rng, 4)),
         'GlobalRotScaleTrans: points not of an mmdet3d points class'),
    ]
    for results, reason in cases:
        stock, fast = _pair(
            GlobalRotScaleTrans,
            FastGlobalRotScaleTrans,
            rot_range=[-0.3, 0.3],
            translation_std=[0.1, 0.1, 0.1])
        COUNTS.clear()
        assert_same_run(stock, fast, results)  # outputs, or the same error
        assert COUNTS == {f'stock: {reason}': 1}  # the fast arm's run
    mine = _MyBoxes(_boxes(rng, 6).tensor)
    for results in (dict(gt_bboxes_3d=mine, gt_labels_3d=np.arange(6)),
                    dict(gt_labels_3d=np.arange(6))):
        stock, fast = _pair(
            ObjectRangeFilter, FastObjectRangeFilter, point_cloud_range=RANGE)
        COUNTS.clear()
        assert_same_run(stock, fast, results)
        assert COUNTS == {
            'stock: ObjectRangeFilter: boxes of another class': 1
        }
