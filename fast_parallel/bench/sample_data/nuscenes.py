"""A small, deterministic nuScenes-format set: key frames with sweeps.

LiDAR key frames (``samples/LIDAR_TOP``) and their previous sweeps
(``sweeps/LIDAR_TOP``) as nuScenes' 5-feature ``.pcd.bin`` files, 10-class
boxes with velocities, and the infos in mmdet3d 1.x format
(``nuscenes_infos_{train,val}.pkl``); mmdet3d's own ``create_data.py
nuscenes --only-gt-database`` then writes the gt database the
``ObjectSample`` of CenterPoint's configs reads. What it writes and why:
``docs/sample_data.md``.
"""
import math
import pickle
from pathlib import Path
from typing import Dict, List, NamedTuple, Tuple

import numpy as np

from fast_parallel.bench.sample_data.common import seeded_rng

#: nuScenes' classes in mmdet3d's ``NuScenesDataset.METAINFO`` order (the
#: label the infos hold).
NUSCENES_CLASSES = ('car', 'truck', 'trailer', 'bus', 'construction_vehicle',
                    'bicycle', 'motorcycle', 'pedestrian', 'traffic_cone',
                    'barrier')
#: Mean box size (l, w, h) per class, metres, close to nuScenes' own.
_SIZES = {
    'car': (4.6, 1.95, 1.7),
    'truck': (6.9, 2.5, 2.8),
    'trailer': (10.0, 2.9, 3.6),
    'bus': (11.0, 2.9, 3.5),
    'construction_vehicle': (6.4, 2.8, 3.2),
    'bicycle': (1.7, 0.6, 1.3),
    'motorcycle': (2.1, 0.8, 1.5),
    'pedestrian': (0.7, 0.7, 1.8),
    'traffic_cone': (0.4, 0.4, 1.1),
    'barrier': (0.5, 2.5, 1.0),
}
_STATIC = ('traffic_cone', 'barrier')
#: The LiDAR sits this high above the road (nuScenes: about 1.84 m).
GROUND_Z = -1.84
#: Sweeps before each key frame, and the time between two sweeps (s).
SWEEPS, SWEEP_DT = 10, 0.05
#: What the maker and mmdet3d's gt database step write.
NUSCENES_OUTPUTS = ('nuscenes_infos_train.pkl', 'nuscenes_infos_val.pkl',
                    'nuscenes_dbinfos_train.pkl', 'nuscenes_gt_database')


class _Object(NamedTuple):
    label: int
    box: Tuple[float, ...]  #: x, y, z (gravity centre), l, w, h, yaw
    velocity: Tuple[float, float]


def _objects(rng: np.random.Generator, count: int) -> List[_Object]:
    """``count`` non-overlapping objects within 45 m, every class in turn."""
    out: List[_Object] = []
    first = int(rng.integers(len(NUSCENES_CLASSES)))
    for k in range(count * 20):
        if len(out) == count:
            break
        name = NUSCENES_CLASSES[(first + len(out)) % len(NUSCENES_CLASSES)]
        size = tuple(s * float(rng.uniform(0.9, 1.1)) for s in _SIZES[name])
        dist = float(rng.uniform(4.0, 45.0))
        angle = float(rng.uniform(-math.pi, math.pi))
        x, y = dist * math.cos(angle), dist * math.sin(angle)
        reach = 0.5 * math.hypot(size[0], size[1])
        if any(
                math.hypot(x - o.box[0], y - o.box[1]) < reach +
                0.5 * math.hypot(o.box[3], o.box[4]) + 0.5 for o in out):
            continue
        yaw = float(rng.uniform(-math.pi, math.pi))
        speed = 0.0 if name in _STATIC else float(rng.uniform(0.0, 8.0))
        velocity = (speed * math.cos(yaw), speed * math.sin(yaw))
        out.append(
            _Object(
                NUSCENES_CLASSES.index(name),
                (x, y, GROUND_Z + size[2] / 2, *size, yaw), velocity))
    return out


