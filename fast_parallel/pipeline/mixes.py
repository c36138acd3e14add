"""Fast form of mmdet's ``MixUp`` (stock's bytes and draws), and the mix
and box helpers it shares with ``CachedMixUp``'s fast form.

The class is stock's, put on the built instance by the switch; its
``transform`` runs stock's steps in stock's order. ``FastMixUp`` builds only
the crop window of the padded canvas and mixes in integers. An input it
cannot make exact (not a 3-channel ``uint8`` image, a ``pad_val`` outside
0..255) goes to stock's ``transform``, counted. Why: ``docs/pipeline.md``.
"""
from typing import Any, Dict, Optional

import cv2
import numpy as np
import torch
from mmdet.datasets.transforms import MixUp
from mmdet.structures.bbox import autocast_box_type

from fast_parallel.pipeline.box_steps import as_tensor_like, mixed_boxes
from fast_parallel.pipeline.mix_window import MixWindow
from fast_parallel.pipeline.part_resize import opencv_setting
from fast_parallel.pipeline.stats import count

__all__ = ['FastMixUp', 'colour_uint8', 'mix_halves', 'pad_val_why', 'rescale']

_WHOLE_FLOATS = (torch.float32, torch.float64)


def colour_uint8(img) -> bool:
    """Whether ``img`` is a 3-channel ``uint8`` image."""
    return isinstance(img, np.ndarray) and img.dtype == np.uint8 and \
        img.ndim == 3 and img.shape[2] == 3


class FastMixUp(MixUp):
    """``MixUp`` that pads only the crop window and mixes in integers."""

    #: The run's kept resizes at ``dynamic_scale`` (set by the switch).
    _fp_fit: Any = None

    def transform(self, results: dict) -> dict:
        why = self._why_stock(results)
        if why is not None:
            count(f'stock: MixUp: {why}')
            return MixUp.transform(self, results)
        return self._fast(results)

    def _why_stock(self, results: dict) -> Optional[str]:
        mix = results.get('mix_results')
        if not isinstance(mix, list) or len(mix) != 1 or \
                not isinstance(mix[0], dict):
            return 'not one mix result'
        if not (colour_uint8(results.get('img'))
                and colour_uint8(mix[0].get('img'))):
            return 'not a 3-channel uint8 image'
        return pad_val_why(self.pad_val)

    @autocast_box_type()
    def _fast(self, results: dict) -> dict:
        if results['mix_results'][0]['gt_bboxes'].shape[0] == 0:
            return results

        retrieve_results = results['mix_results'][0]
        ori_img = results['img']
        window = MixWindow(self, retrieve_results['img'], ori_img.shape[:2],
                           retrieve_results)

        retrieve_gt_bboxes = retrieve_results['gt_bboxes']
        # (in numpy where that gives stock's bits: box_steps)
        found = mixed_boxes(
            results.get('gt_bboxes'), retrieve_gt_bboxes, window.scale_ratio,
            (window.origin_h, window.origin_w), window.is_flip,
            (window.x_offset, window.y_offset), ori_img.shape[:2],
            self.bbox_clip_border)
        if found is not None:  # (the mix result left as stock leaves it)
            moved, kept, inside_inds = found
            retrieve_gt_bboxes.tensor = as_tensor_like(
                moved, retrieve_gt_bboxes.tensor)
        else:
            cp_retrieve_gt_bboxes = self._stock_moves(retrieve_gt_bboxes,
                                                      window,
                                                      ori_img.shape[:2])

        mixup_img = mix_halves(ori_img, window.crop)
        retrieve_gt_bboxes_labels = retrieve_results['gt_bboxes_labels']
        retrieve_gt_ignore_flags = retrieve_results['gt_ignore_flags']
        if found is None:
            mixup_gt_bboxes = cp_retrieve_gt_bboxes.cat(
                (results['gt_bboxes'], cp_retrieve_gt_bboxes), dim=0)
        mixup_gt_bboxes_labels = np.concatenate(
            (results['gt_bboxes_labels'], retrieve_gt_bboxes_labels), axis=0)
        mixup_gt_ignore_flags = np.concatenate(
            (results['gt_ignore_flags'], retrieve_gt_ignore_flags), axis=0)

        if found is None:
            inside_inds = mixup_gt_bboxes.is_inside(list(
                ori_img.shape[:2])).numpy()
            kept = mixup_gt_bboxes[inside_inds]
        results['img'] = mixup_img
        results['img_shape'] = mixup_img.shape[:2]
        results['gt_bboxes'] = kept
        results['gt_bboxes_labels'] = mixup_gt_bboxes_labels[inside_inds]
        results['gt_ignore_flags'] = mixup_gt_ignore_flags[inside_inds]
        return results

    def _stock_moves(self, retrieve_gt_bboxes: Any, window: MixWindow,
                     target: tuple) -> Any:
        """Stock's steps of the mix image's boxes, with torch: the copy
        moved into the crop; ``retrieve_gt_bboxes`` left as stock leaves
        them."""
        rescale(retrieve_gt_bboxes, window.scale_ratio)
        if self.bbox_clip_border:
            retrieve_gt_bboxes.clip_([window.origin_h, window.origin_w])
        if window.is_flip:
            retrieve_gt_bboxes.flip_([window.origin_h, window.origin_w],
                                     direction='horizontal')

        cp_retrieve_gt_bboxes = retrieve_gt_bboxes.clone()
        cp_retrieve_gt_bboxes.translate_([-window.x_offset, -window.y_offset])
        if self.bbox_clip_border:
            cp_retrieve_gt_bboxes.clip_(list(target))
        return cp_retrieve_gt_bboxes


