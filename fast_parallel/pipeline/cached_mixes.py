"""Fast forms of mmdet's ``CachedMosaic`` and ``CachedMixUp`` (RTMDet):
stock's bytes and draws.

Stock keeps a deep copy of each sample in the transform's cache (kept here,
of the keys an entry is read for: later transforms change the sample in
place), then deep-copies the picked entries, and ``CachedMosaic``
deep-copies each of them again for its patch. The picks are only read, but
for their boxes, which are moved in place: the fast forms copy those
alone. ``FastCachedMixUp`` builds only the crop window and mixes in
integers (:class:`~fast_parallel.pipeline.mix_window.MixWindow`);
a sample or cache entry whose image is not 3-channel ``uint8`` makes it take
stock's ``transform``, counted.
"""
import copy
from typing import Optional

import numpy as np
from mmdet.datasets.transforms import CachedMixUp, CachedMosaic
from mmdet.structures.bbox import autocast_box_type
from numpy import random

from fast_parallel.pipeline.box_steps import mixed_boxes
from fast_parallel.pipeline.copies import sample_is_plain
from fast_parallel.pipeline.mix_window import MixWindow
from fast_parallel.pipeline.mixes import (colour_uint8, mix_halves,
                                          pad_val_why, rescale)
from fast_parallel.pipeline.mosaic import mosaic_of
from fast_parallel.pipeline.stats import count

__all__ = ['FastCachedMixUp', 'FastCachedMosaic']

#: The keys of a cache entry that stock's ``CachedMosaic`` / ``CachedMixUp``
#: read (mmdet 3.3.0: their picks, ``get_indexes`` and the patches).
ENTRY_KEYS = ('img', 'gt_bboxes', 'gt_bboxes_labels', 'gt_ignore_flags',
              'gt_masks')


def _cache_and_pop(t, results: dict) -> None:
    """Stock's: keep a copy of the sample, drop one entry when full.

    The sample is plain (:func:`~fast_parallel.pipeline.copies.
    sample_is_plain`: its copy can neither fail nor draw), so the copy
    holds only the keys an entry is read for (one deep copy of them, so
    that shared objects stay shared): the info's ``instances`` with their
    polygons, paths and shapes are never read from the cache, and their
    deep copy was most of the transform's time.
    """
    t.results_cache.append(
        copy.deepcopy({k: results[k]
                       for k in ENTRY_KEYS if k in results}))
    if len(t.results_cache) > t.max_cached_images:
        if t.random_pop:
            index = random.randint(0, len(t.results_cache) - 1)
        else:
            index = 0
        popped = t.results_cache.pop(index)
        if t._fp_others and not sample_is_plain(popped):
            t._fp_others -= 1


def _holds_others(t, results: dict) -> bool:
    """Whether the sample or a cache entry is not a plain sample, so that
    stock's copies of it may draw or fail. The entries that are not (kept
    by stock's ``transform``) are counted once, then as they are popped."""
    if t._fp_others is None:
        t._fp_others = sum(not sample_is_plain(e) for e in t.results_cache)
    return t._fp_others > 0 or not sample_is_plain(results)


def _stock(t, stock_transform, results: dict) -> dict:
    """Stock's ``transform``; the entries it keeps are counted again."""
    try:
        return stock_transform(t, results)
    finally:
        t._fp_others = None


class FastCachedMosaic(CachedMosaic):
    """``CachedMosaic`` without the copies of the picked entries."""

    #: Cache entries that are not plain samples (None: not counted yet).
    _fp_others = None

    def transform(self, results: dict) -> dict:
        if _holds_others(self, results):
            # stock's copies of the sample and the picks may draw or fail
            count('stock: CachedMosaic: a sample holding other objects')
            return _stock(self, CachedMosaic.transform, results)
        return self._fast(results)

    @autocast_box_type()
    def _fast(self, results: dict) -> dict:
        _cache_and_pop(self, results)
        if len(self.results_cache) <= 4:
            return results
        if random.uniform(0, 1) > self.prob:
            return results
        indices = self.get_indexes(self.results_cache)
        mix_results = [self.results_cache[i] for i in indices]
        return mosaic_of(self, results, mix_results, 'gt_masks' in results)


