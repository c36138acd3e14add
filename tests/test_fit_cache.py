"""Mosaic's and MixUp's keep-ratio resizes kept beside the decoded images:
stock's samples and draws, a changed file resized again, the kept bytes
never written, and a budget that leaves them out."""
import copy
import os
import shutil

import cv2
import numpy as np
import pytest
from mmdet.registry import DATASETS
from mmdet.utils import register_all_modules
from transform_utils import (run_both, same_states, set_states,
                             sparse_annotations)

from fast_parallel.bench.pipeline import first_difference
from fast_parallel.bench.presets import load_preset
from fast_parallel.pipeline import COUNTS, switch_pipeline
from fast_parallel.pipeline.fit_cache import FitCache, fit_size
from fast_parallel.pipeline.mixes import FastMixUp
from fast_parallel.pipeline.mosaic import FastMosaic
from fast_parallel.pipeline.unread import DeferredImage

register_all_modules(init_default_scope=False)


def _cfg(data):
    return copy.deepcopy(load_preset('yolox_s', data).train_dataloader.dataset)


def _fits(dataset):
    """The kept-resize caches of the fast Mosaic and MixUp, by class."""
    return {
        type(t).__name__: t._fp_fit
        for t in dataset.pipeline if type(t) in (FastMosaic, FastMixUp)
    }


def _same_samples(stock, fast, samples, seed):
    np.random.seed(seed)
    for i in range(samples):
        (s_kind, s_out, s_states), (f_kind, f_out, f_states) = run_both(
            lambda r, i=i: stock[i % len(stock)],
            lambda r, i=i: fast[i % len(fast)],
            None)
        assert (s_kind, f_kind) == ('ok', 'ok'), (s_out, f_out)
        assert first_difference(s_out, f_out) is None, \
            (i, first_difference(s_out, f_out))
        assert same_states(s_states, f_states), i
        set_states(s_states)


def test_kept_resizes_give_stock_samples_and_draws(sample_data):
    stock = DATASETS.build(_cfg(sample_data))
    fast = DATASETS.build(_cfg(sample_data))
    line = str(switch_pipeline(fast, cache_inputs='auto'))
    assert 'Mosaic/MixUp resizes cached too (up to 0.0 GB)' in line, line
    fits = _fits(fast)
    # one scale (640, 640): Mosaic and MixUp share one cache
    assert isinstance(fits['FastMosaic'], FitCache)
    assert fits['FastMosaic'] is fits['FastMixUp']
    fit = fits['FastMosaic']
    sizes = []
    for i in range(len(fast.dataset)):
        info = fast.dataset.get_data_info(i)
        w, h = fit_size((info['height'], info['width']), (640, 640))
        assert max(w, h) == 640  # the sample images are upscaled
        sizes.append(w * h * 3)
    assert fit.fits.capacity == sum(sizes)
    COUNTS.clear()
    _same_samples(stock, fast, 40, seed=2)
    assert fit.fits.used == sum(sizes)  # each resized once
    assert COUNTS['cache: resizes kept'] > 100
    # a pipeline switched again keeps the same caches
    switch_pipeline(fast, cache_inputs='auto')
    assert _fits(fast)['FastMosaic'] is fit


def test_kept_resizes_are_read_only_and_never_change(sample_data):
    fast = DATASETS.build(_cfg(sample_data))
    switch_pipeline(fast, cache_inputs='auto')
    fit = _fits(fast)['FastMosaic']
    np.random.seed(0)
    for i in range(16):
        fast[i % len(fast)]
    held = fit.fits.data[:fit.fits.used].copy()
    decoded = fit.decoded.data[:fit.decoded.used].copy()
    info = fast.dataset.get_data_info(0)
    w, h = fit_size((info['height'], info['width']), fit.scale)
    view = fit.fits.view(info['img_path'], (h, w, 3), np.dtype(np.uint8))
    assert view is not None and not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0, 0] = 1
    # what a hit hands a mix is stock's resize of the decode
    img = cv2.imread(info['img_path'])
    assert np.array_equal(view, cv2.resize(img, (w, h)))
    for i in range(16, 40):
        out = fast[i % len(fast)]
        out['inputs'].zero_()  # a user's hook writing what it got
    assert np.array_equal(fit.fits.data[:fit.fits.used], held)
    # the decoded images lent to Mosaic and MixUp (views) were only read
    assert np.array_equal(fit.decoded.data[:fit.decoded.used], decoded)
    # a spawned worker gets no cache (it resizes, as stock does)
    import pickle
    assert pickle.loads(pickle.dumps(fit)) is None
    assert copy.deepcopy(fit) is fit


