"""Batches shaped like YOLOX and PointPillars training batches.

They go through the real packing transforms (mmdet's ``PackDetInputs``,
mmdet3d's ``Pack3DDetInputs``), so their structure is exactly what those
pipelines hand the collate function. Used by the demo, the benchmark and the
tests.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np


def _count(rng: np.random.Generator, most: int, fixed: Optional[Sequence[int]],
           i: int) -> int:
    return int(fixed[i]) if fixed is not None else int(
        rng.integers(0, most + 1))


def yolox_samples(batch_size: int = 8,
                  size: int = 640,
                  max_boxes: int = 100,
                  seed: int = 0,
                  num_boxes: Optional[Sequence[int]] = None) -> List[Dict]:
    """Packed detection samples: ``3 x size x size`` uint8 images.

    Args:
        batch_size (int): Samples. Defaults to 8.
        size (int): Image side. Defaults to 640.
        max_boxes (int): Each sample has 0..max_boxes boxes. Defaults to 100.
        seed (int): Random seed. Defaults to 0.
        num_boxes (Sequence[int], optional): Boxes per sample, overriding
            the random count. Defaults to None.

    Returns:
        list[dict]: ``PackDetInputs`` outputs (``inputs``, ``data_samples``).
    """
    from mmdet.datasets.transforms import PackDetInputs
    from mmdet.structures.bbox import HorizontalBoxes
    rng = np.random.default_rng(seed)
    pack = PackDetInputs()
    samples = []
    for i in range(batch_size):
        n = _count(rng, max_boxes, num_boxes, i)
        xy = rng.uniform(0, size * 0.8, (n, 2))
        wh = rng.uniform(4, size * 0.2, (n, 2))
        boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
        results = dict(
            img=rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            img_id=i,
            img_path=f'synthetic/{i:06d}.jpg',
            ori_shape=(size, size),
            img_shape=(size, size),
            scale_factor=(1.0, 1.0),
            flip=False,
            flip_direction=None,
            gt_bboxes=HorizontalBoxes(boxes),
            gt_bboxes_labels=rng.integers(0, 80, n).astype(np.int64),
            gt_ignore_flags=rng.random(n) < 0.05)
        samples.append(pack(results))
    return samples


def pointpillars_samples(
        batch_size: int = 6,
        min_points: int = 15000,
        max_points: int = 25000,
        max_boxes: int = 40,
        seed: int = 0,
        num_boxes: Optional[Sequence[int]] = None) -> List[Dict]:
    """Packed LiDAR samples: ``N x 4`` float32 clouds and LiDAR boxes.

    Args:
        batch_size (int): Samples. Defaults to 6.
        min_points (int): Fewest points in a cloud. Defaults to 15000.
        max_points (int): Most points in a cloud. Defaults to 25000.
        max_boxes (int): Each sample has 0..max_boxes boxes. Defaults to 40.
        seed (int): Random seed. Defaults to 0.
        num_boxes (Sequence[int], optional): Boxes per sample, overriding
            the random count. Defaults to None.

    Returns:
        list[dict]: ``Pack3DDetInputs`` outputs (``inputs`` with
        ``points``, ``data_samples``).
    """
    from mmdet3d.datasets.transforms import Pack3DDetInputs
    from mmdet3d.structures import Box3DMode, LiDARInstance3DBoxes
    from mmdet3d.structures.points import LiDARPoints
    rng = np.random.default_rng(seed)
    pack = Pack3DDetInputs(keys=['points', 'gt_bboxes_3d', 'gt_labels_3d'])
    samples = []
    for i in range(batch_size):
        n_pts = int(rng.integers(min_points, max_points + 1))
        pts = rng.uniform([0, -40, -3, 0], [70.4, 40, 1, 1],
                          (n_pts, 4)).astype(np.float32)
        n = _count(rng, max_boxes, num_boxes, i)
        boxes = np.concatenate([
            rng.uniform([0, -40, -2], [70, 40, 0], (n, 3)),
            rng.uniform([3.2, 1.4, 1.4], [4.6, 1.9, 1.7], (n, 3)),
            rng.uniform(-np.pi, np.pi, (n, 1))
        ],
                               axis=1).astype(np.float32)
        results = dict(
            points=LiDARPoints(pts, points_dim=4),
            gt_bboxes_3d=LiDARInstance3DBoxes(boxes),
            gt_labels_3d=np.zeros(n, dtype=np.int64),
            lidar_path=f'synthetic/{i:06d}.bin',
            sample_idx=i,
            box_type_3d=LiDARInstance3DBoxes,
            box_mode_3d=Box3DMode.LIDAR,
            pcd_horizontal_flip=bool(rng.random() < 0.5),
            pcd_vertical_flip=False,
            pcd_rotation_angle=float(rng.uniform(-0.78, 0.78)),
            pcd_scale_factor=float(rng.uniform(0.95, 1.05)))
        samples.append(pack(results))
    return samples
