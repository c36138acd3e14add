"""SimOTA targets of mmdet's ``YOLOXHead`` for the whole batch at once.

:func:`yolox_targets` returns what ``multi_apply(head._get_targets_single,
...)`` returns inside ``YOLOXHead.loss_by_feat`` (mmdet 3.3.0,
``SimOTAAssigner`` + ``BboxOverlaps2D`` + ``PseudoSampler``), bit for bit,
with padded ground truths and masks: its aten operation count does not depend
on the batch size or the number of boxes. An image whose targets hang on an
implementation-defined choice (a tie at a top-k boundary or in a min) is
computed by stock's own method and counted. Why each step is exact:
``docs/targets_yolox.md``.
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat import yolox_targets_single
from fast_parallel.compat.targets import replaced_reason, upstream
from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.padding import gt_layout_reason, pad_gts
from fast_parallel.step.targets.stock_way import StockWay
from fast_parallel.step.targets.yolox import simota

#: ``YOLOXHead._get_l1_target``'s default ``eps``, which is reproduced here.
_L1_EPS = 1e-8
#: The prediction dtypes covered (float16 and bfloat16: under AMP).
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

__all__ = ['assign_batch', 'prior_scores', 'yolox_supported', 'yolox_targets']


def _stock_single(head: Any) -> Any:
    """The head's per-image stock target method (through the seam)."""
    return yolox_targets_single(head)


def yolox_supported(head: Any) -> Optional[str]:
    """Whether :func:`yolox_targets` covers ``head``.

    Args:
        head: A dense head.

    Returns:
        Optional[str]: None when covered, else why not (for the log).
    """
    if type(head) is not upstream('YOLOXHead'):
        return f'{type(head).__name__} is not YOLOXHead'
    assigner = getattr(head, 'assigner', None)
    if type(assigner) is not upstream('SimOTAAssigner'):
        return f'assigner {type(assigner).__name__} is not SimOTAAssigner'
    iou = getattr(assigner, 'iou_calculator', None)
    if type(iou) is not upstream('BboxOverlaps2D'):
        return f'iou_calculator {type(iou).__name__} is not BboxOverlaps2D'
    if iou.scale != 1. or iou.dtype is not None:
        return 'BboxOverlaps2D with scale or dtype options'
    if type(getattr(head, 'sampler', None)) is not upstream('PseudoSampler'):
        return 'sampler is not PseudoSampler'
    why = replaced_reason((head, 'YOLOXHead'), (assigner, 'SimOTAAssigner'))
    if why:
        return why
    topk = assigner.candidate_topk
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        return f'candidate_topk={topk!r} is not a positive int'
    for name in ('center_radius', 'iou_weight', 'cls_weight'):
        if not isinstance(getattr(assigner, name), (int, float)):
            return f'SimOTAAssigner.{name} is not a number'
    return None


def yolox_targets(head: Any,
                  priors: Tensor,
                  cls_preds: Tensor,
                  decoded_bboxes: Tensor,
                  objectness: Tensor,
                  batch_gt_instances: Sequence[Any],
                  batch_img_metas: Sequence[dict],
                  batch_gt_instances_ignore: Optional[Sequence[Any]] = None,
                  stock_way: Optional[StockWay] = None) -> tuple:
    """Stock's ``multi_apply(head._get_targets_single, ...)``, batched.

    Args:
        head: A head :func:`yolox_supported` covers.
        priors (Tensor): ``(N, 4)`` or ``(B, N, 4)`` priors
            ``[x, y, stride_w, stride_h]``, as ``loss_by_feat`` makes them.
        cls_preds (Tensor): ``(B, N, num_classes)`` logits.
        decoded_bboxes (Tensor): ``(B, N, 4)`` decoded boxes.
        objectness (Tensor): ``(B, N)`` logits.
        batch_gt_instances (Sequence[InstanceData]): ``bboxes`` and ``labels``
            per image.
        batch_img_metas (Sequence[dict]): Per image (stock's path only).
        batch_gt_instances_ignore (Sequence, optional): Ignored boxes, which
            stock's ``SimOTAAssigner.assign`` (mmdet 3.3.0) takes and never
            reads: they change nothing, here as in stock. Defaults to None.
        stock_way (StockWay, optional): Counts the images computed the stock
            way. Defaults to None (a counter of its own).

    Returns:
        tuple: ``(pos_masks, cls_targets, obj_targets, bbox_targets,
        l1_targets, num_pos_per_img)``: six per-image lists, as stock returns
        them.
    """
    num_imgs = len(batch_gt_instances)
    ignore = list(batch_gt_instances_ignore or [None] * num_imgs)
    args = (priors, cls_preds.detach(), decoded_bboxes.detach(),
            objectness.detach())
    rows: List[Optional[tuple]] = [None] * num_imgs
    if _batch_reason(head, *args, batch_gt_instances, ignore) is None:
        try:
            rows = _image_results_or_none(head, *args, batch_gt_instances)
        except cpu_paths.PathModelError:
            rows = [None] * num_imgs
    stock = _stock_single(head)
    (stock_way or StockWay()).fill(
        rows, lambda i: stock(priors if priors.dim() == 2 else priors[i], args[
            1][i], args[2][i], args[3][i], batch_gt_instances[i],
                              batch_img_metas[i], ignore[i]))
    return tuple(map(list, zip(*rows)))


