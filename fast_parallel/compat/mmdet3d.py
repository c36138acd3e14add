"""mmdet3d internals the fast 3D transforms follow.

Checked on mmdet3d 1.4.0 (:data:`fast_parallel.compat.CHECKED_ON`).
"""
from typing import Callable, Tuple

from fast_parallel.compat.core import private

__all__ = [
    "period_kernel", "points_file_read", "rotation_kernel", "sweep_methods"
]


def rotation_kernel() -> Callable:
    """mmdet3d's ``rotation_3d_in_axis`` without its ``array_converter``
    (the function it wraps, ``__wrapped__``): torch tensors in and out.

    Returns:
        callable: ``(points, angles, axis=0, return_mat=False,
        clockwise=False)``.
    """
    from mmdet3d.structures.bbox_3d import utils
    return private(
        utils.rotation_3d_in_axis, '__wrapped__', 'mmdet3d',
        "ObjectSample's fast sampler (the corners of its boxes) and the "
        'fast GlobalRotScaleTrans')


def period_kernel() -> Callable:
    """mmdet3d's ``limit_period`` without its ``array_converter`` (the
    function it wraps, ``__wrapped__``): torch tensors in and out.

    Returns:
        callable: ``(val, offset=0.5, period=np.pi)``.
    """
    from mmdet3d.structures.bbox_3d import utils
    return private(utils.limit_period, '__wrapped__', 'mmdet3d',
                   "the fast ObjectRangeFilter (the boxes' yaw)")


def sweep_methods(transform: object) -> Tuple[Callable, Callable]:
    """``LoadPointsFromMultiSweeps``'s file read and close-point filter.

    Args:
        transform: A ``LoadPointsFromMultiSweeps`` instance.

    Returns:
        tuple: Its bound ``_load_points`` and ``_remove_close``.
    """
    used_for = ('the fast LoadPointsFromMultiSweeps (its sweeps, as stock '
                'reads them)')
    return (private(transform, '_load_points', 'mmdet3d', used_for),
            private(transform, '_remove_close', 'mmdet3d', used_for))


def points_file_read() -> Tuple[str, Callable]:
    """``LoadPointsFromFile``'s file read, which the gt-database cache's
    subclass overrides (stock's ``transform`` calls it by this name).

    Returns:
        tuple: Its name and stock's function ``(self, pts_filename) ->
        np.ndarray``.
    """
    from mmdet3d.datasets.transforms import LoadPointsFromFile
    name = '_load_points'
    return name, private(
        LoadPointsFromFile, name, 'mmdet3d',
        "the decoded-input cache (ObjectSample's gt-database files, read "
        'once per run)')
