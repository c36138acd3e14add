"""``DynamicSoftLabelAssigner.assign`` for a padded batch (tensor code).

Stock builds, per image, a cost for every (valid prior, ground truth) pair:
the soft classification cost (BCE with logits against the IoU-scaled one-hot
label, times the squared gap to the prior's sigmoid score, summed over the
classes), ``-log(IoU + EPS) * iou_weight`` and the soft centre prior
``10 ** (distance / stride - soft_center_radius)``; then dynamic-k matching.
:func:`assign` computes the same costs for the pairs of the whole batch at
once, in stock's flat order, so that the position-dependent CPU ops give
every element stock's bits (:mod:`~fast_parallel.step.targets.cpu_paths`),
and hands them to the shared
:func:`~fast_parallel.step.targets.dynamic_k.match`. Why it is exact:
``docs/targets_rtmdet.md``.
"""
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.dynamic_k import Assignment, match, pairs_of

__all__ = ['assign']


def _min4(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """Elementwise min of four (stock: ``cat(...).min(-1).values``)."""
    return torch.minimum(torch.minimum(a, b), torch.minimum(c, d))


def assign(assigner: Any, priors: Tensor, scores: Tensor, boxes: Tensor,
           inside: Optional[Tensor], gt: Tensor, labels: Tensor,
           gt_mask: Tensor, counts: Sequence[int], eps: float) -> Assignment:
    """The DSL assignment of every image, as stock does it per image.

    Args:
        assigner: The ``DynamicSoftLabelAssigner``.
        priors (Tensor): ``(N, 4)`` point priors ``[x, y, stride_w,
            stride_h]``.
        scores (Tensor): ``(B, N, C)`` class logits, contiguous.
        boxes (Tensor): ``(B, N, 4)`` decoded boxes.
        inside (Tensor, optional): ``(B, N)`` the priors stock assigns
            (``anchor_inside_flags``); None: all of them.
        gt (Tensor): ``(B, G, 4)`` padded ground-truth boxes.
        labels (Tensor): ``(B, G)`` padded labels.
        gt_mask (Tensor): ``(B, G)`` real ground truths.
        counts (Sequence[int]): Ground truths per image.
        eps (float): ``dynamic_soft_label_assigner.EPS``.

    Returns:
        Assignment: Positives, their ground truths and IoUs, fallbacks.
    """
    num_imgs, num_priors, num_classes = scores.shape
    width = gt.shape[1]
    x, y = priors[None, :, None, 0], priors[None, :, None, 1]
    x1, y1, x2, y2 = (gt[:, None, :, i] for i in range(4))
    in_gts = (_min4(x - x1, y - y1, x2 - x, y2 - y) > 0) & gt_mask[:, None]
    valid = in_gts.any(-1)
    if inside is not None:
        valid &= inside
    pairs = pairs_of(valid, gt_mask, counts)  # host sync 1 of 2
    prior = pairs.rows % num_priors
    slot = pairs.imgs * width + pairs.cols
    # soft centre prior: ((prior - centre) ** 2).sum(-1).sqrt() / stride
    centre = ((gt[..., :2] + gt[..., 2:]) / 2.0).reshape(-1, 2)[slot]
    distance = (priors[prior, :2] - centre).pow(2).sum(-1).sqrt() \
        / priors[prior, 2]
    centre_prior = cpu_paths.as_stock('pow10',
                                      distance - assigner.soft_center_radius,
                                      pairs.sizes)
    ious = assigner.iou_calculator(
        boxes.reshape(-1, 4)[pairs.rows],
        gt.reshape(-1, 4)[slot],
        is_aligned=True)
    iou_cost = -cpu_paths.as_stock('log', ious + eps,
                                   pairs.sizes) * assigner.iou_weight
    pair_scores = scores.reshape(-1, num_classes)[pairs.rows]
    # stock's one_hot(...).float(), without one_hot's range check (two
    # device syncs on the CPU)
    classes = torch.arange(num_classes, device=scores.device)
    onehot = (labels.reshape(-1)[slot, None] == classes).float()
    soft_label = onehot * ious[:, None]
    scale = soft_label - cpu_paths.as_stock(
        'sigmoid', pair_scores, [n * num_classes for n in pairs.sizes])
    if scores.device.type == 'cpu':  # elementwise per pair only if so
        cpu_paths.require_same_paths('bce_logits')
    cls_cost = (F.binary_cross_entropy_with_logits(
        pair_scores, soft_label, reduction='none') *
                scale.abs().pow(2.0)).sum(dim=-1)
    cost = cls_cost + iou_cost + centre_prior
    grid = ious.new_zeros(num_imgs * num_priors * width)
    grid[pairs.flat] = ious
    # CUDA, >= 64 classes: the class cost sums of an image with < 16 pairs
    # use another block shape.
    few_pairs = 16 if scores.device.type == 'cuda' and num_classes >= 64 \
        else 0
    return match(
        pairs,
        cost,
        grid.view(num_imgs, num_priors, width),
        gt_mask,
        counts,
        assigner.topk,
        inf_is_bad=False,
        few_pairs=few_pairs,
        few_valid_stock=False,
        min_tie_stock=False,
        # a label outside [0, C) where stock one-hots it (an image with a
        # valid prior): stock's one_hot raises there, so stock's way
        stock_images=(((labels < 0) |
                       (labels >= num_classes)) & gt_mask).any(-1)
        & valid.any(-1))
