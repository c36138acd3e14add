"""``ATSSAssigner.assign`` for every image of a padded batch at once.

Stock, per image, on the anchors inside it: the IoU and the centre distance
of every (anchor, ground truth) pair; per level the ``topk`` nearest
anchors of each ground truth; the threshold mean + std of their IoUs; the
candidates at or over it whose centre lies inside the box are positive;
an anchor positive for several boxes keeps the one of highest IoU (the
first among equals). :func:`assign_batch` does this on the ``(B, N, G)``
grid of all anchors (those outside an image at distance ``+inf``).

The one step whose result stock leaves to the implementation is ``topk``
among equal distances: which of them it takes at the boundary, and their
order (which changes the order of the IoU sum). An image where a ground
truth's ``topk`` nearest anchors of a level are not all finite and
strictly increasing (equal IoUs excepted), or whose first anchor not taken
is not farther, is flagged and computed stock's way by the caller; so is an
image with fewer than ``topk`` inside anchors on a level. Reasoning:
``docs/targets_atss.md``.
"""
from typing import Any, NamedTuple, Sequence

import torch
from torch import Tensor

from fast_parallel.step.targets.atss.threshold import thresholds
from fast_parallel.step.targets.padding import to_device

__all__ = ['ATSS_INF', 'Assigned', 'assign_batch', 'best_gt', 'centre_inside']

#: ``ATSSAssigner.assign``'s local ``INF`` (mmdet 3.3.0; not importable).
ATSS_INF = 100000000


class Assigned(NamedTuple):
    """The batch's assignment."""
    #: ``(B, N)`` long: 0 negative, ``i + 1`` ground truth ``i``, -1 an
    #: anchor stock does not assign (outside the image).
    gt_inds: Tensor
    #: ``(B,)`` bool: images stock must compute (ties, too few anchors).
    stock: Tensor


def same_level(taken: Sequence[int], device: torch.device) -> Tensor:
    """``(K - 1,)`` bool: whether candidates ``j`` and ``j + 1`` are of one
    level (``taken``: candidates per level)."""
    pairs = []
    for count in filter(None, taken):
        pairs.extend([True] * (count - 1) + [False])
    return to_device(torch.tensor(pairs[:-1], dtype=torch.bool), device)


def centre_inside(anchors: Tensor, cand: Tensor, gt: Tensor) -> Tensor:
    """``(B, K, G)``: candidate ``cand``'s anchor centre is inside its box
    by more than 0.01 (stock's ``min`` of the four distances ``> 0.01``: a
    chain of ``minimum``, exact in any order), as ATSS and TaskAligned
    test it."""
    cx = (anchors[:, 0] + anchors[:, 2]) / 2.0
    cy = (anchors[:, 1] + anchors[:, 3]) / 2.0
    cand_cx, cand_cy = cx[cand], cy[cand]
    nearest_side = torch.minimum(
        torch.minimum(cand_cx - gt[:, None, :, 0],
                      cand_cy - gt[:, None, :, 1]),
        torch.minimum(gt[:, None, :, 2] - cand_cx,
                      gt[:, None, :, 3] - cand_cy))
    return nearest_side > 0.01


def best_gt(overlaps: Tensor, cand: Tensor, is_pos: Tensor,
            values: Tensor) -> tuple:
    """Stock's ``overlaps_inf.max(dim=1)``: per anchor, the highest of
    ``values`` among the boxes it is a positive candidate of (``-INF``
    elsewhere), and that box (the first among equals).

    Args:
        overlaps (Tensor): ``(B, N, G)``, for the shape and dtype.
        cand (Tensor): ``(B, K, G)`` candidate anchors per box.
        is_pos (Tensor): ``(B, K, G)`` positive candidates.
        values (Tensor): ``(B, K, G)`` their IoUs.

    Returns:
        tuple[Tensor, Tensor]: ``(B, N)`` maxima and indices.
    """
    inf = overlaps.new_full(overlaps.shape, -ATSS_INF)
    inf.scatter_(1, cand, torch.where(is_pos, values, -ATSS_INF))
    return inf.max(dim=2)


