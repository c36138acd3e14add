"""The RoI head's assign + sample for the whole batch (``StandardRoIHead``).

Stock's ``StandardRoIHead.loss`` assigns each image's proposals to its
ground truths (``MaxIoUAssigner``) and samples them (``RandomSampler``, the
ground truths added as proposals first), image by image. :func:`sample_rois`
assigns every image in one ``(B, G, P)`` overlap, makes the sampler's draws
as stock does (same sizes, same order, same generator) and returns each
image's ``SamplingResult``, equal to stock's field by field, for stock's own
``bbox_loss`` and ``mask_loss``.
"""
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import SAMPLING_RESULT_FIELDS, upstream
from fast_parallel.step.targets.dynamic_k import nonzero
from fast_parallel.step.targets.max_iou.assign import assign_batch
from fast_parallel.step.targets.max_iou.sampling import (sample_batch,
                                                         sampler_reason)
from fast_parallel.step.targets.max_iou.targets import assigner_reason
from fast_parallel.step.targets.padding import pad_gts, pad_rows, to_device
from fast_parallel.step.targets.stock_way import batch_targets

__all__ = [
    'batch_reason', 'roi_samples', 'sample_rois', 'sampling_reason',
    'sampling_results'
]


def sampling_reason(assigner: Any, sampler: Any) -> Optional[str]:
    """None for an RoI head's assigner and sampler :func:`sample_rois`
    reproduces (``MaxIoUAssigner``, ``RandomSampler``), else why not."""
    why = assigner_reason(assigner) or sampler_reason(sampler)
    if why is None and type(sampler) is not upstream('RandomSampler'):
        why = f'sampler {type(sampler).__name__} is not RandomSampler'
    return why


def roi_samples(head: Any,
                x: Sequence[Tensor],
                results_list: Sequence[Any],
                batch_gt_instances: Sequence[Any],
                batch_gt_instances_ignore: Sequence[Any],
                stage: Optional[int] = None,
                if_present: bool = False) -> List[Any]:
    """What stock's RoI ``loss`` gets from its assign + sample loop: each
    image's ``bboxes`` renamed ``priors`` (as stock renames them), then the
    sampling results of :func:`sample_rois`, or, for a batch
    :func:`batch_reason` rules out, stock's own loop (counted).

    Args:
        head: The switched ``StandardRoIHead`` or ``CascadeRoIHead``.
        x (Sequence[Tensor]): Multi-level features.
        results_list (Sequence[InstanceData]): Boxes per image (``bboxes``).
        batch_gt_instances (Sequence[InstanceData]): Ground truths.
        batch_gt_instances_ignore (Sequence): Ignored boxes per image.
        stage (int, optional): The cascade stage; None: the head's only
            assigner and sampler.
        if_present (bool): Rename ``bboxes`` only where an image has them
            (HTC's first loop); else every image must. Defaults to False.

    Returns:
        list[SamplingResult]: Stock's, image by image.
    """
    assigner, sampler = head.bbox_assigner, head.bbox_sampler
    if stage is not None:
        assigner, sampler = assigner[stage], sampler[stage]
    num_imgs = len(results_list)
    for results in results_list:
        # rename rpn_results.bboxes to rpn_results.priors
        if not if_present or 'bboxes' in results:
            results.priors = results.pop('bboxes')
    proposals = [results.priors for results in results_list]
    with batch_targets(head, num_imgs) as stock_way:
        if batch_reason(assigner, proposals, batch_gt_instances) is None:
            return sample_rois(head, proposals, batch_gt_instances, stage)
        stock_way.count(num_imgs)
        return _stock_samples(assigner, sampler, x, results_list,
                              batch_gt_instances, batch_gt_instances_ignore)


