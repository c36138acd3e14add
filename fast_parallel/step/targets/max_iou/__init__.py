"""``AnchorHead.loss_by_feat`` (RetinaHead, RPNHead) with batched targets.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`loss_by_feat`
on one ``RetinaHead`` / ``RPNHead`` instance in place of the class's: mmdet
3.3.0's ``AnchorHead.loss_by_feat`` (and, for ``RPNHead``, its renaming of
the losses), line for line, except that the anchors and their valid flags
are made once for the batch (stock's ``get_anchors`` makes the valid flags
image by image, and the loss stacks a copy of the anchors per image) and the
targets come from
:func:`~fast_parallel.step.targets.max_iou.targets.anchor_head_targets`,
equal to stock's ``get_targets`` bit for bit. A batch the batched path does
not cover runs stock's ``get_anchors`` and ``get_targets``, counted.
"""
from typing import Any, List, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import (raw_positive_infos, replaced_reason,
                                          upstream)
from fast_parallel.step.targets.max_iou.sampling import sampler_reason
from fast_parallel.step.targets.max_iou.targets import (anchor_head_targets,
                                                        assigner_reason,
                                                        batch_reason)
from fast_parallel.step.targets.priors import (image_without_prior_on_host,
                                               inside_flags)
from fast_parallel.step.targets.stock_way import batch_targets


def supported(head: Any) -> Optional[str]:
    """None when :func:`loss_by_feat` is exact for this head, else why not.

    Args:
        head: A dense head.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    if type(head) not in (upstream('RetinaHead'), upstream('RPNHead')):
        return f'{name} is not RetinaHead or RPNHead'
    if not getattr(head, 'train_cfg', None) or not hasattr(head, 'assigner'):
        return f'{name} has no train_cfg (no assigner)'
    why = assigner_reason(head.assigner) or sampler_reason(head.sampler)
    if why:
        return why
    if getattr(head.sampler, 'add_gt_as_proposals', False):
        # stock samples the ground truths with the anchors (G + N priors)
        return 'RandomSampler with add_gt_as_proposals=True'
    if type(head.prior_generator) is not upstream('AnchorGenerator'):
        return 'prior_generator is not AnchorGenerator'
    if getattr(head.prior_generator, 'use_box_type', False):
        return 'AnchorGenerator with use_box_type=True (box-type anchors)'
    if not head.reg_decoded_bbox and type(
            head.bbox_coder) is not upstream('DeltaXYWHBBoxCoder'):
        return f'bbox_coder {type(head.bbox_coder).__name__} is not ' \
            'DeltaXYWHBBoxCoder'
    why = replaced_reason((head, 'AnchorHead'))
    if why:
        return why
    for key in ('pos_weight', 'allowed_border'):
        value = head.train_cfg.get(key, None)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f'train_cfg.{key} is not a number'
    return None


def _ignores_without_boxes(ignores: Optional[Sequence[Any]]) -> bool:
    """Ignored instances without ``bboxes``: stock's ``MaxIoUAssigner``
    reads them and raises, so the batch goes stock's way."""
    return any(
        i is not None and not hasattr(i, 'bboxes') for i in ignores or ())


def _image_without_anchor(self: Any, inside: Optional[Tensor],
                          featmap_sizes: list, metas: List[dict]) -> bool:
    """Whether an image has no anchor to assign: stock's
    ``_get_targets_single`` raises its ``ValueError`` there, so the batch
    goes stock's way and raises it. Decided on the host where it can be
    (``allowed_border < 0``, as in mmdet's RetinaNet and RPN configs), else
    by one host copy, only where ``inside`` exists."""
    if inside is None:
        return False
    known = image_without_prior_on_host(self, featmap_sizes, metas)
    if known is not None:
        return known
    return not bool(inside.any(1).all())


