"""Dynamic-k matching of a padded batch: SimOTA's and RTMDet's, as stock.

mmdet's ``SimOTAAssigner.dynamic_k_matching`` and
``DynamicSoftLabelAssigner.dynamic_k_matching`` are the same code: each
ground truth takes the ``k`` cheapest valid priors, ``k`` the truncated sum
of its top ``candidate_topk`` IoUs (at least 1), and a prior taken more than
once keeps its cheapest ground truth. :func:`match` does it for every image
of a padded batch at once and flags an image whose result stock could decide
otherwise (ties at the top-k boundary, equal minima, a sum too close to an
integer, too few valid priors). Why each step is exact:
``docs/targets_yolox.md``.
"""
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ['Assignment', 'host_values', 'match', 'nonzero', 'pairs_of']


def host_values(*tensors: Tensor) -> List[int]:
    """The values of small integer tensors, in one device-to-host copy."""
    return torch.cat([t.reshape(-1).long() for t in tensors]).tolist()


def nonzero(mask: Tensor, size: int) -> Tensor:
    """Flat indices of ``mask``'s True elements, ascending; size known."""
    return torch.nonzero_static(mask.reshape(-1), size=size).squeeze(1)


class Pairs(NamedTuple):
    """Stock's ``(num_valid, num_gt)`` matrices of every image, one after
    the other, row-major: the valid (prior, ground truth) pairs of the padded
    batch in ascending flat order."""
    #: ``(B, N, G)`` bool: the pairs.
    mask: Tensor
    #: ``(P,)`` flat indices into ``(B, N, G)``.
    flat: Tensor
    #: ``(P,)`` image, prior and ground-truth column of each pair.
    imgs: Tensor
    rows: Tensor
    cols: Tensor
    #: Per image: valid priors, and pairs (the numel of stock's matrix).
    num_valid: List[int]
    sizes: List[int]


