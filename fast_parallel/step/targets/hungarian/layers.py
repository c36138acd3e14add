"""Every decoder layer's Hungarian matching at once: one host copy.

A DETR head's ``loss_by_feat`` computes the loss of each decoder layer (and
of a two-stage encoder's proposals) with the same ground truths, each
layer's predictions already made. :func:`loss_by_feat` (put on the head
instance) plans them before stock's ``loss_by_feat`` runs: the cost matrices
of every layer and image in one batched computation per shape, one copy of
them all to the host, ``linear_sum_assignment`` on each exact matrix, one
copy of the assignments back. ``loss_by_feat_single`` then finds its layer's
assignment by the tensor it is given (its memory, shape and strides) and
computes the rest of its targets; a layer the plan does not hold (another
tensor, other ground truths) is matched on its own.
"""
from inspect import signature
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from fast_parallel.compat.targets import is_upstream
from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.hungarian.costs import (LabelOutOfRange,
                                                        batch_costs,
                                                        cxcywh_to_xyxy)
from fast_parallel.step.targets.hungarian.match import (assign_on_host,
                                                        batch_reason,
                                                        gts_reason,
                                                        image_factors)
from fast_parallel.step.targets.padding import Padded, pad_gts, to_device

__all__ = ['LayerPlan', 'loss_by_feat', 'tensor_key']

Match = Tuple[Tensor, List[int]]


def tensor_key(t: Tensor) -> tuple:
    """What identifies a layer's predictions within one loss call."""
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


class LayerPlan:
    """The planned matches of one ``loss_by_feat`` call.

    Args:
        gts (list): The call's ``batch_gt_instances`` (the list object).
        metas (list): Its ``batch_img_metas``.
        pad (Padded, optional): The ground truths, padded (None where they
            are not laid out as the batched targets read them).
    """

    def __init__(self, gts: Sequence[Any], metas: Sequence[dict],
                 pad: Optional[Padded]) -> None:
        self.gts = gts
        self.metas = metas
        self.pad = pad
        self.matches: Dict[tuple, Match] = {}

    def match(self, cls_scores: Tensor, bbox_preds: Tensor,
              gts: Sequence[Any]) -> Optional[Match]:
        """The planned ``(gt_inds, num_pos)`` of a layer, or None."""
        if gts is not self.gts:
            return None
        return self.matches.get(
            (tensor_key(cls_scores), tensor_key(bbox_preds)))


def _group(layers: Sequence[Tuple[Tensor, Tensor]],
           gts: Sequence[Any]) -> Dict[tuple, List[int]]:
    """The layers that can be planned, by shape and dtype."""
    groups: Dict[tuple, List[int]] = {}
    for n, (scores, boxes) in enumerate(layers):
        images = [scores[i] for i in range(scores.shape[0])]
        if batch_reason(images, [boxes[i] for i in range(boxes.shape[0])],
                        gts) is None:
            key = (tuple(scores.shape), scores.dtype, boxes.dtype)
            groups.setdefault(key, []).append(n)
    return groups


