"""``FCOSHead.get_targets`` for the whole batch, on one instance.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`get_targets`
on one ``FCOSHead`` / ``NASFCOSHead`` instance in place of the class's
(stock's ``loss_by_feat`` calls it as ``self.get_targets``); it returns
:func:`~fast_parallel.step.targets.fcos.targets.point_targets`'s result,
stock's lists bit for bit. A batch outside what that covers runs stock's
``get_targets``, counted.
"""
from typing import Any, List, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import (TARGETS_SINGLE, replaced_reason,
                                          upstream)
from fast_parallel.step.targets.fcos.targets import point_targets
from fast_parallel.step.targets.padding import gt_layout_reason
from fast_parallel.step.targets.stock_way import batch_targets

__all__ = ['batch_reason', 'get_targets', 'supported']

_NUMBER = (int, float)


def _number(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def supported(head: Any) -> Optional[str]:
    """None when :func:`get_targets` is exact for this head, else why not.

    Args:
        head: A dense head.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    fcos = upstream('FCOSHead')
    name = type(head).__name__
    if type(head) not in (fcos, upstream('NASFCOSHead')):
        return f'{name} is not FCOSHead or NASFCOSHead'
    for method in ('get_targets', TARGETS_SINGLE):
        if getattr(type(head), method) is not getattr(fcos, method):
            return f'{name} has its own {method}'
    ranges = getattr(head, 'regress_ranges', None)
    if not isinstance(ranges, (list, tuple)) or not all(
            isinstance(r,
                       (list, tuple)) and len(r) == 2 and all(map(_number, r))
            for r in ranges):
        return 'regress_ranges are not pairs of numbers'
    strides = getattr(head, 'strides', None)
    if not isinstance(strides,
                      (list, tuple)) or not all(map(_number, strides)):
        return 'strides are not numbers'
    if not _number(head.center_sample_radius):
        return 'center_sample_radius is not a number'
    if type(head.num_classes) is not int:
        return 'num_classes is not an int'
    return replaced_reason((head, 'FCOSHead'))


def batch_reason(head: Any, points: Sequence[Tensor],
                 gts: Sequence[Any]) -> Optional[str]:
    """Why this batch's targets take the stock path, or None.

    Args:
        head: The switched head.
        points (Sequence[Tensor]): Points per level.
        gts (Sequence[InstanceData]): Ground truths per image.

    Returns:
        Optional[str]: The reason, or None.
    """
    if not gts or not points:
        return 'an empty batch'
    if len(points) != len(head.regress_ranges) or \
            len(head.strides) < len(points):
        return 'levels unlike regress_ranges / strides'
    first = points[0]
    if any(p.dim() != 2 or p.shape[1] != 2 or p.dtype != first.dtype
           or p.device != first.device for p in points):
        return 'points not (n, 2) of one dtype and device'
    boxes = gts[0].bboxes
    if any(type(gt.bboxes) is not Tensor for gt in gts) or \
            not boxes.dtype.is_floating_point:
        return 'boxes are not a float tensor'
    why = gt_layout_reason(gts, first.device)
    if why is not None:
        return why
    if any(gt.bboxes.dtype != boxes.dtype or gt.bboxes.device != first.device
           or gt.labels.dtype != gts[0].labels.dtype for gt in gts):
        return 'boxes and labels not of one dtype on the points\' device'
    if torch.promote_types(first.dtype, boxes.dtype) != boxes.dtype:
        return 'points finer than the boxes\' dtype'
    return None


def get_targets(self: Any, points: List[Tensor],
                batch_gt_instances: Sequence[Any]) -> tuple:
    """Stock's ``FCOSHead.get_targets``, batched.

    Args:
        self: The ``FCOSHead``.
        points (list[Tensor]): Points per level.
        batch_gt_instances (Sequence[InstanceData]): ``bboxes`` and
            ``labels`` per image.

    Returns:
        tuple: ``(labels, bbox_targets)`` per level, stock's.
    """
    with batch_targets(self, len(batch_gt_instances)) as way:
        why = batch_reason(self, points, batch_gt_instances)
        if why is None:
            return point_targets(self, points, batch_gt_instances)
        way.count(len(batch_gt_instances))
        return upstream('FCOSHead').get_targets(self, points,
                                                batch_gt_instances)
