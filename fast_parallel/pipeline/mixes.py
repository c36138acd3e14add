"""Fast forms of mmdet's ``Mosaic`` and ``MixUp``: stock's bytes and draws.

Each class is stock's, put on the built instance by the switch; its
``transform`` runs stock's steps in stock's order. ``FastMosaic`` copies only
the boxes it moves instead of every results dict; ``FastMixUp`` builds only
the crop window of the padded canvas and mixes in integers. An input they
cannot make exact (not a 3-channel ``uint8`` image, a ``pad_val`` outside
0..255) goes to stock's ``transform``, counted. Why: ``docs/pipeline.md``.
"""
import copy
from typing import Optional

import mmcv
import numpy as np
from mmdet.datasets.transforms import MixUp, Mosaic
from mmdet.structures.bbox import autocast_box_type
from numpy import random

from fast_parallel.compat import mosaic_combine
from fast_parallel.pipeline.stats import COUNTS

__all__ = ['FastMixUp', 'FastMosaic']


def _colour_uint8(img) -> bool:
    return isinstance(img, np.ndarray) and img.dtype == np.uint8 and \
        img.ndim == 3 and img.shape[2] == 3


class FastMosaic(Mosaic):
    """``Mosaic`` that copies each patch's boxes, not its whole results."""

    def transform(self, results: dict) -> dict:
        return self._fast(results)

    @autocast_box_type()
    def _fast(self, results: dict) -> dict:
        # stock's Mosaic.transform, line for line, but for the copies
        if random.uniform(0, 1) > self.prob:
            return results

        assert 'mix_results' in results
        mosaic_bboxes = []
        mosaic_bboxes_labels = []
        mosaic_ignore_flags = []
        shape = (int(self.img_scale[1] * 2), int(self.img_scale[0] * 2))
        if len(results['img'].shape) == 3:
            shape += (3, )
        mosaic_img = np.full(shape, self.pad_val, dtype=results['img'].dtype)

        center_x = int(
            random.uniform(*self.center_ratio_range) * self.img_scale[0])
        center_y = int(
            random.uniform(*self.center_ratio_range) * self.img_scale[1])
        center_position = (center_x, center_y)

        loc_strs = ('top_left', 'top_right', 'bottom_left', 'bottom_right')
        for i, loc in enumerate(loc_strs):
            patch = results if loc == 'top_left' else \
                results['mix_results'][i - 1]
            # stock deep-copies the whole results; only the boxes change
            img_i = patch['img']
            h_i, w_i = img_i.shape[:2]
            scale_ratio_i = min(self.img_scale[1] / h_i,
                                self.img_scale[0] / w_i)
            img_i = mmcv.imresize(
                img_i, (int(w_i * scale_ratio_i), int(h_i * scale_ratio_i)))

            paste_coord, crop_coord = mosaic_combine(self)(
                loc, center_position, img_i.shape[:2][::-1])
            x1_p, y1_p, x2_p, y2_p = paste_coord
            x1_c, y1_c, x2_c, y2_c = crop_coord
            mosaic_img[y1_p:y2_p, x1_p:x2_p] = img_i[y1_c:y2_c, x1_c:x2_c]

            gt_bboxes_i = copy.deepcopy(patch['gt_bboxes'])
            padw = x1_p - x1_c
            padh = y1_p - y1_c
            gt_bboxes_i.rescale_([scale_ratio_i, scale_ratio_i])
            gt_bboxes_i.translate_([padw, padh])
            mosaic_bboxes.append(gt_bboxes_i)
            mosaic_bboxes_labels.append(patch['gt_bboxes_labels'])
            mosaic_ignore_flags.append(patch['gt_ignore_flags'])

        mosaic_bboxes = mosaic_bboxes[0].cat(mosaic_bboxes, 0)
        mosaic_bboxes_labels = np.concatenate(mosaic_bboxes_labels, 0)
        mosaic_ignore_flags = np.concatenate(mosaic_ignore_flags, 0)

        if self.bbox_clip_border:
            mosaic_bboxes.clip_([2 * self.img_scale[1], 2 * self.img_scale[0]])
        inside_inds = mosaic_bboxes.is_inside(
            [2 * self.img_scale[1], 2 * self.img_scale[0]]).numpy()
        mosaic_bboxes = mosaic_bboxes[inside_inds]
        mosaic_bboxes_labels = mosaic_bboxes_labels[inside_inds]
        mosaic_ignore_flags = mosaic_ignore_flags[inside_inds]

        results['img'] = mosaic_img
        results['img_shape'] = mosaic_img.shape[:2]
        results['gt_bboxes'] = mosaic_bboxes
        results['gt_bboxes_labels'] = mosaic_bboxes_labels
        results['gt_ignore_flags'] = mosaic_ignore_flags
        return results


