"""Writes a small, deterministic COCO set and KITTI set for tests and demos.

Usage:
    python tools/make_sample_data.py [--out data] [--coco-images 8]
        [--coco-size 128 160] [--kitti-frames 6] [--seed 0]
        [--no-skip-existing]

The sample configs (``configs/*/*_fast_sample.py``) read ``data/sample``:
``python tools/make_sample_data.py --out data/sample``. About 15 s on 2 CPU
cores, most of it mmdet3d's converter.

Writes, from ``--seed`` alone:

* ``OUT/coco/``: ``train2017/`` and ``val2017/`` JPEGs (width and height
  drawn independently, 128..160 px by default, ``--coco-size MIN MAX``
  otherwise, e.g. ``480 640`` for COCO-size images of the benchmarks:
  landscape and portrait images mix, which
  mmdet's ``AspectRatioBatchSampler`` batches apart; filled rectangles and
  ellipses of four COCO categories on noisy backgrounds) and
  ``annotations/instances_{train,val}2017.json`` with the 80 real COCO
  categories (mmdet's ``CocoDataset`` class names, standard COCO ids), boxes
  that match the drawn shapes, polygon masks, mask areas, ``iscrowd=0``.
* ``OUT/kitti/``: ``training/{velodyne,calib,label_2,image_2,planes}``,
  ``testing/{velodyne,calib,image_2}`` and ``ImageSets/{train,val,trainval,
  test}.txt`` in the KITTI formats. Calibration is that of KITTI object
  training frame 000000. Point clouds hold a ground plane (z ~ -1.73 m in the
  LiDAR frame) over the PointPillars range plus box-surface clusters at each
  labelled Car / Pedestrian / Cyclist; labels are rounded to KITTI's two
  decimals first and the points are drawn inside the boxes those rounded
  labels describe, 2D boxes are the projected 3D corners (all objects lie
  fully inside the image: truncation 0, occlusion 0). ``planes/`` holds the
  road plane in KITTI's planes format, which the PointPillars car config's
  ``ObjectSample(use_ground_plane=True)`` needs. Then mmdet3d's own
  ``tools/create_data.py kitti --with-plane`` runs on it, producing
  ``kitti_infos_{train,val,trainval,test}.pkl``, ``kitti_dbinfos_train.pkl``,
  ``kitti_gt_database/`` and ``{training,testing}/velodyne_reduced/`` (see
  ``run_kitti_converter``).

``--coco-images N`` is the number of COCO train images (val: ``ceil(N / 2)``);
``--kitti-frames N`` the number of KITTI train frames (val and test:
``ceil(N / 2)`` each). By default a part whose outputs all exist is skipped;
the COCO part only if it was written with the same images, size and seed
(kept in the annotation files' ``info``).
"""
import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import cv2
import numpy as np

# Standard COCO ids of the 80 detection categories, in mmdet's class order.
COCO_CATEGORY_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18,
                     19, 20, 21, 22, 23, 24, 25, 27, 28, 31, 32, 33, 34, 35,
                     36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50,
                     51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64,
                     65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82,
                     84, 85, 86, 87, 88, 89, 90)

# The drawn categories: (name, shape, BGR colour, aspect range w / h).
COCO_SHAPES = (
    ('person', 'ellipse', (60, 60, 220), (0.35, 0.6)),
    ('car', 'rectangle', (200, 90, 40), (1.4, 2.2)),
    ('dog', 'ellipse', (40, 140, 180), (1.3, 1.8)),
    ('sports ball', 'ellipse', (40, 220, 240), (1.0, 1.0)),
)

