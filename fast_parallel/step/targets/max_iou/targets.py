"""Anchor-head targets of a whole batch: ``AnchorHead.get_targets``, batched.

:func:`anchor_head_targets` returns what ``get_targets`` returns to
``AnchorHead.loss_by_feat`` (mmdet 3.3.0; ``MaxIoUAssigner`` +
``BboxOverlaps2D``, ``PseudoSampler`` or ``RandomSampler``,
``DeltaXYWHBBoxCoder``), bit for bit: labels, label weights, box targets and
box weights per level, each ``(B, n_level)`` a slice of one stacked tensor as
``images_to_levels`` gives it, and the ``avg_factor``. The assignment of
every image is one ``(B, G, N)`` overlap and one
:func:`~fast_parallel.step.targets.max_iou.assign.assign_batch`; the
sampler's draws are stock's (:mod:`.sampling`).
"""
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import replaced_reason, upstream
from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.dynamic_k import nonzero
from fast_parallel.step.targets.max_iou.assign import assign_batch
from fast_parallel.step.targets.max_iou.results import LazyResults
from fast_parallel.step.targets.max_iou.sampling import sample_batch
from fast_parallel.step.targets.padding import images_to_levels, pad_gts

__all__ = [
    'assigner_reason', 'batch_reason', 'encode_deltas', 'anchor_head_targets'
]


def assigner_reason(assigner: Any) -> Optional[str]:
    """None for a ``MaxIoUAssigner`` the batched assignment reproduces."""
    if type(assigner) is not upstream('MaxIoUAssigner'):
        return f'assigner {type(assigner).__name__} is not MaxIoUAssigner'
    why = replaced_reason((assigner, 'MaxIoUAssigner'),
                          label='MaxIoUAssigner.')
    if why:
        return why
    iou = assigner.iou_calculator
    if type(iou) is not upstream('BboxOverlaps2D'):
        return f'iou_calculator {type(iou).__name__} is not BboxOverlaps2D'
    if iou.scale != 1. or iou.dtype is not None:
        return 'BboxOverlaps2D with scale or dtype options'
    if assigner.perm_repeat_gt_cfg is not None:
        return 'MaxIoUAssigner.perm_repeat_gt_cfg is set'
    if assigner.ignore_iof_thr > 0:
        return 'MaxIoUAssigner.ignore_iof_thr > 0 (ignore boxes read)'
    return None


def batch_reason(assigner: Any, priors: Tensor,
                 gts: Sequence[Any]) -> Optional[str]:
    """Why this batch's assignment takes the stock path, or None."""
    device = priors.device
    if type(priors) is not Tensor or priors.dtype != torch.float32 or \
            priors.dim() != 2 or priors.shape[-1] != 4:
        return 'priors not a float32 (N, 4) tensor'
    for gt in gts:
        boxes, labels = gt.bboxes, gt.labels
        if (type(boxes) is not Tensor or boxes.dtype != torch.float32
                or boxes.device != device or boxes.dim() != 2
                or boxes.shape[1] != 4 or type(labels) is not Tensor
                or labels.shape != boxes.shape[:1] or labels.device != device):
            return 'ground truth layout, dtype or device'
        if device.type != 'cpu' and 0 < assigner.gpu_assign_thr < len(boxes):
            return 'gpu_assign_thr: stock assigns on the CPU'
    return None


def encode_deltas(coder: Any, priors: Tensor, gts: Tensor,
                  sizes: Sequence[int]) -> Tensor:
    """``DeltaXYWHBBoxCoder.encode`` of stock's per-image rows, at once.

    ``bbox2delta``'s arithmetic, elementwise, with its two ``log`` calls as
    stock computes them on each image's tensors
    (:func:`~fast_parallel.step.targets.cpu_paths.as_stock`).

    Args:
        coder: The ``DeltaXYWHBBoxCoder``.
        priors (Tensor): ``(M, 4)`` positive priors, images one after the
            other.
        gts (Tensor): ``(M, 4)`` their ground truths.
        sizes (Sequence[int]): Rows per image.

    Returns:
        Tensor: ``(M, 4)`` deltas.
    """
    proposals, gt = priors.float(), gts.float()
    px = (proposals[..., 0] + proposals[..., 2]) * 0.5
    py = (proposals[..., 1] + proposals[..., 3]) * 0.5
    pw = proposals[..., 2] - proposals[..., 0]
    ph = proposals[..., 3] - proposals[..., 1]
    gx = (gt[..., 0] + gt[..., 2]) * 0.5
    gy = (gt[..., 1] + gt[..., 3]) * 0.5
    gw = gt[..., 2] - gt[..., 0]
    gh = gt[..., 3] - gt[..., 1]
    dx = (gx - px) / pw
    dy = (gy - py) / ph
    dw = cpu_paths.as_stock('log', gw / pw, sizes)
    dh = cpu_paths.as_stock('log', gh / ph, sizes)
    deltas = torch.stack([dx, dy, dw, dh], dim=-1)
    means = deltas.new_tensor(coder.means).unsqueeze(0)
    stds = deltas.new_tensor(coder.stds).unsqueeze(0)
    return deltas.sub_(means).div_(stds)


