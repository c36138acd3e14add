"""The fast transforms give stock's bytes and consume stock's draws.

Property tests at the transform level (many drawn inputs, no dataset), then
the mixing wrapper on real COCO files (the sample set and images of every
kind users have), then the switch. Tests mirror
``fast_parallel/pipeline/``.
"""
import copy
import json
import random
import sys

import cv2
import numpy as np
import pytest
import torch
from mmdet.datasets.transforms import (MixUp, Mosaic, RandomAffine,
                                       YOLOXHSVRandomAug)
from mmdet.structures.bbox import HorizontalBoxes
from mmdet.utils import register_all_modules
from transform_utils import assert_same_run, compare_mix_datasets
from transform_utils import run_both as _run_both
from transform_utils import same_states as _same_states
from transform_utils import set_states as _set
from transform_utils import sparse_annotations

from fast_parallel.bench.pipeline import first_difference
from fast_parallel.bench.presets import load_preset
from fast_parallel.pipeline import COUNTS, switch_pipeline
from fast_parallel.pipeline.colour import FastYOLOXHSVRandomAug
from fast_parallel.pipeline.copies import as_deepcopied
from fast_parallel.pipeline.mix_dataset import FastMultiImageMixDataset
from fast_parallel.pipeline.mixes import FastMixUp
from fast_parallel.pipeline.mosaic import FastMosaic

register_all_modules()


def _image(rng, h, w, channels=3, dtype=np.uint8):
    shape = (h, w) if channels is None else (h, w, channels)
    if dtype == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return (rng.random(shape) * 255).astype(dtype)


def _boxes(rng, n, h, w, as_numpy=False):
    # some boxes reach outside the image, some are degenerate
    x1 = rng.uniform(-0.2 * w, 1.1 * w, n)
    y1 = rng.uniform(-0.2 * h, 1.1 * h, n)
    bw = rng.choice([0.0, 1.0, 5.0, 0.4 * w], n)
    bh = rng.choice([0.0, 1.0, 5.0, 0.4 * h], n)
    boxes = np.stack([x1, y1, x1 + bw, y1 + bh], 1).astype(np.float32)
    return boxes if as_numpy else HorizontalBoxes(boxes)


def _results(rng, h, w, n, channels=3, dtype=np.uint8, as_numpy=False):
    return dict(
        img=_image(rng, h, w, channels, dtype),
        img_shape=(h, w),
        gt_bboxes=_boxes(rng, n, h, w, as_numpy),
        gt_bboxes_labels=rng.integers(0, 80, n).astype(np.int64),
        gt_ignore_flags=rng.random(n) < 0.2)


SIZES = [(1, 1), (7, 3), (33, 65), (120, 160), (480, 640), (640, 480),
         (300, 300)]


def test_as_deepcopied_hands_over_what_a_deep_copy_would():
    base = np.arange(2 * 5 * 6 * 3, dtype=np.uint8).reshape(2, 5, 6, 3)
    read_only = np.ones((4, 4), np.float32)
    read_only.flags.writeable = False
    flipped = base[0][:, ::-1]
    leaves = dict(
        owned=np.zeros((3, 4), np.int64),
        flipped=flipped,
        fortran=np.asfortranarray(base[1, :, :, 0]),
        crop=base[1, 1:3, 2:5],
        same_base=base[0, 2:],
        read_only=read_only,
        objects=np.array([{
            'a': 1
        }, None], dtype=object),
        scalar=np.float32(2.5),
        zero_d=np.array(3.0),
        empty=np.zeros((0, 4), np.float32))
    value = dict(
        leaves,
        nested=[dict(poly=[[1.0, 2.0, 3.0]], arr=base[1, 0]), (flipped, 4)],
        boxes=HorizontalBoxes(torch.zeros(2, 4)),
        tensor=torch.arange(6).view(2, 3).t(),
        text='x')
    copied = copy.deepcopy(value)
    handed = as_deepcopied(value)

    def arrays(tree, path=''):
        if isinstance(tree, np.ndarray):
            yield path, tree
        elif isinstance(tree, dict):
            for k, v in tree.items():
                yield from arrays(v, f'{path}.{k}')
        elif isinstance(tree, (list, tuple)):
            for i, v in enumerate(tree):
                yield from arrays(v, f'{path}[{i}]')

    ours, theirs = dict(arrays(handed)), dict(arrays(copied))
    assert ours.keys() == theirs.keys()
    for path, a in ours.items():
        b = theirs[path]
        assert (a.dtype, a.shape, a.strides) == (b.dtype, b.shape,
                                                 b.strides), path
        assert a.flags.writeable == b.flags.writeable, path
        if a.dtype.hasobject:
            assert a is not value['objects'] and a[0] == b[0]
        else:
            assert a.tobytes() == b.tobytes(), path
    # no two handed-over arrays share memory where the deep copy's do not
    paths = [p for p in ours if not ours[p].dtype.hasobject]
    for i, p in enumerate(paths):
        for q in paths[i + 1:]:
            assert np.shares_memory(ours[p], ours[q]) == np.shares_memory(
                theirs[p], theirs[q]), (p, q)
    # nor with memory the caller still holds (views are copied, wherever)
    for path, a in ours.items():
        assert a.dtype.hasobject or not np.shares_memory(a, base), path
    assert first_difference(handed['tensor'], copied['tensor']) is None
    assert first_difference(handed['boxes'], copied['boxes']) is None
    assert handed['nested'][0]['poly'] == copied['nested'][0]['poly']


