"""What the ATSS family's losses over every level at once share.

The levels are flattened as stock's ``loss_by_feat_single`` flattens them
and concatenated in level order, so each level is a contiguous slice of
stock's shape. :func:`levelwise` runs the CPU kernels whose vector body and
scalar tail differ in the last bit per level on those slices, and
:func:`level_sums` sums each level over its own slice: stock's bits.
Reasoning: ``docs/targets_atss.md``.
"""
import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fast_parallel.compat.targets import (is_upstream, replaced_reason,
                                          runs_forward_only, upstream)
from fast_parallel.outcome import Outcome
from fast_parallel.step.targets.stats import TargetStats

__all__ = [
    'EPS', 'Positives', 'centerness_target', 'fill_levels', 'flat_levels',
    'focal_sums', 'giou_sums', 'head_losses_reason', 'level_sums', 'levelwise',
    'losses_part', 'number', 'rows_of', 'stock_tail', 'targets_for_loss'
]

#: ``weight_reduce_loss``'s ``eps`` (mmdet 3.3.0).
EPS = torch.finfo(torch.float32).eps


def number(value: Any) -> bool:
    """Whether ``value`` is an int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def head_losses_reason(head: Any, upstream_head: str, losses: Sequence[Any],
                       strides: bool) -> Optional[str]:
    """The checks every head's losses at once share: the exact head class,
    none of its loss methods (``STANDS_FOR['<head>.loss']``) set on the
    instance, ``loss_bbox`` a ``GIoULoss``, ``losses`` (the head's loss
    modules, and GFL's ``Integral``) with ``reduction='mean'`` where they
    have one and nothing run around their ``forward``, sigmoid classes and,
    where the losses divide by strides, one number per level. None, or why
    not."""
    if type(head) is not upstream(upstream_head):
        return f'{type(head).__name__} is not {upstream_head}'
    why = replaced_reason((head, f'{upstream_head}.loss'))
    if why:
        return why
    box = head.loss_bbox
    if not is_upstream(box, 'GIoULoss') or not number(box.loss_weight) \
            or not number(box.eps):
        return 'loss_bbox is not GIoULoss'
    if any(getattr(m, 'reduction', 'mean') != 'mean' for m in losses):
        return 'a loss with reduction other than mean'
    if not all(runs_forward_only(m) for m in losses):
        return 'a loss module with hooks or its own forward'
    if head.cls_out_channels != head.num_classes:
        return 'cls_out_channels is not num_classes'
    if strides and not all(
            number(s[0]) and s[0] == s[1]
            for s in head.prior_generator.strides):
        return 'strides that are not one number per level'
    return None


def losses_part(head: Any, why: Optional[str]) -> Tuple[Outcome, TargetStats]:
    """The losses' part of the start line for a switched head
    (``<Head> losses over levels at once``, or ``... per level (why)``), and
    their counter (``head.fast_loss_stats``, per batch), made once."""
    label = f'{type(head).__name__} losses'
    stats = getattr(head, 'fast_loss_stats', None)
    if not isinstance(stats, TargetStats):
        stats = head.fast_loss_stats = TargetStats(label, 'batches')
    if why is None:
        return Outcome(label, True, text=f'{label} over levels at once'), stats
    return Outcome(label, False, why, text=f'{label} per level ({why})'), stats


def levelwise(fn: Callable[..., Tensor],
              rows: Sequence[int],
              *tensors: Tensor,
              everywhere: bool = False) -> Tensor:
    """``fn(*tensors)``, run per level on a CPU (``fn`` of each level's rows,
    views of stock's contiguous shape, then concatenated): the elements of a
    CPU kernel's vector body and scalar tail are stock's. Elsewhere an
    elementwise ``fn`` runs the same function on every element: one call.
    ``everywhere``: per level on every device, for an ``fn`` whose kernels
    choose their order by the tensor's shape (row sums, ``linear``,
    softmax): stock's shapes, stock's choice."""
    if not rows or (tensors[0].device.type != 'cpu' and not everywhere):
        return fn(*tensors)  # no rows: empty tensors
    parts = [_slices(t, rows) for t in tensors]
    return torch.cat([fn(*level) for level in zip(*parts)])


def _slices(x: Tensor, rows: Sequence[int]) -> List[Tensor]:
    """Each level's rows of ``x``: views on a CPU, where a kernel runs on a
    contiguous slice as on the same tensor alone; fresh tensors elsewhere
    (a CUDA kernel may start on the pointer's alignment)."""
    parts = list(x.split(list(rows)))
    if x.device.type != 'cpu':
        parts = [p.clone() for p in parts]
    return parts


def level_sums(x: Tensor, rows: Sequence[int]) -> Tensor:
    """Each level's ``sum()`` (over :func:`_slices`), stacked."""
    return torch.stack([p.sum() for p in _slices(x, rows)])


def flat_levels(levels: Sequence[Tensor], width: int) -> Tensor:
    """Stock's ``permute(0, 2, 3, 1).reshape(-1, width)`` of each level,
    concatenated (``width`` 0: ``reshape(-1)``)."""
    shape = (-1, width) if width else (-1, )
    return torch.cat([x.permute(0, 2, 3, 1).reshape(shape) for x in levels])


def targets_for_loss(self: Any, cls_scores: List[Tensor],
                     sized_by: List[Tensor], gts: Sequence[Any],
                     metas: List[dict],
                     ignores: Optional[Sequence[Any]]) -> Tuple[tuple, float]:
    """The start of stock's ``loss_by_feat``: the anchors and targets per
    level (``self.get_targets``: batched) and ``avg_factor`` as stock reads
    it; the feature map sizes of ``sized_by`` (ATSS: its boxes, GFL: its
    scores, as each stock reads them).

    Returns:
        tuple: ``(anchor_list, labels_list, label_weights_list,
        bbox_targets_list)`` and the ``avg_factor``.
    """
    featmap_sizes = [featmap.size()[-2:] for featmap in sized_by]
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


class Positives:
    """Stock's positives of every level (``0 <= label < num_classes``), in
    level order: ``inds`` into the concatenated levels; after :meth:`read`,
    ``counts`` per level.

    Args:
        labels (Tensor): The concatenated levels' labels.
        num_classes (int): The background label.
        rows (Sequence[int]): Each level's rows.
    """

    def __init__(self, labels: Tensor, num_classes: int,
                 rows: Sequence[int]) -> None:
        self.rows = list(rows)
        self.inds = ((labels >= 0) &
                     (labels < num_classes)).nonzero().squeeze(1)
        self.counts = [0] * len(self.rows)
        self._host = np.zeros(0, dtype=np.int64)

    def read(self, *flags: Tensor) -> List[np.ndarray]:
        """Reads ``inds`` and the boolean ``flags`` (one per positive) in
        one host copy; sets ``counts`` and returns each flag's count per
        level."""
        host = torch.stack([self.inds, *(f.long() for f in flags)])
        host = host.cpu().numpy()
        self._host = host[0]
        level = np.searchsorted(np.cumsum(self.rows), host[0], side='right')
        self.counts = np.bincount(level, minlength=len(self.rows)).tolist()
        return [
            np.bincount(level, f, minlength=len(self.rows)) for f in host[1:]
        ]

    @property
    def pos_rows(self) -> List[int]:
        """The positives of each level that has any."""
        return [c for c in self.counts if c]

    def gather(self, levels: Sequence[Tensor], width: int) -> Tensor:
        """The positives' rows of per-level predictions (flattened as
        :func:`flat_levels`), gathered from the levels that have positives
        only: a level without any gets no gradient from here, as in stock
        (where its ``sum() * 0`` alone reaches it, a negative zero too)."""
        keep = [i for i, c in enumerate(self.counts) if c]
        flat = flat_levels([levels[i] for i in keep], width)
        if len(keep) == len(self.rows):
            return flat[self.inds]
        empty = [0 if c else r for c, r in zip(self.counts, self.rows)]
        before = np.cumsum([0] + empty)[keep]
        local = self._host - np.repeat(before, self.pos_rows)
        return flat[torch.from_numpy(local).to(self.inds.device)]

    def divide(self, x: Tensor, strides: Sequence[Any]) -> Tensor:
        """Each positive's row of ``x`` divided by its level's
        ``stride[0]``, as stock divides by the Python number: a power of
        two divides exactly by a column (CUDA multiplies by a scalar's
        reciprocal, exact then), another stride per level."""
        used = [s[0] for s, c in zip(strides, self.counts) if c]
        if all(math.frexp(float(s))[0] == 0.5 for s in used):
            column = np.repeat(np.float32(used), self.pos_rows)
            return x / torch.from_numpy(column).to(x.device)[:, None]
        return torch.cat(
            [part / s for part, s in zip(x.split(self.pos_rows), used)])


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


def fill_levels(
        counts: Sequence[int], stacked: Sequence[Optional[Tensor]],
        empty: Sequence[Callable[[int], Tensor]]) -> List[List[Tensor]]:
    """Per kind of value, a list per level: ``stacked[k]``'s values (one per
    level with positives, in order) where a level has positives, else
    ``empty[k](level)`` (stock's value for a level without); ``stacked``
    may be None where no level has positives."""
    out: List[List[Tensor]] = [[] for _ in stacked]
    at = 0
    for level, count in enumerate(counts):
        for values, kind, fill in zip(out, stacked, empty):
            values.append(kind[at] if count else fill(level))
        at += bool(count)
    return out
