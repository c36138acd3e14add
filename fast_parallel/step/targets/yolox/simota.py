"""The batched SimOTA costs and YOLOX target tensors (pure tensor code).

:func:`assign` is ``SimOTAAssigner.assign`` for a padded batch (its cost
matrix, then the shared :func:`~fast_parallel.step.targets.dynamic_k.match`);
:func:`build_targets` is the rest of ``YOLOXHead._get_targets_single``. Both
take the mmdet constants they need as arguments; the reasoning is in
``docs/targets_yolox.md``.
"""
from typing import Any, Callable, List, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.dynamic_k import (Assignment, Pairs, match,
                                                  nonzero, pairs_of)

__all__ = ['Assignment', 'assign', 'build_targets']


def assign(assigner: Any, scores: Tensor, valid: Tensor, in_both: Tensor,
           ious: Tensor, labels: Tensor, gt_mask: Tensor,
           counts: Sequence[int], inf: float, eps: float) -> Assignment:
    """SimOTA for the whole batch, as stock does it per image.

    Args:
        assigner: The ``SimOTAAssigner`` (its weights and ``candidate_topk``).
        scores (Tensor): ``(B, N, C)`` ``sqrt(sigmoid(cls) * sigmoid(obj))``.
        valid (Tensor): ``(B, N)`` priors in some box or centre region.
        in_both (Tensor): ``(B, N, G)`` in the box and its centre region.
        ious (Tensor): ``(B, N, G)`` IoU of decoded boxes and ground truths.
        labels (Tensor): ``(B, G)`` padded labels.
        gt_mask (Tensor): ``(B, G)`` real (not padding) ground truths.
        counts (Sequence[int]): Ground truths per image.
        inf (float): ``sim_ota_assigner.INF``.
        eps (float): ``sim_ota_assigner.EPS``.

    Returns:
        Assignment: Positives, their ground truths and IoUs, fallbacks.
    """
    pairs = pairs_of(valid, gt_mask, counts)  # host sync 1 of 2
    pair_cost = _pair_costs(assigner, scores, in_both, ious, labels, pairs,
                            inf, eps)
    return match(
        pairs,
        pair_cost,
        ious,
        gt_mask,
        counts,
        assigner.candidate_topk,
        inf_is_bad=True,
        few_pairs=_few_pairs(scores))


def _pair_costs(assigner: Any, scores: Tensor, in_both: Tensor, ious: Tensor,
                labels: Tensor, pairs: Pairs, inf: float,
                eps: float) -> Tensor:
    """Stock's cost of each valid pair: class cost, IoU cost, and ``inf``
    for a prior outside the box or its centre region (arguments as
    :func:`assign`'s).

    Returns:
        Tensor: ``(P,)``, in :func:`pairs_of`'s order.
    """
    cls_cost = _class_costs(scores, labels, pairs)
    iou_cost = -cpu_paths.as_stock('log',
                                   ious.reshape(-1)[pairs.flat] + eps,
                                   pairs.sizes)
    return (cls_cost * assigner.cls_weight + iou_cost * assigner.iou_weight +
            (~in_both.reshape(-1)[pairs.flat]) * inf)


def _class_costs(scores: Tensor, labels: Tensor, pairs: Pairs) -> Tensor:
    """Each pair's binary cross-entropy of its prior's scores against its
    ground truth's one-hot label, summed over the classes, as stock."""
    num_classes, width = scores.shape[-1], labels.shape[1]
    onehot = F.one_hot(
        labels.reshape(-1)[pairs.imgs * width + pairs.cols].to(torch.int64),
        num_classes).float()
    if scores.device.type == 'cpu':  # BCE is elementwise per pair only if so
        cpu_paths.require_same_paths('bce0')
        cpu_paths.require_same_paths('bce1')
    with torch.autocast('cuda', enabled=False):  # as stock
        return F.binary_cross_entropy(
            scores.reshape(-1,
                           num_classes)[pairs.rows].to(dtype=torch.float32),
            onehot,
            reduction='none').sum(-1).to(dtype=scores.dtype)


