"""Fast form of mmdet's ``Mosaic``: stock's bytes and draws.

The class is stock's, put on the built instance by the switch; its
``transform`` runs stock's steps in stock's order, copying only the boxes it
moves (all patches' in one batch) instead of every results dict, and
decoding only the patches the next ``RandomAffine`` reads
(:mod:`~fast_parallel.pipeline.unread`). Why: ``docs/pipeline.md``.
"""
import copy
from typing import Any, Optional, Tuple

import numpy as np
import torch
from mmdet.datasets.transforms import Mosaic
from mmdet.structures.bbox import autocast_box_type
from numpy import random

from fast_parallel.compat import mosaic_combine
from fast_parallel.pipeline.box_steps import mosaic_boxes, move_operands
from fast_parallel.pipeline.copies import sample_is_plain
from fast_parallel.pipeline.mix_window import (fill, filled, fit_patch,
                                               resize_keeps)
from fast_parallel.pipeline.part_resize import needed_part, resized_part
from fast_parallel.pipeline.scratch import owned_scratch
from fast_parallel.pipeline.stats import count
from fast_parallel.pipeline.unread import (decode_deferred, loaded,
                                           mosaic_reads, pastes_cleanly,
                                           unread)

__all__ = ['FastMosaic', 'batchable', 'moved_boxes', 'mosaic_of']