# Calibration of KITTI object training frame 000000, in its file's order.
KITTI_CALIB = {
    'P0': [
        707.0493, 0.0, 604.0814, 0.0, 0.0, 707.0493, 180.5066, 0.0, 0.0, 0.0,
        1.0, 0.0
    ],
    'P1': [
        707.0493, 0.0, 604.0814, -379.7842, 0.0, 707.0493, 180.5066, 0.0, 0.0,
        0.0, 1.0, 0.0
    ],
    'P2': [
        707.0493, 0.0, 604.0814, 45.75831, 0.0, 707.0493, 180.5066, -0.3454157,
        0.0, 0.0, 1.0, 0.004981016
    ],
    'P3': [
        707.0493, 0.0, 604.0814, -334.1081, 0.0, 707.0493, 180.5066, 2.33066,
        0.0, 0.0, 1.0, 0.003201153
    ],
    'R0_rect': [
        0.9999128, 0.01009263, -0.008511932, -0.01012729, 0.9999406,
        -0.004037671, 0.008470675, 0.004123522, 0.9999556
    ],
    'Tr_velo_to_cam': [
        0.006927964, -0.9999722, -0.002757829, -0.02457729, -0.001162982,
        0.002749836, -0.9999955, -0.06127237, 0.9999753, 0.006931141,
        -0.001143899, -0.3321029
    ],
    'Tr_imu_to_velo': [
        0.9999976, 0.0007553071, -0.002035826, -0.8086759, -0.0007854027,
        0.9998898, -0.01482298, 0.3195559, 0.002024406, 0.01482454, 0.9998881,
        -0.7997231
    ],
}
KITTI_IMAGE_SIZE = (1242, 375)  # width, height
KITTI_GROUND_Z = -1.73  # LiDAR height above the road, metres
PCD_RANGE = (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)  # PointPillars, KITTI car
# (name, l, w, h, forward distance range in metres, draws per frame, BGR)
KITTI_CLASSES = (
    ('Car', (3.5, 4.4), (1.5, 1.8), (1.4, 1.7), (10.0, 35.0), (3, 5), (40, 40,
                                                                       200)),
    ('Pedestrian', (0.6, 1.0), (0.5, 0.7), (1.6, 1.9), (8.0, 25.0), (0, 2),
     (40, 200, 40)),
    ('Cyclist', (1.6, 1.9), (0.5, 0.7), (1.6, 1.8), (8.0, 25.0), (0, 1),
     (200, 40, 40)),
)
KITTI_OUTPUTS = ('kitti_infos_train.pkl', 'kitti_infos_val.pkl',
                 'kitti_infos_trainval.pkl', 'kitti_infos_test.pkl',
                 'kitti_dbinfos_train.pkl', 'kitti_gt_database',
                 'training/velodyne_reduced')
COCO_OUTPUTS = ('annotations/instances_train2017.json',
                'annotations/instances_val2017.json')
#: Default least and largest side of the sample COCO images, in pixels.
COCO_SIZE = (128, 160)


def _rng(seed: int, *keys: int) -> np.random.Generator:
    """A generator for one item, independent of how many others there are."""
    return np.random.default_rng([seed, *keys])


def _exist(root: Path, names: Sequence[str]) -> bool:
    """Whether all ``names`` exist under ``root``."""
    return all((root / name).exists() for name in names)


