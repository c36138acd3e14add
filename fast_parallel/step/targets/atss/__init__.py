"""``ATSSHead`` / ``GFLHead.get_targets`` for the whole batch, on one instance.

:func:`~fast_parallel.step.targets.switch.install` puts :func:`get_targets`
on one ``ATSSHead`` or ``GFLHead`` instance in place of the class's (stock's
``loss_by_feat`` calls it as ``self.get_targets``); it returns
:func:`~fast_parallel.step.targets.atss.targets.atss_targets`'s result,
stock's bit for bit. A batch outside what that covers runs stock's
``get_targets``, and an image whose candidates tie is computed by stock's
``_get_targets_single``; both counted. Both also get
:func:`loss_by_feat` (every level's losses at once). Reasoning:
``docs/targets_atss.md``.
"""
from itertools import accumulate
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.compat.targets import (replaced_reason, targets_single,
                                          upstream)
from fast_parallel.outcome import Outcome
from fast_parallel.step.targets.atss.gfl_losses import (gfl_loss_by_feat,
                                                        gfl_loss_reason)
from fast_parallel.step.targets.atss.levels import losses_part, number
from fast_parallel.step.targets.atss.losses import (atss_loss_by_feat,
                                                    loss_reason)
from fast_parallel.step.targets.atss.targets import atss_targets
from fast_parallel.step.targets.max_iou.sampling import sampler_reason
from fast_parallel.step.targets.padding import (gt_layout_reason,
                                                images_to_levels)
from fast_parallel.step.targets.priors import valid_flags
from fast_parallel.step.targets.stats import TargetStats
from fast_parallel.step.targets.stock_way import batch_targets

__all__ = [
    'assigner_reason', 'batch_reason', 'batched', 'get_anchors', 'get_targets',
    'loss_by_feat', 'loss_part', 'supported'
]


def assigner_reason(assigner: Any) -> Optional[str]:
    """None for an ``ATSSAssigner`` the batched assignment reproduces."""
    if type(assigner) is not upstream('ATSSAssigner'):
        return f'assigner {type(assigner).__name__} is not ATSSAssigner'
    why = replaced_reason((assigner, 'ATSSAssigner'), label='ATSSAssigner.')
    if why:
        return why
    if assigner.alpha is not None:
        return 'ATSSAssigner.alpha is set (DDOD\'s cost-based assignment)'
    if type(assigner.topk) is not int or assigner.topk < 1:
        return 'ATSSAssigner.topk is not a positive int'
    if not number(assigner.ignore_iof_thr) or assigner.ignore_iof_thr > 0:
        return 'ATSSAssigner.ignore_iof_thr > 0 (ignore boxes read)'
    iou = assigner.iou_calculator
    if type(iou) is not upstream('BboxOverlaps2D'):
        return f'iou_calculator {type(iou).__name__} is not BboxOverlaps2D'
    if iou.scale != 1. or iou.dtype is not None:
        return 'BboxOverlaps2D with scale or dtype options'
    return None


def loss_by_feat(self: Any, *args: Any, **kwargs: Any) -> dict:
    """Stock's ``loss_by_feat`` of this ``ATSSHead`` or ``GFLHead``, every
    level's losses at once (:mod:`.losses`, :mod:`.gfl_losses`)."""
    if type(self) is upstream('GFLHead'):
        return gfl_loss_by_feat(self, *args, **kwargs)
    return atss_loss_by_feat(self, *args, **kwargs)


def loss_part(head: Any) -> Tuple[Outcome, TargetStats]:
    """The losses' part of the start line for a switched ``ATSSHead`` or
    ``GFLHead``, and their counter."""
    gfl = type(head) is upstream('GFLHead')
    return losses_part(head,
                       gfl_loss_reason(head) if gfl else loss_reason(head))


def supported(head: Any) -> Optional[str]:
    """None when :func:`get_targets` is exact for this head, else why not.

    Args:
        head: A dense head.

    Returns:
        Optional[str]: None, or a short reason (for the log).
    """
    name = type(head).__name__
    if type(head) not in (upstream('ATSSHead'), upstream('GFLHead')):
        return f'{name} is not ATSSHead or GFLHead'
    if not getattr(head, 'train_cfg', None) or not hasattr(head, 'assigner'):
        return f'{name} has no train_cfg (no assigner)'
    return assigner_reason(head.assigner) or head_reason(head)


