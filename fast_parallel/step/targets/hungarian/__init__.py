"""The DETR family's losses with the Hungarian targets of the batch at once.

:func:`~fast_parallel.step.targets.switch.install` puts
:func:`loss_by_feat_single` (every DETR head: each decoder layer, and the
two-stage encoder's proposals) and, on ``DINOHead``, :func:`loss_dn_single`
(its denoising queries) on one head instance in place of the class's: mmdet
3.3.0's bodies, line for line, except that the targets come from
:func:`~fast_parallel.step.targets.hungarian.match.detr_targets` /
:func:`~fast_parallel.step.targets.hungarian.dn.dn_targets` (the batch at
once, one host copy of the cost matrices per layer) and that, outside
distributed training, the two counts stock turns into tensors and reads back
(``max(avg_factor, 1)`` and ``clamp(num_pos, 1).item()``: device syncs) are
decided on the host, where the matching put them.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat.targets import is_upstream, replaced_reason, upstream
from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.hungarian.costs import (LabelOutOfRange,
                                                        costs_reason,
                                                        cxcywh_to_xyxy)
from fast_parallel.step.targets.hungarian.dn import dn_targets
from fast_parallel.step.targets.hungarian.layers import loss_by_feat
from fast_parallel.step.targets.hungarian.losses import (cls_avg_factor,
                                                         positives_divisor,
                                                         regression_loss)
from fast_parallel.step.targets.hungarian.match import (DETRTargets,
                                                        batch_reason,
                                                        detr_targets,
                                                        gts_reason,
                                                        image_factors)
from fast_parallel.step.targets.stock_way import batch_targets

__all__ = [
    'supported', 'loss_by_feat', 'loss_by_feat_single', 'loss_dn_single'
]

#: The heads covered, by upstream key.
HEADS = ('DETRHead', 'DeformableDETRHead', 'DINOHead', 'ConditionalDETRHead',
         'DABDETRHead')


def supported(head: Any) -> Optional[str]:
    """None when the batched losses are exact for this head, else why not.

    Args:
        head: A module that computes targets.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    if not is_upstream(head, *HEADS):
        return f'{name} is not one of {", ".join(HEADS)}'
    if getattr(head, 'assigner', None) is None:
        return f'{name} has no train_cfg (no assigner)'
    kind = 'DINOHead' if is_upstream(head, 'DINOHead') else 'DETRHead'
    return replaced_reason((head, kind)) or costs_reason(head.assigner)


def _stock_targets(targets: tuple) -> DETRTargets:
    """``get_targets``' lists, concatenated as stock's loss does."""
    (labels_list, label_weights_list, bbox_targets_list, bbox_weights_list,
     num_total_pos, num_total_neg) = targets
    return DETRTargets(
        torch.cat(labels_list, 0), torch.cat(label_weights_list, 0),
        torch.cat(bbox_targets_list, 0), torch.cat(bbox_weights_list, 0),
        num_total_pos, num_total_neg)


def layer_targets(self: Any, cls_scores: Tensor, bbox_preds: Tensor,
                  batch_gt_instances: Sequence[Any],
                  batch_img_metas: Sequence[dict]) -> DETRTargets:
    """One decoder layer's targets, batched or (counted) stock's way."""
    num_imgs = cls_scores.size(0)
    cls_scores_list = [cls_scores[i] for i in range(num_imgs)]
    bbox_preds_list = [bbox_preds[i] for i in range(num_imgs)]
    with batch_targets(self, num_imgs) as stock_way:
        plan = getattr(self, 'fast_layer_plan', None)
        matched = plan.match(cls_scores, bbox_preds,
                             batch_gt_instances) if plan else None
        if matched is not None:
            return detr_targets(self, cls_scores_list, bbox_preds,
                                batch_gt_instances, batch_img_metas, plan.pad,
                                matched)
        if batch_reason(cls_scores_list, bbox_preds_list,
                        batch_gt_instances) is None:
            try:
                return detr_targets(self, cls_scores_list, bbox_preds,
                                    batch_gt_instances, batch_img_metas)
            except (cpu_paths.PathModelError, LabelOutOfRange):
                pass  # stock's way: its values, or its error
        stock_way.count(num_imgs)
        return _stock_targets(
            self.get_targets(cls_scores_list, bbox_preds_list,
                             batch_gt_instances, batch_img_metas))


