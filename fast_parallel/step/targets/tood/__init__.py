"""``TOODHead.get_targets`` for the whole batch, on one instance.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`get_anchors`
(the ATSS family's) and :func:`get_targets` on one ``TOODHead`` instance.
While ``epoch < initial_epoch`` stock's ``TOODHead.get_targets`` runs
``ATSSHead._get_targets_single`` per image with the ``ATSSAssigner``; the
batched ``get_targets`` returns the same from the ATSS family's batched
path (``norm_alignment_metrics`` are the box weights' first column, as
stock's). From ``initial_epoch`` on stock assigns with
``TaskAlignedAssigner``: :func:`~.aligned.aligned_targets` does it for the
batch (:func:`aligned_reason` says when it cannot, and stock runs, counted).
:func:`~.losses.loss_by_feat` computes every level's losses at once.
Reasoning: ``docs/targets_atss.md``.
"""
from typing import Any, Callable, List, Optional, Sequence

import torch
from mmengine.logging import MessageHub
from torch import Tensor

from fast_parallel.compat.targets import (TARGETS_SINGLE, replaced_reason,
                                          targets_single, upstream)
from fast_parallel.step.targets.atss import (assigner_reason, batched,
                                             get_anchors, head_reason,
                                             stacked_targets)
from fast_parallel.step.targets.cpu_paths import PathModelError
from fast_parallel.step.targets.padding import images_to_levels
from fast_parallel.step.targets.tood.aligned import aligned_targets
from fast_parallel.step.targets.tood.losses import loss_by_feat, loss_part

__all__ = [
    'aligned_reason', 'get_anchors', 'get_targets', 'loss_by_feat',
    'loss_part', 'supported'
]