def test_as_deepcopied_keeps_a_deep_copys_aliasing_and_depth():
    """An object met twice is handed as one object (a deep copy's memo
    makes one copy of it); a structure deeper than the walk goes is deep-
    copied (or fails) as stock's copy is, at every depth."""
    shared_list, shared_array = [1.0, 2.0], np.zeros((2, 3), np.float32)
    value = dict(
        a=shared_list,
        b=[shared_list, (shared_array, 1)],
        c=dict(d=shared_array, e=shared_list))
    handed, copied = as_deepcopied(value), copy.deepcopy(value)
    assert handed['a'] is handed['b'][0] is handed['c']['e']
    assert handed['b'][1][0] is handed['c']['d']
    assert copied['a'] is copied['b'][0] and \
        copied['b'][1][0] is copied['c']['d']
    assert first_difference(handed, copied) is None

    def nest(levels):
        tree = dict(leaf=[1, 2])
        for _ in range(levels):
            tree = dict(k=tree)
        return tree

    def outcome(copier, tree, frames):  # called ``frames`` deeper
        if frames:
            return outcome(copier, tree, frames - 1)
        try:
            return copier(tree) and 'copied'
        except RecursionError:
            return 'raised'

    def stock(tree):  # (a frame, as as_deepcopied's: stock's wrapper
        return copy.deepcopy(tree)  # calls its copy from its own frame)

    limit = sys.getrecursionlimit()
    for levels in range(limit * 2 // 5, limit * 3 // 5):  # (both kinds)
        for frames in (0, 1, 2):
            tree = nest(levels)
            assert outcome(stock, tree, frames) == \
                outcome(as_deepcopied, tree, frames), (levels, frames)


def test_first_difference_sees_every_kind_of_difference():
    nan = torch.tensor([float('nan')])
    payload = nan.clone()
    payload.view(torch.int32)[0] = 0x7fc00abc
    assert first_difference(nan, nan.clone()) is None
    assert first_difference(nan, payload) is not None
    assert first_difference(torch.zeros(2, 3), torch.zeros(3, 2).t())
    assert first_difference(torch.zeros(2), torch.zeros(2, dtype=torch.int))
    assert first_difference(np.zeros(2), np.zeros(2, np.float32))
    assert first_difference(dict(a=1, b=2), dict(b=2, a=1))
    assert first_difference(np.int64(3), np.int64(3)) is None
    assert first_difference(np.float32('nan'), np.float32('nan')) is None
    assert first_difference(np.float32(0.0), np.float32(-0.0))
    assert first_difference(np.float32(1), np.float64(1))
    assert first_difference(np.int64(3), np.int64(4))
    assert first_difference(np.int64(3), 3)
    assert first_difference([np.zeros(1)], [np.ones(1)]) == \
        'sample[0]: arrays differ'


@pytest.mark.parametrize('seed', range(6))
def test_fast_mixup_gives_stock_bytes_and_draws(seed):
    rng = np.random.default_rng(seed)
    np.random.seed(seed)
    cases = 0
    for h, w in SIZES:
        for rh, rw in random.Random(seed * 100 + h).sample(SIZES, 3):
            options = dict(
                img_scale=tuple(int(v) for v in rng.choice([64, 160, 640], 2)),
                # (1.0, 1.0): RTMDet's CachedMixUp, no jitter resize
                ratio_range=[(0.5, 1.6), (0.8, 1.6),
                             (1.0, 1.0)][int(rng.integers(3))],
                flip_ratio=float(rng.choice([0.0, 0.5, 1.0])),
                pad_val=[
                    114.0, 114, 0, 255.0, 114.5, (114, 114, 114),
                    (0.5, 7, 255.0)
                ][cases % 7],
                bbox_clip_border=bool(rng.random() < 0.7))
            stock = MixUp(**options)
            fast = copy.deepcopy(stock)
            fast.__class__ = FastMixUp
            n = int(rng.choice([0, 1, 3, 12]))
            as_numpy = bool(rng.random() < 0.3)
            results = _results(rng, h, w, n, as_numpy=as_numpy)
            mix_n = int(rng.choice([0, 2, 9]))
            results['mix_results'] = [
                _results(rng, rh, rw, mix_n, as_numpy=as_numpy)
            ]
            assert_same_run(stock, fast, results)
            cases += 1
    assert cases == len(SIZES) * 3


def test_fast_mixup_without_jitter_reads_the_window_off_the_image(monkeypatch):
    """ratio_range (1.0, 1.0) (RTMDet's CachedMixUp): the crop is read off
    the image and the canvas's pad, for every pad kind, flip, canvas and
    target size (windows over the image, the pad, both, or past both)."""
    from fast_parallel.pipeline.mix_window import MixWindow
    taken = []
    original = MixWindow._window_of_image

    def spy(self, *args):
        taken.append(self.is_flip)
        return original(self, *args)

    monkeypatch.setattr(MixWindow, '_window_of_image', spy)
    rng = np.random.default_rng(11)
    np.random.seed(11)
    pads = [114.0, 114, 0, 255.0, 113.9, (114, 114, 114), (0.5, 7, 255.0)]
    made = 0
    for case in range(70):
        stock = MixUp(
            img_scale=tuple(int(v) for v in rng.integers(8, 90, 2)),
            ratio_range=(1.0, 1.0),
            flip_ratio=float(rng.choice([0.0, 0.5, 1.0])),
            pad_val=pads[case % len(pads)])
        fast = copy.deepcopy(stock)
        fast.__class__ = FastMixUp
        h, w, rh, rw = (int(v) for v in rng.integers(1, 120, 4))
        results = _results(rng, h, w, int(rng.choice([1, 5])))
        results['mix_results'] = [_results(rng, rh, rw, 3)]
        made += assert_same_run(stock, fast, results)[0] == 'ok'
    # every sample stock made took the window (a mix image resized to no
    # width raises stock's error first), flipped and not
    assert made >= 60 and len(taken) == made and 0 < sum(taken) < made
    # a bad img_scale: stock's error from its canvas, before the resize
    for scale in ((-40, 30), (40.0, 30.0)):
        for flip_ratio in (0.0, 1.0):
            stock = MixUp(
                img_scale=(64, 64),
                ratio_range=(1.0, 1.0),
                flip_ratio=flip_ratio)
            stock.dynamic_scale = scale
            fast = copy.deepcopy(stock)
            fast.__class__ = FastMixUp
            results = _results(rng, 20, 20, 2)
            results['mix_results'] = [_results(rng, 30, 40, 3)]
            assert assert_same_run(stock, fast, results)[0] == 'raised'


@pytest.mark.parametrize('kind', ['gray', 'float32', 'uint16', 'rgba'])
def test_fast_mixup_sends_other_images_the_stock_way(kind):
    rng = np.random.default_rng(1)
    channels, dtype = dict(
        gray=(None, np.uint8),
        float32=(3, np.float32),
        uint16=(3, np.uint16),
        rgba=(4, np.uint8))[kind]
    stock = MixUp(img_scale=(64, 64))
    fast = copy.deepcopy(stock)
    fast.__class__ = FastMixUp
    COUNTS.clear()
    for _ in range(4):
        results = _results(rng, 50, 70, 4, channels, dtype)
        results['mix_results'] = [_results(rng, 40, 30, 3, channels, dtype)]
        assert_same_run(stock, fast, results)
    assert sum(v for k, v in COUNTS.items()
               if k.startswith('stock: MixUp')) == 4


@pytest.mark.parametrize('seed', range(4))
def test_fast_mosaic_gives_stock_bytes_and_draws(seed):
    rng = np.random.default_rng(seed)
    np.random.seed(seed)
    for case in range(12):
        stock = Mosaic(
            img_scale=tuple(int(v) for v in rng.choice([32, 160, 640], 2)),
            center_ratio_range=(0.5, 1.5),
            bbox_clip_border=bool(case % 3),
            pad_val=[114.0, 0, 7.5, (114, 114, 114)][case % 4],
            prob=[1.0, 0.5][case % 2])
        fast = copy.deepcopy(stock)
        fast.__class__ = FastMosaic
        channels = None if case % 4 == 3 else 3
        dtype = np.float32 if case % 5 == 4 else np.uint8
        as_numpy = case % 6 == 5
        sizes = random.Random(case).sample(SIZES, 4)
        patches = [
            _results(rng, h, w, int(rng.choice([0, 2, 7])), channels, dtype,
                     as_numpy) for h, w in sizes
        ]
        results = patches[0]
        results['mix_results'] = patches[1:]
        assert_same_run(stock, fast, results)


def test_fast_hsv_gives_stock_bytes_and_draws():
    rng = np.random.default_rng(3)
    np.random.seed(3)
    every_value = np.arange(256 * 3, dtype=np.int64).reshape(16, 16, 3) % 256
    images = [every_value.astype(np.uint8)] + [
        _image(rng, h, w) for h, w in SIZES
    ] + [_image(rng, 20, 10, None),
         _image(rng, 9, 9, 3, np.float32)]
    for deltas in [(5, 30, 30), (0, 0, 0), (90, 255, 255), (179, 1, 300)]:
        stock = YOLOXHSVRandomAug(*deltas)
        fast = copy.deepcopy(stock)
        fast.__class__ = FastYOLOXHSVRandomAug
        for image in images:
            for _ in range(3):
                assert_same_run(stock, fast, dict(img=image.copy()))


# -- the mixing wrapper, on real files ----------------------------------


def _train_dataset_cfg(data, ann_file=None, color_type='color'):
    cfg = load_preset('yolox_s', data).train_dataloader.dataset
    cfg = copy.deepcopy(cfg)
    if ann_file is not None:
        cfg.dataset.ann_file = ann_file
        cfg.dataset.filter_cfg = dict(filter_empty_gt=False, min_size=0)
    cfg.dataset.pipeline[0]['color_type'] = color_type
    return cfg


def _compare_datasets(cfg, samples, skip=None, seed=0):
    return compare_mix_datasets(cfg, samples, skip, seed)


@pytest.mark.parametrize('skip', [None, ['Mosaic', 'RandomAffine', 'MixUp']])
def test_mix_dataset_gives_stock_samples_and_draws(sample_data, skip):
    outcome = _compare_datasets(_train_dataset_cfg(sample_data), 40, skip)
    assert str(outcome).startswith(
        'pipeline: MultiImageMixDataset, Mosaic, MixUp, YOLOXHSVRandomAug, '
        'Pad, PackDetInputs fast; RandomAffine stock (no exact faster form)')
    assert COUNTS['samples'] == 40
    # MixUp's sample was loaded once, not twice, unless switched off
    assert COUNTS['mix loads reused'] == (0 if skip else 40)
    # (no cache: the Mosaic resized only the part the affine reads, some
    # of the time)
    assert (COUNTS['Mosaic: resizes cut to the part read'] > 0) == \
        (skip is None)


def test_mix_dataset_where_most_images_have_no_boxes(sample_data, tmp_path):
    """MixUp's get_indexes loads until it finds boxes (its retry), and mixes
    an image without boxes as stock does (returns early)."""
    ann = sparse_annotations(sample_data, tmp_path)
    _compare_datasets(_train_dataset_cfg(sample_data, ann), 40)
    assert COUNTS['mix loads reused'] == 40


def _write_kinds(folder, rng):
    """Image files of every kind users have, as (file name, w, h)."""
    made = []

    def write(name, array, params=()):
        assert cv2.imwrite(str(folder / name), array, list(params))
        made.append((name, array.shape[1], array.shape[0]))

    write('gray.png', _image(rng, 90, 120, None))
    write('rgba.png', _image(rng, 80, 60, 4))
    write('deep.png', (rng.integers(0, 65536, (70, 50, 3))).astype(np.uint16))
    write('tiny.png', _image(rng, 1, 1))
    write('big.jpg', cv2.resize(_image(rng, 300, 400), (4000, 3000)),
          (cv2.IMWRITE_JPEG_QUALITY, 80))
    write('plain.jpg', _image(rng, 100, 150))
    # a JPEG whose EXIF says "rotate 90": decoders that honour it swap w, h
    ok, jpg = cv2.imencode('.jpg', _image(rng, 40, 100))
    tiff = bytes.fromhex('4D4D002A00000008'
                         '0001'
                         '0112'
                         '0003'
                         '00000001'
                         '00060000'
                         '00000000')
    body = b'Exif\x00\x00' + tiff
    exif = b'\xff\xe1' + (len(body) + 2).to_bytes(2, 'big') + body
    (folder / 'rotated.jpg').write_bytes(jpg[:2].tobytes() + exif +
                                         jpg[2:].tobytes())
    made.append(('rotated.jpg', 100, 40))
    return made


@pytest.mark.parametrize('color_type', ['color', 'unchanged'])
def test_mix_dataset_on_every_kind_of_image(tmp_path, color_type):
    rng = np.random.default_rng(0)
    root = tmp_path / 'coco'
    (root / 'train2017').mkdir(parents=True)
    (root / 'annotations').mkdir()
    made = _write_kinds(root / 'train2017', rng)
    images, annotations = [], []
    for i, (name, w, h) in enumerate(made):
        images.append(dict(id=i, file_name=name, width=w, height=h))
        for k in range(i % 3 + 1):
            annotations.append(
                dict(
                    id=len(annotations),
                    image_id=i,
                    category_id=1,
                    bbox=[k * w / 4, k * h / 5, w / 2 + 1, h / 3 + 1],
                    area=w * h / 6,
                    iscrowd=0))
    coco = dict(
        images=images,
        annotations=annotations,
        categories=[dict(id=1, name='person')])
    ann = root / 'annotations' / 'instances_train2017.json'
    ann.write_text(json.dumps(coco))
    cfg = _train_dataset_cfg(tmp_path, str(ann), color_type)
    cfg.dataset.data_root = str(root) + '/'
    _compare_datasets(cfg, 24)


# -- the switch ------------------------------------------------------------


def test_switch_names_what_stays_stock_and_keeps_subclasses(sample_data):
    from mmdet.registry import DATASETS
    cfg = _train_dataset_cfg(sample_data)
    off = DATASETS.build(copy.deepcopy(cfg))
    assert str(switch_pipeline(off, enabled=False)) == \
        'pipeline: left stock (fast_pipeline=False)'
    assert not any(
        type(t).__module__.startswith('fast_parallel') for t in off.pipeline)

    class MyMosaic(Mosaic):
        pass

    cfg.dataset.pipeline.append(dict(type='RandomFlip', prob=0.5))
    mine = DATASETS.build(copy.deepcopy(cfg))
    mine.pipeline[0] = MyMosaic(img_scale=(640, 640))
    line = str(switch_pipeline(mine))
    assert type(mine.pipeline[0]) is MyMosaic  # a user's subclass: stock
    assert 'MixUp' in line and 'Mosaic' not in line.split(' fast')[0]
    # the wrapped dataset's items may draw (RandomFlip): copies stay
    assert type(mine) is not FastMultiImageMixDataset
    assert 'MultiImageMixDataset stock (copies kept: its pipeline has ' \
        'RandomFlip)' in line
    assert isinstance(mine.pipeline[1], RandomAffine)


def test_a_mix_dataset_built_twice_stays_one_swap(sample_data):
    from mmdet.registry import DATASETS
    dataset = DATASETS.build(copy.deepcopy(_train_dataset_cfg(sample_data)))
    first = str(switch_pipeline(dataset))
    assert str(switch_pipeline(dataset)) == first
    clone = copy.deepcopy(dataset)
    assert type(clone) is FastMultiImageMixDataset and clone._fp_fresh


# -- the decoded-input cache ----------------------------------------------


def test_cache_gives_a_copy_of_what_was_decoded(tmp_path):
    from fast_parallel.pipeline.cache import DecodedCache
    rng = np.random.default_rng(0)
    images = {
        'color.png': _image(rng, 30, 40),
        'gray.png': _image(rng, 9, 7, None),
        'deep.png': rng.integers(0, 65536, (5, 6, 3)).astype(np.uint16),
        'float.npy': rng.random((4, 4, 3)).astype(np.float32),
    }
    paths = [str(tmp_path / name)
             for name in images] + [str(tmp_path / 'never.png')]
    for path, img in zip(paths, images.values()):
        open(path, 'wb').close()
    cache = DecodedCache(paths, sum(i.nbytes for i in images.values()))
    import os
    for path, img in zip(paths, images.values()):
        assert cache.get(path) is None
        cache.put(path, img, os.stat(path))
    for path, img in zip(paths, images.values()):
        got = cache.get(path)
        assert first_difference(got, img) is None
        assert got.flags.c_contiguous and got.flags.writeable and \
            got.flags.owndata
        got[...] = 0  # a transform writing in place changes no cache byte
        assert first_difference(cache.get(path), img) is None
    assert cache.get(paths[-1]) is None and cache.get('elsewhere') is None
    assert cache.used == sum(i.nbytes for i in images.values())
    # full: not kept, counted
    COUNTS.clear()
    cache.put(paths[-1], images['color.png'], os.stat(paths[0]))
    assert cache.get(paths[-1]) is None and COUNTS['cache: full'] == 1
    # the file changed since: decoded again
    with open(paths[0], 'wb') as f:
        f.write(b'new')
    assert cache.get(paths[0]) is None
    assert COUNTS['cache: file changed since it was cached'] == 1
    # a spawned worker gets no cache; a copied dataset the same one
    import pickle
    assert pickle.loads(pickle.dumps(cache)) is None
    assert copy.deepcopy(cache) is cache


def test_cached_loads_across_forked_workers_give_stock_bytes(sample_data):
    """Two workers fill one cache (the main process sees every image
    decoded once); the second epoch's samples, all hits, are stock's."""
    from mmdet.registry import DATASETS
    from torch.utils.data import DataLoader

    from fast_parallel.pipeline.cache import FastLoadImageFromFile
    cfg = _train_dataset_cfg(sample_data)
    stock = DATASETS.build(copy.deepcopy(cfg))
    fast = DATASETS.build(copy.deepcopy(cfg))
    line = str(switch_pipeline(fast, cache_inputs='auto', forked=True))
    assert 'inputs cached in shared memory (up to 0.0 GB;' in line, line
    load = fast.dataset.pipeline.transforms[0]
    assert type(load) is FastLoadImageFromFile
    cache = load._fp_cache
    sizes = sum(
        info['height'] * info['width'] * 3
        for info in map(fast.dataset.get_data_info, range(len(fast.dataset))))
    assert cache.capacity == sizes

    def epoch(dataset, seed):
        loader = DataLoader(
            dataset,
            batch_size=1,
            num_workers=2,
            collate_fn=lambda b: b[0],
            generator=torch.Generator().manual_seed(seed),
            shuffle=True)
        return list(loader)

    epoch(fast, 0)
    assert cache.used == sizes  # every image, once, from the workers
    for a, b in zip(epoch(stock, 1), epoch(fast, 1)):
        assert first_difference(a, b) is None


def _children(pid: int) -> list:
    """The pids whose parent is ``pid`` (from /proc)."""
    import os
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(')', 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _mapping_kb(pid: int, start: int) -> dict:
    """Rss and Pss (kB) of the mapping of ``pid`` that starts at
    ``start``; zeros where the process does not map it."""
    sizes, inside = dict(Rss=0, Pss=0), False
    with open(f'/proc/{pid}/smaps') as f:
        for line in f:
            head = line.split()[0]
            if '-' in head and ':' not in head:
                inside = int(head.split('-')[0], 16) == start
            elif inside and head[:-1] in sizes:
                sizes[head[:-1]] = int(line.split()[1])
    return sizes


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='/proc')
def test_four_workers_hold_one_copy_of_the_cache(sample_data):
    """Four forked workers fill the cache and read it again: the sum of
    their proportional set sizes (and the main process's) for its mapping
    is one copy of the decoded images, while each holds all it read; the
    same for the kept Mosaic / MixUp resizes."""
    import ctypes
    import os

    from mmdet.registry import DATASETS
    from torch.utils.data import DataLoader
    cfg = _train_dataset_cfg(sample_data)
    dataset = DATASETS.build(copy.deepcopy(cfg))
    switch_pipeline(dataset, cache_inputs='auto', forked=True)
    cache = dataset.dataset.pipeline.transforms[0]._fp_cache
    fits = dataset.pipeline[0]._fp_fit.fits
    starts = {}
    for name, held in (('decoded', cache), ('resizes', fits)):
        pointer = ctypes.c_char.from_buffer(held._data_map)
        starts[name] = ctypes.addressof(pointer)
        del pointer
    loader = DataLoader(
        dataset,
        batch_size=1,
        num_workers=4,
        persistent_workers=True,
        collate_fn=lambda b: b[0])
    for _ in range(3):  # decoded into the cache, then all hits
        list(loader)
    workers = _children(os.getpid())
    assert len(workers) >= 4
    kbs = {
        name: {
            pid: _mapping_kb(pid, start)
            for pid in [os.getpid()] + workers
        }
        for name, start in starts.items()
    }
    del loader
    page_kb = os.sysconf('SC_PAGE_SIZE') // 1024
    assert cache.used == cache.capacity  # every image decoded once
    assert fits.used > 0
    for name, held in (('decoded', cache), ('resizes', fits)):
        kb = kbs[name]
        used_kb = held.used / 1024
        rss = max(k['Rss'] for k in kb.values())
        pss = sum(k['Pss'] for k in kb.values())
        print(f'{name}: {used_kb:.0f} kB used; Rss (kB) by process '
              f'{[k["Rss"] for k in kb.values()]}, Pss '
              f'{[k["Pss"] for k in kb.values()]}, sum of Pss {pss} kB')
        assert sum(k['Rss'] > 0 for k in kb.values()) >= 4
        # one copy: the shared pages, counted once over all the processes
        assert used_kb - page_kb * len(kb) <= pss <= used_kb + page_kb * (
            len(kb) + 1)
        assert rss <= used_kb + page_kb


def test_cache_that_does_not_fit_says_what_it_needs(sample_data, monkeypatch):
    from mmdet.registry import DATASETS

    from fast_parallel.pipeline import cache_plan as cache_module
    cfg = _train_dataset_cfg(sample_data)
    monkeypatch.setattr(cache_module, 'AUTO_SHARE', 1e-9)
    dataset = DATASETS.build(copy.deepcopy(cfg))
    line = str(switch_pipeline(dataset, cache_inputs='auto'))
    assert 'inputs not cached (the decoded train set needs 0.0 GB, over ' \
        '0% of the ' in line, line
    # (the load keeps the decoded shapes for the fast Mosaic, no images)
    assert dataset.dataset.pipeline.transforms[0]._fp_cache is None
    monkeypatch.undo()
    spawned = DATASETS.build(copy.deepcopy(cfg))
    assert 'inputs not cached (the workers are not forked)' in str(
        switch_pipeline(spawned, cache_inputs='auto', forked=False))
    gray = copy.deepcopy(cfg)
    gray.dataset.pipeline[0]['color_type'] = 'unchanged'
    assert "inputs not cached (color_type 'unchanged': decoded sizes " \
        'unknown)' in str(
            switch_pipeline(DATASETS.build(gray), cache_inputs='auto'))


def test_mix_dataset_with_the_cache_gives_stock_samples(sample_data):
    cfg = _train_dataset_cfg(sample_data)
    from mmdet.registry import DATASETS
    stock = DATASETS.build(copy.deepcopy(cfg))
    fast = DATASETS.build(copy.deepcopy(cfg))
    switch_pipeline(fast, cache_inputs='auto')
    np.random.seed(5)
    COUNTS.clear()
    for i in range(30):
        (s_kind, s_out, s_states), (f_kind, f_out, f_states) = _run_both(
            lambda r, i=i: stock[i % len(stock)],
            lambda r, i=i: fast[i % len(fast)],
            None)
        assert (s_kind, f_kind) == ('ok', 'ok')
        assert first_difference(s_out, f_out) is None, i
        assert _same_states(s_states, f_states)
        _set(s_states)
    assert COUNTS['cache: hits'] > COUNTS['cache: decoded'] > 0


# -- the data-bound line ---------------------------------------------------


def test_a_run_waiting_on_data_says_so_and_what_would_cover_it(
        sample_data, tmp_path):
    """A real run whose pipeline spends 1.5 s of worker CPU per sample (a
    user's costly transform) on one worker."""
    import time

    from mmcv.transforms import BaseTransform
    from mmdet.registry import TRANSFORMS
    from mmengine.runner import Runner
    from models import CONFIGS
    from runner_utils import sample_config

    @TRANSFORMS.register_module(force=True)
    class SpendCPU(BaseTransform):

        def transform(self, results):
            end = time.thread_time() + 1.5
            while time.thread_time() < end:
                pass
            return results

    cfg = sample_config(
        CONFIGS['yolox'],
        sample_data,
        tmp_path,
        fast=True,
        train_cfg=dict(max_epochs=1, val_interval=10))
    cfg.train_dataloader.num_workers = 1
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.dataset.pipeline.insert(-1, dict(type='SpendCPU'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    from fast_parallel.pipeline.refresh import PipelineRefresher
    assert sum(isinstance(h, PipelineRefresher) for h in runner.hooks) == 1
    log = open(f'{runner.log_dir}/{runner.timestamp}.log').read()
    line = next(x for x in log.splitlines() if 'data-bound: epoch 1' in x)
    assert 'not data-bound' not in line, line
    share = int(line.split('waited for data ')[1].split('%')[0])
    assert share > 10, line
    spent = float(line.split('the 1 worker spent ')[1].split(' ms')[0])
    assert spent >= 2 * 1500, line  # two samples of 1.5 s each, at least
    assert 'num_workers=' in line or 'cores present would be needed' in line
    # what the worker's pipeline did, gathered from it: 8 samples, none of
    # them stock's way, the user's transform with stock's retry copy, each
    # load a cache hit or a decode: one a sample in YOLOX's last epochs (the
    # sample config's only epoch here), else 1 + 3 mosaic + MixUp's, reused
    done = next(x for x in log.splitlines()
                if 'pipeline this epoch (all workers): ' in x)
    figures = dict(
        part.rsplit(' ', 1)
        for part in done.split('(all workers): ')[1].split(', '))
    figures = {k: int(v) for k, v in figures.items()}
    assert figures['samples'] == 8 and figures['stock'] == 0, done
    assert figures['stock copy'] == 8
    loads = figures['cache: hits'] + figures['cache: decoded']
    if 'No mosaic and mixup aug now!' in log:
        assert loads == 8 and figures['mix loads reused'] == 0, done
        assert figures['cache: decoded'] == 8  # the 8 images, once each
    else:
        assert loads >= 5 * 8 and figures['mix loads reused'] == 8, done


def _with_masks(rng, results, kind):
    from mmdet.structures.mask import BitmapMasks, PolygonMasks
    h, w = results['img'].shape[:2]
    n = len(results['gt_bboxes'])
    if kind == 'bitmap':
        results['gt_masks'] = BitmapMasks(
            rng.integers(0, 2, (n, h, w)).astype(np.uint8), h, w)
    else:
        results['gt_masks'] = PolygonMasks([[rng.uniform(0, min(h, w), 8)]
                                            for _ in range(n)], h, w)
    return results


@pytest.mark.parametrize('masks', [None, 'bitmap', 'polygon'])
def test_fast_cached_mixes_give_stock_bytes_and_draws(masks):
    """A stream of samples through each pair (their caches fill, pop and
    are picked from as stock's), with every option's values."""
    from mmdet.datasets.transforms import CachedMixUp, CachedMosaic

    from fast_parallel.pipeline.cached_mixes import (ENTRY_KEYS,
                                                     FastCachedMixUp,
                                                     FastCachedMosaic)
    rng = np.random.default_rng(7)
    np.random.seed(7)
    pairs = []
    for random_pop, cached, prob in ((True, 5, 1.0), (False, 7, 0.5)):
        mosaic = CachedMosaic(
            img_scale=(96, 64),
            max_cached_images=cached,
            random_pop=random_pop,
            prob=prob,
            pad_val=(114, 114, 114) if random_pop else 114.0)
        mixup = CachedMixUp(
            img_scale=(64, 96),
            ratio_range=(0.5, 1.5),
            max_cached_images=cached,
            random_pop=random_pop,
            prob=prob,
            pad_val=(114, 114, 114) if random_pop else 114.0)
        for stock, fast_class in ((mosaic, FastCachedMosaic),
                                  (mixup, FastCachedMixUp)):
            fast = copy.deepcopy(stock)
            fast.__class__ = fast_class
            pairs.append((stock, fast))
    COUNTS.clear()
    for step in range(40):
        h, w = SIZES[step % len(SIZES)]
        h, w = min(h, 200), min(w, 200)
        dtype = np.float32 if step in (21, 22) else np.uint8
        results = _results(rng, h, w, int(rng.choice([0, 1, 4])), 3, dtype)
        if masks:
            results = _with_masks(rng, results, masks)
        for stock, fast in pairs:
            (s_kind, s_out, s_states), (f_kind, f_out, f_states) = \
                _run_both(stock, fast, results)
            assert s_kind == f_kind, (s_out, f_out)
            if s_kind == 'raised':  # stock's error (a float image)
                assert s_out == f_out
            else:
                assert first_difference(s_out, f_out) is None, \
                    first_difference(s_out, f_out)
            assert _same_states(s_states, f_states)
            # the caches fill, pop and are picked from alike: the same
            # entries, of the keys an entry is read for
            assert first_difference([{
                k: e[k]
                for k in ENTRY_KEYS if k in e
            } for e in stock.results_cache], [{
                k: e[k]
                for k in ENTRY_KEYS if k in e
            } for e in fast.results_cache]) is None
            _set(s_states)
    assert COUNTS['stock: CachedMixUp: not a 3-channel uint8 image'] > 0


class _DrawsWhenCopied:
    """A user's object whose deep copy draws a random number."""

    def __deepcopy__(self, memo):
        np.random.random()
        return _DrawsWhenCopied()


def test_mixes_copy_other_objects_as_stock_does():
    """A sample (or a cache entry, or a mix result) holding more than plain
    data, boxes and masks: stock's transform, with its copies' error (a
    lock) or draws, counted."""
    import threading

    from mmdet.datasets.transforms import CachedMixUp, CachedMosaic

    from fast_parallel.pipeline.cached_mixes import (FastCachedMixUp,
                                                     FastCachedMosaic)
    pairs = ((CachedMosaic(img_scale=(64, 64)), FastCachedMosaic),
             (CachedMixUp(img_scale=(64, 64)),
              FastCachedMixUp), (Mosaic(img_scale=(64, 64)), FastMosaic),
             (MixUp(img_scale=(64, 64)), FastMixUp))
    COUNTS.clear()
    for stock_transform, fast_class in pairs:
        mixes = {Mosaic: 3, MixUp: 1}.get(type(stock_transform), 0)
        for extra in (threading.Lock, _DrawsWhenCopied):
            for where in ('sample', 'mix result'):
                if where == 'mix result' and not mixes:
                    continue
                outs = []
                for cls in (type(stock_transform), fast_class):
                    transform = copy.deepcopy(stock_transform)
                    transform.__class__ = cls
                    np.random.seed(5)
                    rng = np.random.default_rng(5)
                    try:
                        for _ in range(8):  # the caches fill and mix
                            results = _results(rng, 30, 40, 2)
                            results['mix_results'] = [
                                _results(rng, 20, 30, 2) for _ in range(mixes)
                            ]
                            target = results if where == 'sample' else \
                                results['mix_results'][0]
                            target['extra'] = extra()
                            if not mixes:
                                del results['mix_results']
                            transform(results)
                        outs.append(('ok', np.random.get_state()[2]))
                    except TypeError as error:
                        outs.append(('raised', str(error)))
                assert outs[0] == outs[1], (fast_class, extra, where, outs)
                # stock's MixUp copies nothing
                raises = extra is threading.Lock and fast_class is not \
                    FastMixUp
                assert outs[0][0] == ('raised' if raises else 'ok')
    assert sum(v for k, v in COUNTS.items()
               if k.endswith('a sample holding other objects')) > 0


def test_a_rebuilt_pipeline_is_switched_with_the_same_cache(sample_data):
    """What ``PipelineSwitchHook`` does (a new ``Compose`` on the dataset),
    then what the refresher does: the new transforms get the fast classes,
    the new image load the run's cache, no second cache is made."""
    from mmcv.transforms import Compose
    from mmdet.registry import DATASETS

    from fast_parallel.pipeline.cache import FastLoadImageFromFile
    from fast_parallel.pipeline.colour import FastYOLOXHSVRandomAug
    from fast_parallel.pipeline.switch import fast_transforms
    cfg = copy.deepcopy(_train_dataset_cfg(sample_data).dataset)
    cfg.pipeline += [
        dict(type='YOLOXHSVRandomAug'),
        dict(type='PackDetInputs')
    ]
    dataset = DATASETS.build(cfg)
    switch_pipeline(dataset, cache_inputs='auto')
    first = dataset.pipeline.transforms[0]._fp_cache
    assert first is not None
    stage2 = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='YOLOXHSVRandomAug'),
        dict(type='PackDetInputs')
    ]
    dataset.pipeline = Compose(stage2)
    before = fast_transforms(dataset)
    line = str(switch_pipeline(dataset, cache_inputs='auto'))
    assert fast_transforms(dataset) != before
    load, _, hsv, _ = dataset.pipeline.transforms
    assert type(load) is FastLoadImageFromFile and load._fp_cache is first
    assert type(hsv) is FastYOLOXHSVRandomAug
    assert 'YOLOXHSVRandomAug, PackDetInputs fast' in line and \
        'inputs cached' in line
    # stock's samples from the rebuilt pipeline
    stock = DATASETS.build(cfg)
    stock.pipeline = Compose(stage2)
    np.random.seed(3)
    for i in range(len(dataset)):
        (s_kind, s_out, s_states), (f_kind, f_out, f_states) = _run_both(
            lambda r, i=i: stock[i], lambda r, i=i: dataset[i], None)
        assert first_difference(s_out, f_out) is None
        assert _same_states(s_states, f_states)
        _set(s_states)


# -- inputs a review found (each ran differently once) ---------------------


def test_odd_layouts_and_dtypes_go_as_on_stock():
    """A same-size Mosaic patch that OpenCV's binding would change (one
    channel kept as a last axis, int64, bool), a Fortran-ordered MixUp
    image, a malformed mix result: fast gives stock's output or error."""
    rng = np.random.default_rng(11)
    np.random.seed(11)
    mosaic = Mosaic(img_scale=(40, 30))
    fast_mosaic = copy.deepcopy(mosaic)
    fast_mosaic.__class__ = FastMosaic
    for dtype, channels in ((np.uint8, 1), (np.int64, 3), (np.bool_, 3),
                            (np.uint8, 3)):
        patches = []
        for k in range(4):
            # the 30 x 40 patches are kept at their size (scale 1)
            img = (rng.integers(0, 2**40, (30, 40, channels)) %
                   (2 if dtype is np.bool_ else 2**40)).astype(dtype)
            if k == 0 and channels == 1:
                img = img[..., 0].astype(dtype)  # a 2-D sample image
            patch = _results(rng, 30, 40, 2)
            patch['img'] = img
            patches.append(patch)
        results = patches[0]
        results['mix_results'] = patches[1:]
        assert_same_run(mosaic, fast_mosaic, results)

    mixup = MixUp(img_scale=(64, 64))
    fast_mixup = copy.deepcopy(mixup)
    fast_mixup.__class__ = FastMixUp
    for _ in range(3):
        results = _results(rng, 50, 60, 3)
        results['img'] = np.asfortranarray(results['img'])
        results['mix_results'] = [_results(rng, 40, 30, 2)]
        assert_same_run(mixup, fast_mixup, results)
    results = _results(rng, 50, 60, 3)
    results['mix_results'] = [None]
    assert_same_run(mixup, fast_mixup, results)


def test_no_retries_and_self_holding_results_as_on_stock(sample_data):
    from mmdet.registry import DATASETS
    cfg = _train_dataset_cfg(sample_data)
    cfg.max_refetch = 0
    stock, fast = DATASETS.build(copy.deepcopy(cfg)), DATASETS.build(
        copy.deepcopy(cfg))
    switch_pipeline(fast)
    assert_same_run(lambda r: stock[0], lambda r: fast[0], None)
    with pytest.raises(RuntimeError, match='always return None'):
        stock[0]
    loop = dict(a=np.zeros((2, 2))[:, ::-1], b=[1.0])
    loop['me'] = loop
    handed = as_deepcopied(loop)
    assert handed['me'] is handed and handed['a'].flags.owndata
    assert first_difference(handed['a'], copy.deepcopy(loop)['a']) is None


def test_a_load_that_draws_makes_mixup_load_its_sample_again(sample_data):
    """A user's load class that draws, named as stock's (so the wrapper's
    items count as fresh): MixUp's sample is loaded again, as stock does,
    not reused from its ``get_indexes``."""
    from mmdet.datasets.transforms import LoadAnnotations as StockLoad
    from mmdet.registry import TRANSFORMS

    class LoadAnnotations(StockLoad):

        def transform(self, results):
            results['drawn'] = random.random()
            return super().transform(results)

    TRANSFORMS.register_module(
        name='DrawingLoadAnnotationsForTest',
        module=LoadAnnotations,
        force=True)
    cfg = _train_dataset_cfg(sample_data)
    assert cfg.dataset.pipeline[1]['type'] == 'LoadAnnotations'
    cfg.dataset.pipeline[1]['type'] = 'DrawingLoadAnnotationsForTest'
    _compare_datasets(cfg, 12)
    assert COUNTS['samples'] == 12 and COUNTS['mix loads reused'] == 0


def test_mixups_sample_is_loaded_again_after_a_refetch(sample_data, tmp_path):
    """Files that are gone, with ``ignore_empty``: the load gives None and
    ``BaseDataset`` picks another sample at random (a draw), for
    ``get_indexes``' load as for stock's second load of MixUp's sample; the
    fast wrapper keeps only a sample loaded without that draw."""
    with open(sample_data / 'coco/annotations/instances_train2017.json') as f:
        coco = json.load(f)
    first = max(image['id'] for image in coco['images']) + 1
    box = coco['annotations'][0]
    for k in range(len(coco['images'])):  # as many gone as there
        coco['images'].append(
            dict(coco['images'][0], id=first + k, file_name=f'gone_{k}.jpg'))
        coco['annotations'].append(dict(box, id=10**6 + k, image_id=first + k))
    ann = tmp_path / 'gone.json'
    ann.write_text(json.dumps(coco))
    cfg = _train_dataset_cfg(sample_data, str(ann))
    cfg.dataset.pipeline[0]['ignore_empty'] = True
    _compare_datasets(cfg, 40)
    assert COUNTS['samples'] == 40
    assert 0 < COUNTS['mix loads reused'] < 40  # (some refetched)


def test_mixups_load_is_looked_at_only_where_it_may_draw(sample_data):
    """The states around get_indexes' load are compared only where a load
    may draw: not for the stock loads of local files; yes for a file
    backend of the user's (it may draw) or another pipeline object."""
    from mmdet.registry import DATASETS

    from fast_parallel.pipeline.mix_dataset import _LoadProbe
    cfg = _train_dataset_cfg(sample_data)
    fast = DATASETS.build(copy.deepcopy(cfg))
    switch_pipeline(fast)
    assert _LoadProbe(fast.dataset).checks is False
    fast.dataset.pipeline.transforms[0].backend_args = dict(backend='local')
    assert _LoadProbe(fast.dataset).checks is True
    fast.dataset.pipeline.transforms[0].backend_args = None
    fast.dataset.pipeline = copy.copy(fast.dataset.pipeline)
    fast.dataset.pipeline.__class__ = type('MyCompose',
                                           (type(fast.dataset.pipeline), ), {})
    assert _LoadProbe(fast.dataset).checks is True


def test_the_mosaic_is_told_its_affine_for_one_sample_only(
        sample_data, monkeypatch):
    """The wrapper tells its first Mosaic the RandomAffine that reads its
    output only while it makes a sample: called on its own afterwards (a
    user's script, a visualizer), the Mosaic gives stock's whole canvas,
    in new memory."""
    from mmdet.registry import DATASETS
    fast = DATASETS.build(copy.deepcopy(_train_dataset_cfg(sample_data)))
    switch_pipeline(fast, cache_inputs=None)
    mosaic, affine = fast.pipeline[0], fast.pipeline[1]
    told = []
    inner = FastMosaic.transform

    def spy(self, results):
        told.append(self._fp_then)
        return inner(self, results)

    monkeypatch.setattr(FastMosaic, 'transform', spy)
    fast[0]
    fast[1]
    assert told == [affine, affine] and mosaic._fp_then is None
    stock = copy.deepcopy(mosaic)
    stock.__class__ = Mosaic
    rng = np.random.default_rng(4)
    outs = []
    for _ in range(2):
        patches = [
            _results(rng, 500, 700, 3, as_numpy=False) for _ in range(4)
        ]
        results = patches[0]
        results['mix_results'] = patches[1:]
        assert_same_run(stock, mosaic, results)
        outs.append(mosaic.transform(copy.deepcopy(results))['img'])
    assert not np.shares_memory(outs[0], outs[1])