def test_a_changed_file_is_resized_again(sample_data, tmp_path):
    root = tmp_path / 'data'
    shutil.copytree(sample_data / 'coco', root / 'coco')
    stock = DATASETS.build(_cfg(root))
    fast = DATASETS.build(_cfg(root))
    switch_pipeline(fast, cache_inputs='auto')
    _same_samples(stock, fast, 24, seed=4)
    fit = _fits(fast)['FastMosaic']
    assert fit.fits.used == fit.fits.capacity
    # every image replaced by another one of the same size
    for i in range(len(fast.dataset)):
        path = fast.dataset.get_data_info(i)['img_path']
        img = cv2.imread(path)
        stat = os.stat(path)
        cv2.imwrite(path, 255 - img)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    COUNTS.clear()
    _same_samples(stock, fast, 24, seed=5)
    assert COUNTS['cache: resizes kept'] == 0
    assert COUNTS['cache: file changed since it was cached'] > 0


def test_resizes_over_the_budget_are_not_kept(sample_data, monkeypatch):
    from fast_parallel.pipeline import cache_plan
    cfg = _cfg(sample_data)
    probe = DATASETS.build(copy.deepcopy(cfg))
    decoded = sum(info['height'] * info['width'] * 3 for info in map(
        probe.dataset.get_data_info, range(len(probe.dataset))))
    # room for the decoded images, not for their 640 px resizes too
    monkeypatch.setattr(cache_plan, 'available_memory',
                        lambda: int(2 * decoded / cache_plan.AUTO_SHARE))
    stock = DATASETS.build(copy.deepcopy(cfg))
    fast = DATASETS.build(copy.deepcopy(cfg))
    line = str(switch_pipeline(fast, cache_inputs='auto'))
    assert 'inputs cached in shared memory' in line, line
    assert 'Mosaic/MixUp resizes not cached (they need 0.0 GB more)' in line
    assert _fits(fast) == {'FastMosaic': None, 'FastMixUp': None}
    COUNTS.clear()
    _same_samples(stock, fast, 12, seed=6)
    assert COUNTS['cache: hits'] > 0 and COUNTS['cache: resizes kept'] == 0


def test_no_kept_resizes_where_items_are_not_plain_loads(sample_data):
    cfg = _cfg(sample_data)
    # a transform in the wrapped dataset's pipeline: its items' images are
    # no longer the decodes of their paths (and stock's copies stay)
    cfg.dataset.pipeline.append(dict(type='RandomFlip', prob=0.5))
    fast = DATASETS.build(copy.deepcopy(cfg))
    line = str(switch_pipeline(fast, cache_inputs='auto'))
    assert 'Mosaic/MixUp resizes' not in line, line
    stock = DATASETS.build(copy.deepcopy(cfg))
    _same_samples(stock, fast, 8, seed=7)
    # without a decoded-input cache, none either
    plain = DATASETS.build(copy.deepcopy(_cfg(sample_data)))
    assert 'Mosaic/MixUp resizes' not in str(
        switch_pipeline(plain, cache_inputs=None))
    assert _fits(plain) == {'FastMosaic': None, 'FastMixUp': None}


@pytest.mark.parametrize(
    'skip', [['Mosaic'], ['MixUp'], ['Mosaic', 'RandomAffine', 'MixUp']])