def _surface(rng: np.random.Generator, box: Tuple[float, ...],
             count: int) -> np.ndarray:
    """``count`` points on the sides and top of ``box``, 3 cm inside."""
    x, y, z, length, w, h, yaw = box
    length, w, h = length - 0.06, w - 0.06, h - 0.06
    areas = np.array([w * h, w * h, length * h, length * h, length * w])
    face = rng.choice(5, size=count, p=areas / areas.sum())
    u, v = rng.uniform(-0.5, 0.5, count), rng.uniform(-0.5, 0.5, count)
    sign = np.where(face % 2 == 0, 0.5, -0.5)
    px = np.select([face < 2, face < 4], [sign * length, u * length],
                   u * length)
    py = np.select([face < 2, face < 4], [u * w, sign * w], v * w)
    pz = np.where(face < 4, v * h, 0.5 * h)
    cos, sin = math.cos(yaw), math.sin(yaw)
    return np.stack([cos * px - sin * py + x, sin * px + cos * py + y, pz + z],
                    axis=1)


def _cloud(rng: np.random.Generator, objects: List[_Object], shift: float,
           ground: int) -> Tuple[np.ndarray, List[int]]:
    """One LiDAR sweep in the key frame's coordinates, 5 features.

    Objects are moved by their velocity over ``shift`` seconds (negative:
    before the key frame).

    Returns:
        tuple: ``float32[n, 5]`` (x, y, z, intensity, ring) and the points
        drawn on each object.
    """
    radius = rng.uniform(1.5, 52.0, ground)
    angle = rng.uniform(-math.pi, math.pi, ground)
    parts = [
        np.stack([
            radius * np.cos(angle), radius * np.sin(angle),
            GROUND_Z + rng.normal(0.0, 0.02, ground)
        ],
                 axis=1)
    ]
    counts = []
    for obj in objects:
        box = list(obj.box)
        box[0] += obj.velocity[0] * shift
        box[1] += obj.velocity[1] * shift
        side = math.sqrt((obj.box[3] + obj.box[4]) * obj.box[5])
        count = int(600 * side / max(math.hypot(box[0], box[1]), 4.0)) + 10
        parts.append(_surface(rng, tuple(box), count))
        counts.append(count)
    xyz = np.concatenate(parts)
    keep = np.ones(len(xyz), bool)
    for obj in objects:  # the road under each object is hidden
        reach = 0.5 * math.hypot(obj.box[3], obj.box[4])
        keep[:ground] &= np.hypot(xyz[:ground, 0] - obj.box[0],
                                  xyz[:ground, 1] - obj.box[1]) > reach
    xyz = xyz[keep]
    elevation = np.arctan2(xyz[:, 2], np.hypot(xyz[:, 0], xyz[:, 1]))
    ring = np.clip((elevation + 0.53) / 0.65 * 32, 0, 31).astype(np.int64)
    intensity = rng.uniform(0.0, 100.0, len(xyz))
    return np.concatenate([xyz, intensity[:, None], ring[:, None]],
                          axis=1).astype(np.float32), counts


def _pose(yaw: float, x: float, y: float) -> np.ndarray:
    """A 4x4 rigid transform: rotation about z, then translation."""
    pose = np.eye(4)
    pose[:2, :2] = [[math.cos(yaw), -math.sin(yaw)],
                    [math.sin(yaw), math.cos(yaw)]]
    pose[:2, 3] = [x, y]
    return pose


