"""RTMDet's training targets for the whole batch (``get_targets``, batched).

:func:`rtmdet_targets` returns what ``RTMDetHead.get_targets`` returns to
``loss_by_feat`` (mmdet 3.3.0: ``DynamicSoftLabelAssigner`` +
``BboxOverlaps2D`` + ``PseudoSampler``): labels, label weights, box targets
and assign metrics per level, each ``(B, n_level)`` a slice of one stacked
tensor as ``images_to_levels`` gives it, bit for bit. Its operation count
does not depend on the batch size or the number of boxes. An image the
batched path cannot decide as stock does is computed by stock's own
``_get_targets_single`` and counted.
"""
from typing import Any, List, Optional, Sequence

import torch
from torch import Tensor

from fast_parallel.compat.targets import (replaced_reason, targets_single,
                                          upstream)
from fast_parallel.step.targets.padding import (gt_layout_reason,
                                                images_to_levels, pad_gts)
from fast_parallel.step.targets.priors import inside_flags
from fast_parallel.step.targets.rtmdet import dsl
from fast_parallel.step.targets.stock_way import StockWay

__all__ = ['batch_reason', 'rtmdet_supported', 'rtmdet_targets']


def rtmdet_supported(head: Any) -> Optional[str]:
    """Whether :func:`rtmdet_targets` covers ``head`` exactly.

    Args:
        head: A dense head.

    Returns:
        Optional[str]: None when covered, else why not (for the log).
    """
    name = type(head).__name__
    if type(head) not in (upstream('RTMDetHead'), upstream('RTMDetSepBNHead')):
        return f'{name} is not RTMDetHead or RTMDetSepBNHead'
    train_cfg = getattr(head, 'train_cfg', None)
    assigner = getattr(head, 'assigner', None)
    if not train_cfg or assigner is None:
        return f'{name} has no train_cfg (no assigner)'
    if type(assigner) is not upstream('DynamicSoftLabelAssigner'):
        return f'assigner {type(assigner).__name__} is not ' \
            'DynamicSoftLabelAssigner'
    iou = getattr(assigner, 'iou_calculator', None)
    if type(iou) is not upstream('BboxOverlaps2D'):
        return f'iou_calculator {type(iou).__name__} is not BboxOverlaps2D'
    if iou.scale != 1. or iou.dtype is not None:
        return 'BboxOverlaps2D with scale or dtype options'
    if type(getattr(head, 'sampler', None)) is not upstream('PseudoSampler'):
        return 'sampler is not PseudoSampler'
    if type(head.prior_generator) is not upstream('MlvlPointGenerator'):
        return 'prior_generator is not MlvlPointGenerator'
    why = replaced_reason((head, 'RTMDetHead'),
                          (assigner, 'DynamicSoftLabelAssigner'))
    if why:
        return why
    topk = assigner.topk
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        return f'topk={topk!r} is not a positive int'
    for value in (assigner.soft_center_radius, assigner.iou_weight,
                  train_cfg.get('pos_weight',
                                None), train_cfg.get('allowed_border', None)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return 'DynamicSoftLabelAssigner / train_cfg option not a number'
    if head.cls_out_channels != head.num_classes:
        return 'cls_out_channels differs from num_classes (softmax)'
    return None


def batch_reason(head: Any, scores: Tensor, boxes: Tensor, gts: Sequence[Any],
                 num_priors: int) -> Optional[str]:
    """Why this whole batch takes the stock path, or None."""
    if scores.dim() != 3 or scores.shape[1] != num_priors or \
            boxes.shape != (*scores.shape[:2], 4) or num_priors == 0:
        return 'shapes'
    f32, device = torch.float32, scores.device
    tensors = [scores, boxes] + [g.bboxes for g in gts]
    if any(
            type(t) is not Tensor or t.dtype != f32 or t.device != device
            for t in tensors):
        return 'dtypes or devices (float32 tensors on one device covered)'
    why = gt_layout_reason(gts, device)
    if why is not None:
        return why
    classes = scores.shape[2]
    if device.type == 'cuda' and classes > 128 and classes % 4:
        return 'CUDA, > 128 classes not a multiple of 4 (row alignment)'
    if device.type == 'cpu' and not scores.is_contiguous():
        return 'non-contiguous predictions on CPU'
    return None


def rtmdet_targets(head: Any,
                   scores: Tensor,
                   boxes: Tensor,
                   mlvl_priors: List[Tensor],
                   featmap_sizes: Sequence,
                   batch_gt_instances: Sequence[Any],
                   batch_img_metas: Sequence[dict],
                   batch_gt_instances_ignore: Optional[Sequence[Any]] = None,
                   stock_way: Optional[StockWay] = None) -> tuple:
    """Stock's ``get_targets(...)[1:5]``, batched.

    Args:
        head: A head :func:`rtmdet_supported` covers.
        scores (Tensor): ``(B, N, C)`` flattened class logits.
        boxes (Tensor): ``(B, N, 4)`` decoded boxes.
        mlvl_priors (list[Tensor]): Point priors per level (with strides).
        featmap_sizes (Sequence): Feature map size per level.
        batch_gt_instances (Sequence[InstanceData]): Ground truths.
        batch_img_metas (Sequence[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored boxes, which
            ``DynamicSoftLabelAssigner.assign`` takes and never reads.
            Defaults to None.
        stock_way (StockWay, optional): Counts the images computed the stock
            way. Defaults to None.

    Returns:
        tuple: ``(labels_list, label_weights_list, bbox_targets_list,
        assign_metrics_list)``, per level, as stock's ``get_targets``.
    """
    stock_way = stock_way or StockWay()
    num_imgs = len(batch_img_metas)
    ignore = list(batch_gt_instances_ignore or [None] * num_imgs)
    priors = torch.cat(mlvl_priors)
    scores, boxes = scores.detach(), boxes.detach()
    num_priors = priors.shape[0]
    num_classes = head.num_classes
    inside = inside_flags(head, priors, featmap_sizes, batch_img_metas)
    labels = torch.full((num_imgs, num_priors),
                        num_classes,
                        dtype=torch.long,
                        device=priors.device)
    weights = priors.new_zeros((num_imgs, num_priors))
    bbox_targets = priors.new_zeros((num_imgs, num_priors, 4))
    metrics = priors.new_zeros((num_imgs, num_priors))
    fallback = [True] * num_imgs
    if batch_reason(head, scores, boxes, batch_gt_instances,
                    num_priors) is None:
        gt, gt_labels, gt_mask, counts = pad_gts(
            [g.bboxes for g in batch_gt_instances],
            [g.labels for g in batch_gt_instances], priors.device)
        if gt.shape[1]:
            found = dsl.assign(head.assigner, priors, scores, boxes, inside,
                               gt, gt_labels, gt_mask, counts,
                               upstream('DSL.EPS'))
            pos, gt_of = found.pos, found.gt_of.unsqueeze(-1)
            labels = torch.where(pos,
                                 gt_labels.gather(1, found.gt_of).long(),
                                 labels)
            bbox_targets = torch.where(pos[..., None],
                                       gt.gather(1, gt_of.expand(-1, -1, 4)),
                                       0.)
            metrics = torch.where(pos, found.pos_iou, 0.)
            fallback = found.fallback
        else:  # no ground truth anywhere: every prior is background
            pos = torch.zeros_like(labels, dtype=torch.bool)
            fallback = [False] * num_imgs
        pos_weight = head.train_cfg['pos_weight']
        # negatives (everything else stock assigns) weigh 1.0
        weights = torch.where(pos, 1.0 if pos_weight <= 0 else pos_weight, 1.0)
        if inside is not None:  # unmap: priors stock skipped get weight 0
            weights = weights.masked_fill(~inside, 0.)
    fallback = [
        bool(f) or stock_only for f, stock_only in zip(
            fallback, _stock_only(batch_gt_instances, batch_img_metas, inside))
    ]
    anchors_list = None
    for i in [i for i in range(num_imgs) if fallback[i]]:
        if anchors_list is None:
            anchors_list, valid_list = head.get_anchors(
                featmap_sizes, batch_img_metas, device=priors.device)
        stock_way.count()
        single = targets_single(head)(head, scores[i], boxes[i],
                                      torch.cat(anchors_list[i]),
                                      torch.cat(valid_list[i]),
                                      batch_gt_instances[i],
                                      batch_img_metas[i], ignore[i])
        if single[1] is None:  # no prior inside the image: stock's
            # get_targets decides (mmdet 3.3.0 fails unpacking this case)
            get_targets = type(head).get_targets
            return get_targets(head, scores, boxes, anchors_list, valid_list,
                               batch_gt_instances, list(batch_img_metas),
                               batch_gt_instances_ignore)
        for out, value in zip((labels, weights, bbox_targets, metrics),
                              single[1:5]):
            out[i].copy_(value)
    return tuple(
        images_to_levels(t, [p.shape[0] for p in mlvl_priors])
        for t in (labels, weights, bbox_targets, metrics))


def _stock_only(gts: Sequence[Any], metas: Sequence[dict],
                inside: Optional[Tensor]) -> List[bool]:
    """Per image, whether only stock's ``_get_targets_single`` gives its
    targets: ground truths with ``masks`` (``DynamicSoftLabelAssigner``
    then centres them by the masks' centre of mass), or no prior inside the
    image (stock's ``get_targets`` then fails unpacking its per-image
    results: :func:`rtmdet_targets` calls it). The second costs a host copy
    of one flag per image, only where ``inside`` exists (``allowed_border
    >= 0``; mmdet's RTMDet configs use -1).
    """
    # (stock also reads every image's img_shape: without one, it raises)
    stock_only = [
        hasattr(gt, 'masks') or 'img_shape' not in meta
        for gt, meta in zip(gts, metas)
    ]
    if inside is not None:
        empty = (~inside.any(1)).tolist()
        stock_only = [a or b for a, b in zip(stock_only, empty)]
    return stock_only