def head_reason(head: Any) -> Optional[str]:
    """Why the batched targets do not cover this head's options (sampler,
    coder, ``train_cfg``, anchors, methods replaced on the instance), or
    None. The caller checks its class and assigner."""
    name = type(head).__name__
    if type(head.sampler) is not upstream('PseudoSampler'):
        return sampler_reason(head.sampler) or \
            f'sampler {type(head.sampler).__name__} is not PseudoSampler'
    if type(head) is not upstream('GFLHead') and not head.reg_decoded_bbox \
            and type(head.bbox_coder) is not upstream('DeltaXYWHBBoxCoder'):
        return f'bbox_coder {type(head.bbox_coder).__name__} is not ' \
            'DeltaXYWHBBoxCoder'
    for key in ('pos_weight', 'allowed_border'):
        if not number(head.train_cfg.get(key, None)):
            return f'train_cfg.{key} is not a number'
    if type(head.num_classes) is not int:
        return 'num_classes is not an int'
    generator = head.prior_generator
    if type(generator) is not upstream('AnchorGenerator') or \
            generator.use_box_type:
        return 'prior_generator is not AnchorGenerator (tensor anchors)'
    return replaced_reason((head, name))


def batch_reason(anchor_list: Sequence[Sequence[Tensor]],
                 valid_flag_list: Sequence[Sequence[Tensor]],
                 gts: Sequence[Any], metas: Sequence[dict],
                 ignores: Sequence[Any]) -> Optional[str]:
    """Why this batch's targets take the stock path, or None."""
    if not metas or any(
            len(x) != len(metas)
            for x in (anchor_list, valid_flag_list, gts, ignores)):
        return 'an empty batch, or lists of other lengths'
    first = anchor_list[0]
    if any(
            len(a) != len(first) or any(x is not y for x, y in zip(a, first))
            for a in anchor_list):
        return 'images with other anchors'
    device = first[0].device
    if any(
            type(a) is not Tensor or a.dtype != torch.float32 or a.dim() != 2
            or a.shape[1] != 4 or a.device != device for a in first):
        return 'anchors not float32 (n, 4) tensors on one device'
    if not sum(a.shape[0] for a in first):
        return 'no anchor at all'
    if any(
            len(flags) != len(first) or any(f.dtype != torch.bool or f.shape !=
                                            a.shape[:1] or f.device != device
                                            for f, a in zip(flags, first))
            for flags in valid_flag_list):
        return 'valid flags unlike the anchors'
    if any(
            type(gt.bboxes) is not Tensor or gt.bboxes.dtype != torch.float32
            or gt.bboxes.device != device for gt in gts):
        return 'boxes are not float32 tensors on the anchors\' device'
    why = gt_layout_reason(gts, device)
    if why is not None:
        return why
    if any(gt.labels.dtype != torch.long for gt in gts):
        # stock's index put of the labels raises for other integer types
        return 'labels are not int64'
    if any('img_shape' not in meta for meta in metas):
        return 'an image without img_shape'
    if any(i is not None and not hasattr(i, 'bboxes') for i in ignores):
        return 'ignored instances without bboxes (stock raises)'
    return None


def get_anchors(self: Any,
                featmap_sizes: List[Any],
                batch_img_metas: List[dict],
                device: Any = 'cuda') -> tuple:
    """Stock's ``AnchorHead.get_anchors``: the same anchors (one list for
    every image, as stock's) and valid flags, made for the batch at once.

    The flags of each pad shape are made on the host (as
    ``AnchorGenerator.valid_flags`` makes them) and sent in one copy; each
    image's level flags are slices of it.

    Args:
        self: The ``ATSSHead`` or ``GFLHead``.
        featmap_sizes (list): Feature map size per level.
        batch_img_metas (list[dict]): ``pad_shape`` per image.
        device: Where the anchors go. Defaults to ``'cuda'`` (stock's).

    Returns:
        tuple: ``(anchor_list, valid_flag_list)``, per image and level.
    """
    if not batch_img_metas:
        return type(self).get_anchors(self, featmap_sizes, batch_img_metas,
                                      device)
    anchors = self.prior_generator.grid_priors(featmap_sizes, device=device)
    flags = valid_flags(self, featmap_sizes, batch_img_metas,
                        torch.device(device))
    ends = list(accumulate(a.shape[0] for a in anchors))
    return [anchors] * len(batch_img_metas), [[
        flags[i, end - a.shape[0]:end] for a, end in zip(anchors, ends)
    ] for i in range(len(batch_img_metas))]


