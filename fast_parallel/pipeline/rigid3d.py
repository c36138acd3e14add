"""Fast forms of mmdet3d's ``GlobalRotScaleTrans`` and ``ObjectRangeFilter``:
stock's steps and draws, without ``array_converter``'s inspection.

Stock rotates the boxes (or the points) through ``rotation_3d_in_axis`` and
limits the yaw through ``limit_period``; both are wrapped in mmdet3d's
``array_converter``, which runs ``inspect.getfullargspec`` at every call
(about as long as the rotation itself), and ``in_range_bev`` gathers the
BEV boxes four times for two columns. For plain ``torch.Tensor``
arguments the converter hands them through and returns the results as they
are, so calling the function it wraps gives the same tensors. Every other
step is stock's, in stock's order. Boxes or points of another class, or
tensors of a ``Tensor`` subclass, go stock's way, counted. Importing this
module imports mmdet3d.
"""
from typing import Any

import numpy as np
import torch
from mmdet3d.datasets.transforms import GlobalRotScaleTrans, ObjectRangeFilter
from mmdet3d.structures import (BaseInstance3DBoxes, CameraInstance3DBoxes,
                                DepthInstance3DBoxes, LiDARInstance3DBoxes)

from fast_parallel.compat.mmdet3d import period_kernel, rotation_kernel
from fast_parallel.pipeline.object_sample import POINT_CLASSES
from fast_parallel.pipeline.stats import count

__all__ = ['FastGlobalRotScaleTrans', 'FastObjectRangeFilter', 'limit_yaw']

#: Box classes whose ``limit_yaw`` is the base class's (read in 1.4.0).
_YAW_BOXES = (LiDARInstance3DBoxes, DepthInstance3DBoxes,
              CameraInstance3DBoxes)


def _plain(tensor: Any) -> bool:
    """Whether the converter hands ``tensor`` through unchanged."""
    return type(tensor) is torch.Tensor


def _rotation_why(input_dict: dict) -> str:
    points = input_dict.get('points')
    if type(points) not in POINT_CLASSES or not _plain(points.tensor):
        return 'points not of an mmdet3d points class'
    boxes = input_dict.get('gt_bboxes_3d')
    if 'gt_bboxes_3d' in input_dict and (type(boxes)
                                         is not LiDARInstance3DBoxes
                                         or not _plain(boxes.tensor)):
        return 'boxes other than LiDARInstance3DBoxes'
    return ''


def limit_yaw(boxes: BaseInstance3DBoxes, offset: float,
              period: float) -> None:
    """Stock's ``boxes.limit_yaw(offset, period)`` on plain tensors."""
    boxes.tensor[:, 6] = period_kernel()(boxes.tensor[:, 6], offset, period)


