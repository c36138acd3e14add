"""The batched SimOTA assignment and YOLOX target tensors (pure tensor code).

:func:`assign` is ``SimOTAAssigner.assign`` + ``dynamic_k_matching`` for a
padded batch; :func:`build_targets` is the rest of
``YOLOXHead._get_targets_single``. Both take the mmdet constants they need as
arguments (see ``yolox._MMDET``); the reasoning is in
``docs/targets_yolox.md``.
"""
from typing import Any, Callable, List, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fast_parallel.step.targets import cpu_paths

__all__ = ['Assignment', 'assign', 'build_targets', 'host_values']


def host_values(*tensors: Tensor) -> List[int]:
    """The values of small integer tensors, in one device-to-host copy."""
    return torch.cat([t.reshape(-1).long() for t in tensors]).tolist()


def _nonzero(mask: Tensor, size: int) -> Tensor:
    """Flat indices of ``mask``'s True elements, ascending; size known."""
    return torch.nonzero_static(mask.reshape(-1), size=size).squeeze(1)


class Assignment(NamedTuple):
    """What :func:`assign` finds, for every image of the batch."""
    #: ``(B, N)`` bool: positive priors.
    pos: Tensor
    #: ``(B, N)`` long: the matched ground truth of each positive.
    gt_of: Tensor
    #: ``(B, N)``: the IoU of each positive with its ground truth.
    pos_iou: Tensor
    #: Per image: whether stock must compute it (a tie, too few priors...).
    fallback: List[bool]
    #: Per image: the number of positives.
    num_pos: List[int]
    #: ``(B, N, G)`` the cost matrix (``inf`` off stock's rows and columns).
    cost: Tensor
    #: ``(B, G)`` long: each ground truth's dynamic k.
    dynamic_k: Tensor


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
    num_imgs, num_priors, width = ious.shape
    num_classes, device = scores.shape[-1], scores.device
    num_valid = host_values(valid.sum(1))  # host sync 1 of 2
    sizes = [v * c for v, c in zip(num_valid, counts)]
    # Stock's (num_valid, num_gt) matrices, one after the other, row-major:
    # exactly the pairs of the padded batch in ascending flat order.
    pair_mask = valid.unsqueeze(-1) & gt_mask.unsqueeze(1)
    pairs = _nonzero(pair_mask, sum(sizes))
    rows, cols = pairs // width, pairs % width
    imgs = rows // num_priors
    onehot = F.one_hot(
        labels.reshape(-1)[imgs * width + cols].to(torch.int64),
        num_classes).float()
    if device.type == 'cpu':  # BCE is elementwise per pair only if so
        cpu_paths.require_same_paths('bce0')
        cpu_paths.require_same_paths('bce1')
    with torch.autocast('cuda', enabled=False):  # as stock
        cls_cost = F.binary_cross_entropy(
            scores.reshape(-1, num_classes)[rows].to(dtype=torch.float32),
            onehot,
            reduction='none').sum(-1).to(dtype=scores.dtype)
    iou_cost = -cpu_paths.as_stock('log', ious.reshape(-1)[pairs] + eps, sizes)
    pair_cost = (
        cls_cost * assigner.cls_weight + iou_cost * assigner.iou_weight +
        (~in_both.reshape(-1)[pairs]) * inf)
    cost = pair_cost.new_full((num_imgs * num_priors * width, ), float('inf'))
    cost[pairs] = pair_cost
    cost = cost.view(num_imgs, num_priors, width)
    bad = torch.zeros(
        num_imgs, dtype=torch.long,
        device=device).index_add_(0, imgs, (~torch.isfinite(pair_cost)).long())

    # dynamic k: the top candidate_topk IoUs over the valid priors (others
    # are 0 here and, with >= candidate_topk valid priors, never counted).
    topk = min(assigner.candidate_topk, num_priors)
    topk_sum = ious.masked_fill(~pair_mask, 0.).topk(topk, dim=1)[0].sum(1)
    dynamic_ks = torch.clamp(topk_sum.int(), min=1).long().unsqueeze(1)
    # Stock sums the same values in another order (a CPU sum's order depends
    # on the number of columns): any two orders of k values in [0, 1] differ
    # by <= 2 * gamma_(k-1) * k. A sum that close to an integer >= 2 could
    # truncate to another k in stock.
    slack = 4. * topk * topk * 2.**-24
    exact = topk_sum.double()
    near_int = (((exact + slack).floor().clamp(min=1)
                 != (exact - slack).floor().clamp(min=1)) & gt_mask).any(1)
    # The k cheapest valid priors of each ground truth, and the next one:
    # equal costs at the boundary make stock's choice implementation-defined.
    depth = min(assigner.candidate_topk + 1, num_priors)
    values, index = cost.topk(depth, dim=1, largest=False)
    rank = torch.arange(depth, device=device).view(1, -1, 1)
    chosen = ((rank < dynamic_ks) & gt_mask.unsqueeze(1)
              & torch.isfinite(values))
    last = values.gather(1, (dynamic_ks - 1).clamp(max=depth - 1))
    after = values.gather(1, dynamic_ks.clamp(max=depth - 1))
    edge_tie = ((last == after) & (dynamic_ks < depth) & torch.isfinite(last)
                & gt_mask.unsqueeze(1)).flatten(1).any(1)
    matching = torch.zeros_like(
        cost, dtype=torch.uint8).scatter_(1, index, chosen.to(torch.uint8))
    # A prior matched more than once keeps its cheapest ground truth; equal
    # minima make the argmin implementation-defined.
    matches = matching.sum(-1)
    multiple = matches > 1
    min_cost, argmin = cost.min(-1)
    min_tie = (multiple &
               ((cost == min_cost.unsqueeze(-1)).sum(-1) > 1)).any(-1)
    gt_of = torch.where(multiple, argmin, matching.argmax(-1))
    pos = matches > 0
    # Stock sums (matching * ious) over a row with one 1: the IoU itself,
    # and +0. for a zero of either sign, as "+ 0." gives.
    pos_iou = ious.gather(-1, gt_of.unsqueeze(-1)).squeeze(-1) + 0.
    flags = host_values(bad + edge_tie.long() + min_tie.long() +
                        near_int.long(), pos.sum(1))  # host sync 2 of 2
    # Fewer valid priors than candidate_topk: stock sums fewer IoUs (CUDA's
    # reduction tree depends on how many). CUDA, >= 64 classes: the class
    # cost sums of an image with < 16 pairs use another block shape.
    few_pairs = 16 if device.type == 'cuda' and num_classes >= 64 else 0
    fallback = [
        flags[i] > 0
        or counts[i] > 0 and (0 < num_valid[i] < assigner.candidate_topk
                              or 0 < sizes[i] < few_pairs)
        for i in range(num_imgs)
    ]
    return Assignment(pos, gt_of, pos_iou, fallback, flags[num_imgs:], cost,
                      dynamic_ks.squeeze(1))


def build_targets(head: Any, priors: Tensor, cls: Tensor, obj: Tensor,
                  gt: Tensor, labels: Tensor, found: Assignment,
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
    flat = _nonzero(found.pos, sum(counts))
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
    parts = [t.split(counts) for t in (cls_target, bbox, l1)]
    return [(found.pos[i], parts[0][i], obj_target[i], parts[1][i],
             parts[2][i], counts[i]) for i in range(num_imgs)]
