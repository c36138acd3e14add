"""``StandardRoIHead.loss`` with the assign + sample of the batch at once.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`loss` on one
``StandardRoIHead`` instance (Faster / Mask R-CNN) in place of the class's:
mmdet 3.3.0's body, line for line, except that each image's sampling result
comes from :func:`~fast_parallel.step.targets.roi.targets.sample_rois`
(equal to stock's, the sampler's random draws included) instead of an
``assign`` and a ``sample`` per image. ``bbox_loss`` and ``mask_loss`` are
the head's own.
"""
from typing import Any, List, Optional, Sequence, Tuple

from torch import Tensor

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.max_iou.sampling import sampler_reason
from fast_parallel.step.targets.max_iou.targets import assigner_reason
from fast_parallel.step.targets.roi.targets import batch_reason, sample_rois
from fast_parallel.step.targets.stock_way import batch_targets


def supported(head: Any) -> Optional[str]:
    """None when :func:`loss` is exact for this RoI head, else why not.

    Args:
        head: A module that computes targets.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    if type(head) is not upstream('StandardRoIHead'):
        return f'{name} is not StandardRoIHead'
    if getattr(head, 'bbox_assigner', None) is None:
        return f'{name} has no train_cfg (no assigner)'
    why = assigner_reason(head.bbox_assigner) or sampler_reason(
        head.bbox_sampler)
    if why:
        return why
    if type(head.bbox_sampler) is not upstream('RandomSampler'):
        return f'sampler {type(head.bbox_sampler).__name__} is not ' \
            'RandomSampler'
    return None


def _stock_samples(self: Any, x: Tuple[Tensor], rpn_results_list: list,
                   batch_gt_instances: list,
                   batch_gt_instances_ignore: list) -> List[Any]:
    """Stock's loop: one ``assign`` and one ``sample`` per image."""
    sampling_results = []
    for i in range(len(rpn_results_list)):
        rpn_results = rpn_results_list[i]
        assign_result = self.bbox_assigner.assign(rpn_results,
                                                  batch_gt_instances[i],
                                                  batch_gt_instances_ignore[i])
        sampling_result = self.bbox_sampler.sample(
            assign_result,
            rpn_results,
            batch_gt_instances[i],
            feats=[lvl_feat[i][None] for lvl_feat in x])
        sampling_results.append(sampling_result)
    return sampling_results


def loss(self: Any, x: Tuple[Tensor], rpn_results_list: Sequence[Any],
         batch_data_samples: Sequence[Any]) -> dict:
    """Stock's ``StandardRoIHead.loss``, the assign + sample batched.

    Args:
        self: The ``StandardRoIHead``.
        x (tuple[Tensor]): Multi-level features.
        rpn_results_list (Sequence[InstanceData]): Proposals per image.
        batch_data_samples (Sequence[DetDataSample]): The batch's samples.

    Returns:
        dict[str, Tensor]: The losses stock computes.
    """
    assert len(rpn_results_list) == len(batch_data_samples)
    outputs = upstream('unpack_gt_instances')(batch_data_samples)
    batch_gt_instances, batch_gt_instances_ignore, _ = outputs

    # assign gts and sample proposals
    num_imgs = len(batch_data_samples)
    for rpn_results in rpn_results_list:
        # rename rpn_results.bboxes to rpn_results.priors
        rpn_results.priors = rpn_results.pop('bboxes')
    proposals = [r.priors for r in rpn_results_list]
    with batch_targets(self, num_imgs) as stock_way:
        if batch_reason(self.bbox_assigner, proposals,
                        batch_gt_instances) is None:
            sampling_results = sample_rois(self, proposals, batch_gt_instances)
        else:
            stock_way.count(num_imgs)
            sampling_results = _stock_samples(self, x, rpn_results_list,
                                              batch_gt_instances,
                                              batch_gt_instances_ignore)

    losses = dict()
    # bbox head loss
    if self.with_bbox:
        bbox_results = self.bbox_loss(x, sampling_results)
        losses.update(bbox_results['loss_bbox'])

    # mask head forward and loss
    if self.with_mask:
        mask_results = self.mask_loss(x, sampling_results,
                                      bbox_results['bbox_feats'],
                                      batch_gt_instances)
        losses.update(mask_results['loss_mask'])

    return losses