def _targets(self: Any, featmap_sizes: list, device: torch.device,
             batch_gt_instances: Sequence[Any], batch_img_metas: List[dict],
             batch_gt_instances_ignore: Optional[Sequence[Any]]) -> tuple:
    """The anchors per image (as ``get_anchors`` gives them) and stock's
    ``get_targets`` result, batched where covered."""
    num_imgs = len(batch_img_metas)
    with batch_targets(self, num_imgs) as stock_way:
        mlvl_anchors = self.prior_generator.grid_priors(
            featmap_sizes, device=device)
        anchors = torch.cat(mlvl_anchors)
        batched = batch_reason(self.assigner, anchors, batch_gt_instances) \
            is None and not _ignores_without_boxes(batch_gt_instances_ignore) \
            and all('img_shape' in meta for meta in batch_img_metas)
        if batched:
            inside = inside_flags(self, anchors, featmap_sizes,
                                  batch_img_metas)
            batched = not _image_without_anchor(self, inside, featmap_sizes,
                                                batch_img_metas)
        if batched:
            targets, results = anchor_head_targets(
                self, anchors, inside, [a.shape[0] for a in mlvl_anchors],
                batch_gt_instances)
            # stock keeps them for get_positive_infos
            raw_positive_infos(self).update(sampling_results=results)
            return [mlvl_anchors] * num_imgs, targets
        stock_way.count(num_imgs)
        anchor_list, valid_flag_list = type(self).get_anchors(
            self, featmap_sizes, batch_img_metas, device=device)
        return anchor_list, type(self).get_targets(
            self,
            anchor_list,
            valid_flag_list,
            batch_gt_instances,
            batch_img_metas,
            batch_gt_instances_ignore=batch_gt_instances_ignore)


def loss_by_feat(
        self: Any,
        cls_scores: List[Tensor],
        bbox_preds: List[Tensor],
        batch_gt_instances: Sequence[Any],
        batch_img_metas: List[dict],
        batch_gt_instances_ignore: Optional[Sequence[Any]] = None) -> dict:
    """Stock's ``AnchorHead.loss_by_feat`` (``RPNHead``'s), targets batched.

    Args:
        self: The ``RetinaHead`` or ``RPNHead``.
        cls_scores (list[Tensor]): Class scores per level.
        bbox_preds (list[Tensor]): Box deltas per level.
        batch_gt_instances (Sequence[InstanceData]): ``bboxes``, ``labels``.
        batch_img_metas (list[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored boxes
            (``MaxIoUAssigner`` with ``ignore_iof_thr <= 0`` does not read
            them). Defaults to None.

    Returns:
        dict[str, list[Tensor]]: ``loss_cls`` and ``loss_bbox`` per level
        (``loss_rpn_cls`` and ``loss_rpn_bbox`` for ``RPNHead``), the
        tensors stock computes.
    """
    featmap_sizes = [featmap.size()[-2:] for featmap in cls_scores]
    assert len(featmap_sizes) == self.prior_generator.num_levels

    device = cls_scores[0].device
    anchor_list, cls_reg_targets = _targets(self, featmap_sizes, device,
                                            batch_gt_instances,
                                            batch_img_metas,
                                            batch_gt_instances_ignore)
    (labels_list, label_weights_list, bbox_targets_list, bbox_weights_list,
     avg_factor) = cls_reg_targets

    # stock: images_to_levels of each image's cat_boxes(anchors), the same
    # tensor stacked B times (one repeat here)
    all_anchors = torch.cat(anchor_list[0]).unsqueeze(0).repeat(
        len(anchor_list), 1, 1)
    all_anchor_list, start = [], 0
    for anchors in anchor_list[0]:
        all_anchor_list.append(all_anchors[:, start:start + anchors.size(0)])
        start += anchors.size(0)

    losses_cls, losses_bbox = upstream('multi_apply')(
        self.loss_by_feat_single,
        cls_scores,
        bbox_preds,
        all_anchor_list,
        labels_list,
        label_weights_list,
        bbox_targets_list,
        bbox_weights_list,
        avg_factor=avg_factor)
    if type(self) is upstream('RPNHead'):
        return dict(loss_rpn_cls=losses_cls, loss_rpn_bbox=losses_bbox)
    return dict(loss_cls=losses_cls, loss_bbox=losses_bbox)