def mosaic_of(t: Mosaic,
              results: dict,
              mix_results: list,
              with_mask: bool = False) -> dict:
    """Stock's mosaic of ``results`` and three ``mix_results`` (from the
    canvas on, with stock's draws), copying only the boxes it moves.

    Args:
        t (Mosaic | CachedMosaic): The transform (its arguments).
        results (dict): The sample; updated and returned.
        mix_results (list[dict]): The other three; read only.
        with_mask (bool): ``CachedMosaic``'s masks. Defaults to False.

    Returns:
        dict: ``results``.
    """
    mosaic_bboxes = []
    mosaic_bboxes_labels = []
    mosaic_ignore_flags = []
    mosaic_masks = []
    shape = (int(t.img_scale[1] * 2), int(t.img_scale[0] * 2))
    if len(results['img'].shape) == 3:
        shape += (3, )
    # (read by the next RandomAffine alone, then dropped: a one-number pad
    # is cast here, as np.full casts it (its error, its warning), and
    # written below only where the affine reads)
    owned = getattr(t, '_fp_then', None) is not None
    pad = None
    if owned:
        mosaic_img = owned_scratch('mosaic', shape, results['img'].dtype)
        if type(t.pad_val) in (int, float):
            pad = np.empty((), mosaic_img.dtype)
            np.copyto(pad, t.pad_val, casting='unsafe')
        else:
            fill(mosaic_img, t.pad_val)
    else:
        mosaic_img = filled(shape, t.pad_val, results['img'].dtype)

    center_x = int(random.uniform(*t.center_ratio_range) * t.img_scale[0])
    center_y = int(random.uniform(*t.center_ratio_range) * t.img_scale[1])
    center_position = (center_x, center_y)
    # the canvas box the next RandomAffine reads (its draws peeked), where
    # a patch is still undecoded: one wholly outside it is never decoded
    patches = [results] + mix_results[:3]
    reads = mosaic_reads(t, shape, patches)
    window = _read_window(reads, mosaic_img) if owned else None
    if pad is not None:  # (the dtype's own value: no cast, no warning)
        x0, y0, x1, y1 = window or (0, 0, shape[1], shape[0])
        mosaic_img[y0:y1, x0:x1] = pad
    # boxes that cannot fail their moves are moved in one batch at the end;
    # any others patch by patch, where stock moves them (its error first)
    batch = batchable([p.get('gt_bboxes') for p in patches])

    loc_strs = ('top_left', 'top_right', 'bottom_left', 'bottom_right')
    for i, loc in enumerate(loc_strs):
        # stock deep-copies each whole results dict; only the boxes change
        # (a patch missing from ``mix_results`` raises stock's IndexError)
        patch = results if loc == 'top_left' else mix_results[i - 1]
        img_i = patch['img']
        h_i, w_i = img_i.shape[:2]
        scale_ratio_i = min(t.img_scale[1] / h_i, t.img_scale[0] / w_i)
        size = (int(w_i * scale_ratio_i), int(h_i * scale_ratio_i))
        # (a resize gives ``size``: stock's coordinates from its shape)
        paste_coord, crop_coord = mosaic_combine(t)(loc, center_position, size)
        if unread(reads, paste_coord, crop_coord, size, mosaic_img, img_i):
            count('deferred decodes: never read')
        else:
            img_i = loaded(img_i, lend=True)  # (only read here)
            x1_p, y1_p, x2_p, y2_p = paste_coord
            x1_c, y1_c, x2_c, y2_c = crop_coord
            clean = pastes_cleanly(paste_coord, crop_coord, size, mosaic_img,
                                   img_i)
            part = _part(t, reads, paste_coord, crop_coord, size, clean, img_i)
            if part is not None:  # the top-left part the affine reads
                (cols, rows), img_i = part
                x2_c = max(x1_c, min(x2_c, cols))
                y2_c = max(y1_c, min(y2_c, rows))
                x2_p, y2_p = x1_p + x2_c - x1_c, y1_p + y2_c - y1_c
            elif size != (w_i, h_i) or not resize_keeps(img_i):
                img_i = fit_patch(t, patch, img_i, size)
            if window is not None and clean:
                # (only the part the affine reads; the rest is never read)
                (x1_p, y1_p, x2_p, y2_p), (x1_c, y1_c, x2_c, y2_c) = \
                    _in_window(window, (x1_p, y1_p, x2_p, y2_p),
                               (x1_c, y1_c, x2_c, y2_c))
                if x2_p > x1_p and y2_p > y1_p:
                    mosaic_img[y1_p:y2_p, x1_p:x2_p] = img_i[y1_c:y2_c,
                                                             x1_c:x2_c]
            else:  # (stock's paste, and its error)
                mosaic_img[y1_p:y2_p, x1_p:x2_p] = img_i[y1_c:y2_c, x1_c:x2_c]

        boxes_i = patch['gt_bboxes']  # (stock reads all three first)
        mosaic_bboxes_labels.append(patch['gt_bboxes_labels'])
        mosaic_ignore_flags.append(patch['gt_ignore_flags'])
        padw = paste_coord[0] - crop_coord[0]
        padh = paste_coord[1] - crop_coord[1]
        move = (boxes_i, scale_ratio_i, padw, padh)
        mosaic_bboxes.append(move if batch else _moved_one(*move))
        if with_mask and patch.get('gt_masks', None) is not None:
            # rescale and translate make new masks
            out_shape = (int(t.img_scale[0] * 2), int(t.img_scale[1] * 2))
            gt_masks_i = patch['gt_masks'].rescale(float(scale_ratio_i))
            gt_masks_i = gt_masks_i.translate(
                out_shape=out_shape, offset=padw, direction='horizontal')
            gt_masks_i = gt_masks_i.translate(
                out_shape=out_shape, offset=padh, direction='vertical')
            mosaic_masks.append(gt_masks_i)

    canvas = (2 * t.img_scale[1], 2 * t.img_scale[0])
    # (in numpy where that gives stock's bits: box_steps)
    picked = mosaic_boxes(mosaic_bboxes, canvas, t.bbox_clip_border) \
        if batch else None
    if picked is None:
        mosaic_bboxes = moved_boxes(mosaic_bboxes) if batch else \
            mosaic_bboxes[0].cat(mosaic_bboxes, 0)
    mosaic_bboxes_labels = np.concatenate(mosaic_bboxes_labels, 0)
    mosaic_ignore_flags = np.concatenate(mosaic_ignore_flags, 0)

    if picked is not None:
        mosaic_bboxes, inside_inds = picked
    else:
        if t.bbox_clip_border:
            mosaic_bboxes.clip_(list(canvas))
        inside_inds = mosaic_bboxes.is_inside(list(canvas)).numpy()
        mosaic_bboxes = mosaic_bboxes[inside_inds]
    mosaic_bboxes_labels = mosaic_bboxes_labels[inside_inds]
    mosaic_ignore_flags = mosaic_ignore_flags[inside_inds]

    results['img'] = mosaic_img
    results['img_shape'] = mosaic_img.shape[:2]
    results['gt_bboxes'] = mosaic_bboxes
    results['gt_bboxes_labels'] = mosaic_bboxes_labels
    results['gt_ignore_flags'] = mosaic_ignore_flags
    if with_mask:
        mosaic_masks = mosaic_masks[0].cat(mosaic_masks)
        results['gt_masks'] = mosaic_masks[inside_inds]
    return results


def _read_window(reads: Optional[tuple],
                 canvas: np.ndarray) -> Optional[Tuple[int, int, int, int]]:
    """``reads`` (:func:`~fast_parallel.pipeline.unread.affine_reads`)
    cut to the canvas, as ints; None where unknown."""
    if reads is None or not all(type(v) is int for v in reads):
        return None
    h, w = canvas.shape[:2]
    x0, y0 = min(max(reads[0], 0), w), min(max(reads[1], 0), h)
    return x0, y0, max(x0, min(reads[2], w)), max(y0, min(reads[3], h))


def _in_window(window: tuple, paste: tuple, crop: tuple) -> tuple:
    """``(paste, crop)`` cut to their part inside ``window`` (x0, y0, x1,
    y1; the paste's coordinates), each side by the same amount; an empty
    paste where they do not meet."""
    left, top = max(0, window[0] - paste[0]), max(0, window[1] - paste[1])
    right, bottom = max(0, paste[2] - window[2]), max(0, paste[3] - window[3])
    cut = (left, top, -right, -bottom)
    return (tuple(v + d for v, d in zip(paste, cut)),
            tuple(v + d for v, d in zip(crop, cut)))