def supported(head: Any) -> Optional[str]:
    """None when :func:`get_targets` is exact for this head, else why not.

    Args:
        head: A dense head.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    if type(head) is not upstream('TOODHead'):
        return f'{name} is not TOODHead'
    if not getattr(head, 'train_cfg', None) or not hasattr(
            head, 'initial_assigner'):
        return f'{name} has no train_cfg (no assigner)'
    if head.assigner is not head.initial_assigner:
        return 'TOODHead.assigner is not its initial_assigner'
    if not isinstance(head.initial_epoch, int):
        return 'initial_epoch is not an int'
    return assigner_reason(head.initial_assigner) or head_reason(head)


def _stock_targets(cls_scores: Tensor, bbox_preds: Tensor) -> Any:
    """Stock's ``TOODHead.get_targets`` with the ATSS family's argument
    order."""

    def stock(self: Any, anchor_list: list, valid_flag_list: list,
              gts: Sequence[Any], metas: List[dict], ignores: Any,
              unmap_outputs: bool) -> tuple:
        return upstream('TOODHead').get_targets(self, cls_scores, bbox_preds,
                                                anchor_list, valid_flag_list,
                                                gts, metas, ignores,
                                                unmap_outputs)

    return stock


def get_targets(self: Any,
                cls_scores: Tensor,
                bbox_preds: Tensor,
                anchor_list: List[List[Tensor]],
                valid_flag_list: List[List[Tensor]],
                batch_gt_instances: Sequence[Any],
                batch_img_metas: List[dict],
                batch_gt_instances_ignore: Optional[Sequence[Any]] = None,
                unmap_outputs: bool = True) -> tuple:
    """Stock's ``TOODHead.get_targets``, batched in the initial epochs.

    Args:
        self: The ``TOODHead``.
        cls_scores (Tensor): ``(B, N, C)`` scores (read after the initial
            epochs, by stock).
        bbox_preds (Tensor): ``(B, N, 4)`` decoded boxes (the same).
        anchor_list (list[list[Tensor]]): Anchors per image and level.
        valid_flag_list (list[list[Tensor]]): Valid flags, the same way.
        batch_gt_instances (Sequence[InstanceData]): Ground truths.
        batch_img_metas (list[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored instances.
        unmap_outputs (bool): Stock's option; False runs stock's way.

    Returns:
        tuple: ``(anchors_list, labels_list, label_weights_list,
        bbox_targets_list, norm_alignment_metrics_list)``, stock's.
    """
    stock = _stock_targets(cls_scores, bbox_preds)
    epoch = MessageHub.get_current_instance().get_info('epoch')
    if not epoch < self.initial_epoch:  # stock's comparison (and error)
        return _aligned(self, epoch, cls_scores, bbox_preds, anchor_list,
                        valid_flag_list, batch_gt_instances, batch_img_metas,
                        batch_gt_instances_ignore, unmap_outputs, stock)
    self.epoch = epoch  # stock's get_targets sets it for the loss
    return batched(
        self, anchor_list, valid_flag_list, batch_gt_instances,
        batch_img_metas, batch_gt_instances_ignore, unmap_outputs, stock,
        stacked_targets(self, batch_gt_instances, batch_img_metas,
                        getattr(upstream('ATSSHead'), TARGETS_SINGLE),
                        _finish))


def aligned_reason(head: Any) -> Optional[str]:
    """None when the epochs from ``initial_epoch`` on (its
    ``alignment_assigner``) are batched too, else why not."""
    assigner = head.alignment_assigner
    if type(assigner) is not upstream('TaskAlignedAssigner'):
        return f'alignment_assigner {type(assigner).__name__} is not ' \
            'TaskAlignedAssigner'
    why = replaced_reason((assigner, 'TaskAlignedAssigner'),
                          label='TaskAlignedAssigner.')
    if why:
        return why
    iou = assigner.iou_calculator
    if type(iou) is not upstream('BboxOverlaps2D') or iou.scale != 1. or \
            iou.dtype is not None:
        return 'TaskAlignedAssigner.iou_calculator is not a plain ' \
            'BboxOverlaps2D'
    if type(assigner.topk) is not int or assigner.topk < 1:
        return 'TaskAlignedAssigner.topk is not a positive int'
    if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool)
            for v in (head.alpha, head.beta)):
        return 'alpha / beta are not numbers'
    return None


def _predictions_reason(cls_scores: Any, bbox_preds: Any, num_imgs: int,
                        num_anchors: int) -> Optional[str]:
    if type(cls_scores) is not Tensor or type(bbox_preds) is not Tensor or \
            cls_scores.dtype != torch.float32 or \
            bbox_preds.dtype != torch.float32 or cls_scores.dim() != 3 or \
            cls_scores.shape[:2] != (num_imgs, num_anchors) or \
            bbox_preds.shape != (num_imgs, num_anchors, 4) or \
            cls_scores.device != bbox_preds.device:
        return 'predictions not float32 (B, N, C) / (B, N, 4)'
    return None


def _aligned(self: Any, epoch: int, cls_scores: Tensor, bbox_preds: Tensor,
             anchor_list: List[List[Tensor]],
             valid_flag_list: List[List[Tensor]], gts: Sequence[Any],
             metas: List[dict], ignores: Optional[Sequence[Any]],
             unmap_outputs: bool, stock: Callable) -> tuple:
    """The epochs from ``initial_epoch`` on: batched where covered, else
    stock's ``get_targets``; counted."""

    def more_reason(num_anchors: int) -> Optional[str]:
        return aligned_reason(self) or _predictions_reason(
            cls_scores, bbox_preds, len(metas), num_anchors)

    def compute(flat: Tensor, valid: Tensor, sizes: List[int],
                per_image: Sequence[Any], way: Any) -> Optional[tuple]:
        self.epoch = epoch  # stock's get_targets sets it for the loss
        try:
            stacked = aligned_targets(self, cls_scores, bbox_preds, flat,
                                      valid, gts, metas, per_image,
                                      targets_single(self), way)
        except PathModelError:  # this CPU's pow loops are not modelled
            return None
        return tuple(images_to_levels(t, sizes) for t in stacked)

    return batched(self, anchor_list, valid_flag_list, gts, metas, ignores,
                   unmap_outputs, stock, compute, more_reason)


def _finish(stacked: List[Tensor], avg_factor: int, sizes: List[int]) -> tuple:
    """Stock's initial-epoch result: the anchors, labels, label weights and
    box targets per level, and the box weights' first column (stacked as
    stock stacks it, then per level) as the alignment metrics."""
    anchors, labels, label_weights, bbox_targets, bbox_weights = stacked
    return (*(images_to_levels(t, sizes)
              for t in (anchors, labels, label_weights, bbox_targets)),
            images_to_levels(bbox_weights[..., 0].contiguous(), sizes))