def plan_layers(head: Any, layers: Sequence[Tuple[Tensor, Tensor]],
                gts: Sequence[Any], metas: Sequence[dict]) -> LayerPlan:
    """Matches every planable layer, with one copy each way.

    Args:
        head: The DETR head.
        layers (Sequence[tuple]): ``(cls_scores, bbox_preds)`` per layer,
            ``(B, Q, C)`` and ``(B, Q, 4)``, against the same ground truths.
        gts (Sequence[InstanceData]): Ground truths per image.
        metas (Sequence[dict]): Image metas.

    Returns:
        LayerPlan: The matches it could plan.
    """
    device = layers[0][0].device
    if gts_reason(gts, device):
        return LayerPlan(gts, metas, None)
    pad = pad_gts([g.bboxes for g in gts], [g.labels for g in gts], device, 1)
    plan = LayerPlan(gts, metas, pad)
    groups = _group(layers, gts) if any(pad.counts) else {}
    costs, members = [], []
    for ids in groups.values():
        count = len(ids)
        scores = [layers[n][0][i] for n in ids for i in range(len(gts))]
        boxes = torch.cat([layers[n][1] for n in ids])
        factor = image_factors(boxes, metas * count)
        repeated = Padded(
            pad.boxes.repeat(count, 1, 1), pad.labels.repeat(count, 1),
            pad.mask.repeat(count, 1), pad.counts * count)
        try:
            cost = batch_costs(head.assigner, scores,
                               cxcywh_to_xyxy(boxes) * factor, repeated,
                               image_factors(repeated.boxes, metas * count))
        except (cpu_paths.PathModelError, LabelOutOfRange):
            continue  # those layers are matched (or go stock) one by one
        # one copy needs one dtype numpy has (a bfloat16 matrix fails in
        # stock's .numpy(): such layers go one by one, to stock's error)
        if cost.dtype != torch.bfloat16 and (not costs
                                             or cost.dtype == costs[0].dtype):
            costs.append(cost)
            members.append(ids)
    if not costs:
        return plan
    flat = torch.cat([c.detach().reshape(-1) for c in costs]).cpu().numpy()
    inds, positives, start = [], [], 0
    try:
        for cost in costs:
            host = flat[start:start + cost.numel()].reshape(cost.shape)
            start += cost.numel()
            gt_inds, num_pos = assign_on_host(
                host, pad.counts * (cost.shape[0] // len(gts)))
            inds.append(gt_inds)
            positives.append(num_pos)
    except ValueError:  # scipy's, for NaN: raised by the layers in order
        return plan
    back = to_device(np.concatenate([i.reshape(-1) for i in inds]), device)
    start, batch = 0, len(gts)
    for ids, host, num_pos in zip(members, inds, positives):
        on_device = back[start:start + host.size].view(host.shape)
        start += host.size
        for k, n in enumerate(ids):
            key = (tensor_key(layers[n][0]), tensor_key(layers[n][1]))
            plan.matches[key] = (on_device[k * batch:(k + 1) * batch],
                                 num_pos[k * batch:(k + 1) * batch])
    return plan


def _layers(head: Any, arguments: Dict[str,
                                       Any]) -> List[Tuple[Tensor, Tensor]]:
    """The ``(cls_scores, bbox_preds)`` each ``loss_by_feat_single`` call
    of stock's ``loss_by_feat`` will get with the call's ground truths."""
    scores = arguments['all_layers_cls_scores']
    boxes = arguments['all_layers_bbox_preds']
    dino = is_upstream(head, 'DINOHead')
    if dino:
        scores, boxes = head.split_outputs(scores, boxes,
                                           arguments['dn_meta'])[:2]
    layers = [(scores[n], boxes[n]) for n in range(len(scores))]
    enc = arguments.get('enc_cls_scores')
    enc_boxes = arguments.get('enc_bbox_preds')
    # Deformable DETR's proposals are matched to other labels (all 0)
    if dino and isinstance(enc, Tensor) and isinstance(enc_boxes, Tensor):
        layers.append((enc, enc_boxes))
    return layers


def loss_by_feat(self: Any, *args: Any, **kwargs: Any) -> dict:
    """Stock's ``loss_by_feat`` (the class's), every layer matched first.

    Args:
        self: A DETR head the family's ``supported`` accepts.
        *args: Stock's arguments.
        **kwargs: Stock's keyword arguments.

    Returns:
        dict[str, Tensor]: Stock's losses.
    """
    stock = type(self).loss_by_feat
    arguments = signature(stock).bind(self, *args, **kwargs).arguments
    gts = arguments['batch_gt_instances']
    layers = _layers(self, arguments)
    if layers and len(gts) and layers[0][0].shape[1] > 0:
        with self.fast_target_stats.computing():
            self.fast_layer_plan = plan_layers(self, layers, gts,
                                               arguments['batch_img_metas'])
    try:
        return stock(self, *args, **kwargs)
    finally:
        self.fast_layer_plan = None