def _part(t: Mosaic, reads: Optional[tuple], paste: tuple, crop: tuple,
          size: tuple, clean: bool, img: np.ndarray) -> Optional[tuple]:
    """``((cols, rows), image)``: the top-left part of the patch's resize
    the next affine reads, and an image holding it
    (:func:`~fast_parallel.pipeline.part_resize.resized_part`), where the
    run keeps no resizes, the resize is not a copy, and stock's paste
    cannot raise (``clean``:
    :func:`~fast_parallel.pipeline.unread.pastes_cleanly`); None
    otherwise."""
    if getattr(t, '_fp_fit', None) is not None or \
            size == img.shape[1::-1] or not clean:
        return None
    part = needed_part(reads, paste, crop, size)
    resized = None if part is None else resized_part(img, size, part)
    if resized is None:
        return None
    count('Mosaic: resizes cut to the part read')
    return part, resized


def batchable(boxes: list) -> bool:
    """Whether the patches' ``boxes`` are all ``HorizontalBoxes`` of one
    dtype (float32 or float64: the half kinds may set a NaN's bits
    otherwise) and device, 2-D, without grad: their moves cannot fail, and
    :func:`moved_boxes` gives stock's bits."""
    from mmdet.structures.bbox import HorizontalBoxes
    if not all(type(b) is HorizontalBoxes for b in boxes):
        return False
    first = boxes[0].tensor
    return first.dtype in (torch.float32, torch.float64) and all(
        b.tensor.dtype == first.dtype and b.tensor.device == first.device
        and b.tensor.dim() == 2 and not b.tensor.requires_grad for b in boxes)


def _moved_one(boxes: Any, scale: float, padw: Any, padh: Any) -> Any:
    """Stock's steps for one patch's boxes: deep copy, rescale, translate.
    """
    boxes = copy.deepcopy(boxes)
    boxes.rescale_([scale, scale])
    boxes.translate_([padw, padh])
    return boxes


def moved_boxes(moves: list) -> Any:
    """Stock's ``cat`` of each patch's boxes deep-copied, ``rescale_``-d
    and ``translate_``-d (:func:`_moved_one`), for boxes that are
    :func:`batchable`: one ``cat``, multiply and add over all rows, the
    same elementwise operations on the same values, so the same bits.

    Args:
        moves (list[tuple]): (boxes, scale ratio, padw, padh) per patch.
    """
    from mmdet.structures.bbox import HorizontalBoxes
    tensors = [boxes.tensor for boxes, *_ in moves]
    kind = dict(dtype=tensors[0].dtype, device=tensors[0].device)
    operands = None
    if kind['device'].type == 'cpu':
        dtype = np.float32 if kind['dtype'] == torch.float32 else np.float64
        operands = move_operands(moves, [len(t) for t in tensors], dtype)
    if operands is not None:
        # the same operands, made by numpy (fewer of torch's calls, each
        # slow with its code out of the caches after the images' work)
        factors, shifts = (torch.from_numpy(o) for o in operands)
        return HorizontalBoxes(
            torch.cat(tensors, 0).mul_(factors).add_(shifts), clone=False)
    pads = [[padw, padh, padw, padh] for _, _, padw, padh in moves]
    rows = torch.tensor([len(t) for t in tensors], device=kind['device'])
    factors = torch.tensor([[scale] for _, scale, *_ in moves], **kind)
    out = torch.cat(tensors, 0).mul_(factors.repeat_interleave(rows, 0))
    return HorizontalBoxes(
        out.add_(torch.tensor(pads, **kind).repeat_interleave(rows, 0)),
        clone=False)


class FastMosaic(Mosaic):
    """``Mosaic`` that copies each patch's boxes, not its whole results."""

    #: The run's kept resizes at ``img_scale`` (set by the switch), or None.
    _fp_fit: Any = None
    #: The ``RandomAffine`` that takes this call's output: set by the mixing
    #: wrapper for the one sample it makes where this Mosaic is its first
    #: active transform and that exact affine the next, and reset after
    #: it; None otherwise.
    _fp_then: Any = None

    def transform(self, results: dict) -> dict:
        if not sample_is_plain(results):  # stock's copies may draw or fail
            count('stock: Mosaic: a sample holding other objects')
            decode_deferred(results)
            return Mosaic.transform(self, results)
        return self._fast(results)

    @autocast_box_type()
    def _fast(self, results: dict) -> dict:
        if random.uniform(0, 1) > self.prob:
            results['img'] = loaded(results['img'])
            return results
        assert 'mix_results' in results
        return mosaic_of(self, results, results['mix_results'])