def test_lent_images_only_where_a_fast_mix_reads_them(sample_data, skip):
    """YOLOX's last epochs skip Mosaic and MixUp: a sample then goes to a
    transform that may write its image, which gets a copy, as on stock."""
    from fast_parallel.pipeline.cache import FastLoadImageFromFile, lent
    stock = DATASETS.build(_cfg(sample_data))
    fast = DATASETS.build(_cfg(sample_data))
    switch_pipeline(fast, cache_inputs='auto')
    for dataset in (stock, fast):
        dataset.update_skip_type_keys(skip)
    load = fast.dataset.pipeline.transforms[0]
    assert type(load) is FastLoadImageFromFile
    seen = []
    first = next(
        t for t in fast.pipeline
        if type(t).__name__.replace('Fast', '') not in skip)
    inner = type(first).transform

    def watch(self, results):  # what the first transform is handed
        # (an image a fast Mosaic decodes when it reads it is no copy)
        img = results['img']
        seen.append(type(img) is DeferredImage or lent(img))
        return inner(self, results)

    first.transform = watch.__get__(first)
    _same_samples(stock, fast, 16, seed=8)
    assert load._fp_lend is False  # set only while a sample loads
    # (a first epoch's misses decode new arrays; the hits are lent)
    assert len(seen) == 16 and any(seen) == (type(first) is FastMosaic)


@pytest.mark.parametrize('case', [
    'mosaic_prob_half', 'mosaic_alone_prob_half', 'flip_before_mosaic',
    'mixup_first_sparse'
])
def test_lent_and_kept_images_where_transforms_return_or_change_them(
        sample_data, tmp_path, case):
    """A Mosaic that returns its input (``prob``), a MixUp that does (a mix
    sample without boxes), a transform that changes the image before the
    mixes: every sample stock's, and no lent view leaves the mixes."""
    from fast_parallel.pipeline.cache import lent
    cfg = _cfg(sample_data)
    pipeline = cfg.pipeline
    if case in ('mosaic_prob_half', 'mosaic_alone_prob_half'):
        pipeline[0]['prob'] = 0.5
    elif case == 'flip_before_mosaic':
        pipeline.insert(0, dict(type='RandomFlip', prob=0.5))
    else:
        cfg.dataset.ann_file = sparse_annotations(sample_data, tmp_path)
        cfg.dataset.filter_cfg = dict(filter_empty_gt=False, min_size=0)
    stock = DATASETS.build(copy.deepcopy(cfg))
    fast = DATASETS.build(copy.deepcopy(cfg))
    switch_pipeline(fast, cache_inputs='auto')
    skip = {
        'mixup_first_sparse': ['Mosaic', 'RandomAffine'],
        # Mosaic the last transform: what it hands back is the sample
        'mosaic_alone_prob_half': [
            'RandomAffine', 'MixUp', 'YOLOXHSVRandomAug', 'RandomFlip',
            'Resize', 'Pad', 'FilterAnnotations', 'PackDetInputs'
        ]
    }.get(case)
    for dataset in (stock, fast) if skip else ():
        dataset.update_skip_type_keys(skip)
    COUNTS.clear()
    _same_samples(stock, fast, 40, seed=9)
    # what a sample's user gets holds no view of the cache
    np.random.seed(10)
    for i in range(12):
        out = fast[i % len(fast)]
        values = out.values() if isinstance(out, dict) else [out]
        assert not any(isinstance(v, np.ndarray) and lent(v) for v in values)
    assert COUNTS['cache: hits'] > 0
    if case == 'flip_before_mosaic':
        # the top-left patch is a flipped copy: never looked up or kept
        fit = _fits(fast)['FastMosaic']
        assert COUNTS['cache: resizes kept'] > 0
        for i in range(len(fast.dataset)):
            info = fast.dataset.get_data_info(i)
            w, h = fit_size((info['height'], info['width']), fit.scale)
            view = fit.fits.view(info['img_path'], (h, w, 3),
                                 np.dtype(np.uint8))
            if view is not None:
                assert np.array_equal(
                    view, cv2.resize(cv2.imread(info['img_path']), (w, h)))