class FastCachedMixUp(CachedMixUp):
    """``CachedMixUp`` that copies only the picked entry's boxes, pads only
    the crop window and mixes in integers."""

    #: Cache entries that are not plain samples (None: not counted yet).
    _fp_others = None

    def transform(self, results: dict) -> dict:
        why = self._why_stock(results)
        if why is not None:
            count(f'stock: CachedMixUp: {why}')
            return _stock(self, CachedMixUp.transform, results)
        return self._fast(results)

    def _why_stock(self, results: dict) -> Optional[str]:
        # decided before any draw, on every image a pick may take
        images = [results.get('img')
                  ] + [entry.get('img') for entry in self.results_cache]
        if not all(map(colour_uint8, images)):
            return 'not a 3-channel uint8 image'
        if _holds_others(self, results):
            return 'a sample holding other objects'
        return pad_val_why(self.pad_val)

    @autocast_box_type()
    def _fast(self, results: dict) -> dict:
        _cache_and_pop(self, results)
        if len(self.results_cache) <= 1:
            return results
        if random.uniform(0, 1) > self.prob:
            return results
        entry = self.results_cache[self.get_indexes(self.results_cache)]
        if entry['gt_bboxes'].shape[0] == 0:
            return results

        with_mask = 'gt_masks' in results
        ori_img = results['img']
        target_h, target_w = ori_img.shape[:2]
        window = MixWindow(self, entry['img'], (target_h, target_w))
        origin = [window.origin_h, window.origin_w]

        # (in numpy where that gives stock's bits: box_steps; its copy of
        # the entry's boxes is local, so it is left out)
        found = mixed_boxes(
            results.get('gt_bboxes'), entry['gt_bboxes'], window.scale_ratio,
            origin, window.is_flip, (window.x_offset, window.y_offset),
            (target_h, target_w), self.bbox_clip_border)
        if found is None:
            retrieve_gt_bboxes = copy.deepcopy(entry['gt_bboxes'])
            rescale(retrieve_gt_bboxes, window.scale_ratio)
        if with_mask:  # rescale, flip and translate make new masks
            retrieve_gt_masks = entry['gt_masks'].rescale(window.scale_ratio)
        if self.bbox_clip_border and found is None:
            retrieve_gt_bboxes.clip_(origin)
        if window.is_flip:
            if found is None:
                retrieve_gt_bboxes.flip_(origin, direction='horizontal')
            if with_mask:
                retrieve_gt_masks = retrieve_gt_masks.flip()

        if found is None:
            cp_retrieve_gt_bboxes = retrieve_gt_bboxes.clone()
            cp_retrieve_gt_bboxes.translate_(
                [-window.x_offset, -window.y_offset])
        if with_mask:
            retrieve_gt_masks = retrieve_gt_masks.translate(
                out_shape=(target_h, target_w),
                offset=-window.x_offset,
                direction='horizontal')
            retrieve_gt_masks = retrieve_gt_masks.translate(
                out_shape=(target_h, target_w),
                offset=-window.y_offset,
                direction='vertical')
        if self.bbox_clip_border and found is None:
            cp_retrieve_gt_bboxes.clip_([target_h, target_w])

        mixup_img = mix_halves(ori_img, window.crop)
        retrieve_gt_bboxes_labels = entry['gt_bboxes_labels']
        retrieve_gt_ignore_flags = entry['gt_ignore_flags']
        if found is None:
            mixup_gt_bboxes = cp_retrieve_gt_bboxes.cat(
                (results['gt_bboxes'], cp_retrieve_gt_bboxes), dim=0)
        mixup_gt_bboxes_labels = np.concatenate(
            (results['gt_bboxes_labels'], retrieve_gt_bboxes_labels), axis=0)
        mixup_gt_ignore_flags = np.concatenate(
            (results['gt_ignore_flags'], retrieve_gt_ignore_flags), axis=0)
        if with_mask:
            mixup_gt_masks = retrieve_gt_masks.cat(
                [results['gt_masks'], retrieve_gt_masks])

        if found is None:
            inside_inds = mixup_gt_bboxes.is_inside([target_h,
                                                     target_w]).numpy()
            kept = mixup_gt_bboxes[inside_inds]
        else:
            _, kept, inside_inds = found
        results['img'] = mixup_img
        results['img_shape'] = mixup_img.shape[:2]
        results['gt_bboxes'] = kept
        results['gt_bboxes_labels'] = mixup_gt_bboxes_labels[inside_inds]
        results['gt_ignore_flags'] = mixup_gt_ignore_flags[inside_inds]
        if with_mask:
            results['gt_masks'] = mixup_gt_masks[inside_inds]
        return results
