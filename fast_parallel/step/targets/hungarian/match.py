"""The Hungarian matching and DETR's targets for a whole batch.

One host copy of the batch's cost matrices, scipy's
``linear_sum_assignment`` on each image's exact matrix (so its assignment,
ties included, is stock's), one copy of the assignment back, then the
labels, weights and normalised box targets of every image in a fixed number
of operations, equal to ``DETRHead._get_targets_single`` bit for bit.
"""
from typing import Any, List, NamedTuple, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.hungarian.costs import (batch_costs,
                                                        cxcywh_to_xyxy)
from fast_parallel.step.targets.padding import (Padded, gt_layout_reason,
                                                pad_gts, to_device)

__all__ = [
    'DETRTargets', 'assign_on_host', 'batch_reason', 'detr_targets',
    'gts_reason', 'hungarian_match', 'image_factors'
]


class DETRTargets(NamedTuple):
    """What ``DETRHead.get_targets`` returns, concatenated over images."""
    labels: Tensor
    label_weights: Tensor
    bbox_targets: Tensor
    bbox_weights: Tensor
    num_total_pos: int
    num_total_neg: int


def batch_reason(scores: Sequence[Tensor], boxes: Sequence[Tensor],
                 gts: Sequence[Any]) -> Optional[str]:
    """Why this batch's matching takes the stock path, or None.

    Args:
        scores (Sequence[Tensor]): ``(Q, C)`` logits per image.
        boxes (Sequence[Tensor]): ``(Q, 4)`` boxes per image.
        gts (Sequence[InstanceData]): Ground truths per image.

    Returns:
        Optional[str]: A short reason, or None.
    """
    if not scores or scores[0].shape[0] == 0:
        return 'no image or no query'
    device = scores[0].device
    why = gts_reason(gts, device)
    if why:
        return why
    width = scores[0].shape[-1]
    if device.type == 'cpu':
        if not all(s.is_contiguous() for s in scores):
            return 'score layout'  # the CPU loops of sigmoid / log follow it
    elif width > 1024:  # CUDA's block softmax sums by the rows' alignment
        return 'more than 1024 classes on CUDA'
    return None


def gts_reason(gts: Sequence[Any], device: torch.device) -> Optional[str]:
    """Why ground truths are not laid out as the batched targets read them
    (``(n, 4)`` tensors of one dtype on ``device``, a label each), or None.
    """
    why = gt_layout_reason(gts, device)
    if why:
        return why
    if any(
            type(gt.bboxes) is not Tensor or gt.bboxes.device != device
            or gt.bboxes.dtype != gts[0].bboxes.dtype for gt in gts):
        return 'ground truth dtype or device'
    if any(gt.labels.dtype not in (torch.int64, torch.int32) for gt in gts):
        return 'label dtype'  # stock indexes by them (uint8: as a mask)
    return None


def image_factors(like: Tensor, metas: Sequence[dict]) -> Tensor:
    """``(B, 1, 4)`` ``[w, h, w, h]`` per image in ``like``'s dtype: the
    ``new_tensor`` stock makes per image, in one copy."""
    rows = []
    for meta in metas:
        img_h, img_w = meta['img_shape']  # stock's unpacking, its error
        rows.append([img_w, img_h, img_w, img_h])
    return to_device(torch.tensor(rows, dtype=like.dtype),
                     like.device)[:, None, :]


