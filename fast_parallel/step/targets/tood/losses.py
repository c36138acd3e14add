"""``TOODHead.loss_by_feat`` with every level's losses computed at once.

Stock runs ``loss_by_feat_single`` once per FPN level: the focal loss on
probabilities (initial epochs) or the quality focal loss on the alignment
metrics (then), and the positives' GIoU, about 60 operations and two device
syncs per level. :func:`tood_loss_by_feat` computes them over the
concatenated levels as the ATSS family's losses do
(:mod:`~fast_parallel.step.targets.atss.levels`). Reasoning:
``docs/targets_atss.md``.
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat.targets import is_upstream, upstream
from fast_parallel.outcome import Outcome
from fast_parallel.step.targets.atss.gfl_losses import qfl_sums
# yapf: disable
from fast_parallel.step.targets.atss.levels import (Positives,
                                                    centerness_target,
                                                    fill_levels, flat_levels,
                                                    focal_sums, giou_sums,
                                                    head_losses_reason,
                                                    level_sums, losses_part,
                                                    number, rows_of)
# yapf: enable
from fast_parallel.step.targets.stats import TargetStats

__all__ = ['loss_by_feat', 'loss_part', 'tood_loss_reason']


def tood_loss_reason(head: Any) -> Optional[str]:
    """None when :func:`loss_by_feat` is exact for this ``TOODHead``'s
    options, else why its losses stay per level (for the log)."""
    first, cls = head.initial_loss_cls, head.loss_cls
    why = head_losses_reason(
        head, 'TOODHead', (first, cls, head.loss_bbox), strides=True)
    if why:
        return why
    if not is_upstream(first, 'FocalLoss') or not first.use_sigmoid or \
            not first.activated or not all(
                number(v) for v in (first.gamma, first.alpha,
                                    first.loss_weight)):
        return 'initial_loss_cls is not a FocalLoss on probabilities'
    if not is_upstream(cls, 'QualityFocalLoss') or not cls.use_sigmoid or \
            not cls.activated or not number(cls.beta) or \
            not number(cls.loss_weight):
        return 'loss_cls is not a QualityFocalLoss on probabilities'
    return None


def loss_part(head: Any) -> Tuple[Outcome, TargetStats]:
    """The losses' part of the start line for a switched ``TOODHead``, and
    their counter."""
    return losses_part(head, tood_loss_reason(head))


def loss_by_feat(
        self: Any,
        cls_scores: List[Tensor],
        bbox_preds: List[Tensor],
        batch_gt_instances: Sequence[Any],
        batch_img_metas: List[dict],
        batch_gt_instances_ignore: Optional[Sequence[Any]] = None) -> dict:
    """Stock's ``TOODHead.loss_by_feat``, the levels' losses at once.

    Args:
        self: The ``TOODHead``.
        cls_scores (list[Tensor]): Class probabilities per level.
        bbox_preds (list[Tensor]): Boxes per level (in stride units).
        batch_gt_instances (Sequence[InstanceData]): Ground truths.
        batch_img_metas (list[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored instances.

    Returns:
        dict: ``loss_cls`` and ``loss_bbox``, a list of one value per level
        each, stock's bits.
    """
    stats = self.fast_loss_stats
    if tood_loss_reason(self) is not None:
        stats.add(1, 1)
        return type(self).loss_by_feat(self, cls_scores, bbox_preds,
                                       batch_gt_instances, batch_img_metas,
                                       batch_gt_instances_ignore)
    # TOODHead.loss_by_feat of mmdet 3.3.0, up to its per-level losses
    num_imgs = len(batch_img_metas)
    featmap_sizes = [featmap.size()[-2:] for featmap in cls_scores]
    assert len(featmap_sizes) == self.prior_generator.num_levels
    device = cls_scores[0].device
    anchor_list, valid_flag_list = self.get_anchors(
        featmap_sizes, batch_img_metas, device=device)
    flatten_cls_scores = torch.cat([
        cls_score.permute(0, 2, 3, 1).reshape(
            num_imgs, -1, self.cls_out_channels) for cls_score in cls_scores
    ], 1)
    flatten_bbox_preds = torch.cat([
        bbox_pred.permute(0, 2, 3, 1).reshape(num_imgs, -1, 4) * stride[0]
        for bbox_pred, stride in zip(bbox_preds, self.prior_generator.strides)
    ], 1)
    (anchor_list, labels_list, label_weights_list, bbox_targets_list,
     alignment_metrics_list) = self.get_targets(
         flatten_cls_scores,
         flatten_bbox_preds,
         anchor_list,
         valid_flag_list,
         batch_gt_instances,
         batch_img_metas,
         batch_gt_instances_ignore=batch_gt_instances_ignore)
    levels = (anchor_list, cls_scores, bbox_preds, labels_list,
              label_weights_list, bbox_targets_list, alignment_metrics_list,
              self.prior_generator.strides)
    rows = rows_of(
        cls_scores, bbox_preds, [],
        (anchor_list, labels_list, label_weights_list, bbox_targets_list),
        self.cls_out_channels, 4, 0)
    if rows is not None and any(
            type(m) is not Tensor or m.dtype != torch.float32 or m.numel() != r
            or m.device != cls_scores[0].device
            for m, r in zip(alignment_metrics_list, rows)):
        rows = None
    out = None if rows is None else _levels_at_once(self, levels, rows)
    stats.add(1, int(out is None))
    if out is None:  # stock's per-level losses on the same targets
        out = upstream('multi_apply')(self.loss_by_feat_single, *levels)
    losses_cls, losses_bbox, cls_avg_factors, bbox_avg_factors = out
    cls_avg_factor = upstream('reduce_mean')(
        sum(cls_avg_factors)).clamp_(min=1).item()
    losses_cls = _divided(losses_cls, cls_avg_factor)
    bbox_avg_factor = upstream('reduce_mean')(
        sum(bbox_avg_factors)).clamp_(min=1).item()
    losses_bbox = _divided(losses_bbox, bbox_avg_factor)
    return dict(loss_cls=losses_cls, loss_bbox=losses_bbox)


def _divided(values: Any, factor: float) -> List[Tensor]:
    """Stock's ``list(map(lambda x: x / factor, values))``; one division
    where the levels' values are one stacked tensor."""
    if isinstance(values, Tensor):
        return list((values / factor).unbind())
    return list(map(lambda x: x / factor, values))


def _levels_at_once(self: Any, levels: tuple,
                    rows: List[int]) -> Optional[tuple]:
    """``multi_apply(self.loss_by_feat_single, *levels)``'s four lists
    (stacked tensors where they can be), computed over the concatenated
    levels; None where a level's positives all have box weight 0
    (``GIoULoss``'s other branch)."""
    anchor_list, cls_scores, bbox_preds = levels[:3]
    labels_list, label_weights_list, bbox_targets_list = levels[3:6]
    metrics_list, strides = levels[6:]
    initial = self.epoch < self.initial_epoch
    anchors = torch.cat([a.reshape(-1, 4) for a in anchor_list])
    cls_score = flat_levels(cls_scores, self.cls_out_channels)
    bbox_targets = torch.cat([t.reshape(-1, 4) for t in bbox_targets_list])
    labels = torch.cat([t.reshape(-1) for t in labels_list])
    metrics = torch.cat([t.reshape(-1) for t in metrics_list])
    label_weights = torch.cat([t.reshape(-1) for t in label_weights_list])
    pos = Positives(labels, self.num_classes, rows)
    if pos.inds.numel():
        pos_bbox_targets = bbox_targets[pos.inds]
        weight = centerness_target(anchors[pos.inds], pos_bbox_targets) \
            if initial else metrics[pos.inds]
        weighted, nans = pos.read(weight > 0, torch.isnan(weight))
        assert not (initial and nans.any())  # stock's, in centerness_target
        if any(c and not w for c, w in zip(pos.counts, weighted)):
            return None  # GIoULoss's (pred * weight).sum() branch
        pos_bbox = giou_sums(self.loss_bbox, pos.gather(bbox_preds, 4),
                             pos.divide(pos_bbox_targets, strides), weight,
                             pos.pos_rows)
        pos_sums = level_sums(weight, pos.pos_rows)
    if initial:
        loss_cls = focal_sums(self.initial_loss_cls, cls_score, labels,
                              label_weights, rows, 1.0)
    else:
        loss_cls = qfl_sums(self.loss_cls, cls_score, cls_score, labels,
                            metrics, label_weights, rows, pos.inds,
                            pos.pos_rows, 1.0)
    # stock's own per-level tensors (for one image a view at an offset)
    metric_sums = [m.reshape(-1).sum() for m in metrics_list]
    if all(pos.counts):
        return loss_cls, pos_bbox, metric_sums, pos_sums.unbind()
    # levels without a positive: stock's zeros of the level's predictions,
    # on stock's flattening of the level (a view for one image)
    found = [pos_bbox, pos_sums] if pos.pos_rows else [None] * 2
    losses_bbox, sums = fill_levels(pos.counts, found, [
        lambda i: bbox_preds[i].permute(0, 2, 3, 1).reshape(-1, 4).sum() * 0,
        lambda i: bbox_targets.new_tensor(0.).sum()
    ])
    return loss_cls, torch.stack(losses_bbox), metric_sums, sums
