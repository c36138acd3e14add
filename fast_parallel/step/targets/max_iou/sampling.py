"""mmdet's ``PseudoSampler`` and ``RandomSampler`` for a padded batch.

Stock samples each image on its own: ``RandomSampler`` draws a
``torch.randperm`` over the positive candidates when there are more than it
wants, then over the negatives, image after image, from torch's global CPU
generator. :func:`sample_batch` makes the same draws, of the same sizes, in
the same order, from the same generator (the candidate counts come to the
host in one read), and picks the same priors: the chosen set of an image is
``sorted(candidates[perm[:k]])``, which is what stock's
``gallery[perm].unique()`` is.
"""
from typing import Any, List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import replaced_reason, upstream
from fast_parallel.step.targets.dynamic_k import host_values, nonzero
from fast_parallel.step.targets.padding import to_device

__all__ = ['Sampled', 'sample_batch', 'sampler_reason']


class Sampled(NamedTuple):
    """The sampled priors of every image."""
    #: ``(B, N)`` bool: sampled positives and negatives.
    pos: Tensor
    neg: Tensor
    #: Per image: how many of each (``pos_inds.numel()`` etc.).
    num_pos: List[int]
    num_neg: List[int]


def sampler_reason(sampler: Any) -> Optional[str]:
    """None for a sampler :func:`sample_batch` reproduces, else why not."""
    if type(sampler) is upstream('PseudoSampler'):
        return None
    if type(sampler) is not upstream('RandomSampler'):
        return f'sampler {type(sampler).__name__} is not PseudoSampler or ' \
            'RandomSampler'
    if sampler.pos_sampler is not sampler or sampler.neg_sampler is not \
            sampler:
        return 'RandomSampler with other pos/neg samplers'
    return replaced_reason((sampler, 'RandomSampler'), label='RandomSampler.')


def _draws(sampler: Any, num_pos: Sequence[int],
           num_neg: Sequence[int]) -> tuple:
    """Stock's draws, image by image: which candidates each keeps.

    Returns:
        tuple: Per image, the kept positions among its positive candidates
        and among its negative ones (None: all), and the counts.
    """
    expected_pos = int(sampler.num * sampler.pos_fraction)
    picks, counts = [], []
    for pos, neg in zip(num_pos, num_neg):
        pick_pos = pick_neg = None
        kept_pos = pos
        if pos > expected_pos:
            pick_pos = torch.randperm(pos)[:expected_pos].tolist()
            kept_pos = expected_pos
        expected_neg = sampler.num - kept_pos
        if sampler.neg_pos_ub >= 0:
            bound = int(sampler.neg_pos_ub * max(1, kept_pos))
            expected_neg = min(expected_neg, bound)
        kept_neg = neg
        if neg > expected_neg:
            pick_neg = torch.randperm(neg)[:expected_neg].tolist()
            kept_neg = expected_neg
        picks.append((pick_pos, pick_neg))
        counts.append((kept_pos, kept_neg))
    return picks, counts


def _chosen(candidates: Tensor, counts: Sequence[int],
            picks: Sequence[Optional[list]], size: int) -> Tensor:
    """A flat ``(size,)`` mask of the chosen candidates of every image."""
    index, start = [], 0
    for count, pick in zip(counts, picks):
        index.extend(
            range(start, start +
                  count) if pick is None else [start + p for p in pick])
        start += count
    device = candidates.device
    index_t = to_device(torch.tensor(index, dtype=torch.long), device)
    mask = torch.zeros(size, dtype=torch.bool, device=device)
    return mask.index_fill_(0, candidates[index_t], True)


def sample_batch(sampler: Any, gt_inds: Tensor) -> Sampled:
    """The samples stock's ``sampler.sample`` keeps in each image.

    Args:
        sampler: A sampler :func:`sampler_reason` accepts.
        gt_inds (Tensor): ``(B, N)`` long, each image's ``gt_inds`` in
            stock's order of priors: ``> 0`` positive candidates, ``0``
            negative ones, ``-1`` neither (ignored, or no prior there).

    Returns:
        Sampled: The positives and negatives kept, per image.
    """
    num_imgs, num_priors = gt_inds.shape
    is_pos, is_neg = gt_inds > 0, gt_inds == 0
    counts = host_values(is_pos.sum(1), is_neg.sum(1))
    num_pos, num_neg = counts[:num_imgs], counts[num_imgs:]
    if type(sampler) is upstream('PseudoSampler'):
        return Sampled(is_pos, is_neg, num_pos, num_neg)
    picks, kept = _draws(sampler, num_pos, num_neg)
    size = num_imgs * num_priors
    pos = _chosen(
        nonzero(is_pos, sum(num_pos)), num_pos, [p for p, _ in picks], size)
    neg = _chosen(
        nonzero(is_neg, sum(num_neg)), num_neg, [n for _, n in picks], size)
    return Sampled(
        pos.view(num_imgs, num_priors), neg.view(num_imgs, num_priors),
        [p for p, _ in kept], [n for _, n in kept])
