"""TOOD's targets after its initial epochs: ``TaskAlignedAssigner``, batched.

:func:`aligned_targets` computes, for the whole batch, what stock's
``TOODHead.get_targets`` stacks from ``_get_targets_single`` per image
(mmdet 3.3.0, ``TaskAlignedAssigner`` + ``BboxOverlaps2D``,
``PseudoSampler``): the unmapped anchors, labels, label weights, box targets
and normalised alignment metrics, ``(B, N, ...)`` each.

Stock, per image, on the anchors inside it: the IoU of the predicted boxes
with the ground truths, the alignment metric ``score ** alpha * iou **
beta`` (``pow`` takes a vector and a scalar loop on the CPU whose last bits
differ: :func:`~fast_parallel.step.targets.cpu_paths.as_stock` gives each
pair stock's), the ``topk`` highest metrics per ground truth, the positive
ones whose anchor centre is inside the box, the highest IoU per anchor, then
each positive's metric normalised by its ground truth's highest metric and
IoU. Only a tie at the ``topk`` boundary between positive metrics leaves
stock's pick to the implementation: that image, and an image with a NaN
input, a label outside the classes (stock indexes the scores by it) or no
anchor inside, is computed by stock's ``_get_targets_single``, counted.
"""
from typing import Any, Callable, List, Sequence

import torch
from torch import Tensor

from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.atss.assign import (ATSS_INF, best_gt,
                                                    centre_inside)
from fast_parallel.step.targets.dynamic_k import host_values, nonzero, pairs_of
from fast_parallel.step.targets.padding import pad_gts
from fast_parallel.step.targets.priors import within_border
from fast_parallel.step.targets.stock_way import StockWay

__all__ = ['aligned_targets']


def _metrics(head: Any, scores: Tensor, overlaps: Tensor, inside: Tensor,
             gt_mask: Tensor, counts: Sequence[int]) -> tuple:
    """``(B, N, G)`` alignment metrics (-1 off stock's matrices) and the
    ``(B,)`` images with a NaN metric."""
    pairs = pairs_of(inside, gt_mask, counts)
    num_pairs = pairs.sizes
    score = scores.reshape(-1)[pairs.flat]
    iou = overlaps.reshape(-1)[pairs.flat]
    metric = cpu_paths.as_stock(cpu_paths.power(head.alpha), score,
                                num_pairs) * cpu_paths.as_stock(
                                    cpu_paths.power(head.beta), iou, num_pairs)
    metrics = overlaps.new_full((overlaps.numel(), ), -1.)
    metrics[pairs.flat] = metric
    # a NaN input flags its image even where the metric hides it (NaN ** 0)
    bad = torch.isnan(metric) | torch.isnan(score) | torch.isnan(iou)
    nan = torch.zeros(len(counts), dtype=torch.long, device=inside.device)
    nan.index_add_(0, pairs.imgs, bad.long())
    return metrics.view(overlaps.shape), nan > 0


