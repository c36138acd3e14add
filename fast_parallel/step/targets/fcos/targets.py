"""FCOS's point targets for a batch of images at once, stock's bits.

Stock's ``FCOSHead._get_targets_single`` works on one image's
``(points, ground truths)`` grid; here the grid is ``(images, points,
ground truths)``, the ground truths padded per image. Each element goes
through stock's own operations on the same values (subtractions, halves,
comparisons: exactly rounded, so the same bits on any device and in any
layout). A padding column gets the area ``+inf``, after the image's own
columns, so the minimum over a row (the first index among equals, as
``torch.min`` documents) is the one stock finds over its image's columns,
a valid box with an area over stock's ``INF`` included; an image without
ground truths gets stock's background labels and zero boxes. Images are
grouped so that one group's grid stays under :data:`GRID_BUDGET` elements.
Why each step is exact: ``docs/targets_fcos.md``.
"""
from typing import Any, List, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat.targets import upstream
from fast_parallel.step.targets.padding import (images_to_levels, pad_gts,
                                                to_device)

__all__ = ['GRID_BUDGET', 'image_groups', 'point_targets']

#: The most ``images x points x ground truths`` one group's grid holds (a
#: larger single image is its own group, stock's own size).
GRID_BUDGET = 1 << 23


def image_groups(counts: Sequence[int],
                 num_points: int,
                 budget: int = GRID_BUDGET) -> List[Tuple[int, int]]:
    """Consecutive ``[start, end)`` groups of images whose padded grid
    (images x points x their largest count, at least one column) fits
    ``budget``.

    Args:
        counts (Sequence[int]): Ground truths per image.
        num_points (int): Points per image.
        budget (int): Grid elements per group. Defaults to
            :data:`GRID_BUDGET`.

    Returns:
        list[tuple[int, int]]: The groups, in order.
    """
    groups: List[Tuple[int, int]] = []
    start, width = 0, 1
    for i, count in enumerate(counts):
        grown = max(width, count, 1)
        if i > start and (i - start + 1) * num_points * grown > budget:
            groups.append((start, i))
            start, grown = i, max(count, 1)
        width = grown
    if counts:
        groups.append((start, len(counts)))
    return groups


def _level_strides(head: Any, num_points: Sequence[int], dtype: torch.dtype,
                   device: torch.device) -> Tensor:
    """Stock's per-point ``strides[level] * radius`` column, ``(P,)``: each
    Python product stored in ``dtype`` as stock's slice fill stores it."""
    radius = head.center_sample_radius
    per_level = torch.tensor(
        [s * radius for s in head.strides[:len(num_points)]], dtype=dtype)
    return to_device(
        per_level.repeat_interleave(torch.tensor(num_points)), device)


