"""``GFLHead.loss_by_feat`` with every level's losses computed at once.

Stock runs ``loss_by_feat_single`` once per FPN level: the quality focal
loss, the positives' distributions (``Integral``), their GIoU and
distribution focal losses, about 110 operations and two device syncs per
level. :func:`loss_by_feat` computes them over the concatenated levels (see
:mod:`~fast_parallel.step.targets.atss.levels`): the softmax, ``linear``,
cross-entropy, row sums and the sigmoid / BCE kernels run per level on
slices of stock's shapes, everything else once. Reasoning:
``docs/targets_atss.md``.
"""
from typing import Any, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fast_parallel.compat.targets import is_upstream, replaced_reason, upstream
# yapf: disable
from fast_parallel.step.targets.atss.levels import (EPS, Positives,
                                                    fill_levels, flat_levels,
                                                    giou_sums,
                                                    head_losses_reason,
                                                    level_sums, levelwise,
                                                    number, rows_of,
                                                    stock_tail,
                                                    targets_for_loss)

# yapf: enable

__all__ = [
    'bce_none', 'gfl_loss_by_feat', 'gfl_loss_reason', 'power', 'qfl_sums'
]


def gfl_loss_reason(head: Any) -> Optional[str]:
    """None when :func:`gfl_loss_by_feat` is exact for this ``GFLHead``'s
    options, else why its losses stay per level (for the log)."""
    cls, dfl = head.loss_cls, head.loss_dfl
    why = head_losses_reason(
        head,
        'GFLHead', (cls, head.loss_bbox, dfl, head.integral),
        strides=True)
    if why:
        return why
    if not is_upstream(cls, 'QualityFocalLoss') or not cls.use_sigmoid or \
            cls.activated or not number(cls.beta) or \
            not number(cls.loss_weight):
        return 'loss_cls is not a sigmoid QualityFocalLoss'
    if not is_upstream(dfl, 'DistributionFocalLoss') or \
            not number(dfl.loss_weight):
        return 'loss_dfl is not DistributionFocalLoss'
    coder = head.bbox_coder
    if not is_upstream(coder, 'DistancePointBBoxCoder') or \
            getattr(coder, 'use_box_type', False) or \
            replaced_reason((coder, 'DistancePointBBoxCoder')):
        return 'bbox_coder is not a plain DistancePointBBoxCoder'
    if not is_upstream(head.integral, 'Integral') or \
            type(head.reg_max) is not int:
        return 'integral is not Integral'
    return None


def gfl_loss_by_feat(
        self: Any,
        cls_scores: List[Tensor],
        bbox_preds: List[Tensor],
        batch_gt_instances: Sequence[Any],
        batch_img_metas: List[dict],
        batch_gt_instances_ignore: Optional[Sequence[Any]] = None) -> dict:
    """Stock's ``GFLHead.loss_by_feat``, the levels' losses at once.

    Args:
        self: The ``GFLHead``.
        cls_scores (list[Tensor]): Class and quality scores per level.
        bbox_preds (list[Tensor]): Box distributions per level.
        batch_gt_instances (Sequence[InstanceData]): Ground truths.
        batch_img_metas (list[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored instances.

    Returns:
        dict: ``loss_cls``, ``loss_bbox`` and ``loss_dfl``, a list of one
        value per level each, stock's bits.
    """
    stats = self.fast_loss_stats
    if gfl_loss_reason(self) is not None:
        stats.add(1, 1)
        return type(self).loss_by_feat(self, cls_scores, bbox_preds,
                                       batch_gt_instances, batch_img_metas,
                                       batch_gt_instances_ignore)
    targets, avg_factor = targets_for_loss(self, cls_scores, cls_scores,
                                           batch_gt_instances, batch_img_metas,
                                           batch_gt_instances_ignore)
    anchor_list, labels_list, label_weights_list, bbox_targets_list = targets
    levels = (anchor_list, cls_scores, bbox_preds, labels_list,
              label_weights_list, bbox_targets_list,
              self.prior_generator.strides)
    rows = rows_of(cls_scores, bbox_preds, [], targets, self.cls_out_channels,
                   4 * (self.reg_max + 1), 0)
    out = None if rows is None else _levels_at_once(self, levels, rows,
                                                    avg_factor)
    stats.add(1, int(out is None))
    if out is None:  # stock's per-level losses on the same targets
        out = upstream('multi_apply')(
            self.loss_by_feat_single, *levels, avg_factor=avg_factor)
    losses_cls, losses_bbox, losses_dfl = stock_tail(out, (1, 2))
    return dict(
        loss_cls=losses_cls, loss_bbox=losses_bbox, loss_dfl=losses_dfl)