def rescale(boxes: Any, ratio: float) -> None:
    """Stock's ``boxes.rescale_([ratio, ratio])``: for float32 / float64
    ``HorizontalBoxes`` and a float ratio that is not NaN, one multiply by
    the ratio (torch rounds it to the dtype, as ``new_tensor`` does; the
    same bits, tested with NaNs, infinities and signed zeros in the boxes)
    instead of three of torch's calls."""
    from mmdet.structures.bbox import HorizontalBoxes
    if type(boxes) is HorizontalBoxes and type(ratio) is float and \
            ratio == ratio and boxes.tensor.dtype in _WHOLE_FLOATS:
        boxes.tensor = boxes.tensor * ratio
    else:
        boxes.rescale_([ratio, ratio])


def pad_val_why(pad_val) -> Optional[str]:
    """Why a ``pad_val`` cannot take the fast mix (None: it can)."""
    pad = np.asarray(pad_val, dtype=np.float64)
    if pad.ndim > 1 or pad.size not in (1, 3) or \
            not np.all((pad >= 0) & (pad <= 255)):
        return 'pad_val not in 0..255 (one value or three)'
    return None


def mix_halves(ori_img: np.ndarray, crop: np.ndarray) -> np.ndarray:
    """Stock's ``(0.5 * a + 0.5 * b).astype(uint8)`` in float32 for uint8
    images: both halves and their sum are exact, so it is ``(a + b) >> 1``,
    i.e. ``(a & b) + ((a ^ b) >> 1)`` without widening, or OpenCV's
    ``addWeighted(a, 0.5, b, 0.5, -0.25)`` where this process's OpenCV
    gives that for every pair (one pass). C-ordered, as stock's sum is
    where ``a`` is and ``b`` lies in C order; stock's own sum (and layout)
    otherwise.
    """
    strides = crop.strides
    if not (ori_img.flags.c_contiguous and min(strides) > 0
            and list(strides) == sorted(strides, reverse=True)):
        return (0.5 * ori_img.astype(np.float32) +
                0.5 * crop.astype(np.float32)).astype(np.uint8)
    if ori_img.shape == crop.shape and ori_img.ndim == 3 and \
            ori_img.shape[2] == 3 and _weighted_is_floor_mean():
        # a * 0.5 + b * 0.5 - 0.25 is exact in float32 and lies a quarter
        # off an integer: OpenCV's rounding gives the floor, in one pass
        return cv2.addWeighted(ori_img, 0.5, crop, 0.5, -0.25)
    mixed = np.bitwise_xor(ori_img, crop, order='C')
    mixed >>= 1
    mixed += np.bitwise_and(ori_img, crop, order='C')
    return mixed


#: :func:`~fast_parallel.pipeline.part_resize.opencv_setting` -> whether
#: ``addWeighted`` gave the floor mean under it.
_FLOOR_MEAN: Dict[tuple, bool] = {}


def _weighted_is_floor_mean() -> bool:
    """Whether this process's OpenCV ``addWeighted(a, 0.5, b, 0.5, -0.25)``
    is ``(a + b) >> 1`` for every pair of ``uint8`` values, under this
    thread's OpenCV setting (checked once per setting, on all 65,536)."""
    setting = opencv_setting()
    exact = _FLOOR_MEAN.get(setting)
    if exact is None:
        values = np.arange(256, dtype=np.uint8)
        # every pair, in rows of an odd length (OpenCV's scalar tail too)
        a, b = (
            np.repeat(v[..., None], 3, 2)
            for v in np.meshgrid(np.append(values, values[-1:]), values))
        want = ((a.astype(np.uint16) + b) >> 1).astype(np.uint8)
        got = cv2.addWeighted(a, 0.5, b, 0.5, -0.25)
        exact = _FLOOR_MEAN[setting] = got.dtype == np.uint8 and \
            np.array_equal(got, want)
    return exact
