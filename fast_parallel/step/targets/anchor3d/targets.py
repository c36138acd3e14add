"""Anchor targets of mmdet3d's ``Anchor3DHead`` for the whole batch at once.

:func:`anchor_target_3d_batched` returns what ``head.anchor_target_3d``
returns (mmdet3d 1.4.0, ``Max3DIoUAssigner`` + ``PseudoSampler`` +
``DeltaXYZWLHRBBoxCoder``), bit for bit, with padded ground truths and masks
instead of one assignment per sample and per ground truth: its aten operation
count depends on the number of anchor sets (classes), not on the batch size
or the number of boxes. Why each step is exact: ``docs/targets_anchor3d.md``.
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat import CompatError
from fast_parallel.compat.targets import replaced_reason, upstream
from fast_parallel.step.targets.cpu_paths import (PathModelError,
                                                  require_same_paths)
from fast_parallel.step.targets.max_iou.assign import assign_batch
from fast_parallel.step.targets.padding import pad_gts
from fast_parallel.step.targets.stock_way import StockWay

__all__ = ['anchor3d_supported', 'anchor_target_3d_batched']


def _assigners(head: Any) -> list:
    """The head's assigners as a list (one per anchor set)."""
    assigner = head.bbox_assigner
    return list(assigner) if isinstance(assigner, list) else [assigner]


def anchor3d_supported(head: Any) -> Optional[str]:
    """Whether :func:`anchor_target_3d_batched` covers this head exactly.

    Args:
        head: A dense head instance.

    Returns:
        Optional[str]: None when covered, else a short reason (for the log).
    """
    try:
        if type(head) is not upstream('Anchor3DHead'):
            return f'{type(head).__name__} is not Anchor3DHead'
        if getattr(head, 'train_cfg',
                   None) is None or not hasattr(head, 'bbox_assigner'):
            return 'Anchor3DHead has no train_cfg (no assigner)'
        why = replaced_reason((head, 'Anchor3DHead'), label='Anchor3DHead.')
        if why:
            return why
        for assigner in _assigners(head):
            if type(assigner) is not upstream('Max3DIoUAssigner'):
                return f'assigner {type(assigner).__name__} is not ' \
                    'Max3DIoUAssigner'
            why = replaced_reason((assigner, 'MaxIoUAssigner'),
                                  label='Max3DIoUAssigner.')
            if why:
                return why
            calc = type(assigner.iou_calculator)
            if calc is not upstream('BboxOverlapsNearest3D'):
                return f'iou_calculator {calc.__name__} is not ' \
                    'BboxOverlapsNearest3D'
        if type(head.bbox_sampler) is not upstream('PseudoSampler3D'):
            return f'sampler {type(head.bbox_sampler).__name__} is not ' \
                'PseudoSampler (sampling=True)'
        if type(head.bbox_coder) is not upstream('DeltaXYZWLHRBBoxCoder'):
            return f'bbox_coder {type(head.bbox_coder).__name__} is not ' \
                'DeltaXYZWLHRBBoxCoder'
        if not isinstance(
                head.train_cfg.get('pos_weight', None), (int, float)):
            return 'train_cfg.pos_weight is not a number'
    except CompatError as error:
        return str(error)
    return None


def _shared_anchors(anchor_list: Sequence[Sequence[Tensor]]) -> bool:
    """Whether every sample has the same anchor tensors (``get_anchors``)."""
    first = anchor_list[0]
    return all(
        levels is first or (len(levels) == len(first) and all(
            a is b for a, b in zip(levels, first))) for levels in anchor_list)


def _log_is_positionless(anchors: Tensor) -> bool:
    """Whether ``log`` gives an element the same bits wherever it sits.

    The box encoding takes ``log`` over every anchor of the batch, stock over
    each sample's positives: equal on CUDA (one function per element) and on
    a CPU build whose vector and scalar loops agree (checked once).
    """
    if anchors.device.type != 'cpu':
        return True
    try:
        require_same_paths('log')
    except PathModelError:
        return False
    return True


def _gt_tensor(instances: Any) -> Tensor:
    """The gt boxes of a sample as a tensor (stock may have swapped it in)."""
    boxes = instances.bboxes_3d
    return boxes if isinstance(boxes, Tensor) else boxes.tensor