def _batch_reason(head: Any, priors: Tensor, cls: Tensor, boxes: Tensor,
                  obj: Tensor, gts: Sequence[Any],
                  ignore: Sequence[Any]) -> Optional[str]:
    """Why this batch takes the stock path, or None.

    Ignore boxes are no reason: the covered ``SimOTAAssigner.assign`` (not
    replaced on the instance, :func:`yolox_supported`) never reads them.
    """
    if cls.dim() != 3:
        return 'shapes'
    num_imgs, num_priors = cls.shape[:2]
    f32, device = torch.float32, cls.device
    if (cls.shape[2] != head.num_classes
            or boxes.shape != (num_imgs, num_priors, 4)
            or obj.shape != (num_imgs, num_priors)
            or priors.shape[-2:] != (num_priors, 4)
            or priors.dim() == 3 and priors.shape[0] != num_imgs
            or len(gts) != num_imgs or num_priors == 0):
        return 'shapes'
    # Under CUDA autocast the decoded boxes are float32 (their exp runs in
    # float32) while scores and priors are half: both are covered.
    if any(
            type(t) is not Tensor or t.dtype != cls.dtype or t.device != device
            for t in (priors, cls, obj)) or cls.dtype not in _DTYPES or type(
                boxes) is not Tensor or boxes.dtype not in (
                    cls.dtype, torch.float32) or boxes.device != device:
        return 'dtypes or devices (scores and priors of one of float32, ' \
            'float16 and bfloat16, boxes of theirs or float32, on one ' \
            'device, covered)'
    if any(
            type(g.bboxes) is not Tensor or g.bboxes.dtype != f32
            or g.bboxes.device != device for g in gts):
        return 'ground truth boxes not float32 on the predictions\' device'
    why = gt_layout_reason(gts, device)
    if why is not None:
        return why
    if device.type == 'cuda' and cls.shape[2] > 128 and cls.shape[2] % 4:
        return 'CUDA, > 128 classes not a multiple of 4 (row alignment)'
    if device.type == 'cpu' and not (cls.is_contiguous()
                                     and obj.is_contiguous()):
        return 'non-contiguous predictions on CPU'
    return None