def _group_targets(head: Any, gts: Sequence[Any], points: Tensor,
                   ranges: Tensor, num_points: Sequence[int]) -> tuple:
    """``(labels (B, P), bbox targets (B, P, 4))`` of one group."""
    inf = upstream('FCOS.INF')
    device = points.device
    padded = pad_gts([gt.bboxes for gt in gts], [gt.labels for gt in gts],
                     device,
                     min_width=1)
    boxes = padded.boxes[:, None]  # (B, 1, G, 4)
    size = (boxes.shape[0], points.shape[0], boxes.shape[2])
    areas = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    areas = areas.expand(size).contiguous()  # stock's repeat: (B, P, G)
    xs = points[:, 0][None, :, None]
    ys = points[:, 1][None, :, None]
    left = xs - boxes[..., 0]
    right = boxes[..., 2] - xs
    top = ys - boxes[..., 1]
    bottom = boxes[..., 3] - ys
    bbox_targets = torch.stack((left, top, right, bottom), -1)
    if head.center_sampling:
        center_xs = (boxes[..., 0] + boxes[..., 2]) / 2
        center_ys = (boxes[..., 1] + boxes[..., 3]) / 2
        stride = _level_strides(head, num_points, center_xs.dtype,
                                device)[None, :, None]
        x_mins = center_xs - stride
        y_mins = center_ys - stride
        x_maxs = center_xs + stride
        y_maxs = center_ys + stride
        # stock stores these in a zeros_like(boxes): the boxes' dtype
        dtype = boxes.dtype
        cx0 = torch.where(x_mins > boxes[..., 0], x_mins, boxes[...,
                                                                0]).to(dtype)
        cy0 = torch.where(y_mins > boxes[..., 1], y_mins, boxes[...,
                                                                1]).to(dtype)
        cx1 = torch.where(x_maxs > boxes[..., 2], boxes[..., 2],
                          x_maxs).to(dtype)
        cy1 = torch.where(y_maxs > boxes[..., 3], boxes[..., 3],
                          y_maxs).to(dtype)
        center_bbox = torch.stack((xs - cx0, ys - cy0, cx1 - xs, cy1 - ys), -1)
        inside_gt_bbox_mask = center_bbox.min(-1)[0] > 0
    else:
        inside_gt_bbox_mask = bbox_targets.min(-1)[0] > 0
    max_regress_distance = bbox_targets.max(-1)[0]
    inside_regress_range = ((max_regress_distance >= ranges[None, :, None, 0])
                            &
                            (max_regress_distance <= ranges[None, :, None, 1]))
    # stock's index put stores INF as the dtype holds it (inf in float16)
    areas.masked_fill_(~(inside_gt_bbox_mask & inside_regress_range),
                       areas.new_tensor(inf))
    # padding: +inf, after the real columns, so that it never comes before
    # one (a valid box may have an area over INF, or an infinite one)
    areas.masked_fill_(~padded.mask[:, None, :], float('inf'))
    min_area, min_area_inds = areas.min(dim=2)
    labels = padded.labels.gather(1, min_area_inds)
    labels.masked_fill_(min_area == inf, head.num_classes)
    bbox_targets = bbox_targets.gather(
        2, min_area_inds[..., None, None].expand(*size[:2], 1, 4))[:, :, 0]
    empty = [i for i, count in enumerate(padded.counts) if count == 0]
    if empty:  # stock: background labels, new_zeros boxes
        labels[empty] = head.num_classes
        bbox_targets[empty] = 0
    return labels, bbox_targets


def point_targets(head: Any, points: Sequence[Tensor],
                  batch_gt_instances: Sequence[Any]) -> tuple:
    """Stock's ``FCOSHead.get_targets(points, batch_gt_instances)``.

    Args:
        head: The ``FCOSHead`` (``regress_ranges``, ``strides``,
            ``center_sampling``, ``center_sample_radius``,
            ``norm_on_bbox``, ``num_classes``).
        points (Sequence[Tensor]): ``(n_level, 2)`` points per level.
        batch_gt_instances (Sequence[InstanceData]): ``bboxes`` (``(n,
            4)``) and ``labels`` per image, on the points' device.

    Returns:
        tuple: ``(labels, bbox_targets)`` per level, each the images'
        rows one after another, as stock returns them.
    """
    num_levels = len(points)
    expanded_regress_ranges = [
        points[i].new_tensor(head.regress_ranges[i])[None].expand_as(points[i])
        for i in range(num_levels)
    ]
    ranges = torch.cat(expanded_regress_ranges, dim=0)
    concat_points = torch.cat(points, dim=0)
    num_points = [center.size(0) for center in points]
    counts = [int(gt.bboxes.shape[0]) for gt in batch_gt_instances]
    labels_parts, bbox_parts = [], []
    for start, end in image_groups(counts, concat_points.shape[0]):
        labels, bbox_targets = _group_targets(head,
                                              batch_gt_instances[start:end],
                                              concat_points, ranges,
                                              num_points)
        labels_parts.append(labels)
        bbox_parts.append(bbox_targets)
    labels = labels_parts[0] if len(labels_parts) == 1 else torch.cat(
        labels_parts)
    bbox_targets = bbox_parts[0] if len(bbox_parts) == 1 else torch.cat(
        bbox_parts)
    concat_lvl_labels, concat_lvl_bbox_targets = [], []
    for level_labels, level_boxes, stride in zip(
            images_to_levels(labels, num_points),
            images_to_levels(bbox_targets, num_points), head.strides):
        # stock's cat: dense (a one-point level's reshape is a view)
        concat_lvl_labels.append(level_labels.reshape(-1).contiguous())
        level_boxes = level_boxes.reshape(-1, 4).contiguous()
        if head.norm_on_bbox:
            level_boxes = level_boxes / stride
        concat_lvl_bbox_targets.append(level_boxes)
    return concat_lvl_labels, concat_lvl_bbox_targets
