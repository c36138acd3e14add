"""``HungarianAssigner``'s weighted cost matrices for a whole batch.

Stock computes, per image, each match cost on the ``(Q, C)`` scores and
``(Q, 4)`` boxes against the image's ``n`` ground truths, stacks the costs
and sums them. Here each cost runs once on the ``(B, Q, ...)`` batch against
the ``(B, G)`` padded ground truths: the same operations on the same values,
so ``cost[i, :, :n_i]`` is stock's matrix bit for bit (columns past ``n_i``
are padding, never read). Box arithmetic, ``cdist`` and the IoUs are
correctly rounded or computed pair by pair; the sigmoid and log of
``FocalLossCost`` go through :func:`~fast_parallel.step.targets.cpu_paths
.as_stock`, which gives each element the value of stock's per-image call on
the CPU. Details: ``docs/targets_hungarian.md``.
"""
from typing import Any, List, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import is_upstream, replaced_reason, upstream
from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.padding import Padded

__all__ = ['LabelOutOfRange', 'batch_costs', 'costs_reason', 'cxcywh_to_xyxy']

#: The match costs computed for the batch, by upstream key.
COSTS = ('FocalLossCost', 'ClassificationCost', 'BBoxL1Cost', 'IoUCost')


class LabelOutOfRange(Exception):
    """A label outside ``[-C, C)`` (CPU): stock's indexing raises its own
    error there, so the caller takes stock's path to raise it."""


def _columns(values: Tensor, index: Tensor) -> Tensor:
    """``values[..., index]`` per image (a gather: the labels' columns)."""
    try:
        return values.gather(2, index)
    except RuntimeError as error:  # out of range (CPU): stock's error
        raise LabelOutOfRange(str(error)) from error


def costs_reason(assigner: Any) -> Optional[str]:
    """Why an assigner's matching stays stock, or None.

    Args:
        assigner: The head's ``assigner``.

    Returns:
        Optional[str]: None for an exact ``HungarianAssigner`` whose costs
        are all covered, else a short reason (for the log).
    """
    if not is_upstream(assigner, 'HungarianAssigner'):
        return f'assigner {type(assigner).__name__} is not HungarianAssigner'
    why = replaced_reason((assigner, 'HungarianAssigner'),
                          label='HungarianAssigner.')
    if why:
        return why
    for cost in assigner.match_costs:
        name = type(cost).__name__
        if not is_upstream(cost, *COSTS):
            return f'match cost {name} not covered'
        why = replaced_reason((cost, name), label=f'{name}.')
        if why:
            return why
        if is_upstream(cost, 'FocalLossCost'):
            if cost.binary_input:
                return 'FocalLossCost(binary_input=True) not covered'
            if cost.gamma != 2:  # pow(x, 2) is x * x in both CPU loops
                return f'FocalLossCost(gamma={cost.gamma}) not covered'
        if is_upstream(cost, 'BBoxL1Cost') and cost.box_format not in ('xyxy',
                                                                       'xywh'):
            return f'BBoxL1Cost(box_format={cost.box_format!r})'
    return None


def cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """mmdet's ``bbox_cxcywh_to_xyxy`` (elementwise: any batch shape)."""
    return upstream('bbox_cxcywh_to_xyxy')(boxes)


def _stock_layout(scores: Sequence[Tensor]) -> Tensor:
    """The images' score tensors as one contiguous batch, each image's
    elements where stock's own (contiguous) tensor has them."""
    return torch.stack(list(scores)) if len(scores) > 1 else scores[0][None]


def _focal(cost: Any, flat: Tensor, sizes: List[int], index: Tensor) -> Tensor:
    """``FocalLossCost._focal_loss_cost``, columns gathered per image."""
    cls_pred = cpu_paths.as_stock('sigmoid', flat, sizes)
    neg_cost = -cpu_paths.as_stock('log', 1 - cls_pred + cost.eps, sizes) * (
        1 - cost.alpha) * cls_pred.pow(cost.gamma)
    pos_cost = -cpu_paths.as_stock('log', cls_pred + cost.eps, sizes) * \
        cost.alpha * (1 - cls_pred).pow(cost.gamma)
    cls_cost = _columns(pos_cost, index) - _columns(neg_cost, index)
    return cls_cost * cost.weight