def _centres(boxes: Tensor) -> Tensor:
    """``bbox_center_distance``'s centre points, ``(..., 2)``."""
    return torch.stack(((boxes[..., 0] + boxes[..., 2]) / 2.0,
                        (boxes[..., 1] + boxes[..., 3]) / 2.0),
                       dim=-1)


def assign_batch(assigner: Any, anchors: Tensor, inside: Tensor,
                 level_sizes: Sequence[int], gt: Tensor, gt_mask: Tensor,
                 counts: Sequence[int]) -> Assigned:
    """Stock's ``gt_inds`` for every image whose result is determined.

    Args:
        assigner: The ``ATSSAssigner`` (``alpha`` None, ``BboxOverlaps2D``).
        anchors (Tensor): ``(N, 4)`` anchors of every level, float32.
        inside (Tensor): ``(B, N)`` bool, the anchors stock assigns.
        level_sizes (Sequence[int]): Anchors per level.
        gt (Tensor): ``(B, G, 4)`` padded ground truths (``G >= 1``).
        gt_mask (Tensor): ``(B, G)`` real ground truths.
        counts (Sequence[int]): Ground truths per image.

    Returns:
        Assigned: The assignment and the images to compute stock's way.
    """
    num_imgs = inside.shape[0]
    topk = assigner.topk
    overlaps = assigner.iou_calculator(
        anchors.unsqueeze(0).expand(num_imgs, -1, -1), gt)  # (B, N, G)
    points = _centres(anchors)
    distances = (points[None, :, None, :] -
                 _centres(gt)[:, None, :, :]).pow(2).sum(-1).sqrt()
    distances = distances.masked_fill(~inside[..., None], float('inf'))

    takens, nexts, lasts, candidates, start = [], [], [], [], 0
    for size in level_sizes:
        near, idx = distances[:, start:start + size].topk(
            min(topk + 1, size), dim=1, largest=False)
        takens.append(near[:, :topk])
        candidates.append(idx[:, :topk] + start)
        if size > topk:  # the last one taken, the nearest one not taken
            lasts.append(near[:, topk - 1:topk])
            nexts.append(near[:, topk:])
        start += size
    taken, cand = torch.cat(takens, dim=1), torch.cat(candidates, dim=1)
    cand_overlaps = overlaps.gather(1, cand)  # (B, K, G)
    # stock's candidates and their order are known when every taken anchor
    # is inside (finite), the first one not taken is farther (boundary), and
    # anchors at equal distances within a level have equal IoUs (their
    # order then changes no sum)
    unsure = ~torch.isfinite(taken).all(1)
    if nexts:
        unsure |= ~(torch.cat(nexts, dim=1) > torch.cat(lasts, dim=1)).all(1)
    bits = cand_overlaps.view(torch.int32)
    tie = (taken[:, 1:] == taken[:, :-1]) & (bits[:, 1:] != bits[:, :-1])
    pairs = same_level([t.shape[1] for t in takens], tie.device)
    unsure |= (tie & pairs[:, None]).any(1)
    thr = thresholds(cand_overlaps, counts)
    is_pos = cand_overlaps >= thr[:, None, :]

    is_pos &= centre_inside(anchors, cand, gt) & gt_mask[:, None, :]
    max_overlaps, argmax = best_gt(overlaps, cand, is_pos, cand_overlaps)
    gt_inds = torch.where(max_overlaps != -ATSS_INF, argmax + 1, 0)
    gt_inds = gt_inds.masked_fill(~inside, -1)
    # no anchor in an image: stock raises its ValueError there
    stock = (unsure & gt_mask).any(1) | ~inside.any(1)
    return Assigned(gt_inds, stock)
