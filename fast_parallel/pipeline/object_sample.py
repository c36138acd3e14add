"""Fast form of mmdet3d's ``ObjectSample``: stock's points, boxes and draws.

Stock pastes the sampled gt-database objects and removes the scene's points
inside their boxes with ``points_in_rbbox``, every point against every face
of every box. :class:`FastObjectSample` removes them with
:func:`~fast_parallel.pipeline.points_in_boxes.in_any_box`, the same mask
for every input, and gives its sampler the fast class of
:mod:`~fast_parallel.pipeline.db_sampler` (why: ``docs/pipeline.md``);
pasting and every draw stay stock's. Sampled boxes with non-finite faces go
stock's way, counted. Importing this module imports mmdet3d.
"""
from typing import Dict

import numpy as np
from mmdet3d.datasets.transforms import ObjectSample
from mmdet3d.structures.points import BasePoints

from fast_parallel.pipeline.db_sampler import fast_sampler_class
from fast_parallel.pipeline.points_in_boxes import box_faces, in_any_box
from fast_parallel.pipeline.stats import count

__all__ = ['FastObjectSample']


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
        faces = box_faces(boxes)
        if len(boxes) and not (np.isfinite(faces[0]).all()
                               and np.isfinite(faces[1]).all()):
            count('stock: ObjectSample: a sampled box with non-finite faces')
        inside = in_any_box(points.coord.numpy(), boxes, faces)
        return points[np.logical_not(inside)]
