"""``MaxIoUAssigner.assign_wrt_overlaps`` for a padded batch.

mmdet's ``MaxIoUAssigner`` and mmdet3d's ``Max3DIoUAssigner`` (which keeps
its parent's ``assign_wrt_overlaps``) assign each prior from its overlaps
with the ground truths of its own sample: the best ground truth above
``pos_iou_thr``, background below ``neg_iou_thr``, and, with
``match_low_quality``, each ground truth's best priors on top, later ground
truths winning. :func:`assign_batch` does it for every sample at once, on
``(B, G, N)`` overlaps whose padding columns ``valid`` leaves out.
"""
from typing import Any, Tuple

import torch
from torch import Tensor

__all__ = ['assign_batch']


def assign_batch(assigner: Any, overlaps: Tensor,
                 valid: Tensor) -> Tuple[Tensor, Tensor]:
    """Stock's ``gt_inds`` and ``max_overlaps`` of every sample.

    Args:
        assigner: A ``MaxIoUAssigner`` (or ``Max3DIoUAssigner``).
        overlaps (Tensor): ``(B, G, N)`` IoUs of the padded ground truths
            with the priors.
        valid (Tensor): ``(B, G)`` the ground truths this assigner sees in
            each sample.

    Returns:
        tuple[Tensor, Tensor]: ``(B, N)`` long ``gt_inds`` (-1 ignored, 0
        negative, ``i + 1`` the padded ground truth ``i``) and ``(B, N)``
        ``max_overlaps`` (0 in a sample without ground truth, as stock).
    """
    batch, num_gts, num_anchors = overlaps.shape
    # Padding below every IoU (>= 0): it never wins a max nor ties with it,
    # and the gts keep their order, so first-index argmax ties are stock's.
    overlaps = overlaps.masked_fill(~valid[..., None], -1.)
    max_overlaps, argmax_overlaps = overlaps.max(dim=1)
    assigned = torch.full_like(argmax_overlaps, -1)
    neg_thr = assigner.neg_iou_thr
    if isinstance(neg_thr, float):
        neg = (max_overlaps >= 0) & (max_overlaps < neg_thr)
        assigned = assigned.masked_fill(neg, 0)
    elif isinstance(neg_thr, tuple):
        assert len(neg_thr) == 2
        neg = (max_overlaps >= neg_thr[0]) & (max_overlaps < neg_thr[1])
        assigned = assigned.masked_fill(neg, 0)
    pos = max_overlaps >= assigner.pos_iou_thr
    assigned = torch.where(pos, argmax_overlaps + 1, assigned)
    if assigner.match_low_quality:
        gt_max, gt_argmax = overlaps.max(dim=2)
        takes = (gt_max >= assigner.min_pos_iou) & valid
        if assigner.gt_max_assign_all:
            hits = overlaps == gt_max[..., None]
        else:
            anchor_ids = torch.arange(num_anchors, device=overlaps.device)
            hits = anchor_ids == gt_argmax[..., None]
        hits &= takes[..., None]
        # stock loops i = 0..G-1, each overwriting the last: the highest
        # gt index that hits an anchor wins it
        order = torch.arange(
            1, num_gts + 1, dtype=torch.int32, device=overlaps.device)
        last = torch.where(hits, order[:, None], 0).amax(dim=1)
        assigned = torch.where(last > 0, last.long(), assigned)
    # a sample with no gt for this assigner: stock's early return, all
    # negative with zero overlaps
    empty = ~valid.any(dim=1, keepdim=True)
    return assigned.masked_fill(empty, 0), max_overlaps.masked_fill(empty, 0.)
