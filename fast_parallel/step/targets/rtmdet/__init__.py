"""``RTMDetHead.loss_by_feat`` with the targets of the batch at once.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`loss_by_feat`
on one ``RTMDetHead`` / ``RTMDetSepBNHead`` instance in place of the
class's: mmdet 3.3.0's body, line for line, except that the priors are made
once for the batch (stock's ``get_anchors`` repeats them and makes valid
flags per image) and the targets come from
:func:`~fast_parallel.step.targets.rtmdet.targets.rtmdet_targets`, equal to
stock's ``get_targets`` bit for bit.
"""
from typing import Any, List, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.rtmdet.targets import (rtmdet_supported,
                                                       rtmdet_targets)
from fast_parallel.step.targets.stock_way import batch_targets

#: None when :func:`loss_by_feat` is exact for a head, else why not.
supported = rtmdet_supported


def loss_by_feat(
        self: Any,
        cls_scores: List[Tensor],
        bbox_preds: List[Tensor],
        batch_gt_instances: Sequence[Any],
        batch_img_metas: List[dict],
        batch_gt_instances_ignore: Optional[Sequence[Any]] = None) -> dict:
    """Stock's ``RTMDetHead.loss_by_feat``, the targets batched.

    Args:
        self: The ``RTMDetHead``.
        cls_scores (list[Tensor]): Class scores per level.
        bbox_preds (list[Tensor]): Decoded box distances per level.
        batch_gt_instances (Sequence[InstanceData]): ``bboxes``, ``labels``.
        batch_img_metas (list[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored boxes.
            Defaults to None.

    Returns:
        dict[str, list[Tensor]]: ``loss_cls`` and ``loss_bbox`` per level,
        the tensors stock computes.
    """
    distance2bbox = upstream('distance2bbox')
    reduce_mean = upstream('reduce_mean')
    num_imgs = len(batch_img_metas)
    featmap_sizes = [featmap.size()[-2:] for featmap in cls_scores]
    assert len(featmap_sizes) == self.prior_generator.num_levels

    device = cls_scores[0].device
    mlvl_priors = self.prior_generator.grid_priors(
        featmap_sizes, device=device, with_stride=True)
    flatten_cls_scores = torch.cat([
        cls_score.permute(0, 2, 3, 1).reshape(
            num_imgs, -1, self.cls_out_channels) for cls_score in cls_scores
    ], 1)
    decoded_bboxes = []
    for anchor, bbox_pred in zip(mlvl_priors, bbox_preds):
        anchor = anchor.reshape(-1, 4)
        bbox_pred = bbox_pred.permute(0, 2, 3, 1).reshape(num_imgs, -1, 4)
        bbox_pred = distance2bbox(anchor, bbox_pred)
        decoded_bboxes.append(bbox_pred)

    flatten_bboxes = torch.cat(decoded_bboxes, 1)

    with batch_targets(self, num_imgs) as stock_way:
        cls_reg_targets = rtmdet_targets(self, flatten_cls_scores,
                                         flatten_bboxes, mlvl_priors,
                                         featmap_sizes, batch_gt_instances,
                                         batch_img_metas,
                                         batch_gt_instances_ignore, stock_way)
    (labels_list, label_weights_list, bbox_targets_list,
     assign_metrics_list) = cls_reg_targets

    multi_apply = upstream('multi_apply')
    (losses_cls, losses_bbox, cls_avg_factors, bbox_avg_factors) = multi_apply(
        self.loss_by_feat_single, cls_scores, decoded_bboxes, labels_list,
        label_weights_list, bbox_targets_list, assign_metrics_list,
        self.prior_generator.strides)

    cls_avg_factor = reduce_mean(sum(cls_avg_factors)).clamp_(min=1).item()
    losses_cls = list(map(lambda x: x / cls_avg_factor, losses_cls))

    bbox_avg_factor = reduce_mean(sum(bbox_avg_factors)).clamp_(min=1).item()
    losses_bbox = list(map(lambda x: x / bbox_avg_factor, losses_bbox))
    return dict(loss_cls=losses_cls, loss_bbox=losses_bbox)
