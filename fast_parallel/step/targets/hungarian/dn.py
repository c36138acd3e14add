"""DINO's denoising targets for a whole batch (``DINOHead.get_dn_targets``).

Stock builds, per image with ``n`` ground truths, ``num_groups`` groups of
``q = num_denoising_queries // num_groups`` queries: query ``g * q + t`` is a
positive of ground truth ``t`` for ``t < n``; everything else is a
background query. Here the query grid of the whole batch is compared with
the counts at once, and the normalised ``cxcywh`` box of each ground truth
(computed once per image, as stock's ``repeat`` copies it) is gathered.
"""
from typing import Any, Dict, Optional, Sequence

import torch

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.hungarian.match import (DETRTargets,
                                                        image_factors)
from fast_parallel.step.targets.padding import Padded, pad_gts, to_device

__all__ = ['dn_targets']


def dn_targets(head: Any,
               gts: Sequence[Any],
               metas: Sequence[dict],
               dn_meta: Dict[str, int],
               pad: Optional[Padded] = None) -> DETRTargets:
    """``head.get_dn_targets``, concatenated over the images.

    Args:
        head: A ``DINOHead``.
        gts (Sequence[InstanceData]): Ground truths per image.
        metas (Sequence[dict]): Image metas (``img_shape``).
        dn_meta (dict): ``num_denoising_queries``, ``num_denoising_groups``.
        pad (Padded, optional): ``gts`` padded (made here if None).

    Returns:
        DETRTargets: Stock's targets; ``num_total_neg`` counts stock's
        ``neg_inds`` (one per positive).
    """
    num_groups = dn_meta['num_denoising_groups']
    num_denoising_queries = dn_meta['num_denoising_queries']
    num_queries_each_group = int(num_denoising_queries / num_groups)
    device = gts[0].bboxes.device
    if pad is None:
        pad = pad_gts([g.bboxes for g in gts], [g.labels for g in gts], device,
                      1)
    batch, width = pad.labels.shape
    counts = to_device(torch.tensor(pad.counts, dtype=torch.long), device)
    query = torch.arange(num_denoising_queries, device=device)
    within = query % num_queries_each_group
    group = query // num_queries_each_group
    # stock's positives: t < n in each of the num_groups groups
    pos = (within[None, :] < counts[:, None]) & (group < num_groups)[None, :]
    slot = within.clamp(max=width - 1)[None, :].expand(batch, -1)
    labels = torch.where(pos,
                         pad.labels.gather(1, slot).long(), head.num_classes)
    label_weights = pad.boxes.new_ones(batch * num_denoising_queries)
    factor = image_factors(pad.boxes, metas)
    normalized = pad.boxes / factor
    targets = upstream('bbox_xyxy_to_cxcywh')(normalized)
    matched = targets.gather(1, slot[..., None].expand(-1, -1, 4))
    # stock's targets and weights are torch.zeros(...): the default dtype
    dtype = torch.get_default_dtype()
    zero = torch.zeros((), dtype=dtype, device=device)
    bbox_targets = torch.where(pos[..., None], matched.to(dtype), zero)
    bbox_weights = pos[..., None].expand(-1, -1, 4).to(dtype)
    total_pos = sum(n * num_groups for n in pad.counts)
    return DETRTargets(
        labels.view(-1), label_weights, bbox_targets.view(-1, 4),
        bbox_weights.reshape(-1, 4), total_pos, total_pos)
