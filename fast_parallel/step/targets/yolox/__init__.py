"""``YOLOXHead.loss_by_feat`` with the SimOTA targets of the batch at once.

:func:`~fast_parallel.step.targets.switch.install` puts
:func:`loss_by_feat` on one head instance in place of the class's: mmdet
3.3.0's body, line for line, except that the targets come from
:func:`~fast_parallel.step.targets.yolox.targets.yolox_targets` (one pass
for all images, equal to ``_get_targets_single`` bit for bit) and that, outside
distributed training, the positive count is decided on the host, where the
targets already put it (stock compares a tensor with ``1.0`` and ``0``: two
or three device syncs that decide the same thing).
"""
from typing import Any, Optional, Sequence

import torch
from mmdet.utils import reduce_mean
from torch import Tensor

from fast_parallel.compat import yolox_bbox_decode
from fast_parallel.compat.targets import reduce_mean_reduces
from fast_parallel.step.targets.stock_way import batch_targets
from fast_parallel.step.targets.yolox.targets import (yolox_supported,
                                                      yolox_targets)

#: None when :func:`loss_by_feat` is exact for a head, else why not.
supported = yolox_supported


def loss_by_feat(
        self: Any,
        cls_scores: Sequence[Tensor],
        bbox_preds: Sequence[Tensor],
        objectnesses: Sequence[Tensor],
        batch_gt_instances: Sequence[Any],
        batch_img_metas: Sequence[dict],
        batch_gt_instances_ignore: Optional[Sequence[Any]] = None) -> dict:
    """Stock's ``YOLOXHead.loss_by_feat``, the targets batched.

    Args:
        self: The ``YOLOXHead``.
        cls_scores (Sequence[Tensor]): Class scores per level.
        bbox_preds (Sequence[Tensor]): Box deltas per level.
        objectnesses (Sequence[Tensor]): Objectness per level.
        batch_gt_instances (Sequence[InstanceData]): ``bboxes``, ``labels``.
        batch_img_metas (Sequence[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored boxes
            (a batch with any takes the stock targets). Defaults to None.

    Returns:
        dict[str, Tensor]: ``loss_cls``, ``loss_bbox``, ``loss_obj`` (and
        ``loss_l1``), the tensors stock computes.
    """
    num_imgs = len(batch_img_metas)
    if batch_gt_instances_ignore is None:
        batch_gt_instances_ignore = [None] * num_imgs

    featmap_sizes = [cls_score.shape[2:] for cls_score in cls_scores]
    mlvl_priors = self.prior_generator.grid_priors(
        featmap_sizes,
        dtype=cls_scores[0].dtype,
        device=cls_scores[0].device,
        with_stride=True)
    flatten_cls_preds = torch.cat([
        cls_pred.permute(0, 2, 3, 1).reshape(
            num_imgs, -1, self.cls_out_channels) for cls_pred in cls_scores
    ],
                                  dim=1)
    flatten_bbox_preds = torch.cat([
        bbox_pred.permute(0, 2, 3, 1).reshape(num_imgs, -1, 4)
        for bbox_pred in bbox_preds
    ],
                                   dim=1)
    flatten_objectness = torch.cat([
        objectness.permute(0, 2, 3, 1).reshape(num_imgs, -1)
        for objectness in objectnesses
    ],
                                   dim=1)
    flatten_priors = torch.cat(mlvl_priors)
    flatten_bboxes = yolox_bbox_decode(self)(flatten_priors,
                                             flatten_bbox_preds)

    with batch_targets(self, num_imgs) as stock_way:
        targets = yolox_targets(self, flatten_priors, flatten_cls_preds,
                                flatten_bboxes, flatten_objectness,
                                batch_gt_instances, batch_img_metas,
                                batch_gt_instances_ignore, stock_way)
    (pos_masks, cls_targets, obj_targets, bbox_targets, l1_targets,
     num_fg_imgs) = targets

    total = sum(num_fg_imgs)  # ints, as stock's targets return them
    num_pos = torch.tensor(
        total, dtype=torch.float, device=flatten_cls_preds.device)
    if reduce_mean_reduces():
        num_total_samples = max(reduce_mean(num_pos), 1.0)
    else:  # stock's max(num_pos, 1.0), decided from the host's count
        num_total_samples = 1.0 if total < 1 else num_pos
    has_pos = total > 0  # stock: num_pos > 0

    pos_masks = torch.cat(pos_masks, 0)
    cls_targets = torch.cat(cls_targets, 0)
    obj_targets = torch.cat(obj_targets, 0)
    bbox_targets = torch.cat(bbox_targets, 0)
    if self.use_l1:
        l1_targets = torch.cat(l1_targets, 0)

    loss_obj = self.loss_obj(flatten_objectness.view(-1, 1),
                             obj_targets) / num_total_samples
    if has_pos:
        loss_cls = self.loss_cls(
            flatten_cls_preds.view(-1, self.num_classes)[pos_masks],
            cls_targets) / num_total_samples
        loss_bbox = self.loss_bbox(
            flatten_bboxes.view(-1, 4)[pos_masks],
            bbox_targets) / num_total_samples
    else:  # mmdet issue 7298: keep both branches in the graph
        loss_cls = flatten_cls_preds.sum() * 0
        loss_bbox = flatten_bboxes.sum() * 0

    loss_dict = dict(loss_cls=loss_cls, loss_bbox=loss_bbox, loss_obj=loss_obj)
    if self.use_l1:
        if has_pos:
            loss_l1 = self.loss_l1(
                flatten_bbox_preds.view(-1, 4)[pos_masks],
                l1_targets) / num_total_samples
        else:
            loss_l1 = flatten_bbox_preds.sum() * 0
        loss_dict.update(loss_l1=loss_l1)
    return loss_dict