def _stock_samples(assigner: Any, sampler: Any, x: Sequence[Tensor],
                   results_list: Sequence[Any],
                   batch_gt_instances: Sequence[Any],
                   batch_gt_instances_ignore: Sequence[Any]) -> List[Any]:
    """Stock's loop: one ``assign`` and one ``sample`` per image (the
    images' ``bboxes`` already renamed ``priors``).

    Args:
        assigner: The (stage's) bbox assigner.
        sampler: The (stage's) bbox sampler.
        x (Sequence[Tensor]): Multi-level features.
        results_list (Sequence[InstanceData]): Proposals per image.
        batch_gt_instances (Sequence[InstanceData]): Ground truths.
        batch_gt_instances_ignore (Sequence): Ignored boxes per image.

    Returns:
        list[SamplingResult]: Stock's, image by image.
    """
    sampling_results = []
    for i, results in enumerate(results_list):
        assign_result = assigner.assign(results, batch_gt_instances[i],
                                        batch_gt_instances_ignore[i])
        sampling_results.append(
            sampler.sample(
                assign_result,
                results,
                batch_gt_instances[i],
                feats=[lvl_feat[i][None] for lvl_feat in x]))
    return sampling_results


def batch_reason(assigner: Any, proposals: Sequence[Tensor],
                 gts: Sequence[Any]) -> Optional[str]:
    """Why this batch's RoI targets take the stock path, or None."""
    if not proposals:
        return 'no image'
    device = proposals[0].device
    for rois, gt in zip(proposals, gts):
        boxes, labels = gt.bboxes, gt.labels
        if (type(rois) is not Tensor or rois.dtype != torch.float32
                or rois.device != device or rois.dim() != 2
                or rois.shape[1] != 4 or type(boxes) is not Tensor
                or boxes.dtype != torch.float32 or boxes.device != device
                or boxes.dim() != 2 or boxes.shape[1] != 4
                or type(labels) is not Tensor
                or labels.shape != boxes.shape[:1] or labels.device != device):
            return 'proposal or ground truth layout, dtype or device'
        if device.type != 'cpu' and 0 < assigner.gpu_assign_thr < len(boxes):
            return 'gpu_assign_thr: stock assigns on the CPU'
    return None


def _ragged_index(gt_counts: Sequence[int], roi_counts: Sequence[int],
                  gt_width: int, width: int, add_gts: bool,
                  device: torch.device) -> Tensor:
    """``(2, T)``: the grid positions of each image's priors in stock's
    order (its ground truths when added, then its proposals), and each one's
    index within its image; one copy to the device."""
    index: List[int] = []
    local: List[int] = []
    for i, (g, p) in enumerate(zip(gt_counts, roi_counts)):
        base = i * width
        if add_gts and g:
            index.extend(range(base, base + g))
        index.extend(range(base + gt_width, base + gt_width + p))
        local.extend(range(len(index) - len(local)))
    return to_device(torch.tensor([index, local], dtype=torch.long), device)