def _classification(cost: Any, scores: Tensor, index: Tensor) -> Tensor:
    """``ClassificationCost``: softmax over the classes, row by row."""
    pred_scores = scores.softmax(-1)
    cls_cost = -_columns(pred_scores, index)
    return cls_cost * cost.weight


def _l1(cost: Any, boxes: Tensor, gts: Tensor, gt_factor: Tensor) -> Tensor:
    """``BBoxL1Cost``: normalised boxes, ``cdist`` with ``p=1``."""
    pred_bboxes, gt_bboxes = boxes, gts
    if cost.box_format == 'xywh':
        to_cxcywh = upstream('bbox_xyxy_to_cxcywh')
        gt_bboxes = to_cxcywh(gt_bboxes)
        pred_bboxes = to_cxcywh(pred_bboxes)
    gt_bboxes = gt_bboxes / gt_factor
    pred_bboxes = pred_bboxes / gt_factor
    bbox_cost = torch.cdist(pred_bboxes, gt_bboxes, p=1)
    return bbox_cost * cost.weight


def _iou(cost: Any, boxes: Tensor, gts: Tensor) -> Tensor:
    """``IoUCost``: ``bbox_overlaps`` of every pair (float16 in float32)."""
    pred_bboxes = boxes
    fp16 = pred_bboxes.dtype == torch.float16
    if fp16:
        pred_bboxes = pred_bboxes.to(torch.float32)
    overlaps = upstream('bbox_overlaps')(
        pred_bboxes, gts, mode=cost.iou_mode, is_aligned=False)
    if fp16:
        overlaps = overlaps.to(torch.float16)
    iou_cost = -overlaps
    return iou_cost * cost.weight


def batch_costs(assigner: Any, scores: Sequence[Tensor], boxes: Tensor,
                gts: Padded, gt_factor: Tensor) -> Tensor:
    """Every image's weighted cost matrix, in one ``(B, Q, G)`` tensor.

    Args:
        assigner: A ``HungarianAssigner`` :func:`costs_reason` accepts.
        scores (Sequence[Tensor]): ``(Q, C)`` class logits per image, each
            contiguous (as stock reads them).
        boxes (Tensor): ``(B, Q, 4)`` predicted boxes, ``xyxy`` in pixels.
        gts (Padded): The padded ground truths (``G >= 1`` columns).
        gt_factor (Tensor): ``(B, 1, 4)`` ``[w, h, w, h]`` per image, in the
            ground truths' dtype.

    Returns:
        Tensor: ``(B, Q, G)``; ``[i, :, :n_i]`` equals stock's matrix.

    Raises:
        PathModelError: Where the CPU kernels' layout model does not hold
            (the caller takes the stock path).
        LabelOutOfRange: A label stock's indexing rejects (CPU).
    """
    batch = len(scores)
    num_queries = boxes.shape[1]
    sizes = [s.numel() for s in scores]
    stacked = None
    # stock's scores[:, labels]: a negative label counts from the end (the
    # padding's -1 too: its columns are never read)
    labels = gts.labels.long()
    columns = torch.where(labels < 0, labels + scores[0].shape[-1], labels)
    index = columns[:, None, :].expand(batch, num_queries, -1)
    costs = []
    for cost in assigner.match_costs:
        if is_upstream(cost, 'FocalLossCost', 'ClassificationCost'):
            if stacked is None:
                stacked = _stock_layout(scores)
            if is_upstream(cost, 'FocalLossCost'):
                costs.append(_focal(cost, stacked, sizes, index))
            else:
                costs.append(_classification(cost, stacked, index))
        elif is_upstream(cost, 'BBoxL1Cost'):
            costs.append(_l1(cost, boxes, gts.boxes, gt_factor))
        else:
            costs.append(_iou(cost, boxes, gts.boxes))
    return torch.stack(costs).sum(dim=0)
