"""KITTI calibration, frames and file formats of the sample KITTI set.

The calibration is that of KITTI object training frame 000000; see
``docs/sample_data.md``.
"""
import math
from pathlib import Path

import numpy as np

#: Calibration of KITTI object training frame 000000, in its file's order.
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
KITTI_IMAGE_SIZE = (1242, 375)  #: width, height
KITTI_GROUND_Z = -1.73  #: LiDAR height above the road, metres


def kitti_lidar2cam() -> np.ndarray:
    """``R0_rect @ Tr_velo_to_cam`` as a 4x4 matrix.

    Returns:
        np.ndarray: LiDAR -> rectified camera, ``float64[4, 4]``.
    """
    rect = np.eye(4)
    rect[:3, :3] = np.reshape(KITTI_CALIB['R0_rect'], (3, 3))
    velo2cam = np.eye(4)
    velo2cam[:3] = np.reshape(KITTI_CALIB['Tr_velo_to_cam'], (3, 4))
    return rect @ velo2cam


def wrap_angle(angle: float) -> float:
    """An angle in [-pi, pi).

    Args:
        angle (float): Radians.

    Returns:
        float: The same direction, wrapped.
    """
    return (angle + math.pi) % (2 * math.pi) - math.pi


def camera_corners(loc: np.ndarray, length: float, h: float, w: float,
                   ry: float) -> np.ndarray:
    """The 8 corners of a KITTI box in the rectified camera frame.

    Args:
        loc (np.ndarray): Bottom centre (3,).
        length (float): Box length.
        h (float): Box height.
        w (float): Box width.
        ry (float): Rotation about the camera's y axis.

    Returns:
        np.ndarray: ``(3, 8)`` corners.
    """
    x = np.array([1, 1, -1, -1, 1, 1, -1, -1]) * length / 2
    y = np.array([0, 0, 0, 0, -1, -1, -1, -1]) * h
    z = np.array([1, -1, -1, 1, 1, -1, -1, 1]) * w / 2
    rot = np.array([[math.cos(ry), 0, math.sin(ry)], [0, 1, 0],
                    [-math.sin(ry), 0, math.cos(ry)]])
    return rot @ np.stack([x, y, z]) + loc[:, None]


def project(points_cam: np.ndarray) -> np.ndarray:
    """Pixel coordinates of camera points through ``P2``.

    Args:
        points_cam (np.ndarray): ``(3, n)`` points, rectified camera frame.

    Returns:
        np.ndarray: ``(2, n)`` pixel coordinates.
    """
    p2 = np.reshape(KITTI_CALIB['P2'], (3, 4))
    uvw = p2 @ np.vstack([points_cam, np.ones(points_cam.shape[1])])
    return uvw[:2] / uvw[2:]


def kitti_road_plane() -> np.ndarray:
    """The road plane, as KITTI's ``planes/`` files hold it.

    Returns:
        np.ndarray: ``(a, b, c, d)`` with ``a x + b y + c z + d = 0`` in the
        rectified camera frame, unit normal pointing up.
    """
    lidar2cam = kitti_lidar2cam()
    normal = lidar2cam[:3, :3] @ np.array([0.0, 0.0, 1.0])
    point = (lidar2cam @ np.array([0.0, 0.0, KITTI_GROUND_Z, 1.0]))[:3]
    normal /= np.linalg.norm(normal)
    return np.append(normal, -normal @ point)


def write_plane(path: Path) -> None:
    """Writes :func:`kitti_road_plane` in KITTI's ``planes/`` format.

    Args:
        path (Path): The ``planes/NNNNNN.txt`` file.
    """
    values = ' '.join(f'{v:.6e}' for v in kitti_road_plane())
    path.write_text(f'# Plane\nWidth 4\nHeight 1\n{values}\n')


def write_calib(path: Path) -> None:
    """Writes ``KITTI_CALIB`` in KITTI's ``calib/`` text format.

    Args:
        path (Path): The ``calib/NNNNNN.txt`` file.
    """
    lines = [
        f'{key}: ' + ' '.join(f'{v:.12e}' for v in values)
        for key, values in KITTI_CALIB.items()
    ]
    path.write_text('\n'.join(lines) + '\n')
