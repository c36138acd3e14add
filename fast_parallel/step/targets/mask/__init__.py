"""``FCNMaskHead.get_targets`` for the whole batch, on one instance.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`get_targets`
on one ``FCNMaskHead`` / ``HTCMaskHead`` instance (Mask R-CNN, Cascade Mask
R-CNN, HTC; ``HTCMaskHead`` changes only ``forward``) in place of
the class's; it returns :func:`mask_targets`, stock's ``mask_target`` result
bit for bit. A batch it does not cover (polygon masks, masks of different
sizes...) runs stock's ``get_targets``, counted. Reasoning:
``docs/targets_mask.md``.
"""
from typing import Any, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from fast_parallel.compat.targets import replaced_reason, upstream
from fast_parallel.step.targets.padding import to_device
from fast_parallel.step.targets.stock_way import batch_targets

__all__ = ['batch_reason', 'get_targets', 'mask_targets', 'supported']


def supported(head: Any) -> Optional[str]:
    """None when :func:`get_targets` is exact for this head, else why not.

    Args:
        head: A module that computes targets.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    fcn = upstream('FCNMaskHead')
    if type(head) not in (fcn, upstream('HTCMaskHead')):
        return f'{name} is not FCNMaskHead or HTCMaskHead'
    if type(head).get_targets is not fcn.get_targets:
        return f'{name} has its own get_targets'
    return replaced_reason((head, 'FCNMaskHead'))


def batch_reason(results: Sequence[Any], gts: Sequence[Any],
                 cfg: Any) -> Optional[str]:
    """Why this batch's mask targets take the stock path, or None."""
    if not results or len(results) != len(gts):
        return 'an empty batch, or lists of other lengths'
    if not isinstance(cfg.get('mask_size', None), (int, tuple, list)):
        return 'rcnn_train_cfg.mask_size is not an int or a pair'
    if any(not hasattr(gt, 'masks') for gt in gts):
        return 'ground truths without masks'
    masks = [gt.masks for gt in gts]
    bitmaps = upstream('BitmapMasks')
    if any(type(m) is not bitmaps for m in masks):
        return 'masks are not BitmapMasks'
    first = masks[0]
    if any(
        (m.height, m.width) != (first.height, first.width) or not isinstance(
            m.masks, np.ndarray) or m.masks.ndim != 3 or m.masks.shape[1:] != (
                m.height, m.width) or m.masks.dtype != first.masks.dtype
            for m in masks):
        return 'masks of different sizes or dtypes (not padded to the batch)'
    device = results[0].pos_priors.device
    for result, gt, mask in zip(results, gts, masks):
        priors, inds = result.pos_priors, result.pos_assigned_gt_inds
        if (type(priors) is not Tensor or priors.dtype != torch.float32
                or priors.dim() != 2 or priors.shape[1] != 4
                or priors.device != device or type(inds) is not Tensor
                or inds.dtype != torch.long or inds.device != device
                or inds.shape != priors.shape[:1]):
            return 'positive priors not float32 (n, 4) with long indices'
        if len(mask) != len(gt.bboxes):
            return 'masks and boxes of different counts'
    return None


def _mask_size(cfg: Any) -> tuple:
    size = cfg.mask_size
    return (size, size) if isinstance(size, int) else tuple(size)


def mask_targets(results: Sequence[Any], gts: Sequence[Any],
                 cfg: Any) -> Tensor:
    """Stock's ``mask_target`` of a batch whose masks share one size.

    Every image's positive proposals, clipped to the masks' size, in one
    ``roi_align`` over all images' masks (each RoI reads its own mask
    only), each RoI's ground truth found at its image's offset.

    Args:
        results (Sequence[SamplingResult]): Sampling results per image.
        gts (Sequence[InstanceData]): Ground truths with ``masks``.
        cfg: The RoI head's ``train_cfg`` (``mask_size``,
            ``soft_mask_target``).

    Returns:
        Tensor: ``(num_pos, h, w)`` float32 targets, images in order.
    """
    size = _mask_size(cfg)
    proposals = torch.cat([r.pos_priors for r in results])
    num_pos = [r.pos_priors.shape[0] for r in results]
    if not sum(num_pos):
        return proposals.new_zeros((0, ) + size)
    device = proposals.device
    masks = [gt.masks for gt in gts]
    height, width = masks[0].height, masks[0].width
    bounds = to_device(
        torch.tensor([width, height, width, height], dtype=torch.float32),
        device)
    clipped = proposals.clamp(min=0).minimum(bounds)
    offsets, start = [], 0
    for count, mask in zip(num_pos, masks):
        offsets.extend([start] * count)
        start += len(mask)
    inds = torch.cat([r.pos_assigned_gt_inds for r in results]) + to_device(
        torch.tensor(offsets, dtype=torch.long), device)
    every = torch.from_numpy(np.concatenate([m.masks for m in masks]))
    fake_inds = torch.arange(
        clipped.shape[0], device=device).to(dtype=clipped.dtype)[:, None]
    rois = torch.cat([fake_inds, clipped], dim=1)
    chosen = every.to(device).index_select(0, inds).to(dtype=rois.dtype)
    targets = upstream('roi_align')(chosen[:, None], rois, size, 1.0, 0, 'avg',
                                    True).squeeze(1)
    if cfg.get('soft_mask_target', False):
        return targets.float()
    return (targets >= 0.5).float()


def get_targets(self: Any, sampling_results: List[Any],
                batch_gt_instances: Sequence[Any],
                rcnn_train_cfg: Any) -> Tensor:
    """Stock's ``FCNMaskHead.get_targets``, batched.

    Args:
        self: The ``FCNMaskHead``.
        sampling_results (list[SamplingResult]): Per image.
        batch_gt_instances (Sequence[InstanceData]): With ``masks``.
        rcnn_train_cfg: The RoI head's ``train_cfg``.

    Returns:
        Tensor: The positives' mask targets, stock's.
    """
    with batch_targets(self, len(batch_gt_instances)) as way:
        why = batch_reason(sampling_results, batch_gt_instances,
                           rcnn_train_cfg)
        if why is None:
            return mask_targets(sampling_results, batch_gt_instances,
                                rcnn_train_cfg)
        way.count(len(batch_gt_instances))
        return upstream('FCNMaskHead').get_targets(
            self,
            sampling_results=sampling_results,
            batch_gt_instances=batch_gt_instances,
            rcnn_train_cfg=rcnn_train_cfg)