class FastGlobalRotScaleTrans(GlobalRotScaleTrans):
    """``GlobalRotScaleTrans`` calling the rotation without its converter."""

    def transform(self, input_dict: dict) -> dict:
        """Stock's rotation, scaling and translation of points and boxes,
        with stock's draws in stock's order.

        Args:
            input_dict (dict): Result dict from the loading pipeline.

        Returns:
            dict: With ``points``, ``gt_bboxes_3d``, ``pcd_rotation``,
            ``pcd_rotation_angle``, ``pcd_scale_factor``, ``pcd_trans`` and
            ``transformation_3d_flow`` as stock's.
        """
        why = _rotation_why(input_dict)
        if why:
            count(f'stock: GlobalRotScaleTrans: {why}')
            return super().transform(input_dict)
        if 'transformation_3d_flow' not in input_dict:
            input_dict['transformation_3d_flow'] = []
        self._rotate(input_dict)
        if 'pcd_scale_factor' not in input_dict:
            input_dict['pcd_scale_factor'] = np.random.uniform(
                self.scale_ratio_range[0], self.scale_ratio_range[1])
        self._scale(input_dict)
        translation_std = np.array(self.translation_std, dtype=np.float32)
        trans_factor = np.random.normal(scale=translation_std, size=3).T
        input_dict['points'].translate(trans_factor)
        input_dict['pcd_trans'] = trans_factor
        if 'gt_bboxes_3d' in input_dict:
            input_dict['gt_bboxes_3d'].translate(trans_factor)
        input_dict['transformation_3d_flow'].extend(['R', 'S', 'T'])
        return input_dict

    def _rotate(self, input_dict: dict) -> None:
        """Stock's rotation step: ``LiDARInstance3DBoxes.rotate(angle,
        points)`` or ``points.rotate(angle)`` (mmdet3d 1.4.0), inlined."""
        noise_rotation = np.random.uniform(self.rot_range[0],
                                           self.rot_range[1])
        points = input_dict['points']
        boxes = input_dict.get('gt_bboxes_3d')
        if boxes is not None and len(boxes.tensor) != 0:
            angle = boxes.tensor.new_tensor(noise_rotation)
            boxes.tensor[:, 0:3], rot_mat_T = rotation_kernel()(
                boxes.tensor[:, 0:3],
                angle,
                axis=boxes.YAW_AXIS,
                return_mat=True)
            boxes.tensor[:, 6] += angle
            if boxes.tensor.shape[1] == 9:  # the velocity
                boxes.tensor[:, 7:9] = boxes.tensor[:, 7:9] @ rot_mat_T[:2, :2]
            points.rotate(rot_mat_T)  # a matrix: no converter
        else:
            rotation = points.tensor.new_tensor(noise_rotation)
            rotated, rot_mat_T = rotation_kernel()(
                points.tensor[:, :3][None],
                rotation,
                axis=points.rotation_axis,
                return_mat=True)
            points.tensor[:, :3] = rotated.squeeze(0)
            rot_mat_T = rot_mat_T.squeeze(0)
        input_dict['pcd_rotation'] = rot_mat_T
        input_dict['pcd_rotation_angle'] = noise_rotation

    def _scale(self, input_dict: dict) -> None:
        """Stock's scaling step."""
        scale = input_dict['pcd_scale_factor']
        points = input_dict['points']
        points.scale(scale)
        if self.shift_height:
            assert 'height' in points.attribute_dims.keys(), \
                'setting shift_height=True but points have no height attribute'
            points.tensor[:, points.attribute_dims['height']] *= scale
        input_dict['points'] = points
        if 'gt_bboxes_3d' in input_dict and \
                len(input_dict['gt_bboxes_3d'].tensor) != 0:
            input_dict['gt_bboxes_3d'].scale(scale)


class FastObjectRangeFilter(ObjectRangeFilter):
    """``ObjectRangeFilter`` with the range test on the tensor's columns
    and the yaw limited without the converter."""

    def transform(self, input_dict: dict) -> dict:
        """Stock's filter: the boxes whose BEV centre is in range, their
        labels, and their yaw limited to [-pi, pi).

        Args:
            input_dict (dict): Result dict from the loading pipeline.

        Returns:
            dict: With ``gt_bboxes_3d`` and ``gt_labels_3d`` filtered.
        """
        boxes = input_dict.get('gt_bboxes_3d')
        if type(boxes) not in _YAW_BOXES or not _plain(boxes.tensor) or \
                boxes.tensor.dim() != 2 or boxes.tensor.shape[1] < 7:
            count('stock: ObjectRangeFilter: boxes of another class')
            return super().transform(input_dict)
        # stock's in_range_bev compares the BEV boxes' (x, y) columns, which
        # it gathers four times: the same columns of the tensor, compared
        if isinstance(boxes, CameraInstance3DBoxes):
            bev_range = self.pcd_range[[0, 2, 3, 5]]
            x, y = boxes.tensor[:, 0], boxes.tensor[:, 2]
        else:
            bev_range = self.pcd_range[[0, 1, 3, 4]]
            x, y = boxes.tensor[:, 0], boxes.tensor[:, 1]
        gt_labels_3d = input_dict['gt_labels_3d']
        mask = ((x > bev_range[0]) & (y > bev_range[1])
                & (x < bev_range[2]) & (y < bev_range[3]))
        boxes = boxes[mask]
        gt_labels_3d = gt_labels_3d[mask.numpy().astype(bool)]
        limit_yaw(boxes, 0.5, 2 * np.pi)
        input_dict['gt_bboxes_3d'] = boxes
        input_dict['gt_labels_3d'] = gt_labels_3d
        return input_dict