def aligned_targets(head: Any, cls_scores: Tensor, bbox_preds: Tensor,
                    flat_anchors: Tensor, valid: Tensor, gts: Sequence[Any],
                    metas: Sequence[dict], ignores: Sequence[Any],
                    single: Callable, way: StockWay) -> List[Tensor]:
    """Stock's per-image aligned targets of the whole batch, stacked.

    Args:
        head: The ``TOODHead`` (``alignment_assigner``, ``alpha``,
            ``beta``).
        cls_scores (Tensor): ``(B, N, C)`` scores.
        bbox_preds (Tensor): ``(B, N, 4)`` predicted boxes.
        flat_anchors (Tensor): ``(N, 4)`` anchors of every level.
        valid (Tensor): ``(B, N)`` bool valid flags.
        gts (Sequence[InstanceData]): Ground truths per image.
        metas (Sequence[dict]): Meta information per image.
        ignores (Sequence): Ignored instances per image (or None each).
        single (callable): Stock's ``TOODHead._get_targets_single``.
        way (StockWay): Counts the images computed stock's way.

    Returns:
        list[Tensor]: The ``(B, N, ...)`` anchors, labels, label weights,
        box targets and normalised alignment metrics.
    """
    num_imgs, num_anchors = valid.shape
    inside = within_border(head, flat_anchors, valid, metas)
    gt, gt_labels, gt_mask, counts = pad_gts([g.bboxes for g in gts],
                                             [g.labels for g in gts],
                                             flat_anchors.device, 1)
    width = gt.shape[1]
    overlaps = head.alignment_assigner.iou_calculator(bbox_preds.detach(),
                                                      gt).detach()
    scores = cls_scores.detach().gather(
        2,
        gt_labels.clamp(0, cls_scores.shape[-1] - 1)[:, None, :].expand(
            -1, num_anchors, -1))
    metrics, unsure = _metrics(head, scores, overlaps, inside, gt_mask, counts)
    # stock indexes the scores by label: a label outside [0, C) wraps or
    # raises there; and an image without an inside anchor raises
    num_classes = cls_scores.shape[-1]
    unsure |= (((gt_labels < 0) |
                (gt_labels >= num_classes)) & gt_mask).any(1) | ~inside.any(1)

    topk = head.alignment_assigner.topk
    top, cand = metrics.topk(min(topk + 1, num_anchors), dim=1)
    if num_anchors > topk:  # a positive tie at the boundary
        last, first_out = top[:, topk - 1], top[:, topk]
        unsure |= ((last == first_out) & (last > 0) & gt_mask).any(1)
    cand, cand_metrics = cand[:, :topk], top[:, :topk]
    is_pos = (cand_metrics > 0) & centre_inside(flat_anchors, cand,
                                                gt) & gt_mask[:, None]
    max_overlaps, argmax = best_gt(overlaps, cand, is_pos,
                                   overlaps.gather(1, cand))
    pos = (max_overlaps != -ATSS_INF) & inside
    neg = ~pos & inside
    read = host_values(pos.sum(1), unsure)
    num_pos, stock = read[:num_imgs], read[num_imgs:]

    labels = torch.where(pos,
                         gt_labels.gather(1, argmax).long(), head.num_classes)
    pos_weight = head.train_cfg['pos_weight']
    label_weights = torch.where(pos, 1.0 if pos_weight <= 0 else pos_weight,
                                neg.float())
    flat = nonzero(pos, sum(num_pos))
    slot = (flat // num_anchors) * width + argmax.reshape(-1)[flat]
    bbox_targets = flat_anchors.new_zeros(
        (num_imgs * num_anchors, 4)).index_copy_(0, flat,
                                                 gt.reshape(-1, 4)[slot])
    # each positive's metric over its ground truth's highest, times its
    # highest IoU (max: exact in any order)
    pos_metric = metrics.reshape(-1, width).gather(1, argmax.reshape(
        -1, 1)).reshape(-1)[flat]
    pos_iou = max_overlaps.reshape(-1)[flat]
    top_metric = pos_metric.new_full(
        (num_imgs * width, ),
        -float('inf')).scatter_reduce(0, slot, pos_metric, 'amax')
    top_iou = pos_iou.new_full(
        (num_imgs * width, ),
        -float('inf')).scatter_reduce(0, slot, pos_iou, 'amax')
    norm = pos_metric / (top_metric[slot] + 10e-8) * top_iou[slot]
    norm_metrics = flat_anchors.new_zeros(
        (num_imgs * num_anchors, )).index_copy_(0, flat, norm)
    anchors = torch.where(inside[..., None], flat_anchors, 0.)
    stacked = [
        anchors, labels, label_weights,
        bbox_targets.view(num_imgs, num_anchors, 4),
        norm_metrics.view(num_imgs, num_anchors)
    ]
    for i in (i for i, s in enumerate(stock) if s):
        rows = single(
            head,
            cls_scores[i],
            bbox_preds[i],
            flat_anchors,
            valid[i],
            gts[i],
            metas[i],
            ignores[i],
            unmap_outputs=True)
        for target, row in zip(stacked, rows):
            target[i] = row
        way.count()
    return stacked
