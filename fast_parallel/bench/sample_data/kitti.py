"""A small, deterministic KITTI set: road, poles and labelled objects.

Raw KITTI folders only; :mod:`~fast_parallel.bench.sample_data.
kitti_converter` adds the infos. What it writes and why:
``docs/sample_data.md``.
"""
import math
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

import cv2
import numpy as np

from fast_parallel.bench.sample_data import kitti_calib as calib
from fast_parallel.bench.sample_data.common import seeded_rng

#: PointPillars' point cloud range of the KITTI car config.
PCD_RANGE = (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)


class KittiClass(NamedTuple):
    """How one KITTI class is drawn (sizes in metres)."""
    name: str
    length: Tuple[float, float]  #: range
    width: Tuple[float, float]  #: range
    height: Tuple[float, float]  #: range
    distance: Tuple[float, float]  #: forward distance range
    draws: Tuple[int, int]  #: tries per frame, least and most
    colour: Tuple[int, int, int]  #: BGR in the image


#: The drawn classes.
KITTI_CLASSES = (
    KittiClass('Car', (3.5, 4.4), (1.5, 1.8), (1.4, 1.7), (10.0, 35.0), (3, 5),
               (40, 40, 200)),
    KittiClass('Pedestrian', (0.6, 1.0), (0.5, 0.7), (1.6, 1.9), (8.0, 25.0),
               (0, 2), (40, 200, 40)),
    KittiClass('Cyclist', (1.6, 1.9), (0.5, 0.7), (1.6, 1.8), (8.0, 25.0),
               (0, 1), (200, 40, 40)),
)
#: ``(x, y, radius)`` of an object already placed, LiDAR frame.
Taken = Tuple[float, float, float]


def _kitti_object(rng: np.random.Generator, cls: KittiClass,
                  taken: List[Taken]) -> Optional[dict]:
    """Draws one object fully inside the image, clear of the others.

    Label values are rounded to KITTI's two decimals; the LiDAR box is the
    one mmdet3d derives from that rounded label.

    Args:
        rng (np.random.Generator): The frame's generator.
        cls (KittiClass): What to draw.
        taken (list[tuple]): Objects already placed; the new one is added.

    Returns:
        dict | None: The label fields and the LiDAR box, or None after 50
        tries.
    """
    width, height = calib.KITTI_IMAGE_SIZE
    lidar2cam = calib.kitti_lidar2cam()
    for _ in range(50):
        length, w, h = (
            round(float(rng.uniform(*r)), 2)
            for r in (cls.length, cls.width, cls.height))
        x = float(rng.uniform(*cls.distance))
        y = float(rng.uniform(-0.55, 0.55)) * x
        yaw = float(rng.uniform(-math.pi, math.pi))
        radius = 0.5 * math.hypot(length, w)
        if any(
                math.hypot(x - tx, y - ty) < radius + tr + 0.5
                for tx, ty, tr in taken):
            continue
        loc = (lidar2cam @ [x, y, calib.KITTI_GROUND_Z, 1.0])[:3].round(2)
        ry = round(calib.wrap_angle(-yaw - math.pi / 2), 2)
        corners = calib.camera_corners(loc, length, h, w, ry)
        if corners[2].min() < 1.0:
            continue
        uv = calib.project(corners)
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
        alpha = round(calib.wrap_angle(ry - math.atan2(loc[0], loc[2])), 2)
        lidar_yaw = calib.wrap_angle(-ry - math.pi / 2)
        return {
            'name': cls.name,
            'colour': cls.colour,
            'dims_hwl': (h, w, length),
            'loc': loc,
            'ry': ry,
            'box2d': box2d,
            'uv': uv,
            'alpha': alpha,
            'lidar_box': (center, (length, w, h), lidar_yaw),
        }
    return None


def _label_line(obj: dict) -> str:
    """One KITTI label line (truncation 0, occlusion 0).

    Args:
        obj (dict): From :func:`_kitti_object`.

    Returns:
        str: The line, without its newline.
    """
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

    Args:
        rng (np.random.Generator): The frame's generator.
        objects (list[dict]): The frame's objects, kept clear.

    Returns:
        np.ndarray: ``float32[n, 4]``.
    """
    x0, y0, _, x1, y1, _ = PCD_RANGE
    n = 10000
    ground = np.stack([
        rng.uniform(x0, x1, n),
        rng.uniform(y0, y1, n),
        calib.KITTI_GROUND_Z + rng.normal(0.0, 0.02, n),
        rng.uniform(0.0, 0.3, n)
    ],
                      axis=1)
    poles = []
    for _ in range(6):
        px, py = rng.uniform(5, 60), rng.uniform(-30, 30)
        poles.append(
            np.stack([
                px + rng.normal(0, 0.05, 40), py + rng.normal(0, 0.05, 40),
                rng.uniform(calib.KITTI_GROUND_Z, 0.8, 40),
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
    """A plain road scene with each object's projected hull, far ones first.

    Args:
        objects (list[dict]): The frame's objects.

    Returns:
        np.ndarray: BGR ``uint8`` image of ``kitti_calib.KITTI_IMAGE_SIZE``.
    """
    width, height = calib.KITTI_IMAGE_SIZE
    img = np.empty((height, width, 3), np.uint8)
    rows = np.arange(height)[:, None]
    img[:] = np.where(rows < 180, 200 - rows // 4, 90 + rows // 8)[..., None]
    for obj in sorted(objects, key=lambda o: -o['loc'][2]):
        hull = cv2.convexHull(obj['uv'].T.astype(np.float32)).astype(np.int32)
        cv2.fillConvexPoly(img, hull, obj['colour'])
    return img


def _kitti_frame(root: Path, split: str, idx: int, seed: int) -> None:
    """Writes velodyne, calib, image_2 (and label_2, planes for training).

    Args:
        root (Path): The KITTI folder.
        split (str): ``'training'`` or ``'testing'``.
        idx (int): The frame id.
        seed (int): Random seed.
    """
    rng = seeded_rng(seed, 1, split == 'testing', idx)
    objects: List[dict] = []
    taken: List[Taken] = []
    for cls in KITTI_CLASSES:
        for _ in range(int(rng.integers(cls.draws[0], cls.draws[1] + 1))):
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
    calib.write_calib(folder / 'calib' / f'{name}.txt')
    cv2.imwrite(
        str(folder / 'image_2' / f'{name}.png'), _kitti_image(objects),
        [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if split == 'training':
        (folder / 'label_2' / f'{name}.txt').write_text(''.join(
            _label_line(o) + '\n' for o in objects))
        calib.write_plane(folder / 'planes' / f'{name}.txt')


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