def anchor_head_targets(head: Any, anchors: Tensor, inside: Optional[Tensor],
                        level_sizes: Sequence[int],
                        batch_gt_instances: Sequence[Any]) -> tuple:
    """Stock's ``AnchorHead.get_targets(...)`` for the whole batch.

    Args:
        head: A head :func:`~fast_parallel.step.targets.max_iou.supported`
            accepts (a batch :func:`batch_reason` accepts).
        anchors (Tensor): ``(N, 4)`` anchors of every level.
        inside (Tensor, optional): ``(B, N)`` the anchors stock assigns;
            None: all of them.
        level_sizes (Sequence[int]): Anchors per level.
        batch_gt_instances (Sequence[InstanceData]): Ground truths.

    Returns:
        tuple: ``(labels_list, label_weights_list, bbox_targets_list,
        bbox_weights_list, avg_factor)`` and the lazily built sampling
        results (stock keeps them in ``head._raw_positive_infos``).
    """
    num_imgs, num_anchors = len(batch_gt_instances), anchors.shape[0]
    # one padding column at least: an overlap with no column is undefined
    gt, gt_labels, gt_mask, counts = pad_gts(
        [g.bboxes for g in batch_gt_instances],
        [g.labels for g in batch_gt_instances], anchors.device, 1)
    assigner = head.assigner
    overlaps = assigner.iou_calculator(
        gt,
        anchors.unsqueeze(0).expand(num_imgs, -1, -1))
    if inside is not None:  # stock assigns the inside anchors only
        overlaps = overlaps.masked_fill(~inside[:, None], -1.)
    gt_inds, max_overlaps = assign_batch(assigner, overlaps, gt_mask)
    if inside is not None:
        gt_inds = gt_inds.masked_fill(~inside, -1)
    sampled = sample_batch(head.sampler, gt_inds)
    pos = sampled.pos
    gt_of = (gt_inds - 1).clamp(min=0)
    labels = torch.where(pos,
                         gt_labels.gather(1, gt_of).long(), head.num_classes)
    pos_weight = head.train_cfg['pos_weight']
    weights = torch.where(pos, 1.0 if pos_weight <= 0 else pos_weight,
                          sampled.neg.float())
    flat = nonzero(pos, sum(sampled.num_pos))
    slot = (flat // num_anchors) * gt.shape[1] + gt_of.reshape(-1)[flat]
    pos_gt = gt.reshape(-1, 4)[slot]
    if head.reg_decoded_bbox:
        pos_targets = pos_gt
    else:
        pos_targets = encode_deltas(head.bbox_coder,
                                    anchors[flat % num_anchors], pos_gt,
                                    sampled.num_pos)
    dim = pos_targets.shape[-1]
    bbox_targets = anchors.new_zeros(
        (num_imgs * num_anchors, dim)).index_copy_(0, flat, pos_targets)
    bbox_weights = pos[..., None].to(anchors.dtype).expand(-1, -1, dim)
    with_neg = type(head.sampler) is not upstream('PseudoSampler')
    avg_factor = sum(
        max(p, 1) + (max(n, 1) if with_neg else 0)
        for p, n in zip(sampled.num_pos, sampled.num_neg))
    results = LazyResults(anchors, inside, batch_gt_instances, gt_inds,
                          max_overlaps, gt_labels, sampled, with_neg)
    return (images_to_levels(labels, level_sizes),
            images_to_levels(weights, level_sizes),
            images_to_levels(
                bbox_targets.view(num_imgs, num_anchors, dim), level_sizes),
            images_to_levels(bbox_weights.contiguous(),
                             level_sizes), avg_factor), results
