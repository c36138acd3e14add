"""ATSS / GFL targets of a whole batch: ``ATSSHead.get_targets``, batched.

:func:`atss_targets` returns what stock's ``get_targets`` stacks from
``_get_targets_single`` (mmdet 3.3.0, ``ATSSHead`` / ``GFLHead`` with
``ATSSAssigner`` and ``PseudoSampler``; ``TOODHead`` in its initial epochs):
the unmapped anchors, labels, label weights, box targets and box weights,
``(B, N, ...)`` each, and the ``avg_factor``. Images
:func:`~.assign.assign_batch` flags are computed by stock's
``_get_targets_single`` and written over their rows.
"""
from typing import Any, Callable, List, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.atss.assign import assign_batch
from fast_parallel.step.targets.dynamic_k import host_values, nonzero
from fast_parallel.step.targets.max_iou.targets import encode_deltas
from fast_parallel.step.targets.padding import pad_gts
from fast_parallel.step.targets.priors import within_border
from fast_parallel.step.targets.stock_way import StockWay

__all__ = ['atss_targets']


def _pos_targets(head: Any, anchors: Tensor, pos_gt: Tensor,
                 num_pos: Sequence[int]) -> Tensor:
    """The box targets of the positives: their boxes (``GFLHead``, or
    ``reg_decoded_bbox``), else the coder's deltas."""
    if type(head) is upstream('GFLHead') or head.reg_decoded_bbox:
        return pos_gt
    return encode_deltas(head.bbox_coder, anchors, pos_gt, num_pos)


def atss_targets(head: Any, flat_anchors: Tensor, valid: Tensor,
                 level_sizes: List[int], gts: Sequence[Any],
                 metas: Sequence[dict], ignores: Sequence[Any],
                 single: Callable, way: StockWay) -> Tuple[List[Tensor], int]:
    """Stock's per-image targets of the whole batch, stacked.

    Args:
        head: A head :func:`~fast_parallel.step.targets.atss.supported`
            accepts (or TOOD's, in its initial epochs).
        flat_anchors (Tensor): ``(N, 4)`` anchors of every level.
        valid (Tensor): ``(B, N)`` bool valid flags.
        level_sizes (list[int]): Anchors per level.
        gts (Sequence[InstanceData]): Ground truths per image.
        metas (Sequence[dict]): Meta information per image.
        ignores (Sequence): Ignored instances per image (or None each).
        single (callable): The stock ``_get_targets_single`` an image stock
            must compute is computed by (unbound).
        way (StockWay): Counts the images computed stock's way.

    Returns:
        tuple: The ``(B, N, ...)`` anchors, labels, label weights, box
        targets and box weights (what ``images_to_levels`` stacks), and the
        ``avg_factor``.
    """
    num_imgs, num_anchors = valid.shape
    inside = within_border(head, flat_anchors, valid, metas)
    gt, gt_labels, gt_mask, counts = pad_gts([g.bboxes for g in gts],
                                             [g.labels for g in gts],
                                             flat_anchors.device, 1)
    assigned = assign_batch(head.assigner, flat_anchors, inside, level_sizes,
                            gt, gt_mask, counts)
    gt_inds = assigned.gt_inds
    pos, neg = gt_inds > 0, gt_inds == 0
    read = host_values(pos.sum(1), assigned.stock)
    num_pos, stock = read[:num_imgs], read[num_imgs:]

    gt_of = (gt_inds - 1).clamp(min=0)
    labels = torch.where(pos,
                         gt_labels.gather(1, gt_of).long(), head.num_classes)
    pos_weight = head.train_cfg['pos_weight']
    label_weights = torch.where(pos, 1.0 if pos_weight <= 0 else pos_weight,
                                neg.float())
    flat = nonzero(pos, sum(num_pos))
    slot = (flat // num_anchors) * gt.shape[1] + gt_of.reshape(-1)[flat]
    pos_targets = _pos_targets(head, flat_anchors[flat % num_anchors],
                               gt.reshape(-1, 4)[slot], num_pos)
    bbox_targets = flat_anchors.new_zeros(
        (num_imgs * num_anchors,
         4)).index_copy_(0, flat, pos_targets).view(num_imgs, num_anchors, 4)
    bbox_weights = pos[...,
                       None].to(flat_anchors.dtype).expand(-1, -1,
                                                           4).contiguous()
    anchors = torch.where(inside[..., None], flat_anchors, 0.)
    factors = [max(p, 1) for p in num_pos]

    for i in (i for i, s in enumerate(stock) if s):
        (anchors[i], labels[i], label_weights[i], bbox_targets[i],
         bbox_weights[i], _, _, result) = single(
             head,
             flat_anchors,
             valid[i],
             level_sizes,
             gts[i],
             metas[i],
             ignores[i],
             unmap_outputs=True)
        factors[i] = result.avg_factor
        way.count()
    return [anchors, labels, label_weights, bbox_targets,
            bbox_weights], sum(factors)