def _frame(root: Path, split: str, idx: int, seed: int, stamp: float) -> dict:
    """Writes one key frame and its sweeps; returns its 1.x info."""
    rng = seeded_rng(seed, 3, split == 'val', idx)
    objects = _objects(rng, int(rng.integers(8, 15)))
    token = f'{split}{idx:04d}'
    name = f'n000-sample-{token}__LIDAR_TOP__{int(stamp * 1e6)}.pcd.bin'
    points, counts = _cloud(rng, objects, 0.0, 12000)
    points.tofile(str(root / 'samples' / 'LIDAR_TOP' / name))
    sweeps = []
    for k in range(1, SWEEPS + 1):
        dt = k * SWEEP_DT
        # the sweep sensor's pose in the key frame: the ego drove ~5 m/s
        pose = _pose(0.01 * k, -5.0 * dt, 0.2 * dt)
        cloud, _ = _cloud(rng, objects, -dt, 5000)
        # mmdet3d maps a sweep into the key frame with
        # p @ lidar2sensor[:3, :3] - lidar2sensor[:3, 3]
        lidar2sensor = np.eye(4, dtype=np.float32)
        lidar2sensor[:3, :3] = pose[:3, :3].T
        lidar2sensor[:3, 3] = -pose[:3, 3]
        local = cloud.copy()
        local[:, :3] = (cloud[:, :3] + lidar2sensor[:3, 3]) @ pose[:3, :3]
        sweep_name = (f'n000-sweep-{token}-{k:02d}__LIDAR_TOP__'
                      f'{int((stamp - dt) * 1e6)}.pcd.bin')
        local.astype(np.float32).tofile(
            str(root / 'sweeps' / 'LIDAR_TOP' / sweep_name))
        sweeps.append(
            dict(
                lidar_points=dict(
                    lidar_path=f'sweeps/LIDAR_TOP/{sweep_name}',
                    lidar2ego=np.eye(4).tolist(),
                    lidar2sensor=lidar2sensor.tolist()),
                ego2global=_pose(0.01 * k, 300.0 - 5.0 * dt, 900.0).tolist(),
                timestamp=stamp - dt,
                sample_data_token=f'{token}-sweep{k:02d}'))
    instances = []
    for n, (obj, count) in enumerate(zip(objects, counts)):
        velocity = list(obj.velocity)
        if n == 1 and NUSCENES_CLASSES[obj.label] in _STATIC:
            velocity = [math.nan, math.nan]  # as nuScenes has some
        instances.append(
            dict(
                bbox_3d=[float(v) for v in obj.box],
                bbox_label=obj.label,
                bbox_label_3d=obj.label,
                velocity=velocity,
                num_lidar_pts=count,
                num_radar_pts=0,
                bbox_3d_isvalid=True))
    return dict(
        sample_idx=idx,
        token=token,
        timestamp=stamp,
        ego2global=_pose(0.0, 300.0, 900.0).tolist(),
        images={},
        lidar_points=dict(
            num_pts_feats=5, lidar_path=name, lidar2ego=np.eye(4).tolist()),
        lidar_sweeps=sweeps,
        instances=instances,
        cam_instances={})


def make_nuscenes_raw(root: Path, num_train: int, num_val: int,
                      seed: int) -> None:
    """Writes the point files and ``nuscenes_infos_{train,val}.pkl``.

    Args:
        root (Path): The nuScenes folder.
        num_train (int): Train key frames.
        num_val (int): Val key frames.
        seed (int): Random seed.
    """
    for sub in ('samples/LIDAR_TOP', 'sweeps/LIDAR_TOP'):
        (root / sub).mkdir(parents=True, exist_ok=True)
    metainfo: Dict[str, object] = dict(
        categories={
            name: i
            for i, name in enumerate(NUSCENES_CLASSES)
        },
        dataset='nuscenes',
        version='v1.0-trainval',
        info_version='1.1')
    for split, count in (('train', num_train), ('val', num_val)):
        frames = [
            _frame(root, split, i, seed, 1_533_000_000.0 + 20.0 * i)
            for i in range(count)
        ]
        with open(root / f'nuscenes_infos_{split}.pkl', 'wb') as f:
            pickle.dump(dict(metainfo=metainfo, data_list=frames), f)
