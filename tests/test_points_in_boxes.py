"""``in_any_box`` equals mmdet3d's ``points_in_rbbox(...).any(-1)`` bit for
bit (fast_parallel/pipeline/points_in_boxes.py): random clouds and boxes,
points on the faces and corners and a few ulps either side of them, NaN and
inf points, zero-size and huge boxes, coordinates up to 1e6, float64 clouds
and the strided ``coord`` view ``ObjectSample`` passes."""
import numpy as np
import pytest
from mmdet3d.structures.ops import box_np_ops

from fast_parallel.pipeline.points_in_boxes import in_any_box

CASES = 240


def _boxes(rng: np.random.Generator, m: int, scale: float) -> np.ndarray:
    centres = rng.uniform(-scale, scale, (m, 3))
    sizes = rng.choice([0.0, 0.01, 0.5, 2.0, 4.0, 12.0], (m, 3)) * \
        rng.uniform(0.5, 1.5, (m, 3))
    yaw = rng.choice([0.0, np.pi / 2, -np.pi, 0.3], (m, 1))
    yaw = np.where(rng.random((m, 1)) < 0.5, yaw, rng.uniform(-4, 4, (m, 1)))
    return np.concatenate([centres, sizes, yaw], 1).astype(np.float32)


def _near_faces(rng: np.random.Generator, boxes: np.ndarray,
                k: int) -> np.ndarray:
    """Points on the boxes' faces, corners and edges, moved a few ulps."""
    corners = box_np_ops.center_to_corner_box3d(
        boxes[:, :3], boxes[:, 3:6], boxes[:, 6], origin=(0.5, 0.5, 0), axis=2)
    surfaces = box_np_ops.corner_to_surfaces_3d(corners)  # (M, 6, 4, 3)
    pick_box = rng.integers(0, len(boxes), k)
    pick_face = rng.integers(0, 6, k)
    weights = rng.dirichlet(np.ones(4), k)
    weights[rng.random(k) < 0.2] = np.eye(4)[rng.integers(0, 4)]  # corners
    faces = surfaces[pick_box, pick_face]  # (k, 4, 3)
    points = np.einsum('kc,kcd->kd', weights, faces).astype(np.float32)
    ulps = rng.integers(-3, 4, (k, 3))
    for _ in range(3):
        step = np.sign(ulps)
        towards = np.where(step > 0, np.float32(np.inf), np.float32(-np.inf))
        points = np.where(ulps != 0, np.nextafter(points, towards),
                          points).astype(np.float32)
        ulps = ulps - step
    return points


def _case(seed: int):
    rng = np.random.default_rng(seed)
    scale = float(rng.choice([5.0, 60.0, 1e4, 1e6]))
    boxes = _boxes(rng, int(rng.integers(1, 12)), scale)
    cloud = [
        rng.uniform(-1.2 * scale, 1.2 * scale,
                    (int(rng.integers(0, 400)), 3)).astype(np.float32),
        _near_faces(rng, boxes, int(rng.integers(1, 400)))
    ]
    if seed % 5 == 0:
        cloud.append(
            np.array([[np.nan, 0, 0], [0, np.inf, 0], [-np.inf, 1, 2],
                      [0, 0, np.nan]],
                     dtype=np.float32))
    points = np.concatenate(cloud)
    points = points[rng.permutation(len(points))]
    # as ObjectSample passes it: the xyz view of an (N, 4) float32 cloud
    full = np.concatenate(
        [points, rng.random((len(points), 1)).astype(np.float32)], 1)
    if seed % 7 == 3:
        full = full.astype(np.float64)
    return full, boxes


@pytest.mark.parametrize('part', range(4))
def test_same_mask_as_points_in_rbbox(part: int) -> None:
    inside_any = 0
    for seed in range(part, CASES, 4):
        full, boxes = _case(seed)
        points = full[:, :3]
        stock = box_np_ops.points_in_rbbox(points, boxes).any(-1)
        fast = in_any_box(points, boxes)
        assert fast.dtype == stock.dtype and fast.shape == stock.shape
        assert np.array_equal(fast,
                              stock), (seed, np.flatnonzero(fast != stock))
        inside_any += int(stock.sum())
    assert inside_any > 0  # the cases do put points in boxes


def test_nan_points_count_as_inside_as_in_stock() -> None:
    """A NaN coordinate makes every sign comparison False, so stock keeps
    the point in every box (and ``ObjectSample`` removes it)."""
    boxes = np.array([[0, 0, 0, 2, 2, 2, 0.1]], dtype=np.float32)
    points = np.array([[np.nan, 0, 0], [50, 50, 50], [0, 0, 1]],
                      dtype=np.float32)
    stock = box_np_ops.points_in_rbbox(points, boxes).any(-1)
    assert stock.tolist() == [True, False, True]
    assert np.array_equal(in_any_box(points, boxes), stock)


def test_no_boxes_and_no_points() -> None:
    points = np.zeros((5, 3), np.float32)
    none = np.zeros((0, 7), np.float32)
    assert np.array_equal(
        in_any_box(points, none),
        box_np_ops.points_in_rbbox(points, none).any(-1))
    boxes = np.array([[0, 0, 0, 2, 2, 2, 0]], dtype=np.float32)
    empty = np.zeros((0, 3), np.float32)
    assert in_any_box(empty, boxes).shape == (0, )
