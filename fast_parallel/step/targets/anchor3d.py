"""Anchor targets of mmdet3d's ``Anchor3DHead`` for the whole batch at once.

:func:`anchor_target_3d_batched` returns what ``head.anchor_target_3d``
returns (mmdet3d 1.4.0, ``Max3DIoUAssigner`` + ``PseudoSampler`` +
``DeltaXYZWLHRBBoxCoder``), bit for bit, with padded ground truths and masks
instead of one assignment per sample and per ground truth: its aten operation
count depends on the number of anchor sets (classes), not on the batch size
or the number of boxes. Why each step is exact: ``docs/targets_anchor3d.md``.
"""
import importlib
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat import CompatError
from fast_parallel.step.targets.cpu_paths import (PathModelError,
                                                  require_same_paths)

#: The upstream names used here: (module, name, package). Checked on
#: mmdet3d 1.4.0 and mmdet 3.3.0; none is private, but the targets must
#: follow these exact classes, so any other version goes the stock way.
_UPSTREAM = {
    'Anchor3DHead': ('mmdet3d.models.dense_heads', 'Anchor3DHead', 'mmdet3d'),
    'Max3DIoUAssigner':
    ('mmdet3d.models.task_modules', 'Max3DIoUAssigner', 'mmdet3d'),
    'PseudoSampler':
    ('mmdet3d.models.task_modules', 'PseudoSampler', 'mmdet3d'),
    'DeltaXYZWLHRBBoxCoder':
    ('mmdet3d.models.task_modules', 'DeltaXYZWLHRBBoxCoder', 'mmdet3d'),
    'BboxOverlapsNearest3D':
    ('mmdet3d.structures.ops', 'BboxOverlapsNearest3D', 'mmdet3d'),
    'get_direction_target': ('mmdet3d.models.dense_heads.train_mixins',
                             'get_direction_target', 'mmdet3d'),
}
_CHECKED_ON = {'mmdet3d': '1.4.0', 'mmdet': '3.3.0'}
#: Head methods of the target path that an instance must not override.
_HEAD_METHODS = ('anchor_target_3d_single', 'anchor_target_single_assigner')
#: Assigner methods that an instance must not override.
_ASSIGNER_METHODS = ('assign', 'assign_wrt_overlaps')

__all__ = ['anchor3d_supported', 'anchor_target_3d_batched']


def _upstream(key: str) -> Any:
    """An upstream class or function of :data:`_UPSTREAM`, by key."""
    module, name, package = _UPSTREAM[key]
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise CompatError(
            f'fast_parallel batched anchor targets need `{module}.{name}` '
            f'(checked on {package} {_CHECKED_ON[package]}); it is missing. '
            'Set fast_targets=False to keep the stock targets.') from None


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
        if type(head) is not _upstream('Anchor3DHead'):
            return f'{type(head).__name__} is not Anchor3DHead'
        if getattr(head, 'train_cfg',
                   None) is None or not hasattr(head, 'bbox_assigner'):
            return 'Anchor3DHead has no train_cfg (no assigner)'
        for name in _HEAD_METHODS:
            if name in vars(head):
                return f'Anchor3DHead.{name} replaced on the instance'
        for assigner in _assigners(head):
            if type(assigner) is not _upstream('Max3DIoUAssigner'):
                return f'assigner {type(assigner).__name__} is not ' \
                    'Max3DIoUAssigner'
            if any(name in vars(assigner) for name in _ASSIGNER_METHODS):
                return 'Max3DIoUAssigner.assign replaced on the instance'
            calc = type(assigner.iou_calculator)
            if calc is not _upstream('BboxOverlapsNearest3D'):
                return f'iou_calculator {calc.__name__} is not ' \
                    'BboxOverlapsNearest3D'
        if type(head.bbox_sampler) is not _upstream('PseudoSampler'):
            return f'sampler {type(head.bbox_sampler).__name__} is not ' \
                'PseudoSampler (sampling=True)'
        if type(head.bbox_coder) is not _upstream('DeltaXYZWLHRBBoxCoder'):
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


def _pad(boxes: List[Tensor], labels: List[Tensor],
         device: torch.device) -> Tuple[Tensor, Tensor, Tensor]:
    """Pads the samples' gts into (B, G, D) boxes, (B, G) labels and mask.

    One ``cat`` and one gather whatever the batch: the padding index is built
    on the host from the box counts (shapes, so no device sync) and travels
    in one copy, non-blocking from pinned memory on a GPU.
    """
    counts = [len(b) for b in boxes]
    total, width = sum(counts), max(counts)
    num_gts = max(width, 1)  # one all-padding column when there is no gt
    index, start = [], 0
    for count in counts:
        index.extend(range(start, start + count))
        index.extend([total] * (num_gts - count))  # the dummy row
        start += count
    pinned = device.type == 'cuda'
    index = torch.tensor(
        index, dtype=torch.long, pin_memory=pinned).to(
            device, non_blocking=pinned).view(len(boxes), num_gts)
    dim = boxes[0].size(-1)
    all_boxes = torch.cat([*boxes, boxes[0].new_zeros((1, dim))])
    all_labels = torch.cat([*labels, labels[0].new_full((1, ), -1)])
    return all_boxes[index], all_labels[index], index < total