def _min4(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """Elementwise min of four (stock: ``stack(...).min(dim).values``)."""
    return torch.minimum(torch.minimum(a, b), torch.minimum(c, d))


def _in_gt_and_center(assigner: Any, priors: Tensor, gt: Tensor,
                      gt_mask: Tensor) -> Tuple[Tensor, Tensor]:
    """Stock's ``get_in_gt_and_in_center_info``, ``(B, N, G)`` at once.

    Returns:
        tuple[Tensor, Tensor]: ``valid`` ``(B, N)`` (in some box or centre
        region) and ``in_both`` ``(B, N, G)``.
    """
    x, y, stride_x, stride_y = (priors[..., i, None] for i in range(4))
    x1, y1, x2, y2 = (gt[:, None, :, i] for i in range(4))
    in_gts = _min4(x - x1, y - y1, x2 - x, y2 - y) > 0
    cxs = ((gt[..., 0] + gt[..., 2]) / 2.0).unsqueeze(1)
    cys = ((gt[..., 1] + gt[..., 3]) / 2.0).unsqueeze(1)
    radius_x = assigner.center_radius * stride_x
    radius_y = assigner.center_radius * stride_y
    in_cts = _min4(x - (cxs - radius_x), y - (cys - radius_y),
                   (cxs + radius_x) - x, (cys + radius_y) - y) > 0
    in_gts &= gt_mask.unsqueeze(1)
    in_cts &= gt_mask.unsqueeze(1)
    return in_gts.any(-1) | in_cts.any(-1), in_gts & in_cts


def prior_scores(cls: Tensor, obj: Tensor) -> Tensor:
    """Stock's ``(cls.sigmoid() * obj.unsqueeze(1).sigmoid()).sqrt_()`` of
    every image, for the batch at once.

    Args:
        cls (Tensor): ``(B, N, C)`` class logits, contiguous.
        obj (Tensor): ``(B, N)`` objectness logits, contiguous.

    Returns:
        Tensor: ``(B, N, C)``; each sigmoid element as stock's per-image call
        computes it (see :mod:`cpu_paths`).
    """
    num_imgs, num_priors, num_classes = cls.shape
    scores = cpu_paths.as_stock('sigmoid', cls,
                                [num_priors * num_classes] * num_imgs)
    scores = scores * cpu_paths.as_stock('sigmoid', obj,
                                         [num_priors] * num_imgs).unsqueeze(-1)
    return scores.sqrt_()


@torch.no_grad()
def assign_batch(
        head: Any, priors: Tensor, cls: Tensor, boxes: Tensor, obj: Tensor,
        gts: Sequence[Any]
) -> Optional[Tuple[Tensor, Tensor, simota.Assignment]]:
    """SimOTA for a batch :func:`yolox_targets` covers (no ignore boxes).

    Args:
        head: The ``YOLOXHead``.
        priors (Tensor): ``(N, 4)`` or ``(B, N, 4)`` priors.
        cls (Tensor): ``(B, N, C)`` class logits.
        boxes (Tensor): ``(B, N, 4)`` decoded boxes.
        obj (Tensor): ``(B, N)`` objectness logits.
        gts (Sequence[InstanceData]): Ground truths per image.

    Returns:
        Optional[tuple]: Padded boxes ``(B, G, 4)``, labels ``(B, G)`` and the
        :class:`simota.Assignment`; None when no image has a ground truth.
    """
    gt, labels, gt_mask, counts = pad_gts([g.bboxes for g in gts],
                                          [g.labels for g in gts], cls.device)
    if gt.shape[1] == 0:
        return None
    offset = torch.cat(
        [priors[..., :2] + priors[..., 2:] * 0.5, priors[..., 2:]], dim=-1)
    scores = prior_scores(cls, obj)
    valid, in_both = _in_gt_and_center(head.assigner, offset, gt, gt_mask)
    ious = head.assigner.iou_calculator(boxes, gt)
    found = simota.assign(head.assigner, scores, valid, in_both, ious, labels,
                          gt_mask, counts, upstream('SimOTA.INF'),
                          upstream('SimOTA.EPS'))
    return gt, labels, found


@torch.no_grad()
def _image_results_or_none(head: Any, priors: Tensor, cls: Tensor,
                           boxes: Tensor, obj: Tensor,
                           gts: Sequence[Any]) -> List[Optional[tuple]]:
    """The per-image result tuples; None for an image stock must compute."""
    assigned = assign_batch(head, priors, cls, boxes, obj, gts)
    if assigned is None:  # no ground truth anywhere: stock's first branch
        return _no_targets(cls, cls.shape[0])
    gt, labels, found = assigned
    out = simota.build_targets(head, priors, cls, obj, gt, labels,
                               [len(g.bboxes) for g in gts], boxes.dtype,
                               found, upstream('bbox_xyxy_to_cxcywh'), _L1_EPS)
    return [None if found.fallback[i] else row for i, row in enumerate(out)]


def _no_targets(cls: Tensor, num_imgs: int) -> List[tuple]:
    """Stock's ``num_gts == 0`` results for a batch without ground truth."""
    num_priors, num_classes = cls.shape[1:]
    masks = cls.new_zeros((num_imgs, num_priors), dtype=torch.bool)
    objs = cls.new_zeros((num_imgs, num_priors, 1))
    empty_cls = cls.new_zeros((0, num_classes)).split([0] * num_imgs)
    empty_box = cls.new_zeros((0, 4)).split([0] * num_imgs)
    empty_l1 = cls.new_zeros((0, 4)).split([0] * num_imgs)
    return [(masks[i], empty_cls[i], objs[i], empty_box[i], empty_l1[i], 0)
            for i in range(num_imgs)]