def assign_on_host(host: np.ndarray, counts: Sequence[int]) -> tuple:
    """Each image's assignment from its cost matrix on the host.

    Args:
        host (np.ndarray): ``(B, Q, G)`` cost matrices.
        counts (Sequence[int]): Ground truths per image.

    Returns:
        tuple: ``(gt_inds, num_pos)``: ``(B, Q)`` int64, stock's
        ``assign_result.gt_inds`` per image (0 background, ``j + 1``
        matched to ground truth ``j``), and the matches per image.

    Raises:
        ValueError: scipy's, for a matrix with NaN or an infeasible one,
            as stock raises it.
    """
    lsa = upstream('linear_sum_assignment')
    batch, num_queries = host.shape[:2]
    gt_inds = np.zeros((batch, num_queries), dtype=np.int64)
    num_pos: List[int] = []
    for i, count in enumerate(counts):
        if count == 0:  # stock: every query background, no matching
            num_pos.append(0)
            continue
        rows, cols = lsa(host[i, :, :count])
        gt_inds[i, rows] = cols + 1
        num_pos.append(len(rows))
    return gt_inds, num_pos


def hungarian_match(cost: Tensor, counts: Sequence[int]) -> tuple:
    """:func:`assign_on_host` from one host copy of ``cost``, the
    assignment back on ``cost``'s device in one copy."""
    gt_inds, num_pos = assign_on_host(cost.detach().cpu().numpy(), counts)
    return to_device(gt_inds, cost.device), num_pos


def detr_targets(head: Any,
                 scores: Sequence[Tensor],
                 bbox_preds: Tensor,
                 gts: Sequence[Any],
                 metas: Sequence[dict],
                 pad: Optional[Padded] = None,
                 matched: Optional[tuple] = None) -> DETRTargets:
    """``head.get_targets`` of one decoder layer, the batch at once.

    Args:
        head: A DETR head whose assigner ``costs_reason`` accepts.
        scores (Sequence[Tensor]): ``(Q, C)`` logits per image.
        bbox_preds (Tensor): ``(B, Q, 4)`` normalised ``cxcywh`` boxes.
        gts (Sequence[InstanceData]): Ground truths per image.
        metas (Sequence[dict]): Image metas (``img_shape``).
        pad (Padded, optional): ``gts`` padded (made here if None).
        matched (tuple, optional): ``(gt_inds, num_pos)`` planned already
            (:mod:`~fast_parallel.step.targets.hungarian.layers`).

    Returns:
        DETRTargets: Stock's targets, concatenated over the images.
    """
    batch, num_queries = bbox_preds.shape[:2]
    device = bbox_preds.device
    if pad is None:
        pad = pad_gts([g.bboxes for g in gts], [g.labels for g in gts], device,
                      1)
    factor = image_factors(bbox_preds, metas)
    if matched is not None:
        gt_inds, num_pos = matched
    elif any(pad.counts):
        boxes = cxcywh_to_xyxy(bbox_preds) * factor
        gt_factor = image_factors(pad.boxes, metas)
        cost = batch_costs(head.assigner, scores, boxes, pad, gt_factor)
        gt_inds, num_pos = hungarian_match(cost, pad.counts)
    else:
        gt_inds = torch.zeros((batch, num_queries),
                              dtype=torch.long,
                              device=device)
        num_pos = [0] * batch
    pos = gt_inds > 0
    slot = (gt_inds - 1).clamp(min=0)
    labels = torch.where(pos,
                         pad.labels.gather(1, slot).long(), head.num_classes)
    gt_dtype = pad.boxes.dtype
    label_weights = pad.boxes.new_ones(batch * num_queries)
    # the factor stock divides the matched boxes by: bbox_pred.new_tensor
    normalized = pad.boxes / factor
    targets = upstream('bbox_xyxy_to_cxcywh')(normalized)
    matched = targets.gather(1, slot[..., None].expand(-1, -1, 4))
    zero = torch.zeros((), dtype=gt_dtype, device=device)
    bbox_targets = torch.where(pos[..., None], matched.to(gt_dtype), zero)
    bbox_weights = pos[..., None].expand(-1, -1, 4).to(gt_dtype)
    total_pos = sum(num_pos)
    return DETRTargets(
        labels.view(-1), label_weights, bbox_targets.view(-1, 4),
        bbox_weights.reshape(-1, 4), total_pos,
        batch * num_queries - total_pos)