def sample_rois(head: Any,
                proposals: Sequence[Tensor],
                gts: Sequence[Any],
                stage: Optional[int] = None,
                if_present: bool = False) -> List[Any]:
    """Each image's ``bbox_sampler.sample(bbox_assigner.assign(...))``.

    Args:
        head: A ``StandardRoIHead`` the package's ``supported`` accepts, or
            a ``CascadeRoIHead`` the cascade package's accepts.
        proposals (Sequence[Tensor]): ``(P_i, 4)`` proposals per image.
        gts (Sequence[InstanceData]): Ground truths per image.
        stage (int, optional): The cascade stage whose assigner and
            sampler (``head.bbox_assigner[stage]``...) to use; None: the
            head's only ones.

    Returns:
        list[SamplingResult]: Stock's, image by image.
    """
    device = proposals[0].device
    num_imgs = len(proposals)
    gt, gt_labels, gt_mask, gt_counts = pad_gts([g.bboxes for g in gts],
                                                [g.labels for g in gts],
                                                device, 1)
    rois, roi_mask = pad_rows(proposals, device, 1)
    roi_counts = [int(p.shape[0]) for p in proposals]
    assigner, sampler = head.bbox_assigner, head.bbox_sampler
    if stage is not None:
        assigner, sampler = assigner[stage], sampler[stage]
    overlaps = assigner.iou_calculator(gt, rois)
    overlaps = overlaps.masked_fill(~roi_mask[:, None], -1.)
    # (its max overlaps: no SamplingResult field)
    gt_inds, _ = assign_batch(assigner, overlaps, gt_mask)
    gt_of = (gt_inds - 1).clamp(min=0)
    labels = torch.where(gt_inds > 0, gt_labels.gather(1, gt_of), -1)
    gt_inds = gt_inds.masked_fill(~roi_mask, -1)
    add_gts = sampler.add_gt_as_proposals
    gt_width = gt.shape[1]
    if add_gts:  # stock's add_gt_: the ground truths first, as proposals
        own = torch.arange(1, gt_width + 1, device=device).expand(num_imgs, -1)
        gt_inds = torch.cat([own.masked_fill(~gt_mask, -1), gt_inds], 1)
        labels = torch.cat([gt_labels, labels], 1)
        priors = torch.cat([gt, rois], 1)
        flags = torch.cat([
            gt_mask.to(torch.uint8),
            torch.zeros_like(roi_mask, dtype=torch.uint8)
        ], 1)
    else:
        priors, gt_width = rois, 0
        flags = torch.zeros_like(roi_mask, dtype=torch.uint8)
    sampled = sample_batch(sampler, gt_inds)
    width = gt_inds.shape[1]
    index, local = _ragged_index(gt_counts, roi_counts, gt_width, width,
                                 add_gts, device)
    # every image's priors, one after the other in stock's order
    cat_priors, cat_gt_inds, cat_labels, cat_flags = (
        t.reshape(-1, *t.shape[2:])[index]
        for t in (priors, gt_inds, labels, flags))
    # stock's pos_inds / neg_inds: ascending indices within each image
    pos_at = nonzero(sampled.pos.reshape(-1)[index], sum(sampled.num_pos))
    neg_at = nonzero(sampled.neg.reshape(-1)[index], sum(sampled.num_neg))
    assigned = cat_gt_inds[pos_at] - 1
    rows = _gt_rows(sampled.num_pos, gt.shape[1], device)
    fields = dict(
        pos_inds=local[pos_at],
        neg_inds=local[neg_at],
        pos_priors=cat_priors[pos_at],
        neg_priors=cat_priors[neg_at],
        pos_is_gt=cat_flags[pos_at],
        pos_assigned_gt_inds=assigned,
        pos_gt_labels=cat_labels[pos_at],
        pos_gt_bboxes=gt.reshape(-1, 4)[rows + assigned])
    return sampling_results(
        {
            name:
            value.split(
                sampled.num_neg if name.startswith('neg') else sampled.num_pos)
            for name, value in fields.items()
        }, [g.bboxes for g in gts])


def _gt_rows(num_pos: Sequence[int], width: int,
             device: torch.device) -> Tensor:
    """Each positive's image's first row in the padded ground truths
    ``(B * width, 4)``; one copy to the device."""
    rows: List[int] = []
    for i, count in enumerate(num_pos):
        rows.extend([i * width] * count)
    return to_device(torch.tensor(rows, dtype=torch.long), device)


def sampling_results(fields: Dict[str, Sequence[Tensor]],
                     gt_bboxes: Sequence[Tensor]) -> List[Any]:
    """Each image's ``SamplingResult``, its fields set as stock's
    ``SamplingResult.__init__`` sets them (``avg_factor_with_neg=True``, as
    ``RandomSampler`` makes them), from per-image views of batch-wide
    tensors (:data:`~fast_parallel.compat.targets.SAMPLING_RESULT_FIELDS`).

    Args:
        fields (dict[str, Sequence[Tensor]]): Per image: ``pos_inds``,
            ``neg_inds``, ``pos_priors``, ``neg_priors``, ``pos_is_gt``,
            ``pos_assigned_gt_inds``, ``pos_gt_labels``, ``pos_gt_bboxes``.
        gt_bboxes (Sequence[Tensor]): Each image's ``(G, 4)`` ground truths.

    Returns:
        list[SamplingResult]: Stock's, image by image.
    """
    cls = upstream('SamplingResult')
    results = []
    for i, boxes in enumerate(gt_bboxes):
        result = cls.__new__(cls)
        values = {name: parts[i] for name, parts in fields.items()}
        num_pos = max(values['pos_inds'].numel(), 1)
        num_neg = max(values['neg_inds'].numel(), 1)
        values.update(
            num_pos=num_pos,
            num_neg=num_neg,
            avg_factor_with_neg=True,
            avg_factor=num_pos + num_neg,
            num_gts=boxes.shape[0])
        if boxes.numel() == 0:  # stock's view of the empty ground truths
            values['pos_gt_bboxes'] = boxes.view(-1, 4)
        vars(result).update(
            (name, values[name]) for name in SAMPLING_RESULT_FIELDS)
        results.append(result)
    return results