def _few_pairs(scores: Tensor) -> int:
    """Images with fewer pairs go the stock way: on CUDA, with >= 64
    classes, the class cost sums of an image with < 16 pairs use another
    block shape."""
    return 16 if scores.device.type == 'cuda' and scores.shape[-1] >= 64 \
        else 0


def build_targets(head: Any, priors: Tensor, cls: Tensor, obj: Tensor,
                  gt: Tensor, labels: Tensor, gt_counts: Sequence[int],
                  box_dtype: torch.dtype, found: Assignment,
                  xyxy_to_cxcywh: Callable[[Tensor], Tensor],
                  l1_eps: float) -> List[tuple]:
    """The rest of ``_get_targets_single``: the six results per image.

    Args:
        head: The ``YOLOXHead`` (``num_classes``, ``use_l1``).
        priors (Tensor): ``(N, 4)`` or ``(B, N, 4)`` priors (no offset).
        cls (Tensor): ``(B, N, C)`` class logits (for dtypes).
        obj (Tensor): ``(B, N)`` objectness logits (for dtypes).
        gt (Tensor): ``(B, G, 4)`` padded boxes.
        labels (Tensor): ``(B, G)`` padded labels.
        gt_counts (Sequence[int]): Ground truths per image.
        box_dtype (torch.dtype): The decoded boxes' dtype.
        found (Assignment): From :func:`assign`.
        xyxy_to_cxcywh (Callable): mmdet's ``bbox_xyxy_to_cxcywh``.
        l1_eps (float): ``YOLOXHead._get_l1_target``'s ``eps``.

    Returns:
        list[tuple]: Per image ``(foreground_mask, cls_target, obj_target,
        bbox_target, l1_target, num_pos)``, views into batch tensors.
    """
    num_imgs, num_priors, num_classes = cls.shape
    width = gt.shape[1]
    counts = found.num_pos
    flat = nonzero(found.pos, sum(counts))
    slot = (flat // num_priors) * width + found.gt_of.reshape(-1)[flat]
    bbox = gt.reshape(-1, 4)[slot]
    cls_target = F.one_hot(labels.reshape(-1)[slot].long(), num_classes) * \
        found.pos_iou.reshape(-1)[flat].unsqueeze(-1)
    obj_target = found.pos.to(obj.dtype).unsqueeze(-1)
    l1 = cls.new_zeros((flat.numel(), 4))
    if head.use_l1:
        pos_priors = priors.reshape(
            -1, 4)[flat % num_priors if priors.dim() == 2 else flat]
        box = xyxy_to_cxcywh(bbox)
        l1[:, :2] = (box[:, :2] - pos_priors[:, :2]) / pos_priors[:, 2:]
        l1[:, 2:] = cpu_paths.as_stock('log',
                                       box[:, 2:] / pos_priors[:, 2:] + l1_eps,
                                       [2 * n for n in counts])
    parts = [list(t.split(counts)) for t in (cls_target, bbox, l1)]
    for i in range(num_imgs):
        if counts[i]:
            continue
        # Stock's early returns make their (empty) targets in the
        # predictions' dtypes: without ground truths the class and box
        # targets in the class scores' (cls_preds.new_zeros), without valid
        # priors the class targets in the decoded boxes' (the assigner's
        # max_overlaps). Under AMP these differ: float16 and float32.
        if gt_counts[i]:
            parts[0][i] = cls.new_zeros((0, num_classes), dtype=box_dtype)
        else:
            parts[0][i] = cls.new_zeros((0, num_classes))
            parts[1][i] = cls.new_zeros((0, 4))
    return [(found.pos[i], parts[0][i], obj_target[i], parts[1][i],
             parts[2][i], counts[i]) for i in range(num_imgs)]
