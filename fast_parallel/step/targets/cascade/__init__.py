"""``CascadeRoIHead.loss`` with each stage's assign + sample batched.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`loss` on one
``CascadeRoIHead`` instance (Cascade R-CNN, Cascade Mask R-CNN) in place of
the class's: mmdet 3.3.0's body, line for line, except that at every stage
each image's sampling result comes from the RoI family's
:func:`~fast_parallel.step.targets.roi.targets.sample_rois` with that
stage's ``MaxIoUAssigner`` and ``RandomSampler`` (their thresholds, the
sampler's random draws in stock's order) instead of an ``assign`` and a
``sample`` per image. ``bbox_loss``, ``mask_loss`` and the refinement
between stages are the head's own. Each stage counts as a batch of images
in the head's counter.
"""
from typing import Any, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.roi.targets import roi_samples, sampling_reason

__all__ = ['loss', 'stages_reason', 'supported']


def supported(head: Any) -> Optional[str]:
    """None when :func:`loss` is exact for this RoI head, else why not.

    Args:
        head: A module that computes targets.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    if type(head) is not upstream('CascadeRoIHead'):
        return f'{name} is not CascadeRoIHead'
    return stages_reason(head)


def stages_reason(head: Any) -> Optional[str]:
    """None when every stage's assigner and sampler are batched exactly,
    else why not."""
    name = type(head).__name__
    assigners = getattr(head, 'bbox_assigner', None)
    samplers = getattr(head, 'bbox_sampler', None)
    if not isinstance(assigners, list) or not isinstance(samplers, list) or \
            len(assigners) != head.num_stages or \
            len(samplers) != head.num_stages:
        return f'{name} has no assigner and sampler per stage (no train_cfg)'
    for stage, (assigner, sampler) in enumerate(zip(assigners, samplers)):
        why = sampling_reason(assigner, sampler)
        if why:
            return f'stage {stage}: {why}'
    return None


def loss(self: Any, x: Tuple[Tensor], rpn_results_list: Sequence[Any],
         batch_data_samples: Sequence[Any]) -> dict:
    """Stock's ``CascadeRoIHead.loss``, each stage's assign + sample
    batched.

    Args:
        self: The ``CascadeRoIHead``.
        x (tuple[Tensor]): Multi-level features.
        rpn_results_list (Sequence[InstanceData]): Proposals per image.
        batch_data_samples (Sequence[DetDataSample]): The batch's samples.

    Returns:
        dict[str, Tensor]: The losses stock computes, ``s<stage>.<name>``.
    """
    assert len(rpn_results_list) == len(batch_data_samples)
    outputs = upstream('unpack_gt_instances')(batch_data_samples)
    batch_gt_instances, batch_gt_instances_ignore, batch_img_metas \
        = outputs

    losses = dict()
    results_list = rpn_results_list
    for stage in range(self.num_stages):
        self.current_stage = stage

        stage_loss_weight = self.stage_loss_weights[stage]

        # assign gts and sample proposals
        sampling_results = []
        if self.with_bbox or self.with_mask:
            sampling_results = roi_samples(self, x, results_list,
                                           batch_gt_instances,
                                           batch_gt_instances_ignore, stage)

        # bbox head forward and loss
        bbox_results = self.bbox_loss(stage, x, sampling_results)

        for name, value in bbox_results['loss_bbox'].items():
            losses[f's{stage}.{name}'] = (
                value * stage_loss_weight if 'loss' in name else value)

        # mask head forward and loss
        if self.with_mask:
            mask_results = self.mask_loss(stage, x, sampling_results,
                                          batch_gt_instances)
            for name, value in mask_results['loss_mask'].items():
                losses[f's{stage}.{name}'] = (
                    value * stage_loss_weight if 'loss' in name else value)

        # refine bboxes
        if stage < self.num_stages - 1:
            bbox_head = self.bbox_head[stage]
            with torch.no_grad():
                results_list = bbox_head.refine_bboxes(sampling_results,
                                                       bbox_results,
                                                       batch_img_metas)
                # Empty proposal
                if results_list is None:
                    break
    return losses