def _levels_at_once(self: Any, levels: tuple, rows: List[int],
                    avg_factor: float) -> Optional[tuple]:
    """``multi_apply(self.loss_by_feat_single, *levels)``'s four lists
    (stacked tensors where every level has positives), computed over the
    concatenated levels; None where a level's positives all have box
    weight 0 (``GIoULoss``'s other branch)."""
    anchor_list, cls_scores, bbox_preds = levels[:3]
    labels_list, label_weights_list, bbox_targets_list, strides = levels[3:]
    bins = self.reg_max + 1
    if not all(
            x.permute(0, 2, 3, 1).reshape(
                -1, self.cls_out_channels).is_contiguous()
            for x in cls_scores):
        # stock's reshape is a strided view (one image): its kernels would
        # walk the classes in another order
        return None
    anchors = torch.cat([a.reshape(-1, 4) for a in anchor_list])
    cls_score = flat_levels(cls_scores, self.cls_out_channels)
    bbox_targets = torch.cat([t.reshape(-1, 4) for t in bbox_targets_list])
    labels = torch.cat([t.reshape(-1) for t in labels_list])
    label_weights = torch.cat([t.reshape(-1) for t in label_weights_list])
    pos = Positives(labels, self.num_classes, rows)
    score = label_weights.new_zeros(labels.shape)
    pred_sigmoid = levelwise(torch.sigmoid, rows, cls_score)
    if pos.inds.numel():
        weight_targets = pred_sigmoid.detach().max(dim=1)[0][pos.inds]
        weighted, = pos.read(weight_targets > 0)
        if any(c and not w for c, w in zip(pos.counts, weighted)):
            return None  # GIoULoss's (pred * weight).sum() branch
        pos_rows = pos.pos_rows
        pos_bbox_targets = bbox_targets[pos.inds]
        pos_bbox_pred = pos.gather(bbox_preds, 4 * bins)
        pos_anchor_centers = pos.divide(
            self.anchor_center(anchors[pos.inds]), strides)
        pos_bbox_pred_corners = levelwise(
            self.integral, pos_rows, pos_bbox_pred, everywhere=True)
        pos_decode_bbox_pred = self.bbox_coder.decode(pos_anchor_centers,
                                                      pos_bbox_pred_corners)
        pos_decode_bbox_targets = pos.divide(pos_bbox_targets, strides)
        score[pos.inds] = upstream('bbox_overlaps')(
            pos_decode_bbox_pred.detach(),
            pos_decode_bbox_targets,
            is_aligned=True)
        pred_corners = pos_bbox_pred.reshape(-1, bins)
        target_corners = self.bbox_coder.encode(pos_anchor_centers,
                                                pos_decode_bbox_targets,
                                                self.reg_max).reshape(-1)
        pos_bbox = giou_sums(self.loss_bbox, pos_decode_bbox_pred,
                             pos_decode_bbox_targets, weight_targets, pos_rows)
        pos_dfl = _dfl(self.loss_dfl, pred_corners, target_corners,
                       weight_targets[:, None].expand(-1, 4).reshape(-1),
                       [4 * c for c in pos_rows])
        pos_sums = level_sums(weight_targets, pos_rows)
    loss_cls = qfl_sums(self.loss_cls, cls_score, pred_sigmoid, labels, score,
                        label_weights, rows, pos.inds, pos.pos_rows,
                        avg_factor)
    if all(pos.counts):
        return loss_cls.unbind(), pos_bbox, pos_dfl, pos_sums.unbind()
    # levels without a positive: stock's zeros of the level's predictions,
    # on stock's flattening of the level, summed twice as stock sums it
    flat = [
        x.permute(0, 2, 3, 1).reshape(-1, 4 * bins) if not c else None
        for x, c in zip(bbox_preds, pos.counts)
    ]
    found = [pos_bbox, pos_dfl, pos_sums] if pos.pos_rows else [None] * 3
    losses_bbox, losses_dfl, sums = fill_levels(pos.counts, found, [
        lambda i: flat[i].sum() * 0, lambda i: flat[i].sum() * 0,
        lambda i: flat[i].new_tensor(0).sum()
    ])
    return (loss_cls.unbind(), torch.stack(losses_bbox),
            torch.stack(losses_dfl), sums)


