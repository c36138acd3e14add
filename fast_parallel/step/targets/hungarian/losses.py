"""The DETR losses' device syncs that the matching already decided.

Stock's DETR losses turn two host counts into tensors and read them back
(``max(avg_factor, 1)``, ``clamp(num_pos, 1).item()``), and mmdet's
``GIoULoss`` and ``L1Loss`` ask ``torch.any(weight > 0)`` of box weights that
are 1 exactly at the matched queries. Outside distributed training each is
decided here from the counts the matching put on the host: the same values,
no device sync. Under a process group (``reduce_mean`` all-reduces) and for
any other loss class, or a loss module with hooks, it is stock's call.
"""
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from fast_parallel.compat.targets import (is_upstream, reduce_mean_reduces,
                                          runs_forward_only, upstream)

__all__ = ['cls_avg_factor', 'positives_divisor', 'regression_loss']


def _as_dtype(value: float, dtype: torch.dtype) -> float:
    """``value`` as ``new_tensor([value])`` of ``dtype`` holds it (torch
    rounds a Python float to a 16-bit one through float32: twice)."""
    if dtype == torch.float32:
        return float(np.float32(value))
    if dtype == torch.float64:
        return float(value)
    return torch.tensor([value], dtype=dtype).item()  # on the host


def cls_avg_factor(self: Any, like: Tensor, num_total_pos: int,
                   num_total_neg: int) -> Any:
    """Stock's ``max(reduce_mean(...), 1)`` of the class loss's divisor.

    Without a process group, ``reduce_mean`` returns its tensor and
    ``max(t, 1)`` is ``1`` exactly when ``1 > t``: decided on the host from
    the value the tensor holds, the tensor itself returned otherwise.
    """
    factor = num_total_pos * 1.0 + num_total_neg * self.bg_cls_weight
    if not self.sync_cls_avg_factor:
        return max(factor, 1)
    tensor = like.new_tensor([factor])
    if reduce_mean_reduces():
        return max(upstream('reduce_mean')(tensor), 1)
    return 1 if _as_dtype(factor, tensor.dtype) < 1 else tensor


def positives_divisor(loss_cls: Tensor, num_total_pos: int) -> float:
    """Stock's ``clamp(reduce_mean(new_tensor([num_pos])), min=1).item()``."""
    if reduce_mean_reduces():
        tensor = loss_cls.new_tensor([num_total_pos])
        return torch.clamp(upstream('reduce_mean')(tensor), min=1).item()
    return max(_as_dtype(num_total_pos, loss_cls.dtype), 1.0)


def regression_loss(module: Any, has_pos: bool, pred: Tensor, target: Tensor,
                    weight: Tensor, avg_factor: Optional[float]) -> Tensor:
    """``module(pred, target, weight, avg_factor=avg_factor)``, its
    ``torch.any(weight > 0)`` given as ``has_pos``.

    Args:
        module (nn.Module): The head's ``loss_iou`` or ``loss_bbox``.
        has_pos (bool): Whether any weight is positive (a matched query).
        pred (Tensor): Predictions.
        target (Tensor): Targets.
        weight (Tensor): The box weights (1 at matched queries, else 0).
        avg_factor (float, optional): The divisor.

    Returns:
        Tensor: Stock's loss.
    """
    plain = is_upstream(module, 'GIoULoss', 'L1Loss')
    if not plain or not runs_forward_only(module):
        return module(pred, target, weight, avg_factor=avg_factor)
    # GIoULoss.forward / L1Loss.forward of mmdet 3.3.0
    if not has_pos:
        if pred.dim() == weight.dim() + 1:
            weight = weight.unsqueeze(1)
        return (pred * weight).sum()  # 0
    if is_upstream(module, 'L1Loss'):
        return module.loss_weight * upstream('l1_loss')(
            pred,
            target,
            weight,
            reduction=module.reduction,
            avg_factor=avg_factor)
    if weight.dim() > 1:
        assert weight.shape == pred.shape
        weight = weight.mean(-1)
    return module.loss_weight * upstream('giou_loss')(
        pred,
        target,
        weight,
        eps=module.eps,
        reduction=module.reduction,
        avg_factor=avg_factor)