def pairs_of(valid: Tensor, gt_mask: Tensor, counts: Sequence[int]) -> Pairs:
    """The valid pairs of a batch (one device-to-host read).

    Args:
        valid (Tensor): ``(B, N)`` the priors stock keeps (``valid_mask``).
        gt_mask (Tensor): ``(B, G)`` real (not padding) ground truths.
        counts (Sequence[int]): Ground truths per image.

    Returns:
        Pairs: The pairs and their per-image sizes.
    """
    num_priors, width = valid.shape[1], gt_mask.shape[1]
    num_valid = host_values(valid.sum(1))
    sizes = [v * c for v, c in zip(num_valid, counts)]
    mask = valid.unsqueeze(-1) & gt_mask.unsqueeze(1)
    flat = nonzero(mask, sum(sizes))
    rows, cols = flat // width, flat % width
    return Pairs(mask, flat, rows // num_priors, rows, cols, num_valid, sizes)


class Assignment(NamedTuple):
    """What :func:`match` finds, for every image of the batch."""
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


def match(pairs: Pairs,
          pair_cost: Tensor,
          ious: Tensor,
          gt_mask: Tensor,
          counts: Sequence[int],
          candidate_topk: int,
          inf_is_bad: bool,
          few_pairs: int,
          few_valid_stock: bool = True,
          min_tie_stock: bool = True,
          stock_images: Optional[Tensor] = None) -> Assignment:
    """Dynamic-k matching of every image, from the costs of its pairs.

    Args:
        pairs (Pairs): From :func:`pairs_of`.
        pair_cost (Tensor): ``(P,)`` stock's cost of each pair.
        ious (Tensor): ``(B, N, G)`` IoU of the decoded boxes and the ground
            truths (only the pairs are read).
        gt_mask (Tensor): ``(B, G)`` real ground truths.
        counts (Sequence[int]): Ground truths per image.
        candidate_topk (int): The assigner's ``candidate_topk`` / ``topk``.
        inf_is_bad (bool): Send an image with any non-finite cost the stock
            way (SimOTA, whose costs are finite by construction); else only
            NaN costs, and an infinite cost among the chosen ones or at the
            boundary (RTMDet's soft centre prior overflows far from a large
            box's centre).
        few_pairs (int): An image with fewer pairs than this goes the stock
            way (a reduction of stock's shape may differ; 0: none).
        few_valid_stock (bool): Send an image with fewer valid priors than
            ``candidate_topk`` the stock way, where stock sums fewer IoUs
            for ``k`` (the batched sum adds zeros, and the near-integer check
            covers any order of the same values). Defaults to True (SimOTA,
            as it was first checked).
        min_tie_stock (bool): Send an image the stock way where a prior
            matched more than once has equal cheapest costs. torch documents
            ``min(dim)`` to return the first of equal minima, which the
            padded row (real ground truths first, in stock's order, then
            infinite padding) gives as stock's does; defaults to True all
            the same (SimOTA, as it was first checked).
        stock_images (Tensor, optional): ``(B,)`` bool: images the caller
            sends the stock way, learnt on the host with the flags here (no
            sync of their own). Defaults to None.

    Returns:
        Assignment: Positives, their ground truths and IoUs, fallbacks.
    """
    num_imgs = ious.shape[0]
    cost, bad = _cost_grid(pairs, pair_cost, ious.shape, inf_is_bad)
    if stock_images is not None:
        bad = bad + stock_images.long()
    dynamic_ks, near_int = _dynamic_k(pairs, ious, gt_mask, candidate_topk)
    matching, edge_tie = _cheapest(pairs, cost, dynamic_ks, gt_mask,
                                   candidate_topk, inf_is_bad)
    pos, gt_of, min_tie = _resolve(cost, matching, edge_tie, min_tie_stock)
    # Stock sums (matching * ious) over a row with one 1: the IoU itself,
    # and +0. for a zero of either sign, as "+ 0." gives.
    pos_iou = ious.gather(-1, gt_of.unsqueeze(-1)).squeeze(-1) + 0.
    flags = host_values(bad + edge_tie.long() + min_tie.long() +
                        near_int.long(), pos.sum(1))  # host sync 2 of 2
    fallback = _fallbacks(flags[:num_imgs], pairs, counts,
                          candidate_topk if few_valid_stock else 0, few_pairs)
    return Assignment(pos, gt_of, pos_iou, fallback, flags[num_imgs:], cost,
                      dynamic_ks.squeeze(1))


def _cost_grid(pairs: Pairs, pair_cost: Tensor, shape: torch.Size,
               inf_is_bad: bool) -> Tuple[Tensor, Tensor]:
    """``(B, N, G)`` costs (``inf`` off the pairs) and, per image, how many
    of its pair costs are bad (NaN, or not finite with ``inf_is_bad``)."""
    num_imgs, num_priors, width = shape
    cost = pair_cost.new_full((num_imgs * num_priors * width, ), float('inf'))
    cost[pairs.flat] = pair_cost
    cost = cost.view(num_imgs, num_priors, width)
    bad_cost = ~torch.isfinite(pair_cost) if inf_is_bad else torch.isnan(
        pair_cost)
    bad = torch.zeros(
        num_imgs, dtype=torch.long,
        device=cost.device).index_add_(0, pairs.imgs, bad_cost.long())
    return cost, bad


def _dynamic_k(pairs: Pairs, ious: Tensor, gt_mask: Tensor,
               candidate_topk: int) -> Tuple[Tensor, Tensor]:
    """Each ground truth's k, ``(B, 1, G)``, and per image whether a sum
    was too close to an integer for the order of its terms not to matter.
    """
    # The top candidate_topk IoUs over the valid priors (others are 0 here
    # and, with >= candidate_topk valid priors, never counted).
    topk = min(candidate_topk, ious.shape[1])
    topk_sum = ious.masked_fill(~pairs.mask, 0.).topk(topk, dim=1)[0].sum(1)
    dynamic_ks = torch.clamp(topk_sum.int(), min=1).long().unsqueeze(1)
    # Stock sums the same values in another order (a CPU sum's order depends
    # on the number of columns): any two orders of k values in [0, 1] differ
    # by <= 2 * gamma_(k-1) * k. A sum that close to an integer >= 2 could
    # truncate to another k in stock.
    slack = 4. * topk * topk * 2.**-24
    exact = topk_sum.double()
    near_int = (((exact + slack).floor().clamp(min=1)
                 != (exact - slack).floor().clamp(min=1)) & gt_mask).any(1)
    return dynamic_ks, near_int


def _cheapest(pairs: Pairs, cost: Tensor, dynamic_ks: Tensor, gt_mask: Tensor,
              candidate_topk: int, inf_is_bad: bool) -> Tuple[Tensor, Tensor]:
    """The k cheapest valid priors of each ground truth, ``(B, N, G)``
    uint8, and per image whether the choice ties at its boundary."""
    num_priors = cost.shape[1]
    # ... and the next one: equal costs at the boundary make stock's choice
    # implementation-defined.
    depth = min(candidate_topk + 1, num_priors)
    values, index = cost.topk(depth, dim=1, largest=False)
    rank = torch.arange(depth, device=cost.device).view(1, -1, 1)
    taken = (rank < dynamic_ks) & gt_mask.unsqueeze(1)
    chosen = taken & torch.isfinite(values)
    last = values.gather(1, (dynamic_ks - 1).clamp(max=depth - 1))
    after = values.gather(1, dynamic_ks.clamp(max=depth - 1))
    edge_tie = ((last == after) & (dynamic_ks < depth) & torch.isfinite(last)
                & gt_mask.unsqueeze(1)).flatten(1).any(1)
    if not inf_is_bad:  # an infinite cost chosen: ties with the padding
        # (an image without valid priors has only padding: stock's early
        # return, every prior background, which is what is left here)
        has_valid = pairs.mask.flatten(1).any(1)
        edge_tie |= (taken & ~torch.isfinite(values)).flatten(1).any(1) & \
            has_valid
    matching = torch.zeros_like(
        cost, dtype=torch.uint8).scatter_(1, index, chosen.to(torch.uint8))
    return matching, edge_tie


def _resolve(cost: Tensor, matching: Tensor, edge_tie: Tensor,
             min_tie_stock: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """Positives ``(B, N)``, their ground truth, and per image whether a
    prior matched more than once has equal cheapest costs."""
    # A prior matched more than once keeps its cheapest ground truth (the
    # first of equal minima, as torch documents min(dim)).
    matches = matching.sum(-1)
    multiple = matches > 1
    min_cost, argmin = cost.min(-1)
    if min_tie_stock:
        min_tie = (multiple &
                   ((cost == min_cost.unsqueeze(-1)).sum(-1) > 1)).any(-1)
    else:
        min_tie = torch.zeros_like(edge_tie)
    gt_of = torch.where(multiple, argmin, matching.argmax(-1))
    return matches > 0, gt_of, min_tie


def _fallbacks(flags: Sequence[int], pairs: Pairs, counts: Sequence[int],
               few_valid: int, few_pairs: int) -> List[bool]:
    """Per image: whether stock must compute it. Besides a flag, fewer valid
    priors than ``few_valid`` (stock sums fewer IoUs; CUDA's reduction tree
    depends on how many) or fewer pairs than ``few_pairs``."""
    return [
        flags[i] > 0 or counts[i] > 0 and
        (0 < pairs.num_valid[i] < few_valid or 0 < pairs.sizes[i] < few_pairs)
        for i in range(len(counts))
    ]
