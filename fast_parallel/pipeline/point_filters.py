"""Fast forms of mmdet3d's ``PointsRangeFilter`` and ``PointShuffle``:
stock's points, masks and draws.

Stock's ``points.in_range_3d`` makes six comparisons and five ``&`` over
whole columns of the cloud (eleven passes, each a new tensor), and
``points[mask]`` a boolean gather. :class:`FastPointsRangeFilter` makes the
same mask in one pass (:func:`in_range_mask`: the same six ``float32``
comparisons per point, NaN outside as in stock's) and gathers the kept rows
with ``index_select``, the same values in the same kind of tensor; the
points object is made as stock's ``__getitem__`` makes it. A cloud it does
not cover (another points class or dtype, a range that is not six
``float32`` values) goes stock's way, counted. :class:`FastPointShuffle`
draws stock's ``randperm`` and gathers the rows with ``index_select``
(stock's ``tensor[idx]``: the same rows, row-major, at about a third of
the cost). Importing this module imports mmdet3d and numba.
"""
from typing import Any

import numba
import numpy as np
import torch
from mmdet3d.datasets.transforms import PointShuffle, PointsRangeFilter
from mmdet3d.structures.points import BasePoints

from fast_parallel.pipeline.object_sample import POINT_CLASSES
from fast_parallel.pipeline.stats import count

__all__ = ['FastPointShuffle', 'FastPointsRangeFilter', 'in_range_mask']


@numba.njit(cache=True)
def _mask(xyz: Any, r: Any, out: Any) -> None:
    for i in range(xyz.shape[0]):
        x, y, z = xyz[i, 0], xyz[i, 1], xyz[i, 2]
        out[i] = (x > r[0]) & (y > r[1]) & (z > r[2]) & (x < r[3]) & (
            y < r[4]) & (
                z < r[5])


def in_range_mask(points: np.ndarray, point_range: np.ndarray) -> np.ndarray:
    """mmdet3d's ``in_range_3d`` mask, as a numpy array.

    Args:
        points (np.ndarray): ``(N, C >= 3)`` ``float32`` points.
        point_range (np.ndarray): Six ``float32`` values, ``(x_min, y_min,
            z_min, x_max, y_max, z_max)``.

    Returns:
        np.ndarray: ``(N,)`` bool, True strictly inside on every axis.
    """
    out = np.empty(points.shape[0], dtype=np.bool_)
    _mask(points, point_range, out)
    return out


def _why_stock(points: Any, point_range: Any) -> str:
    if type(points) not in POINT_CLASSES:
        return 'another points class'
    tensor = points.tensor
    if tensor.dtype != torch.float32 or tensor.dim() != 2 or \
            tensor.shape[1] < 3 or tensor.device.type != 'cpu' or \
            tensor.requires_grad:
        return 'points not a float32 CPU matrix'
    if not isinstance(point_range, np.ndarray) or \
            point_range.dtype != np.float32 or point_range.shape != (6, ):
        return 'a range other than six float32 values'
    return ''


def _masks_taken(input_dict: dict, index: np.ndarray) -> dict:
    """Stock's last step of both transforms: ``pts_instance_mask`` and
    ``pts_semantic_mask``, where present, indexed as the points were."""
    pts_instance_mask = input_dict.get('pts_instance_mask', None)
    pts_semantic_mask = input_dict.get('pts_semantic_mask', None)
    if pts_instance_mask is not None:
        input_dict['pts_instance_mask'] = pts_instance_mask[index]
    if pts_semantic_mask is not None:
        input_dict['pts_semantic_mask'] = pts_semantic_mask[index]
    return input_dict


class FastPointsRangeFilter(PointsRangeFilter):
    """``PointsRangeFilter`` with the mask made in one pass."""

    def transform(self, input_dict: dict) -> dict:
        """Stock's ``transform``: the points in range, and the same rows of
        ``pts_instance_mask`` / ``pts_semantic_mask``.

        Args:
            input_dict (dict): Result dict from the loading pipeline.

        Returns:
            dict: With ``points`` (and the masks) filtered.
        """
        points = input_dict['points']
        why = _why_stock(points, self.pcd_range)
        if why:
            count(f'stock: PointsRangeFilter: {why}')
            return super().transform(input_dict)
        points_mask = in_range_mask(points.tensor.numpy(), self.pcd_range)
        # stock's points[mask]: the rows gathered (row-major, as stock's
        # boolean index gives them from any layout), the object made alike
        kept = torch.index_select(
            points.tensor, 0, torch.from_numpy(np.flatnonzero(points_mask)))
        input_dict['points'] = type(points)(
            kept,
            points_dim=kept.shape[1],
            attribute_dims=points.attribute_dims)
        return _masks_taken(input_dict, points_mask)


#: mmdet3d's own ``BasePoints.shuffle`` (a user's replacement of it, on
#: the class or on a points object, takes stock's ``transform``).
_STOCK_SHUFFLE = BasePoints.shuffle if (
    BasePoints.shuffle.__module__, BasePoints.shuffle.__qualname__) == (
        'mmdet3d.structures.points.base_points',
        'BasePoints.shuffle') else None


class FastPointShuffle(PointShuffle):
    """``PointShuffle`` whose gather of the shuffled rows is an
    ``index_select``."""

    def transform(self, input_dict: dict) -> dict:
        """Stock's ``transform``: the points (and masks) in the order of
        stock's ``torch.randperm`` draw.

        Args:
            input_dict (dict): Result dict from the loading pipeline.

        Returns:
            dict: With ``points`` (and the masks) shuffled.
        """
        points = input_dict['points']
        tensor = getattr(points, 'tensor', None)
        if type(points) not in POINT_CLASSES or \
                type(points).shuffle is not _STOCK_SHUFFLE or \
                'shuffle' in vars(points) or \
                type(tensor) is not torch.Tensor or tensor.dim() != 2 or \
                tensor.layout is not torch.strided or \
                tensor.device.type != 'cpu' or tensor.requires_grad:
            count('stock: PointShuffle: another points class or shuffle, '
                  'or not a CPU matrix')
            return super().transform(input_dict)
        # BasePoints.shuffle: the draw, then tensor[idx] (a new row-major
        # tensor of those rows, from any layout: index_select's)
        idx = torch.randperm(len(points), device=tensor.device)
        points.tensor = torch.index_select(tensor, 0, idx)
        return _masks_taken(input_dict, idx.numpy())
