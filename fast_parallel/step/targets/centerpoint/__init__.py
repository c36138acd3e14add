"""``CenterHead.get_targets`` for the whole batch, on one instance.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`get_targets`
on one mmdet3d ``CenterHead`` instance in place of the class's (stock's
``loss_by_feat`` calls it as ``self.get_targets``); it returns
:func:`~fast_parallel.step.targets.centerpoint.targets.center_targets`'s
result, stock's tuple bit for bit. A batch outside what that covers runs
stock's ``get_targets``, counted.
"""
from typing import Any, List, Optional, Sequence

import torch

from fast_parallel.compat.targets import (CENTER_HEAD_TRAIN_KEYS,
                                          replaced_reason, upstream)
from fast_parallel.step.targets.centerpoint.targets import center_targets
from fast_parallel.step.targets.cpu_paths import PathModelError
from fast_parallel.step.targets.stock_way import StockWay, batch_targets


def supported(head: Any) -> Optional[str]:
    """None when :func:`get_targets` is exact for this head, else why not.

    Args:
        head: A dense head.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    if type(head) is not upstream('CenterHead'):
        return f'{name} is not CenterHead'
    cfg = getattr(head, 'train_cfg', None)
    if not cfg:
        return 'CenterHead has no train_cfg'
    missing = [key for key in CENTER_HEAD_TRAIN_KEYS if key not in cfg]
    if missing:
        return f'train_cfg lacks {", ".join(missing)}'
    for key in ('max_objs', 'dense_reg', 'min_radius'):
        if type(cfg[key]) is not int:
            return f'train_cfg.{key} is not an int'
    if not isinstance(cfg['gaussian_overlap'], (int, float)):
        return 'train_cfg.gaussian_overlap is not a number'
    if not isinstance(cfg['out_size_factor'],
                      int) or cfg['out_size_factor'] <= 0:
        return 'train_cfg.out_size_factor is not a positive int'
    for names in head.class_names:
        if len(set(names)) != len(names):
            return 'a task names a class twice'
    return replaced_reason((head, 'CenterHead'))


def batch_reason(gts: Sequence[Any]) -> Optional[str]:
    """Why this batch's targets take the stock path, or None."""
    boxes_class = upstream('LiDARInstance3DBoxes')
    if not gts:
        return 'an empty batch'
    device = gts[0].labels_3d.device
    for gt in gts:
        boxes, labels = gt.bboxes_3d, gt.labels_3d
        if type(boxes) is not boxes_class:
            return f'boxes are {type(boxes).__name__}, not ' \
                'LiDARInstance3DBoxes'
        tensor = boxes.tensor
        if (tensor.dtype != torch.float32 or tensor.dim() != 2
                or tensor.shape[1] != 9 or tensor.device != device):
            return 'boxes not (n, 9) float32 on the labels\' device'
        if (labels.dim() != 1 or labels.shape[0] != tensor.shape[0]
                or labels.dtype.is_floating_point or labels.device != device):
            return 'labels not one integer per box, on one device'
    return None


def get_targets(self: Any, batch_gt_instances_3d: List[Any]) -> tuple:
    """Stock's ``CenterHead.get_targets``, batched.

    Args:
        self: The ``CenterHead``.
        batch_gt_instances_3d (list[InstanceData]): ``bboxes_3d`` and
            ``labels_3d`` per sample.

    Returns:
        tuple: Stock's heatmaps, anno boxes, inds and masks, per task.
    """
    with batch_targets(self, len(batch_gt_instances_3d)) as stock_way:
        if batch_reason(batch_gt_instances_3d) is None:
            batched = StockWay()
            try:
                out = center_targets(self, batch_gt_instances_3d, batched)
            except PathModelError:  # a CPU build this cannot match
                out = None
            if out is not None:
                stock_way.count(batched.samples)
                return out
        stock_way.count(len(batch_gt_instances_3d))
        return type(self).get_targets(self, batch_gt_instances_3d)