def power(x: Tensor, beta: Any, rows: List[int]) -> Tensor:
    """``x.pow(beta)``; per level on a CPU unless it is a product."""
    if beta == 2.0:
        return x.pow(beta)
    return levelwise(lambda t: t.pow(beta), rows, x)


def qfl_sums(module: Any, pred: Tensor, pred_sigmoid: Tensor, label: Tensor,
             score: Tensor, weight: Tensor, rows: List[int], pos: Tensor,
             pos_rows: List[int], avg_factor: float) -> Tensor:
    """``QualityFocalLoss(pred, (label, score), weight, avg_factor)``
    (``quality_focal_loss`` of mmdet 3.3.0, or ``..._with_prob`` where the
    module is ``activated``: ``pred_sigmoid`` is ``pred``) per level,
    stacked."""
    beta = module.beta
    bce = F.binary_cross_entropy if module.activated else \
        F.binary_cross_entropy_with_logits
    scale_factor = pred_sigmoid
    zerolabel = scale_factor.new_zeros(pred.shape)
    loss = levelwise(bce_none(bce), rows, pred, zerolabel) * power(
        scale_factor, beta, rows)
    # with no positive too, as stock (its empty gather adds a zero gradient)
    pos_label = label[pos].long()
    scale_factor = score[pos] - pred_sigmoid[pos, pos_label]
    loss[pos, pos_label] = levelwise(
        bce_none(bce), pos_rows, pred[pos, pos_label], score[pos]) * power(
            scale_factor.abs(), beta, pos_rows)
    loss = levelwise(
        lambda x: x.sum(dim=1, keepdim=False), rows, loss, everywhere=True)
    loss = loss * weight
    return module.loss_weight * (level_sums(loss, rows) / (avg_factor + EPS))


def bce_none(bce: Any) -> Any:
    """``bce(pred, target, reduction='none')``."""
    return lambda pred, target: bce(pred, target, reduction='none')


def _dfl(module: Any, pred: Tensor, label: Tensor, weight: Tensor,
         rows: List[int]) -> Tensor:
    """``DistributionFocalLoss(pred, label, weight, avg_factor=4.0)``
    (``distribution_focal_loss`` of mmdet 3.3.0) per level, stacked."""
    dis_left = label.long()
    dis_right = dis_left + 1
    weight_left = dis_right.float() - label
    weight_right = label - dis_left.float()

    def cross_entropy(p: Tensor, t: Tensor) -> Tensor:
        return F.cross_entropy(p, t, reduction='none')

    left = levelwise(cross_entropy, rows, pred, dis_left, everywhere=True)
    right = levelwise(cross_entropy, rows, pred, dis_right, everywhere=True)
    loss = left * weight_left + right * weight_right
    loss = loss * weight
    return module.loss_weight * (level_sums(loss, rows) / (4.0 + EPS))
