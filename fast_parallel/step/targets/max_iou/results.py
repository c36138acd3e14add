"""Stock's ``AssignResult`` / ``SamplingResult`` of one image, from a batch.

Stock's anchor heads keep each image's sampling result in
``head._raw_positive_infos`` (``get_positive_infos`` reads them for some
instance-segmentation detectors). :class:`LazyResults` holds what the
batched targets computed and builds image ``i``'s results, equal to stock's,
only when someone asks for them.
"""
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import upstream

__all__ = ['LazyResults', 'sampling_result']


def sampling_result(pos: Tensor, neg: Tensor, priors: Tensor, gts: Any,
                    gt_inds: Tensor, max_overlaps: Tensor, labels: Tensor,
                    gt_flags: Tensor, with_neg: bool) -> Any:
    """An image's ``SamplingResult``, as its sampler builds it.

    Args:
        pos (Tensor): ``(n,)`` bool, the sampled positives among ``priors``.
        neg (Tensor): ``(n,)`` bool, the sampled negatives.
        priors (Tensor): ``(n, 4)`` the image's priors (stock's order).
        gts (InstanceData): The image's ground truths.
        gt_inds (Tensor): ``(n,)`` the assignment's ``gt_inds``.
        max_overlaps (Tensor): ``(n,)`` its ``max_overlaps``.
        labels (Tensor): ``(n,)`` its ``labels``.
        gt_flags (Tensor): ``(n,)`` uint8, 1 where a prior is a ground truth.
        with_neg (bool): ``avg_factor_with_neg`` (``RandomSampler``'s True,
            ``PseudoSampler``'s False).

    Returns:
        SamplingResult: With its ``AssignResult``.
    """
    assign = upstream('AssignResult')(
        num_gts=len(gts.bboxes),
        gt_inds=gt_inds,
        max_overlaps=max_overlaps,
        labels=labels)
    return upstream('SamplingResult')(
        pos_inds=torch.nonzero(pos).squeeze(-1),
        neg_inds=torch.nonzero(neg).squeeze(-1),
        priors=priors,
        gt_bboxes=gts.bboxes,
        assign_result=assign,
        gt_flags=gt_flags,
        avg_factor_with_neg=with_neg)


class LazyResults(Sequence):
    """The images' ``SamplingResult`` of an anchor head, built on access.

    Args:
        priors (Tensor): ``(N, 4)`` anchors.
        inside (Tensor, optional): ``(B, N)`` the anchors stock assigns.
        gts (Sequence[InstanceData]): Ground truths per image.
        gt_inds (Tensor): ``(B, N)`` the assignment (-1 outside).
        max_overlaps (Tensor): ``(B, N)``.
        gt_labels (Tensor): ``(B, G)`` padded labels.
        sampled (Sampled): The sampler's positives and negatives.
        with_neg (bool): The sampler's ``avg_factor_with_neg``.
    """

    def __init__(self, priors: Tensor, inside: Optional[Tensor],
                 gts: Sequence[Any], gt_inds: Tensor, max_overlaps: Tensor,
                 gt_labels: Tensor, sampled: Any, with_neg: bool) -> None:
        self.priors, self.inside, self.gts = priors, inside, gts
        self.gt_inds, self.max_overlaps = gt_inds, max_overlaps
        self.gt_labels, self.sampled, self.with_neg = (gt_labels, sampled,
                                                       with_neg)
        self._built: dict = {}

    def __len__(self) -> int:
        return len(self.gts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        i = range(len(self))[i]
        if i not in self._built:
            keep = slice(None) if self.inside is None else self.inside[i]
            gt_inds = self.gt_inds[i][keep]
            labels = torch.where(
                gt_inds > 0,
                self.gt_labels[i].gather(0, (gt_inds - 1).clamp(min=0)),
                -1).long()
            priors = self.priors[keep]
            self._built[i] = sampling_result(
                self.sampled.pos[i][keep], self.sampled.neg[i][keep], priors,
                self.gts[i], gt_inds, self.max_overlaps[i][keep], labels,
                priors.new_zeros(priors.shape[0],
                                 dtype=torch.uint8), self.with_neg)
        return self._built[i]
