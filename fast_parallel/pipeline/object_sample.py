"""Fast form of mmdet3d's ``ObjectSample``: stock's points, boxes and draws.

Stock pastes the sampled gt-database objects and removes the scene's points
inside their boxes with ``points_in_rbbox``, every point against every face
of every box. :class:`FastObjectSample` removes them with
:func:`~fast_parallel.pipeline.points_in_boxes.in_any_box`, the same mask
for every input, writes the pasted and the kept points once into the output
(stock copies the scene four times), and gives its sampler the fast class
of :mod:`~fast_parallel.pipeline.db_sampler` (why: ``docs/pipeline.md``);
every draw stays stock's. ``sample_2d``, another points class and sampled
boxes with non-finite faces go stock's way, counted. Importing this module
imports mmdet3d.
"""
from typing import Dict

import numpy as np
import torch
from mmdet3d.datasets.transforms import ObjectSample
from mmdet3d.structures.points import (BasePoints, CameraPoints, DepthPoints,
                                       LiDARPoints)

from fast_parallel.pipeline.db_sampler import fast_sampler_class
from fast_parallel.pipeline.points_in_boxes import (box_faces, finite_faces,
                                                    in_any_box)
from fast_parallel.pipeline.stats import count

__all__ = ['FastObjectSample']

#: Points classes whose ``new_point``, ``cat`` and ``__getitem__`` are
#: mmdet3d's own (also read by :mod:`~fast_parallel.pipeline.sweeps`).
POINT_CLASSES = (LiDARPoints, DepthPoints, CameraPoints)


def _in_any_box(points: BasePoints, boxes: np.ndarray) -> np.ndarray:
    """Stock's ``points_in_rbbox(points.coord, boxes).any(-1)``; boxes with
    non-finite faces take stock's test, counted."""
    faces = box_faces(boxes)
    if len(boxes) and not finite_faces(faces):
        count('stock: ObjectSample: a sampled box with non-finite faces')
    return in_any_box(points.coord.numpy(), boxes, faces)


class FastObjectSample(ObjectSample):
    """``ObjectSample`` whose removal of the points in the sampled boxes
    skips, cell by cell, the boxes no point of a cell can be in, and whose
    sampler skips the copies and scene-pair tests stock's makes."""

    def switch_parts(self) -> Dict[str, str]:
        """Gives this instance's sampler its fast class, where it has one.

        Returns:
            dict: ``{part: why}`` for a part left stock (the switch's line
            names it), else empty.
        """
        sampler = self.db_sampler
        fast = fast_sampler_class(sampler)
        if fast is None:
            return {
                f'ObjectSample\'s {type(sampler).__name__}':
                'not mmdet3d\'s DataBaseSampler, or its methods replaced'
            }
        sampler.__class__ = fast
        return {}

    @staticmethod
    def remove_points_in_boxes(points: BasePoints,
                               boxes: np.ndarray) -> BasePoints:
        """Stock's ``remove_points_in_boxes``, bit for bit.

        Args:
            points (BasePoints): The scene's points.
            boxes (np.ndarray): ``(M, 7+)`` sampled LiDAR boxes.

        Returns:
            BasePoints: The points outside every box, in stock's order.
        """
        inside = _in_any_box(points, boxes)
        return points[np.logical_not(inside)]

    def transform(self, input_dict: dict) -> dict:
        """Stock's ``transform``, the pasted cloud written in one pass.

        Args:
            input_dict (dict): Result dict from the loading pipeline.

        Returns:
            dict: ``points``, ``gt_bboxes_3d`` and ``gt_labels_3d`` as
            stock's.
        """
        if self.sample_2d or type(input_dict['points']) not in POINT_CLASSES:
            count('stock: ObjectSample: ' +
                  ('sample_2d' if self.sample_2d else 'another points class'))
            return super().transform(input_dict)
        gt_bboxes_3d = input_dict['gt_bboxes_3d']
        gt_labels_3d = input_dict['gt_labels_3d']
        if self.use_ground_plane:
            ground_plane = input_dict.get('plane', None)
            assert ground_plane is not None, '`use_ground_plane` is True ' \
                                             'but find plane is None'
        else:
            ground_plane = None
        points = input_dict['points']
        sampled_dict = self.db_sampler.sample_all(
            gt_bboxes_3d.tensor.numpy(),
            gt_labels_3d,
            img=None,
            ground_plane=ground_plane)
        if sampled_dict is not None:
            sampled_gt_bboxes_3d = sampled_dict['gt_bboxes_3d']
            sampled_points = sampled_dict['points']
            sampled_gt_labels = sampled_dict['gt_labels_3d']
            gt_labels_3d = np.concatenate([gt_labels_3d, sampled_gt_labels],
                                          axis=0)
            gt_bboxes_3d = gt_bboxes_3d.new_box(
                np.concatenate(
                    [gt_bboxes_3d.tensor.numpy(), sampled_gt_bboxes_3d]))
            points = self._pasted(points, sampled_points, sampled_gt_bboxes_3d)
        input_dict['gt_bboxes_3d'] = gt_bboxes_3d
        input_dict['gt_labels_3d'] = gt_labels_3d.astype(np.int64)
        input_dict['points'] = points
        return input_dict

    def _pasted(self, points: BasePoints, sampled: BasePoints,
                boxes: np.ndarray) -> BasePoints:
        """``points.cat([sampled, remove_points_in_boxes(points, boxes)])``
        with the kept points indexed straight into the output."""
        if type(sampled) is not type(points) or \
                sampled.tensor.shape[1] != points.tensor.shape[1]:
            # stock's expression, for stock's error
            return points.cat(
                [sampled, self.remove_points_in_boxes(points, boxes)])
        inside = _in_any_box(points, boxes)
        keep = torch.from_numpy(np.flatnonzero(np.logical_not(inside)))
        head = len(sampled)
        out = torch.empty((head + len(keep), points.tensor.shape[1]),
                          dtype=points.tensor.dtype)
        out[:head] = sampled.tensor
        # a row gather from a column-major cloud (KITTI's) is slow: rows
        # first (the same values)
        torch.index_select(points.tensor.contiguous(), 0, keep, out=out[head:])
        return type(points)(
            out,
            points_dim=sampled.points_dim,
            attribute_dims=sampled.attribute_dims)