def get_targets(self: Any,
                anchor_list: List[List[Tensor]],
                valid_flag_list: List[List[Tensor]],
                batch_gt_instances: Sequence[Any],
                batch_img_metas: List[dict],
                batch_gt_instances_ignore: Optional[Sequence[Any]] = None,
                unmap_outputs: bool = True) -> tuple:
    """Stock's ``ATSSHead.get_targets`` (``GFLHead``'s), batched.

    Args:
        self: The ``ATSSHead`` or ``GFLHead``.
        anchor_list (list[list[Tensor]]): Anchors per image and level.
        valid_flag_list (list[list[Tensor]]): Valid flags, the same way.
        batch_gt_instances (Sequence[InstanceData]): Ground truths.
        batch_img_metas (list[dict]): Meta information per image.
        batch_gt_instances_ignore (Sequence, optional): Ignored instances
            (not read by an ``ATSSAssigner`` without ``ignore_iof_thr``).
        unmap_outputs (bool): Stock's option; False runs stock's way.

    Returns:
        tuple: ``(anchors_list, labels_list, label_weights_list,
        bbox_targets_list, bbox_weights_list, avg_factor)``, stock's.
    """
    return batched(
        self, anchor_list, valid_flag_list, batch_gt_instances,
        batch_img_metas, batch_gt_instances_ignore, unmap_outputs,
        type(self).get_targets,
        stacked_targets(self, batch_gt_instances, batch_img_metas,
                        targets_single(self), per_level))


def batched(
        self: Any,
        anchor_list: List[List[Tensor]],
        valid_flag_list: List[List[Tensor]],
        gts: Sequence[Any],
        metas: List[dict],
        ignores: Optional[Sequence[Any]],
        unmap_outputs: bool,
        stock: Callable,
        compute: Callable,
        more_reason: Optional[Callable[[int], Optional[str]]] = None) -> tuple:
    """The batched targets where :func:`batch_reason` (and ``more_reason``
    of the anchor count) allows, else ``stock(self, anchor_list,
    valid_flag_list, gts, metas, ignores, unmap_outputs)``; counted.

    ``compute(flat_anchors, valid, level_sizes, ignores, way)`` makes the
    batched result (None: stock's way after all).

    Returns:
        tuple: ``compute``'s result, or stock's.
    """
    num_imgs = len(metas)
    per_image = [None] * num_imgs if ignores is None else ignores
    with batch_targets(self, num_imgs) as way:
        why = batch_reason(anchor_list, valid_flag_list, gts, metas, per_image)
        if why is None and unmap_outputs:
            levels = anchor_list[0]
            sizes = [a.shape[0] for a in levels]
            why = more_reason and more_reason(sum(sizes))
        if why is None and unmap_outputs:
            flags = [f for image in valid_flag_list for f in image]
            out = compute(
                torch.cat(levels),
                torch.cat(flags).view(num_imgs, -1), sizes, per_image, way)
            if out is not None:
                return out
        way.count(num_imgs)
        return stock(self, anchor_list, valid_flag_list, gts, metas, ignores,
                     unmap_outputs)


def stacked_targets(self: Any, gts: Sequence[Any], metas: List[dict],
                    single: Callable, finish: Callable) -> Callable:
    """:func:`batched`'s ``compute`` of the ATSS family: ``finish(stacked,
    avg_factor, level_sizes)`` of :func:`~.targets.atss_targets`, an image
    stock must compute computed by ``single``."""

    def compute(flat: Tensor, valid: Tensor, sizes: List[int],
                ignores: Sequence[Any], way: Any) -> tuple:
        stacked, avg_factor = atss_targets(self, flat, valid, sizes, gts,
                                           metas, ignores, single, way)
        return finish(stacked, avg_factor, sizes)

    return compute


def per_level(stacked: List[Tensor], avg_factor: int,
              sizes: List[int]) -> tuple:
    """``get_targets``' result: each stacked target per level, then the
    ``avg_factor``."""
    return (*(images_to_levels(t, sizes) for t in stacked), avg_factor)
