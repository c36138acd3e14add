"""``ATSSHead.loss_by_feat`` with every level's losses computed at once.

Stock runs ``loss_by_feat_single`` once per FPN level (about 80 operations
and three device syncs each). :func:`atss_loss_by_feat` flattens each level as
stock does, concatenates the levels and computes the focal, GIoU and
centerness losses over the concatenation; each level's sum is taken over its
own slice, and the CPU kernels whose vector and scalar loops give different
last bits (``sigmoid``, BCE with logits, ``exp``, a non-square ``pow``) run
per level on views of stock's shapes (:func:`levelwise`), so every loss and
gradient is stock's bits. A batch outside that runs stock's per-level code
on the same targets, counted. Reasoning: ``docs/targets_atss.md``.
"""
from typing import Any, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fast_parallel.compat.targets import is_upstream, replaced_reason, upstream
# yapf: disable
from fast_parallel.step.targets.atss.levels import (EPS, Positives,
                                                    centerness_target,
                                                    fill_levels, flat_levels,
                                                    focal_sums, giou_sums,
                                                    head_losses_reason,
                                                    level_sums, levelwise,
                                                    number, rows_of,
                                                    stock_tail,
                                                    targets_for_loss)

# yapf: enable

__all__ = ['atss_loss_by_feat', 'loss_reason']


def loss_reason(head: Any) -> Optional[str]:
    """None when :func:`atss_loss_by_feat` is exact for this ``ATSSHead``'s
    options, else why its losses stay per level (for the log)."""
    cls, ctr = head.loss_cls, head.loss_centerness
    why = head_losses_reason(
        head, 'ATSSHead', (cls, head.loss_bbox, ctr), strides=False)
    if why:
        return why
    if not is_upstream(cls, 'FocalLoss') or not cls.use_sigmoid or \
            cls.activated or not all(
                number(v) for v in (cls.gamma, cls.alpha, cls.loss_weight)):
        return 'loss_cls is not a sigmoid FocalLoss'
    if not is_upstream(ctr, 'CrossEntropyLoss') or not ctr.use_sigmoid or \
            ctr.class_weight is not None or not number(ctr.loss_weight) \
            or not (ctr.ignore_index is None or type(ctr.ignore_index) is int):
        return 'loss_centerness is not a sigmoid CrossEntropyLoss'
    coder = head.bbox_coder
    if not is_upstream(coder, 'DeltaXYWHBBoxCoder') or coder.add_ctr_clamp \
            or getattr(coder, 'use_box_type', False) or \
            replaced_reason((coder, 'DeltaXYWHBBoxCoder')):
        return 'bbox_coder is not a plain DeltaXYWHBBoxCoder'
    return None


def _decode(coder: Any, rois: Tensor, deltas: Tensor,
            rows: List[int]) -> Tensor:
    """``DeltaXYWHBBoxCoder.decode`` (``delta2bbox`` of mmdet 3.3.0, no
    ``max_shape``, no centre clamp), its ``exp`` per level."""
    means = deltas.new_tensor(coder.means).view(1, -1)
    stds = deltas.new_tensor(coder.stds).view(1, -1)
    denorm_deltas = deltas * stds + means
    dxy = denorm_deltas[:, :2]
    dwh = denorm_deltas[:, 2:]
    rois_ = rois.repeat(1, 1).reshape(-1, 4)
    pxy = ((rois_[:, :2] + rois_[:, 2:]) * 0.5)
    pwh = (rois_[:, 2:] - rois_[:, :2])
    dxy_wh = pwh * dxy
    max_ratio = np.abs(np.log(16 / 1000))
    dwh = dwh.clamp(min=-max_ratio, max=max_ratio)
    gxy = pxy + dxy_wh
    gwh = pwh * levelwise(torch.exp, rows, dwh)
    x1y1 = gxy - (gwh * 0.5)
    x2y2 = gxy + (gwh * 0.5)
    return torch.cat([x1y1, x2y2], dim=-1)