def _needs_stock(head: Any, gts: Tensor, ignore: Any, anchors: Tensor) -> bool:
    """Whether one sample must take the stock path to stay exact.

    Ignore boxes change the overlaps; ``gpu_assign_thr`` makes stock compute
    the overlaps on the CPU (other rounding than the GPU's); another dtype
    than the anchors' promotes differently once padded with the others.
    """
    assigners = _assigners(head)
    if ignore is not None and ('bboxes_3d' not in ignore
                               or any(a.ignore_iof_thr > 0
                                      for a in assigners)):
        return True
    if anchors.device.type != 'cpu' and any(0 < a.gpu_assign_thr < len(gts)
                                            for a in assigners):
        return True
    return gts.dtype != anchors.dtype or gts.dim() != 2


def _targets_one_set(head: Any, assigner: Any, anchors: Tensor, boxes: Tensor,
                     labels: Tensor, valid: Tensor,
                     num_classes: int) -> Tuple[Tensor, ...]:
    """``anchor_target_single_assigner`` for all samples of one anchor set.

    Returns:
        tuple[Tensor]: (B, A) labels, label weights, (B, A, C) bbox targets,
        bbox weights, (B, A) dir targets, dir weights, and (B,) counts of
        positive and negative anchors.
    """
    batch, num_gts, dim = boxes.shape
    overlaps = assigner.iou_calculator(boxes.reshape(-1, dim), anchors)
    assigned, _ = assign_batch(assigner, overlaps.view(batch, num_gts, -1),
                               valid)
    pos, neg = assigned > 0, assigned == 0
    gt_index = (assigned - 1).clamp(min=0)
    pos_gts = boxes.gather(1, gt_index[..., None].expand(-1, -1, dim))
    # elementwise on every anchor, then kept where positive: the positive
    # rows hold the values stock computes on its compacted rows
    deltas = head.bbox_coder.encode(anchors, pos_gts)
    dirs = upstream('get_direction_target')(
        anchors, deltas, head.dir_offset, head.dir_limit_offset, one_hot=False)
    pos_weight = head.train_cfg.pos_weight
    pos_weight = 1.0 if pos_weight <= 0 else pos_weight
    box_weights = pos.to(anchors.dtype)[..., None]
    return (torch.where(pos,
                        labels.gather(1, gt_index).long(),
                        num_classes), torch.where(pos, pos_weight,
                                                  neg.float()),
            torch.where(pos[..., None], deltas.to(anchors.dtype),
                        0.), box_weights.repeat(1, 1, anchors.size(-1)),
            torch.where(pos, dirs, 0), pos.float(), pos.sum(1), neg.sum(1))


def _batch_target_tensors(head: Any, anchors: Tensor, boxes: List[Tensor],
                          labels: List[Tensor],
                          num_classes: int) -> Tuple[Tensor, ...]:
    """``anchor_target_3d_single`` for all samples: one or per-class sets."""
    boxes, labels, valid, _ = pad_gts(boxes, labels, anchors.device, 1)
    if not isinstance(head.bbox_assigner, list):
        flat = anchors.reshape(-1, anchors.size(-1))
        return _targets_one_set(head, head.bbox_assigner, flat, boxes, labels,
                                valid, num_classes)
    feat_size = anchors.size(0) * anchors.size(1) * anchors.size(2)
    rot_angles, code = anchors.size(-2), anchors.size(-1)
    assert len(head.bbox_assigner) == anchors.size(-3)
    sets = []
    for i, assigner in enumerate(head.bbox_assigner):  # a constant loop
        current = anchors[..., i, :, :].reshape(-1, head.box_code_size)
        seen = valid & (labels == i) if head.assign_per_class else valid
        sets.append(
            _targets_one_set(head, assigner, current, boxes, labels, seen,
                             num_classes))
    batch = len(valid)
    shapes = ((feat_size, 1, rot_angles), ) * 2 + (
        (feat_size, 1, rot_angles, code), ) * 2 + (
            (feat_size, 1, rot_angles), ) * 2
    out = []
    for k, shape in enumerate(shapes):
        parts = [s[k].reshape(batch, *shape) for s in sets]
        merged = torch.cat(parts, dim=-len(shape) + 1)
        out.append(
            merged.reshape(batch, -1, code) if len(shape) ==
            4 else merged.reshape(batch, -1))
    return (*out, sum(s[6] for s in sets), sum(s[7] for s in sets))


def _stock_batch(head: Any, stock_way: StockWay, anchor_list: list, *args:
                 Any) -> tuple:
    """The class's own ``anchor_target_3d`` (the instance's may be ours)."""
    stock_way.count(len(anchor_list))
    return type(head).anchor_target_3d(head, anchor_list, *args)