class FastMixUp(MixUp):
    """``MixUp`` that pads only the crop window and mixes in integers."""

    def transform(self, results: dict) -> dict:
        why = self._why_stock(results)
        if why is not None:
            COUNTS[f'stock: MixUp: {why}'] += 1
            return MixUp.transform(self, results)
        return self._fast(results)

    def _why_stock(self, results: dict) -> Optional[str]:
        mix = results.get('mix_results')
        if not isinstance(mix, list) or len(mix) != 1:
            return 'not one mix result'
        if not (_colour_uint8(results.get('img'))
                and _colour_uint8(mix[0].get('img'))):
            return 'not a 3-channel uint8 image'
        pad = np.asarray(self.pad_val, dtype=np.float64)
        if pad.ndim > 1 or pad.size not in (1, 3) or \
                not np.all((pad >= 0) & (pad <= 255)):
            return 'pad_val not in 0..255 (one value or three)'
        return None

    @autocast_box_type()
    def _fast(self, results: dict) -> dict:
        if results['mix_results'][0]['gt_bboxes'].shape[0] == 0:
            return results

        retrieve_results = results['mix_results'][0]
        retrieve_img = retrieve_results['img']

        jit_factor = random.uniform(*self.ratio_range)
        is_flip = random.uniform(0, 1) > self.flip_ratio

        # stock: np.ones(..., img dtype) * pad_val; numpy's own rule gives
        # the canvas dtype and value (float64 for a float pad_val; one
        # value per channel for three)
        one = np.ones((1, 1, 3), dtype=retrieve_img.dtype) * self.pad_val
        out_img = np.full((self.dynamic_scale[1], self.dynamic_scale[0], 3),
                          one,
                          dtype=one.dtype)

        scale_ratio = min(self.dynamic_scale[1] / retrieve_img.shape[0],
                          self.dynamic_scale[0] / retrieve_img.shape[1])
        retrieve_img = mmcv.imresize(
            retrieve_img, (int(retrieve_img.shape[1] * scale_ratio),
                           int(retrieve_img.shape[0] * scale_ratio)))
        out_img[:retrieve_img.shape[0], :retrieve_img.shape[1]] = retrieve_img

        scale_ratio *= jit_factor
        out_img = mmcv.imresize(out_img, (int(out_img.shape[1] * jit_factor),
                                          int(out_img.shape[0] * jit_factor)))
        if is_flip:
            out_img = out_img[:, ::-1, :]

        ori_img = results['img']
        origin_h, origin_w = out_img.shape[:2]
        target_h, target_w = ori_img.shape[:2]
        padded_h, padded_w = max(origin_h, target_h), max(origin_w, target_w)
        x_offset, y_offset = 0, 0
        if padded_h > target_h:
            y_offset = random.randint(0, padded_h - target_h)
        if padded_w > target_w:
            x_offset = random.randint(0, padded_w - target_w)
        # stock pads the whole canvas (float64, cast to uint8), then crops
        fill = (np.ones((1, 1, 3)) * self.pad_val).astype(np.uint8)
        padded_cropped_img = np.full((target_h, target_w, 3),
                                     fill,
                                     dtype=np.uint8)
        rows = max(0, min(target_h, origin_h - y_offset))
        cols = max(0, min(target_w, origin_w - x_offset))
        padded_cropped_img[:rows, :cols] = \
            out_img[y_offset:y_offset + rows, x_offset:x_offset + cols]

        retrieve_gt_bboxes = retrieve_results['gt_bboxes']
        retrieve_gt_bboxes.rescale_([scale_ratio, scale_ratio])
        if self.bbox_clip_border:
            retrieve_gt_bboxes.clip_([origin_h, origin_w])
        if is_flip:
            retrieve_gt_bboxes.flip_([origin_h, origin_w],
                                     direction='horizontal')

        cp_retrieve_gt_bboxes = retrieve_gt_bboxes.clone()
        cp_retrieve_gt_bboxes.translate_([-x_offset, -y_offset])
        if self.bbox_clip_border:
            cp_retrieve_gt_bboxes.clip_([target_h, target_w])

        # 0.5 * a + 0.5 * b in float32, truncated: (a + b) >> 1 for uint8
        mixup_img = ori_img.astype(np.uint16)
        mixup_img += padded_cropped_img
        mixup_img >>= 1

        retrieve_gt_bboxes_labels = retrieve_results['gt_bboxes_labels']
        retrieve_gt_ignore_flags = retrieve_results['gt_ignore_flags']
        mixup_gt_bboxes = cp_retrieve_gt_bboxes.cat(
            (results['gt_bboxes'], cp_retrieve_gt_bboxes), dim=0)
        mixup_gt_bboxes_labels = np.concatenate(
            (results['gt_bboxes_labels'], retrieve_gt_bboxes_labels), axis=0)
        mixup_gt_ignore_flags = np.concatenate(
            (results['gt_ignore_flags'], retrieve_gt_ignore_flags), axis=0)

        inside_inds = mixup_gt_bboxes.is_inside([target_h, target_w]).numpy()
        mixup_gt_bboxes = mixup_gt_bboxes[inside_inds]
        mixup_gt_bboxes_labels = mixup_gt_bboxes_labels[inside_inds]
        mixup_gt_ignore_flags = mixup_gt_ignore_flags[inside_inds]

        results['img'] = mixup_img.astype(np.uint8)
        results['img_shape'] = mixup_img.shape[:2]
        results['gt_bboxes'] = mixup_gt_bboxes
        results['gt_bboxes_labels'] = mixup_gt_bboxes_labels
        results['gt_ignore_flags'] = mixup_gt_ignore_flags
        return results