# ----------------------------------------------------------------------- COCO
def _place_box(
    rng: np.random.Generator, width: int, height: int, aspect: Tuple[float,
                                                                     float],
    taken: List[Tuple[int, int, int,
                      int]]) -> Optional[Tuple[int, int, int, int]]:
    """Picks an inclusive pixel box clear of the others (2 px apart).

    Returns:
        tuple | None: ``(x0, y0, x1, y1)``, or None after 50 tries.
    """
    for _ in range(50):
        h = int(rng.integers(16, min(width, height) // 2))
        w = max(8, min(width - 4, int(round(h * rng.uniform(*aspect)))))
        x0 = int(rng.integers(1, width - w))
        y0 = int(rng.integers(1, height - h))
        box = (x0, y0, x0 + w - 1, y0 + h - 1)
        if all(box[0] > t[2] + 2 or box[2] < t[0] - 2 or box[1] > t[3] +
               2 or box[3] < t[1] - 2 for t in taken):
            return box
    return None


def _shape_polygon(shape: str, box: Tuple[int, int, int, int]) -> np.ndarray:
    """Integer polygon of a rectangle or an ellipse filling ``box``."""
    x0, y0, x1, y1 = box
    if shape == 'rectangle':
        return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.int32)
    center = ((x0 + x1) // 2, (y0 + y1) // 2)
    axes = ((x1 - x0) // 2, (y1 - y0) // 2)
    return cv2.ellipse2Poly(center, axes, 0, 0, 360, 10).astype(np.int32)


def _coco_image(
        rng: np.random.Generator,
        image_id: int,
        first_ann_id: int,
        size: Tuple[int,
                    int] = COCO_SIZE) -> Tuple[np.ndarray, dict, List[dict]]:
    """Draws one image and its annotations.

    Args:
        rng (np.random.Generator): The image's own generator.
        image_id (int): COCO image id.
        first_ann_id (int): Id of its first annotation.
        size (tuple[int, int]): Least and largest side in pixels.
            Defaults to ``COCO_SIZE``.

    Returns:
        tuple: BGR image, the ``images`` entry, the ``annotations`` entries.
    """
    from mmdet.datasets import CocoDataset
    classes = CocoDataset.METAINFO['classes']
    width, height = (
        int(v) for v in rng.integers(size[0], size[1] + 1, size=2))
    base = rng.integers(60, 200, size=3)
    noise = rng.normal(0.0, 12.0, size=(height, width, 3))
    img = np.clip(base + noise, 0, 255).astype(np.uint8)
    taken: List[Tuple[int, int, int, int]] = []
    anns = []
    for _ in range(int(rng.integers(1, 5))):
        name, shape, colour, aspect = COCO_SHAPES[int(rng.integers(0, 4))]
        box = _place_box(rng, width, height, aspect, taken)
        if box is None:
            continue
        taken.append(box)
        poly = _shape_polygon(shape, box)
        mask = np.zeros((height, width), np.uint8)
        cv2.fillPoly(mask, [poly], 1)
        jitter = rng.integers(-20, 21, size=3)
        img[mask > 0] = np.clip(np.array(colour) + jitter, 0, 255)
        ys, xs = np.nonzero(mask)
        x0, y0 = int(xs.min()), int(ys.min())
        anns.append({
            'id':
            first_ann_id + len(anns),
            'image_id':
            image_id,
            'category_id':
            COCO_CATEGORY_IDS[classes.index(name)],
            'bbox': [x0, y0,
                     int(xs.max()) - x0 + 1,
                     int(ys.max()) - y0 + 1],
            'area':
            int(mask.sum()),
            'segmentation': [poly.reshape(-1).astype(float).tolist()],
            'iscrowd':
            0,
        })
    info = {
        'id': image_id,
        'file_name': f'{image_id:012d}.jpg',
        'width': width,
        'height': height
    }
    return img, info, anns


def _coco_made_with(num_train: int, size: Tuple[int, int], seed: int) -> dict:
    """What the annotation files' ``info`` records of how they were made."""
    return {'train_images': num_train, 'size': list(size), 'seed': seed}


def _coco_is(root: Path, made_with: dict) -> bool:
    """Whether ``root`` holds a complete COCO set made with ``made_with``."""
    if not _exist(root, COCO_OUTPUTS):
        return False
    for name in COCO_OUTPUTS:
        info = json.loads((root / name).read_text()).get('info', {})
        if info.get('made_with') != made_with:
            return False
    return True


def make_coco(root: Path,
              num_train: int,
              num_val: int,
              seed: int,
              size: Tuple[int, int] = COCO_SIZE) -> None:
    """Writes ``root/{train2017,val2017,annotations}``.

    Args:
        root (Path): The COCO folder.
        num_train (int): Train images.
        num_val (int): Val images.
        seed (int): Random seed.
        size (tuple[int, int]): Least and largest image side in pixels
            (width and height are drawn independently). Defaults to
            ``COCO_SIZE``.
    """
    if not 32 <= size[0] <= size[1]:
        raise ValueError(f'--coco-size: need 32 <= MIN <= MAX, got {size}')
    from mmdet.datasets import CocoDataset
    categories = [{
        'id': cid,
        'name': name,
        'supercategory': 'none'
    } for cid, name in zip(COCO_CATEGORY_IDS, CocoDataset.METAINFO['classes'])]
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    ann_id = 1
    splits = (('train2017', num_train), ('val2017', num_val))
    for split_no, (split, count) in enumerate(splits):
        (root / split).mkdir(exist_ok=True)
        images, annotations = [], []
        for i in range(count):
            image_id = split_no * 1_000_000 + i + 1
            img, info, anns = _coco_image(
                _rng(seed, 0, split_no, i), image_id, ann_id, size)
            ann_id += len(anns)
            cv2.imwrite(
                str(root / split / info['file_name']), img,
                [cv2.IMWRITE_JPEG_QUALITY, 95])
            images.append(info)
            annotations.extend(anns)
        doc = {
            'info': {
                'description': 'fast_parallel sample data',
                'made_with': _coco_made_with(num_train, size, seed)
            },
            'licenses': [],
            'images': images,
            'annotations': annotations,
            'categories': categories
        }
        path = root / 'annotations' / f'instances_{split}.json'
        path.write_text(json.dumps(doc))


# ---------------------------------------------------------------------- KITTI
def kitti_lidar2cam() -> np.ndarray:
    """``R0_rect @ Tr_velo_to_cam`` as a 4x4 matrix (LiDAR -> rect. camera)."""
    rect = np.eye(4)
    rect[:3, :3] = np.reshape(KITTI_CALIB['R0_rect'], (3, 3))
    velo2cam = np.eye(4)
    velo2cam[:3] = np.reshape(KITTI_CALIB['Tr_velo_to_cam'], (3, 4))
    return rect @ velo2cam


def _wrap(angle: float) -> float:
    """An angle in [-pi, pi)."""
    return (angle + math.pi) % (2 * math.pi) - math.pi


def _camera_corners(loc: np.ndarray, length: float, h: float, w: float,
                    ry: float) -> np.ndarray:
    """8 corners (3, 8) of a KITTI box; ``loc`` is its bottom centre."""
    x = np.array([1, 1, -1, -1, 1, 1, -1, -1]) * length / 2
    y = np.array([0, 0, 0, 0, -1, -1, -1, -1]) * h
    z = np.array([1, -1, -1, 1, 1, -1, -1, 1]) * w / 2
    rot = np.array([[math.cos(ry), 0, math.sin(ry)], [0, 1, 0],
                    [-math.sin(ry), 0, math.cos(ry)]])
    return rot @ np.stack([x, y, z]) + loc[:, None]


def _project(points_cam: np.ndarray) -> np.ndarray:
    """Pixel coordinates (2, n) of camera points (3, n) through P2."""
    p2 = np.reshape(KITTI_CALIB['P2'], (3, 4))
    uvw = p2 @ np.vstack([points_cam, np.ones(points_cam.shape[1])])
    return uvw[:2] / uvw[2:]


def _kitti_object(rng: np.random.Generator, cls: tuple,
                  taken: List[Tuple[float, float, float]]) -> Optional[dict]:
    """Draws one object fully inside the image, clear of the others.

    Label values are rounded to KITTI's two decimals; the LiDAR box is the
    one mmdet3d derives from that rounded label.

    Returns:
        dict | None: The label fields and the LiDAR box, or None.
    """
    name, l_rng, w_rng, h_rng, x_rng, _, colour = cls
    width, height = KITTI_IMAGE_SIZE
    lidar2cam = kitti_lidar2cam()
    for _ in range(50):
        length, w, h = (
            round(float(rng.uniform(*r)), 2) for r in (l_rng, w_rng, h_rng))
        x = float(rng.uniform(*x_rng))
        y = float(rng.uniform(-0.55, 0.55)) * x
        yaw = float(rng.uniform(-math.pi, math.pi))
        radius = 0.5 * math.hypot(length, w)
        if any(
                math.hypot(x - tx, y - ty) < radius + tr + 0.5
                for tx, ty, tr in taken):
            continue
        loc = (lidar2cam @ [x, y, KITTI_GROUND_Z, 1.0])[:3].round(2)
        ry = round(_wrap(-yaw - math.pi / 2), 2)
        corners = _camera_corners(loc, length, h, w, ry)
        if corners[2].min() < 1.0:
            continue
        uv = _project(corners)
        if (uv.min() < 0 or uv[0].max() > width - 1
                or uv[1].max() > height - 1):
            continue
        box2d = [
            max(0.0, uv[0].min()),
            max(0.0, uv[1].min()),
            min(width - 1.0, uv[0].max()),
            min(height - 1.0, uv[1].max())
        ]
        if box2d[3] - box2d[1] < 28:  # keep it moderate-or-easier
            continue
        center = (np.linalg.inv(lidar2cam) @ np.append(loc, 1.0))[:3]
        taken.append((float(center[0]), float(center[1]), radius))
        return {
            'name': name,
            'colour': colour,
            'dims_hwl': (h, w, length),
            'loc': loc,
            'ry': ry,
            'box2d': box2d,
            'uv': uv,
            'alpha': round(_wrap(ry - math.atan2(loc[0], loc[2])), 2),
            'lidar_box': (center, (length, w, h), _wrap(-ry - math.pi / 2)),
        }
    return None


def _label_line(obj: dict) -> str:
    """One KITTI label line (truncation 0, occlusion 0)."""
    h, w, length = obj['dims_hwl']
    x, y, z = obj['loc']
    x1, y1, x2, y2 = obj['box2d']
    return (f"{obj['name']} 0.00 0 {obj['alpha']:.2f} {x1:.2f} {y1:.2f} "
            f'{x2:.2f} {y2:.2f} {h:.2f} {w:.2f} {length:.2f} {x:.2f} {y:.2f} '
            f"{z:.2f} {obj['ry']:.2f}")


def _surface_points(rng: np.random.Generator, lidar_box: tuple,
                    count: int) -> np.ndarray:
    """Points on the sides and top of a LiDAR box, 4 cm inside it.

    Args:
        rng (np.random.Generator): Random generator.
        lidar_box (tuple): Bottom centre (3,), (l, w, h), yaw (CCW from +x).
        count (int): How many points.

    Returns:
        np.ndarray: ``float32[count, 4]``: x, y, z, intensity.
    """
    center, (length, w, h), yaw = lidar_box
    length, w, h = length - 0.08, w - 0.08, h - 0.08
    areas = np.array([w * h, w * h, length * h, length * h, length * w])
    face = rng.choice(5, size=count, p=areas / areas.sum())
    u = rng.uniform(-0.5, 0.5, size=count)
    v = rng.uniform(0.0, 1.0, size=count)
    sign = np.where(face % 2 == 0, 0.5, -0.5)
    along = u * length
    x = np.select([face < 2, face < 4], [sign * length, along], along)
    y = np.select([face < 2, face < 4], [u * w, sign * w], (v - 0.5) * w)
    z = np.where(face < 4, v * h, h) + 0.04
    cos, sin = math.cos(yaw), math.sin(yaw)
    pts = np.stack([
        cos * x - sin * y + center[0], sin * x + cos * y + center[1],
        z + center[2],
        rng.uniform(0.2, 0.9, size=count)
    ],
                   axis=1)
    return pts.astype(np.float32)


def _ground_and_clutter(rng: np.random.Generator,
                        objects: List[dict]) -> np.ndarray:
    """Road points over the PointPillars range plus a few poles, off objects.

    Returns:
        np.ndarray: ``float32[n, 4]``.
    """
    x0, y0, _, x1, y1, _ = PCD_RANGE
    n = 10000
    ground = np.stack([
        rng.uniform(x0, x1, n),
        rng.uniform(y0, y1, n), KITTI_GROUND_Z + rng.normal(0.0, 0.02, n),
        rng.uniform(0.0, 0.3, n)
    ],
                      axis=1)
    poles = []
    for _ in range(6):
        px, py = rng.uniform(5, 60), rng.uniform(-30, 30)
        poles.append(
            np.stack([
                px + rng.normal(0, 0.05, 40), py + rng.normal(0, 0.05, 40),
                rng.uniform(KITTI_GROUND_Z, 0.8, 40),
                rng.uniform(0.3, 1.0, 40)
            ],
                     axis=1))
    pts = np.concatenate([ground] + poles)
    keep = np.ones(len(pts), bool)
    for obj in objects:
        center, (length, w, _), _ = obj['lidar_box']
        reach = 0.5 * math.hypot(length, w) + 0.3
        keep &= np.hypot(pts[:, 0] - center[0], pts[:, 1] - center[1]) > reach
    return pts[keep].astype(np.float32)


def _kitti_image(objects: List[dict]) -> np.ndarray:
    """A plain road scene with each object's projected hull, far ones first."""
    width, height = KITTI_IMAGE_SIZE
    img = np.empty((height, width, 3), np.uint8)
    rows = np.arange(height)[:, None]
    img[:] = np.where(rows < 180, 200 - rows // 4, 90 + rows // 8)[..., None]
    for obj in sorted(objects, key=lambda o: -o['loc'][2]):
        hull = cv2.convexHull(obj['uv'].T.astype(np.float32)).astype(np.int32)
        cv2.fillConvexPoly(img, hull, obj['colour'])
    return img


def kitti_road_plane() -> np.ndarray:
    """The road plane ``(a, b, c, d)``, ``a x + b y + c z + d = 0`` in the
    rectified camera frame, unit normal pointing up (KITTI ``planes/``)."""
    lidar2cam = kitti_lidar2cam()
    normal = lidar2cam[:3, :3] @ np.array([0.0, 0.0, 1.0])
    point = (lidar2cam @ np.array([0.0, 0.0, KITTI_GROUND_Z, 1.0]))[:3]
    normal /= np.linalg.norm(normal)
    return np.append(normal, -normal @ point)


def _write_plane(path: Path) -> None:
    """Writes :func:`kitti_road_plane` in KITTI's ``planes/`` format."""
    values = ' '.join(f'{v:.6e}' for v in kitti_road_plane())
    path.write_text(f'# Plane\nWidth 4\nHeight 1\n{values}\n')


def _write_calib(path: Path) -> None:
    """Writes ``KITTI_CALIB`` in KITTI's ``calib/`` text format."""
    lines = [
        f'{key}: ' + ' '.join(f'{v:.12e}' for v in values)
        for key, values in KITTI_CALIB.items()
    ]
    path.write_text('\n'.join(lines) + '\n')


def _kitti_frame(root: Path, split: str, idx: int, seed: int) -> None:
    """Writes velodyne, calib, image_2 (and label_2 for training) of a frame.

    Args:
        root (Path): The KITTI folder.
        split (str): ``'training'`` or ``'testing'``.
        idx (int): The frame id.
        seed (int): Random seed.
    """
    rng = _rng(seed, 1, split == 'testing', idx)
    objects: List[dict] = []
    taken: List[Tuple[float, float, float]] = []
    for cls in KITTI_CLASSES:
        for _ in range(int(rng.integers(cls[5][0], cls[5][1] + 1))):
            obj = _kitti_object(rng, cls, taken)
            if obj is not None:
                objects.append(obj)
    clouds = [_ground_and_clutter(rng, objects)]
    for obj in objects:
        dist = float(np.hypot(*obj['lidar_box'][0][:2]))
        per_metre = 9000 if obj['name'] == 'Car' else 2500
        clouds.append(
            _surface_points(rng, obj['lidar_box'],
                            int(per_metre / dist) + 40))
    name = f'{idx:06d}'
    folder = root / split
    np.concatenate(clouds).tofile(str(folder / 'velodyne' / f'{name}.bin'))
    _write_calib(folder / 'calib' / f'{name}.txt')
    cv2.imwrite(
        str(folder / 'image_2' / f'{name}.png'), _kitti_image(objects),
        [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if split == 'training':
        (folder / 'label_2' / f'{name}.txt').write_text(''.join(
            _label_line(o) + '\n' for o in objects))
        _write_plane(folder / 'planes' / f'{name}.txt')


def make_kitti_raw(root: Path, num_train: int, num_val: int, num_test: int,
                   seed: int) -> None:
    """Writes the raw KITTI folders and ``ImageSets``.

    Training ids are ``0 .. num_train + num_val - 1`` (train first, then
    val); testing ids ``0 .. num_test - 1``, in ``testing/``.

    Args:
        root (Path): The KITTI folder.
        num_train (int): Train frames.
        num_val (int): Val frames.
        num_test (int): Test frames.
        seed (int): Random seed.
    """
    for split, subdirs in (('training', ('velodyne', 'calib', 'image_2',
                                         'label_2', 'planes')),
                           ('testing', ('velodyne', 'calib', 'image_2'))):
        for sub in subdirs:
            (root / split / sub).mkdir(parents=True, exist_ok=True)
    for idx in range(num_train + num_val):
        _kitti_frame(root, 'training', idx, seed)
    for idx in range(num_test):
        _kitti_frame(root, 'testing', idx, seed)
    sets = {
        'train': range(num_train),
        'val': range(num_train, num_train + num_val),
        'trainval': range(num_train + num_val),
        'test': range(num_test)
    }
    (root / 'ImageSets').mkdir(exist_ok=True)
    for name, ids in sets.items():
        (root / 'ImageSets' / f'{name}.txt').write_text(''.join(f'{i:06d}\n'
                                                                for i in ids))


def mmdet3d_create_data_script() -> Path:
    """Path of mmdet3d's installed ``tools/create_data.py``."""
    import mmdet3d
    return Path(mmdet3d.__file__).parent / '.mim' / 'tools' / 'create_data.py'


# Runs create_data.py as __main__ with its arguments. Upstream's
# update_kitti_infos sleeps 5 s before each of its 4 in-place rewrites of an
# info file, a chance to abort overwriting real data; for generated data that
# is 20 s of nothing, so this child process gives that module a no-op sleep
# (the module uses ``time`` for nothing else). Nothing else changes.
_CONVERTER_DRIVER = """
import runpy, sys, types
import tools.dataset_converters.update_infos_to_v2 as update_infos
update_infos.time = types.SimpleNamespace(sleep=lambda seconds: None)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def run_kitti_converter(root: Path) -> None:
    """Runs mmdet3d's ``create_data.py kitti --with-plane`` on ``root``.

    The script imports ``tools.dataset_converters``, so it runs with its
    ``.mim`` folder as working directory and first on ``PYTHONPATH``, in a
    child process of this Python (see ``_CONVERTER_DRIVER``). Its log goes to
    ``root/create_data.log``.

    Args:
        root (Path): The KITTI folder.

    Raises:
        RuntimeError: If the converter fails.
    """
    script = mmdet3d_create_data_script()
    mim = script.parent.parent
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [str(mim)] + [p for p in [env.get('PYTHONPATH')] if p])
    args = [
        str(script), 'kitti', '--root-path',
        str(root), '--out-dir',
        str(root), '--extra-tag', 'kitti', '--with-plane'
    ]
    log = root / 'create_data.log'
    with open(log, 'w') as f:
        done = subprocess.run(
            [sys.executable, '-c', _CONVERTER_DRIVER] + args,
            cwd=str(mim),
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f'create_data.py {" ".join(args[1:])} failed '
                           f'({done.returncode}):\n{tail}')


def make_sample_data(out: Path,
                     coco_images: int = 8,
                     kitti_frames: int = 6,
                     seed: int = 0,
                     skip_existing: bool = True,
                     coco_size: Tuple[int, int] = COCO_SIZE) -> Path:
    """Writes ``out/coco`` and ``out/kitti``; see the module docstring.

    Args:
        out (Path): Output folder.
        coco_images (int): COCO train images; val gets ``ceil(n / 2)``.
            Defaults to 8.
        kitti_frames (int): KITTI train frames; val and test get
            ``ceil(n / 2)`` each. Defaults to 6.
        seed (int): Random seed. Defaults to 0.
        skip_existing (bool): Leave a part alone when all its outputs exist
            (COCO: made with the same images, size and seed). Defaults to
            True.
        coco_size (tuple[int, int]): Least and largest COCO image side.
            Defaults to ``COCO_SIZE`` (128, 160).

    Returns:
        Path: ``out``.
    """
    if coco_images < 1 or kitti_frames < 1:
        raise ValueError('need at least one COCO image and one KITTI frame')
    out = Path(out).resolve()
    coco, kitti = out / 'coco', out / 'kitti'
    made_with = _coco_made_with(coco_images, tuple(coco_size), seed)
    if skip_existing and _coco_is(coco, made_with):
        print(f'{coco}: already there, skipped')
    else:
        val = math.ceil(coco_images / 2)
        with _progress(f'COCO {coco_images} train + {val} val images, '
                       f'{coco_size[0]}-{coco_size[1]} px, in {coco}'):
            make_coco(coco, coco_images, val, seed, tuple(coco_size))
    if skip_existing and _exist(kitti, KITTI_OUTPUTS):
        print(f'{kitti}: already there, skipped')
    else:
        extra = math.ceil(kitti_frames / 2)
        with _progress(f'KITTI {kitti_frames} train + {extra} val + {extra} '
                       f'test frames, in {kitti}'):
            make_kitti_raw(kitti, kitti_frames, extra, extra, seed)
        with _progress('KITTI infos and gt database (mmdet3d create_data.py '
                       f'kitti --with-plane; log: {kitti}/create_data.log)'):
            run_kitti_converter(kitti)
    return out


@contextlib.contextmanager
def _progress(what: str) -> Iterator[None]:
    """Prints ``make_sample_data: WHAT ...`` and, when the block ends,
    ``done in N s`` on the same line."""
    print(f'make_sample_data: {what} ...', end=' ', flush=True)
    start = time.perf_counter()
    yield
    print(f'done in {time.perf_counter() - start:.1f} s', flush=True)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses the command line (see the module docstring)."""
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, with a help text for every option.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    parser = argparse.ArgumentParser(
        description='Writes a small, deterministic COCO set (OUT/coco) and '
        'KITTI set (OUT/kitti, with the infos and gt database of mmdet3d\'s '
        'create_data.py) for the tests and demos; the sample configs read '
        '--out data/sample. Everything follows from --seed.')
    parser.add_argument(
        '--out',
        type=Path,
        default=Path('data'),
        help='folder to write coco/ and kitti/ into '
        '(default: %(default)s)')
    parser.add_argument(
        '--coco-images',
        type=int,
        default=8,
        help='COCO train images; val gets half, rounded up '
        '(default: %(default)s)')
    parser.add_argument(
        '--coco-size',
        type=int,
        nargs=2,
        default=list(COCO_SIZE),
        metavar=('MIN', 'MAX'),
        help='least and largest COCO image side in pixels, '
        'width and height drawn independently (default: '
        '%(default)s; the benchmarks use 480 640)')
    parser.add_argument(
        '--kitti-frames',
        type=int,
        default=6,
        help='KITTI train frames; val and test get half each, '
        'rounded up (default: %(default)s)')
    parser.add_argument(
        '--seed',
        type=int,
        default=0,
        help='random seed of every image, box and point '
        '(default: %(default)s)')
    parser.add_argument(
        '--skip-existing',
        default=True,
        action=argparse.BooleanOptionalAction,
        help='leave a set alone when all its files exist '
        '(COCO: made with the same images, size and seed); '
        '--no-skip-existing writes both again')
    return parser


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """Command-line entry point.

    Args:
        argv (Sequence[str], optional): Arguments; ``sys.argv[1:]`` if None.

    Returns:
        dict[str, str]: Paths of the ``coco`` and ``kitti`` folders.
    """
    args = parse_args(argv)
    out = make_sample_data(args.out, args.coco_images, args.kitti_frames,
                           args.seed, args.skip_existing, args.coco_size)
    return {'coco': str(out / 'coco'), 'kitti': str(out / 'kitti')}


if __name__ == '__main__':
    main()