def anchor_target_3d_batched(
        head: Any,
        anchor_list: List[List[Tensor]],
        batch_gt_instances_3d: List[Any],
        batch_input_metas: List[dict],
        batch_gt_instances_ignore: Optional[List[Any]] = None,
        label_channels: int = 1,
        num_classes: int = 1,
        sampling: bool = True,
        stock_way: Optional[StockWay] = None) -> Optional[tuple]:
    """``head.anchor_target_3d(...)`` for the whole batch at once.

    The arguments are ``AnchorTrainMixin.anchor_target_3d``'s. The result is
    the same tuple, bit for bit; like stock, ``anchor_list[i]`` becomes the
    concatenated anchors and, with one assigner, ``bboxes_3d`` of each sample
    with gts becomes its tensor. Call it only where
    :func:`anchor3d_supported` returned None.

    Args:
        head: The ``Anchor3DHead``.
        anchor_list (list[list[Tensor]]): Multi-level anchors of each sample.
        batch_gt_instances_3d (list[InstanceData]): ``bboxes_3d`` and
            ``labels_3d`` of each sample.
        batch_input_metas (list[dict]): Meta info of each sample.
        batch_gt_instances_ignore (list, optional): Ignored gts per sample.
            Defaults to None.
        label_channels (int): Passed through as stock does. Defaults to 1.
        num_classes (int): The background label. Defaults to 1.
        sampling (bool): Passed through as stock does. Defaults to True.
        stock_way (StockWay, optional): Counts the samples computed the stock
            way: all of them, through ``head.anchor_target_3d``, when the
            anchors are not shared by the samples or are class-aware lists,
            or on a CPU build whose ``log`` loops differ. Defaults to None (a
            counter of its own).

    Returns:
        tuple: Stock's ``(labels_list, label_weights_list,
        bbox_targets_list, bbox_weights_list, dir_targets_list,
        dir_weights_list, num_total_pos, num_total_neg)``.
    """
    stock_way = stock_way or StockWay()
    num_inputs = len(batch_input_metas)
    assert len(anchor_list) == num_inputs
    if isinstance(anchor_list[0][0], list) or not _shared_anchors(
            anchor_list) or not _log_is_positionless(anchor_list[0][0]):
        return _stock_batch(head, stock_way, anchor_list,
                            batch_gt_instances_3d, batch_input_metas,
                            batch_gt_instances_ignore, label_channels,
                            num_classes, sampling)
    if batch_gt_instances_ignore is None:
        batch_gt_instances_ignore = [None] * num_inputs
    anchors = torch.cat(anchor_list[0])
    gts = [_gt_tensor(x).to(anchors.device) for x in batch_gt_instances_3d]
    stock = [
        i for i in range(num_inputs)
        if _needs_stock(head, gts[i], batch_gt_instances_ignore[i], anchors)
    ]
    widths = {gts[i].size(-1) for i in range(num_inputs) if i not in stock}
    if len(widths) > 1:  # box widths differ: not a batch stock can take
        return _stock_batch(head, stock_way, anchor_list,
                            batch_gt_instances_3d, batch_input_metas,
                            batch_gt_instances_ignore, label_channels,
                            num_classes, sampling)
    level_sizes = [
        a.view(-1, head.box_code_size).size(0) for a in anchor_list[0]
    ]
    for i in range(num_inputs):  # stock's side effect, without the copies
        anchor_list[i] = anchors
    boxes, labels = [], []
    for i, instances in enumerate(batch_gt_instances_3d):
        if i in stock:  # in the batch as a sample without gts
            boxes.append(
                anchors.new_zeros((0, max(widths, default=anchors.size(-1)))))
            labels.append(instances.labels_3d[:0])
            continue
        if not isinstance(head.bbox_assigner, list) and len(gts[i]) > 0:
            instances.bboxes_3d = gts[i]  # stock's side effect
        boxes.append(gts[i])
        labels.append(instances.labels_3d)
    out = list(
        _batch_target_tensors(head, anchors, boxes, labels, num_classes))
    stock_way.count(len(stock))
    for i in stock:
        single = type(head).anchor_target_3d_single(
            head,
            anchors,
            batch_gt_instances_3d[i],
            batch_gt_instances_ignore[i],
            batch_input_metas[i],
            label_channels=label_channels,
            num_classes=num_classes,
            sampling=sampling)
        for k in range(6):
            out[k][i].copy_(single[k].view_as(out[k][i]))
        out[6][i], out[7][i] = single[6].numel(), single[7].numel()
    totals = torch.stack(out[6:]).clamp(min=1).sum(1).tolist()
    levels = []
    for target in out[:6]:  # images_to_levels on the stacked targets
        start, split = 0, []
        for size in level_sizes:
            split.append(target[:, start:start + size])
            start += size
        levels.append(split)
    return (*levels, *totals)
