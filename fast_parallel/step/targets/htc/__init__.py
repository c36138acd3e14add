"""``HybridTaskCascadeRoIHead.loss`` with each stage's assign + sample
batched.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`loss` on one
``HybridTaskCascadeRoIHead`` instance (HTC) in place of the class's: mmdet
3.3.0's body, line for line, except that every assign + sample loop
(each stage's, and the interleaved one after a stage's refinement) is the
RoI family's :func:`~fast_parallel.step.targets.roi.targets.roi_samples`
(each stage's ``MaxIoUAssigner`` and ``RandomSampler``, the draws in stock's
order), as Cascade R-CNN's. The semantic head, ``bbox_loss``, ``mask_loss``
and the refinement are the head's own.
"""
from typing import Any, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.cascade import stages_reason
from fast_parallel.step.targets.roi.targets import roi_samples

__all__ = ['loss', 'supported']


def supported(head: Any) -> Optional[str]:
    """None when :func:`loss` is exact for this RoI head, else why not.

    Args:
        head: A module that computes targets.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    if type(head) is not upstream('HybridTaskCascadeRoIHead'):
        return f'{name} is not HybridTaskCascadeRoIHead'
    return stages_reason(head)


def loss(self: Any, x: Tuple[Tensor], rpn_results_list: Sequence[Any],
         batch_data_samples: Sequence[Any]) -> dict:
    """Stock's ``HybridTaskCascadeRoIHead.loss``, the assign + sample loops
    batched.

    Args:
        self: The ``HybridTaskCascadeRoIHead``.
        x (tuple[Tensor]): Multi-level features.
        rpn_results_list (Sequence[InstanceData]): Proposals per image.
        batch_data_samples (Sequence[DetDataSample]): The batch's samples.

    Returns:
        dict[str, Tensor]: The losses stock computes.
    """
    assert len(rpn_results_list) == len(batch_data_samples)
    outputs = upstream('unpack_gt_instances')(batch_data_samples)
    batch_gt_instances, batch_gt_instances_ignore, batch_img_metas \
        = outputs

    # semantic segmentation part
    # 2 outputs: segmentation prediction and embedded features
    losses = dict()
    if self.with_semantic:
        gt_semantic_segs = [
            data_sample.gt_sem_seg.sem_seg
            for data_sample in batch_data_samples
        ]
        gt_semantic_segs = torch.stack(gt_semantic_segs)
        semantic_pred, semantic_feat = self.semantic_head(x)
        loss_seg = self.semantic_head.loss(semantic_pred, gt_semantic_segs)
        losses['loss_semantic_seg'] = loss_seg
    else:
        semantic_feat = None

    results_list = rpn_results_list
    for stage in range(self.num_stages):
        self.current_stage = stage

        stage_loss_weight = self.stage_loss_weights[stage]

        # assign gts and sample proposals
        sampling_results = roi_samples(
            self,
            x,
            results_list,
            batch_gt_instances,
            batch_gt_instances_ignore,
            stage,
            if_present=True)

        # bbox head forward and loss
        bbox_results = self.bbox_loss(
            stage=stage,
            x=x,
            sampling_results=sampling_results,
            semantic_feat=semantic_feat)

        for name, value in bbox_results['loss_bbox'].items():
            losses[f's{stage}.{name}'] = (
                value * stage_loss_weight if 'loss' in name else value)

        # mask head forward and loss
        if self.with_mask:
            # interleaved execution: use regressed bboxes by the box branch
            # to train the mask branch
            if self.interleaved:
                bbox_head = self.bbox_head[stage]
                with torch.no_grad():
                    results_list = bbox_head.refine_bboxes(
                        sampling_results, bbox_results, batch_img_metas)
                    # re-assign and sample 512 RoIs from 512 RoIs
                    sampling_results = roi_samples(self, x, results_list,
                                                   batch_gt_instances,
                                                   batch_gt_instances_ignore,
                                                   stage)
            mask_results = self.mask_loss(
                stage=stage,
                x=x,
                sampling_results=sampling_results,
                batch_gt_instances=batch_gt_instances,
                semantic_feat=semantic_feat)
            for name, value in mask_results['loss_mask'].items():
                losses[f's{stage}.{name}'] = (
                    value * stage_loss_weight if 'loss' in name else value)

        # refine bboxes (same as Cascade R-CNN)
        if stage < self.num_stages - 1 and not self.interleaved:
            bbox_head = self.bbox_head[stage]
            with torch.no_grad():
                results_list = bbox_head.refine_bboxes(
                    sampling_results=sampling_results,
                    bbox_results=bbox_results,
                    batch_img_metas=batch_img_metas)

    return losses
