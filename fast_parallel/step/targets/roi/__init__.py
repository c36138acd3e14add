"""``StandardRoIHead.loss`` with the assign + sample of the batch at once.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`loss` on one
``StandardRoIHead`` instance (Faster / Mask R-CNN) in place of the class's:
mmdet 3.3.0's body, line for line, except that each image's sampling result
comes from :func:`~fast_parallel.step.targets.roi.targets.sample_rois`
(equal to stock's, the sampler's random draws included) instead of an
``assign`` and a ``sample`` per image. ``bbox_loss`` and ``mask_loss`` are
the head's own.
"""
from typing import Any, Optional, Sequence, Tuple

from torch import Tensor

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.roi.targets import roi_samples, sampling_reason


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
    return sampling_reason(head.bbox_assigner, head.bbox_sampler)


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
    sampling_results = roi_samples(self, x, rpn_results_list,
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