def _assign(assigner: Any, overlaps: Tensor, valid: Tensor) -> Tensor:
    """``MaxIoUAssigner.assign_wrt_overlaps``'s ``gt_inds`` for a batch.

    Args:
        assigner: The Max3DIoUAssigner of this anchor set.
        overlaps (Tensor): (B, G, A) IoUs of padded gts with the anchors.
        valid (Tensor): (B, G) the gts this assigner sees in each sample.

    Returns:
        Tensor: (B, A) long: -1 ignored, 0 negative, i + 1 the padded gt i.
    """
    batch, num_gts, num_anchors = overlaps.shape
    # Padding below every IoU (>= 0): it never wins a max nor ties with it,
    # and the gts keep their order, so first-index argmax ties are stock's.
    overlaps = overlaps.masked_fill(~valid[..., None], -1.)
    max_overlaps, argmax_overlaps = overlaps.max(dim=1)
    assigned = torch.full_like(argmax_overlaps, -1)
    neg_thr = assigner.neg_iou_thr
    if isinstance(neg_thr, float):
        neg = (max_overlaps >= 0) & (max_overlaps < neg_thr)
        assigned = assigned.masked_fill(neg, 0)
    elif isinstance(neg_thr, tuple):
        assert len(neg_thr) == 2
        neg = (max_overlaps >= neg_thr[0]) & (max_overlaps < neg_thr[1])
        assigned = assigned.masked_fill(neg, 0)
    pos = max_overlaps >= assigner.pos_iou_thr
    assigned = torch.where(pos, argmax_overlaps + 1, assigned)
    if assigner.match_low_quality:
        gt_max, gt_argmax = overlaps.max(dim=2)
        takes = (gt_max >= assigner.min_pos_iou) & valid
        if assigner.gt_max_assign_all:
            hits = overlaps == gt_max[..., None]
        else:
            anchor_ids = torch.arange(num_anchors, device=overlaps.device)
            hits = anchor_ids == gt_argmax[..., None]
        hits &= takes[..., None]
        # stock loops i = 0..G-1, each overwriting the last: the highest
        # gt index that hits an anchor wins it
        order = torch.arange(
            1, num_gts + 1, dtype=torch.int32, device=overlaps.device)
        last = torch.where(hits, order[:, None], 0).amax(dim=1)
        assigned = torch.where(last > 0, last.long(), assigned)
    # a sample with no gt for this assigner: stock skips it, all negative
    return assigned.masked_fill(~valid.any(dim=1, keepdim=True), 0)


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
    assigned = _assign(assigner, overlaps.view(batch, num_gts, -1), valid)
    pos, neg = assigned > 0, assigned == 0
    gt_index = (assigned - 1).clamp(min=0)
    pos_gts = boxes.gather(1, gt_index[..., None].expand(-1, -1, dim))
    # elementwise on every anchor, then kept where positive: the positive
    # rows hold the values stock computes on its compacted rows
    deltas = head.bbox_coder.encode(anchors, pos_gts)
    dirs = _upstream('get_direction_target')(
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


def _batched(head: Any, anchors: Tensor, boxes: List[Tensor],
             labels: List[Tensor], num_classes: int) -> Tuple[Tensor, ...]:
    """``anchor_target_3d_single`` for all samples: one or per-class sets."""
    boxes, labels, valid = _pad(boxes, labels, anchors.device)
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


def _stock_batch(head: Any, anchor_list: list, *args: Any) -> tuple:
    """The class's own ``anchor_target_3d`` (the instance's may be ours)."""
    return type(head).anchor_target_3d(head, anchor_list,
                                       *args), len(anchor_list)


def anchor_target_3d_batched(
        head: Any,
        anchor_list: List[List[Tensor]],
        batch_gt_instances_3d: List[Any],
        batch_input_metas: List[dict],
        batch_gt_instances_ignore: Optional[List[Any]] = None,
        label_channels: int = 1,
        num_classes: int = 1,
        sampling: bool = True) -> Tuple[Optional[tuple], int]:
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

    Returns:
        tuple: ``(targets, num_stock)``: ``targets`` is stock's
        ``(labels_list, label_weights_list, bbox_targets_list,
        bbox_weights_list, dir_targets_list, dir_weights_list, num_total_pos,
        num_total_neg)``; ``num_stock`` how many samples were computed the
        stock way (all of them, through ``head.anchor_target_3d``, when the
        anchors are not shared by the samples or are class-aware lists, or on
        a CPU build whose ``log`` loops differ).
    """
    num_inputs = len(batch_input_metas)
    assert len(anchor_list) == num_inputs
    if isinstance(anchor_list[0][0], list) or not _shared_anchors(
            anchor_list) or not _log_is_positionless(anchor_list[0][0]):
        return _stock_batch(head, anchor_list, batch_gt_instances_3d,
                            batch_input_metas, batch_gt_instances_ignore,
                            label_channels, num_classes, sampling)
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
        return _stock_batch(head, anchor_list, batch_gt_instances_3d,
                            batch_input_metas, batch_gt_instances_ignore,
                            label_channels, num_classes, sampling)
    level_sizes = [
        a.view(-1, head.box_code_size).size(0) for a in anchor_list[0]
    ]
    for i in range(num_inputs):  # stock's side effect, without the copies
        anchor_list[i] = anchors
    boxes, labels = [], []
    for i, instances in enumerate(batch_gt_instances_3d):
        if i in stock:  # in the batch as a sample without gts
            boxes.append(anchors.new_zeros((0, max(widths, default=7))))
            labels.append(instances.labels_3d[:0])
            continue
        if not isinstance(head.bbox_assigner, list) and len(gts[i]) > 0:
            instances.bboxes_3d = gts[i]  # stock's side effect
        boxes.append(gts[i])
        labels.append(instances.labels_3d)
    out = list(_batched(head, anchors, boxes, labels, num_classes))
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
    return (*levels, *totals), len(stock)