def atss_loss_by_feat(
        self: Any,
        cls_scores: List[Tensor],
        bbox_preds: List[Tensor],
        centernesses: List[Tensor],
        batch_gt_instances: Sequence[Any],
        batch_img_metas: List[dict],
        batch_gt_instances_ignore: Optional[Sequence[Any]] = None) -> dict:
    """Stock's ``ATSSHead.loss_by_feat``, the levels' losses at once.

    Args:
        self: The ``ATSSHead``.
        cls_scores (list[Tensor]): Class scores per level.
        bbox_preds (list[Tensor]): Box deltas per level.
        centernesses (list[Tensor]): Centerness per level.
        batch_gt_instances (Sequence[InstanceData]): Ground truths.
        batch_img_metas (list[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored instances.

    Returns:
        dict: ``loss_cls``, ``loss_bbox`` and ``loss_centerness``, a list of
        one value per level each, stock's bits.
    """
    stats = self.fast_loss_stats
    why = loss_reason(self)
    if why is not None:
        stats.add(1, 1)
        return type(self).loss_by_feat(self, cls_scores, bbox_preds,
                                       centernesses, batch_gt_instances,
                                       batch_img_metas,
                                       batch_gt_instances_ignore)
    targets, avg_factor = targets_for_loss(self, cls_scores, bbox_preds,
                                           batch_gt_instances, batch_img_metas,
                                           batch_gt_instances_ignore)
    anchor_list, labels_list, label_weights_list, bbox_targets_list = targets
    levels = (anchor_list, cls_scores, bbox_preds, centernesses, labels_list,
              label_weights_list, bbox_targets_list)
    rows = rows_of(cls_scores, bbox_preds, [centernesses], targets,
                   self.cls_out_channels, 4, 1)
    out = None if rows is None else _levels_at_once(self, levels, rows,
                                                    avg_factor)
    stats.add(1, int(out is None))
    if out is None:  # stock's per-level losses on the same targets
        out = upstream('multi_apply')(
            self.loss_by_feat_single, *levels, avg_factor=avg_factor)
    losses_cls, losses_bbox, loss_centerness = stock_tail(out, (1, ))
    return dict(
        loss_cls=losses_cls,
        loss_bbox=losses_bbox,
        loss_centerness=loss_centerness)


def _levels_at_once(self: Any, levels: tuple, rows: List[int],
                    avg_factor: float) -> Optional[tuple]:
    """``multi_apply(self.loss_by_feat_single, *levels)``'s four lists
    (``loss_bbox`` still undivided, as one stacked tensor), computed over
    the concatenated levels; None where a level takes a branch of stock's
    this does not compute (every positive's box weight zero)."""
    anchor_list, cls_scores, bbox_preds, centernesses = levels[:4]
    labels_list, label_weights_list, bbox_targets_list = levels[4:]
    anchors = torch.cat([a.reshape(-1, 4) for a in anchor_list])
    cls_score = flat_levels(cls_scores, self.cls_out_channels)
    bbox_targets = torch.cat([t.reshape(-1, 4) for t in bbox_targets_list])
    labels = torch.cat([t.reshape(-1) for t in labels_list])
    label_weights = torch.cat([t.reshape(-1) for t in label_weights_list])
    loss_cls = focal_sums(self.loss_cls, cls_score, labels, label_weights,
                          rows, avg_factor).unbind()
    pos = Positives(labels, self.num_classes, rows)
    if pos.inds.numel():
        pos_bbox_targets = bbox_targets[pos.inds]
        pos_anchors = anchors[pos.inds]
        centerness_targets = centerness_target(pos_anchors, pos_bbox_targets)
        weighted, nans = pos.read(centerness_targets > 0,
                                  torch.isnan(centerness_targets))
        assert not nans.any()  # stock's, in centerness_target
        if any(c and not w for c, w in zip(pos.counts, weighted)):
            return None  # GIoULoss's (pred * weight).sum() branch
        pos_decode_bbox_pred = _decode(self.bbox_coder, pos_anchors,
                                       pos.gather(bbox_preds, 4), pos.pos_rows)
        pos_bbox = giou_sums(self.loss_bbox, pos_decode_bbox_pred,
                             pos_bbox_targets, centerness_targets,
                             pos.pos_rows)
        pos_ctr = _centerness_loss(self.loss_centerness,
                                   pos.gather(centernesses,
                                              0), centerness_targets,
                                   pos.pos_rows, avg_factor)
        pos_sums = level_sums(centerness_targets, pos.pos_rows)
    if all(pos.counts):
        return loss_cls, pos_bbox, pos_ctr.unbind(), pos_sums.unbind()
    # levels without a positive: stock's zeros of the level's predictions,
    # on stock's flattening of the level (a view for one image)
    found = [pos_bbox, pos_ctr, pos_sums] if pos.pos_rows else [None] * 3
    losses_bbox, losses_ctr, sums = fill_levels(pos.counts, found, [
        lambda i: bbox_preds[i].permute(0, 2, 3, 1).reshape(-1, 4).sum() * 0,
        lambda i: centernesses[i].permute(0, 2, 3, 1).reshape(-1).sum() * 0,
        lambda i: bbox_targets.new_tensor(0.).sum()
    ])
    return loss_cls, torch.stack(losses_bbox), losses_ctr, sums


def _centerness_loss(module: Any, pred: Tensor, label: Tensor, rows: List[int],
                     avg_factor: float) -> Tensor:
    """``CrossEntropyLoss(use_sigmoid=True)(pred, label, avg_factor=...)``
    (``binary_cross_entropy`` of mmdet 3.3.0) per level, stacked."""
    ignore_index = -100 if module.ignore_index is None else module.ignore_index
    weight = ((label >= 0) & (label != ignore_index)).float()
    loss = levelwise(
        lambda p, t: F.binary_cross_entropy_with_logits(
            p, t, reduction='none'), rows, pred, label.float())
    loss = loss * weight.float()
    return module.loss_weight * (level_sums(loss, rows) / (avg_factor + EPS))