def _losses(self: Any, cls_scores: Tensor, bbox_preds: Tensor,
            targets: DETRTargets, batch_img_metas: Sequence[dict],
            empty_check: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The rest of stock's ``loss_by_feat_single`` / ``_loss_dn_single``
    once the targets are made (``empty_check``: the latter's ``len > 0``)."""
    labels, label_weights, bbox_targets, bbox_weights = targets[:4]
    num_total_pos, num_total_neg = targets.num_total_pos, targets.num_total_neg
    # classification loss
    scores = cls_scores.reshape(-1, self.cls_out_channels)
    avg_factor = cls_avg_factor(self, scores, num_total_pos, num_total_neg)
    if empty_check and len(scores) == 0:
        loss_cls = torch.zeros(1, dtype=scores.dtype, device=scores.device)
    elif isinstance(self.loss_cls, upstream('QualityFocalLoss')):
        bg_class_ind = self.num_classes
        pos_inds = ((labels >= 0)
                    & (labels < bg_class_ind)).nonzero().squeeze(1)
        quality = label_weights.new_zeros(labels.shape)
        pos_bbox_targets = bbox_targets[pos_inds]
        pos_decode_bbox_targets = cxcywh_to_xyxy(pos_bbox_targets)
        pos_bbox_pred = bbox_preds.reshape(-1, 4)[pos_inds]
        pos_decode_bbox_pred = cxcywh_to_xyxy(pos_bbox_pred)
        quality[pos_inds] = upstream('bbox_overlaps')(
            pos_decode_bbox_pred.detach(),
            pos_decode_bbox_targets,
            is_aligned=True)
        loss_cls = self.loss_cls(
            scores, (labels, quality), label_weights, avg_factor=avg_factor)
    else:
        loss_cls = self.loss_cls(
            scores, labels, label_weights, avg_factor=avg_factor)
    # the average number of gt boxes across all gpus, for normalization
    num_pos = positives_divisor(loss_cls, num_total_pos)
    # factors to rescale the normalised boxes: one copy for the batch
    factors = image_factors(bbox_preds,
                            batch_img_metas).expand(-1, bbox_preds.size(1),
                                                    -1).reshape(-1, 4)
    flat_preds = bbox_preds.reshape(-1, 4)
    bboxes = cxcywh_to_xyxy(flat_preds) * factors
    bboxes_gt = cxcywh_to_xyxy(bbox_targets) * factors
    # regression IoU loss, defaultly GIoU loss; then the L1 loss (stock's
    # torch.any(weight > 0) is num_total_pos > 0: the weights are 1 there)
    loss_iou = regression_loss(self.loss_iou, num_total_pos > 0, bboxes,
                               bboxes_gt, bbox_weights, num_pos)
    loss_bbox = regression_loss(self.loss_bbox, num_total_pos > 0, flat_preds,
                                bbox_targets, bbox_weights, num_pos)
    return loss_cls, loss_bbox, loss_iou


def loss_by_feat_single(self: Any, cls_scores: Tensor, bbox_preds: Tensor,
                        batch_gt_instances: List[Any],
                        batch_img_metas: List[dict]) -> Tuple[Tensor]:
    """Stock's ``DETRHead.loss_by_feat_single``, the targets batched.

    Args:
        self: The DETR head.
        cls_scores (Tensor): ``(B, Q, C)`` logits of one decoder layer.
        bbox_preds (Tensor): ``(B, Q, 4)`` normalised ``cxcywh`` boxes.
        batch_gt_instances (list[InstanceData]): Ground truths per image.
        batch_img_metas (list[dict]): Image metas.

    Returns:
        tuple[Tensor]: ``loss_cls``, ``loss_bbox``, ``loss_iou``, stock's.
    """
    targets = layer_targets(self, cls_scores, bbox_preds, batch_gt_instances,
                            batch_img_metas)
    return _losses(self, cls_scores, bbox_preds, targets, batch_img_metas,
                   False)


def loss_dn_single(self: Any, dn_cls_scores: Tensor, dn_bbox_preds: Tensor,
                   batch_gt_instances: List[Any], batch_img_metas: List[dict],
                   dn_meta: Dict[str, int]) -> Tuple[Tensor]:
    """Stock's ``DINOHead._loss_dn_single``, the targets batched.

    Args:
        self: The ``DINOHead``.
        dn_cls_scores (Tensor): ``(B, D, C)`` denoising logits of a layer.
        dn_bbox_preds (Tensor): ``(B, D, 4)`` denoising boxes.
        batch_gt_instances (list[InstanceData]): Ground truths per image.
        batch_img_metas (list[dict]): Image metas.
        dn_meta (dict): ``num_denoising_queries``, ``num_denoising_groups``.

    Returns:
        tuple[Tensor]: ``loss_cls``, ``loss_bbox``, ``loss_iou``, stock's.
    """
    num_imgs = len(batch_gt_instances)
    with batch_targets(self, num_imgs) as stock_way:
        groups = dn_meta['num_denoising_groups']
        each = int(dn_meta['num_denoising_queries'] / groups)
        if num_imgs and each > 0 and gts_reason(
                batch_gt_instances, dn_bbox_preds.device) is None and all(
                    len(g) <= each for g in batch_gt_instances):
            plan = getattr(self, 'fast_layer_plan', None)
            pad = plan.pad if plan and plan.gts is batch_gt_instances else None
            targets = dn_targets(self, batch_gt_instances, batch_img_metas,
                                 dn_meta, pad)
        else:
            stock_way.count(num_imgs)
            targets = _stock_targets(
                self.get_dn_targets(batch_gt_instances, batch_img_metas,
                                    dn_meta))
    return _losses(self, dn_cls_scores, dn_bbox_preds, targets,
                   batch_img_metas, True)
