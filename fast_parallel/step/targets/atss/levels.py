"""What the ATSS family's losses over every level at once share.

The levels are flattened as stock's ``loss_by_feat_single`` flattens them
and concatenated in level order, so each level is a contiguous slice of
stock's shape. :func:`levelwise` runs the CPU kernels whose vector body and
scalar tail differ in the last bit per level on those slices, and
:func:`level_sums` sums each level over its own slice: stock's bits.
Reasoning: ``docs/targets_atss.md``.
"""
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fast_parallel.compat.targets import upstream

__all__ = [
    'EPS', 'centerness_target', 'flat_levels', 'focal_sums', 'giou_sums',
    'level_sums', 'levelwise', 'number', 'positives', 'rows_of', 'stock_tail',
    'targets_for_loss'
]

#: ``weight_reduce_loss``'s ``eps`` (mmdet 3.3.0).
EPS = torch.finfo(torch.float32).eps


def number(value: Any) -> bool:
    """Whether ``value`` is an int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def levelwise(fn: Callable[..., Tensor], rows: Sequence[int], *tensors:
              Tensor) -> Tensor:
    """``fn(*tensors)``, run per level on a CPU (``fn`` of each level's rows,
    views of stock's contiguous shape, then concatenated): the elements of a
    CPU kernel's vector body and scalar tail are stock's. Elsewhere every
    element runs the same function: one call."""
    if tensors[0].device.type != 'cpu':
        return fn(*tensors)
    parts = [t.split(list(rows)) for t in tensors]
    return torch.cat([fn(*level) for level in zip(*parts)])


def level_sums(x: Tensor, rows: Sequence[int]) -> Tensor:
    """Each level's ``sum()``, stacked. On a CPU the sum of a contiguous
    slice is the sum of the same tensor alone; a CUDA reduction may start on
    the pointer's alignment, so each level is a fresh tensor there."""
    parts = x.split(list(rows))
    if x.device.type != 'cpu':
        parts = [p.clone() for p in parts]
    return torch.stack([p.sum() for p in parts])


def flat_levels(levels: Sequence[Tensor], width: int) -> Tensor:
    """Stock's ``permute(0, 2, 3, 1).reshape(-1, width)`` of each level,
    concatenated (``width`` 0: ``reshape(-1)``)."""
    shape = (-1, width) if width else (-1, )
    return torch.cat([x.permute(0, 2, 3, 1).reshape(shape) for x in levels])


def targets_for_loss(self: Any, cls_scores: List[Tensor],
                     bbox_preds: List[Tensor], gts: Sequence[Any],
                     metas: List[dict],
                     ignores: Optional[Sequence[Any]]) -> Tuple[tuple, float]:
    """The start of stock's ``loss_by_feat``: the anchors and targets per
    level (``self.get_targets``: batched) and ``avg_factor`` as stock reads
    it.

    Returns:
        tuple: ``(anchor_list, labels_list, label_weights_list,
        bbox_targets_list)`` and the ``avg_factor``.
    """
    featmap_sizes = [featmap.size()[-2:] for featmap in bbox_preds]
    assert len(featmap_sizes) == self.prior_generator.num_levels
    device = cls_scores[0].device
    anchor_list, valid_flag_list = self.get_anchors(
        featmap_sizes, metas, device=device)
    (anchor_list, labels_list, label_weights_list, bbox_targets_list, _,
     avg_factor) = self.get_targets(
         anchor_list,
         valid_flag_list,
         gts,
         metas,
         batch_gt_instances_ignore=ignores)
    avg_factor = upstream('reduce_mean')(torch.tensor(
        avg_factor, dtype=torch.float, device=device)).item()
    return (anchor_list, labels_list, label_weights_list,
            bbox_targets_list), avg_factor


def rows_of(cls_scores: Sequence[Tensor], bbox_preds: Sequence[Tensor],
            others: Sequence[Sequence[Tensor]],
            targets: Sequence[Sequence[Tensor]], cls_channels: int,
            box_channels: int, other_channels: int) -> Optional[List[int]]:
    """Each level's flattened rows, or None where stock's shapes, dtypes or
    devices are not the ones the batched losses compute.

    Args:
        cls_scores, bbox_preds: Per level ``(B, A * channels, H, W)``.
        others: More per-level predictions (ATSS's centerness), each
            ``(B, A * other_channels, H, W)``.
        targets: ``(anchor_list, labels_list, label_weights_list,
            bbox_targets_list)`` per level.
        cls_channels, box_channels, other_channels (int): Per anchor.
    """
    anchors, labels, label_weights, bbox_targets = targets
    levels = len(cls_scores)
    every = (bbox_preds, *others, anchors, labels, label_weights, bbox_targets)
    if not levels or any(len(x) != levels for x in every):
        return None
    device = cls_scores[0].device
    rows = []
    for level, (score, box, *rest) in enumerate(zip(cls_scores, *every)):
        extra, (anchor, label, weight, target) = rest[:-4], rest[-4:]
        tensors = (score, box, *extra, anchor, label, weight, target)
        if any(type(t) is not Tensor or t.device != device for t in tensors):
            return None
        if label.dtype != torch.long or any(
                t.dtype != torch.float32 for t in tensors if t is not label):
            return None
        if any(t.dim() != 4 for t in (score, box, *extra)):
            return None
        num, channels, height, width = score.shape
        per_pixel = channels // cls_channels
        if channels % cls_channels or box.shape != (
                num, box_channels * per_pixel, height, width) or any(
                    t.shape != (num, other_channels * per_pixel, height, width)
                    for t in extra):
            return None
        count = num * height * width * per_pixel
        if label.numel() != count or weight.numel() != count or \
                anchor.numel() != 4 * count or target.numel() != 4 * count:
            return None
        rows.append(count)
    return rows


def positives(labels: Tensor, num_classes: int,
              rows: Sequence[int]) -> Tuple[Tensor, Callable]:
    """Stock's positives of every level (``0 <= label < num_classes``), in
    level order, and a reader of per-positive flags.

    Returns:
        tuple: ``pos_inds`` and ``read(*flags)``, which reads ``pos_inds`` and
        the boolean ``flags`` (one per positive) in one host copy and returns
        the positives per level and each flag's count per level.
    """
    pos_inds = ((labels >= 0) & (labels < num_classes)).nonzero().squeeze(1)

    def read(*flags: Tensor) -> Tuple[List[int], List[np.ndarray]]:
        host = torch.stack([pos_inds, *(f.long() for f in flags)])
        host = host.cpu().numpy()
        level = np.searchsorted(np.cumsum(rows), host[0], side='right')
        counts = np.bincount(level, minlength=len(rows))
        return counts.tolist(), [
            np.bincount(level, f, minlength=len(rows)) for f in host[1:]
        ]

    return pos_inds, read


def giou_sums(module: Any, pred: Tensor, target: Tensor, weight: Tensor,
              rows: List[int]) -> Tensor:
    """``GIoULoss.forward(pred, target, weight, avg_factor=1.0)`` of mmdet
    3.3.0 per level (every level has a positive weight: the caller checks),
    stacked."""
    gious = upstream('bbox_overlaps')(
        pred, target, mode='giou', is_aligned=True, eps=module.eps)
    loss = (1 - gious) * weight
    return module.loss_weight * (level_sums(loss, rows) / (1.0 + EPS))


def stock_tail(out: tuple, divided: Sequence[int]) -> List[List[Tensor]]:
    """The end of stock's ``loss_by_feat``: ``out`` is ``multi_apply``'s
    lists (a stacked tensor where the levels were computed at once), the last
    the per-level sums whose total, ``reduce_mean``-ed and clamped to 1, the
    lists at ``divided`` are divided by.

    Returns:
        list: The loss lists (all but the last of ``out``).
    """
    *losses, factors = out
    factor = sum(factors)
    factor = upstream('reduce_mean')(factor).clamp_(min=1).item()
    result = []
    for i, values in enumerate(losses):
        if i in divided and isinstance(values, Tensor):
            values = (values / factor).unbind()
        elif i in divided:
            values = map(lambda x: x / factor, values)
        result.append(list(values))
    return result


def focal_sums(module: Any, pred: Tensor, labels: Tensor, weight: Tensor,
               rows: List[int], avg_factor: float) -> Tensor:
    """``FocalLoss(pred, labels, weight, avg_factor)`` of mmdet 3.3.0 per
    level, stacked: mmcv's kernel on CUDA as stock, else
    ``py_sigmoid_focal_loss`` (``py_focal_loss_with_prob`` where the module
    is ``activated``: ``pred`` holds probabilities)."""
    gamma, alpha = module.gamma, module.alpha
    if not module.activated and torch.cuda.is_available() and pred.is_cuda:
        loss = upstream('sigmoid_focal_loss')(
            pred, labels, weight, gamma=gamma, alpha=alpha, reduction='none')
    else:
        num_classes = pred.size(1)
        target = F.one_hot(labels, num_classes=num_classes + 1)
        target = target[:, :num_classes].type_as(pred)
        if module.activated:
            prob, bce = pred, F.binary_cross_entropy
        else:
            prob = levelwise(torch.sigmoid, rows, pred)
            bce = F.binary_cross_entropy_with_logits
        pt = (1 - prob) * target + prob * (1 - target)
        if gamma == 2.0:  # the CPU's pow by 2 is a product: no tail
            power = pt.pow(gamma)
        else:
            power = levelwise(lambda x: x.pow(gamma), rows, pt)
        focal_weight = (alpha * target + (1 - alpha) * (1 - target)) * power
        loss = levelwise(lambda p, t: bce(p, t, reduction='none'), rows, pred,
                         target) * focal_weight
        loss = loss * weight.view(-1, 1)
    return module.loss_weight * (level_sums(loss, rows) / (avg_factor + EPS))


def centerness_target(anchors: Tensor, gts: Tensor) -> Tensor:
    """``ATSSHead.centerness_target`` of mmdet 3.3.0 without its NaN assert
    (the caller reads it with the counts)."""
    anchors_cx = (anchors[:, 2] + anchors[:, 0]) / 2
    anchors_cy = (anchors[:, 3] + anchors[:, 1]) / 2
    l_ = anchors_cx - gts[:, 0]
    t_ = anchors_cy - gts[:, 1]
    r_ = gts[:, 2] - anchors_cx
    b_ = gts[:, 3] - anchors_cy
    left_right = torch.stack([l_, r_], dim=1)
    top_bottom = torch.stack([t_, b_], dim=1)
    return torch.sqrt((left_right.min(dim=-1)[0] / left_right.max(dim=-1)[0]) *
                      (top_bottom.min(dim=-1)[0] / top_bottom.max(dim=-1)[0]))
