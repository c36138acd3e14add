"""``cache_inputs='disk:DIR'``: decoded images kept as ``.npy`` files. A hit
is a new array of the decode's bytes, dtype, shape and flags; a changed
image, other decode flags or a broken file is decoded again; a failed write
is counted; spawned and forked workers and a later run share the folder;
the YOLOX sample pipeline with it gives stock's samples and draws."""
import copy
import os
import pickle

import cv2
import numpy as np
import pytest
import torch

from fast_parallel.bench.pipeline import first_difference
from fast_parallel.bench.presets import load_preset
from fast_parallel.pipeline import COUNTS, switch_pipeline
from fast_parallel.pipeline.disk_cache import DiskCache, decoder_versions


def _images(rng):
    return {
        'color.png': rng.integers(0, 256, (30, 41, 3), dtype=np.uint8),
        'gray.png': rng.integers(0, 256, (9, 7), dtype=np.uint8),
        'deep.png': rng.integers(0, 65536, (5, 6, 3)).astype(np.uint16),
        'rgba.png': rng.integers(0, 256, (4, 4, 4), dtype=np.uint8),
        'float.npy': rng.random((4, 4, 3)).astype(np.float32),
        'tiny.png': np.zeros((1, 1, 3), np.uint8),
    }


def test_disk_cache_gives_a_new_array_of_what_was_decoded(tmp_path):
    rng = np.random.default_rng(0)
    images = _images(rng)
    cache = DiskCache(str(tmp_path / 'cache'), 'flags-a')
    paths = []
    for name, img in images.items():
        path = tmp_path / name
        path.write_bytes(b'x' * (len(paths) + 1))
        paths.append(str(path))
        assert cache.get(str(path)) is None
        cache.put(str(path), img, os.stat(path))
    for path, img in zip(paths, images.values()):
        got = cache.get(path)
        assert first_difference(got, img) is None
        assert got.flags.c_contiguous and got.flags.writeable and \
            got.flags.owndata
        got[...] = 0  # a transform writing in place changes no file
        assert first_difference(cache.get(path), img) is None
    files = sorted(p for p in (tmp_path / 'cache').rglob('*') if p.is_file())
    assert len(files) == len(images) and all(p.suffix == '.npy' for p in files)
    # other decode flags (or decoder versions): other files
    assert DiskCache(str(tmp_path / 'cache'), 'flags-b').get(paths[0]) is None
    # the image changed since (size, or mtime alone): decoded again
    os.utime(paths[0], ns=(5, 5))
    assert cache.get(paths[0]) is None
    # a broken file: read as a miss, counted
    stat = os.stat(paths[1])
    cache.put(paths[1], images['gray.png'], stat)
    broken = cache.file_for(paths[1], stat)
    with open(broken, 'r+b') as f:
        f.truncate(os.path.getsize(broken) - 3)
    COUNTS.clear()
    assert cache.get(paths[1]) is None
    assert COUNTS == {'cache: disk file unreadable (ValueError)': 1}
    # what a decode never gives is not written: non-C-ordered, object
    fresh = tmp_path / 'fresh.png'
    fresh.write_bytes(b'new')
    cache.put(
        str(fresh), np.asfortranarray(images['color.png']), os.stat(fresh))
    cache.put(str(fresh), np.array([None]), os.stat(fresh))
    assert not os.path.exists(cache.file_for(str(fresh), os.stat(fresh)))
    # a failed write: counted, nothing left behind
    blocked = tmp_path / 'blocked'
    blocked_cache = DiskCache(str(blocked), 'flags-a')
    target = blocked_cache.file_for(paths[0], os.stat(paths[0]))
    open(os.path.dirname(target), 'w').close()  # a file where a folder goes
    COUNTS.clear()
    blocked_cache.put(paths[0], images['color.png'], os.stat(paths[0]))
    assert COUNTS == {'cache: disk write failed (FileExistsError)': 1}
    assert blocked_cache.get(paths[0]) is None
    # a spawned worker gets the same folder
    assert pickle.loads(pickle.dumps(cache)).file_for(
        paths[3], os.stat(paths[3])) == cache.file_for(paths[3],
                                                       os.stat(paths[3]))


def test_file_names_hold_the_decoder_versions():
    assert decoder_versions('cv2').startswith(f'cv2 {cv2.__version__} (build ')
    assert ' PIL ' in decoder_versions('pillow') + ' '


def _train_dataset_cfg(data):
    return copy.deepcopy(load_preset('yolox_s', data).train_dataloader.dataset)


def test_mix_dataset_with_the_disk_cache_gives_stock_samples(
        sample_data, tmp_path):
    """Two epochs through forked workers (the first writes, the second
    reads), then a new dataset of a later run reading the files in this
    process: every sample and random state is stock's."""
    from mmdet.registry import DATASETS
    from torch.utils.data import DataLoader

    from fast_parallel.pipeline.cache import FastLoadImageFromFile
    cfg = _train_dataset_cfg(sample_data)
    stock = DATASETS.build(copy.deepcopy(cfg))
    fast = DATASETS.build(copy.deepcopy(cfg))
    folder = tmp_path / 'decoded'
    line = str(switch_pipeline(fast, cache_inputs=f'disk:{folder}'))
    assert line.endswith(f'; inputs cached on disk in {folder} (one .npy '
                         'per decoded image); Mosaic decodes only the patches '
                         'RandomAffine reads'), line
    assert type(fast.dataset.pipeline.transforms[0]) is FastLoadImageFromFile

    def epoch(dataset, seed, workers):
        np.random.seed(seed)  # what an in-process epoch draws from
        loader = DataLoader(
            dataset,
            batch_size=1,
            num_workers=workers,
            collate_fn=lambda b: b[0],
            generator=torch.Generator().manual_seed(seed),
            shuffle=True)
        return list(loader)

    epoch(fast, 0, 2)
    images = len(fast.dataset)
    assert len(list(folder.rglob('*.npy'))) == images
    for a, b in zip(epoch(stock, 1, 2), epoch(fast, 1, 2)):
        assert first_difference(a, b) is None
    later = DATASETS.build(copy.deepcopy(cfg))
    switch_pipeline(later, cache_inputs=f'disk:{folder}')
    COUNTS.clear()
    for a, b in zip(epoch(stock, 2, 0), epoch(later, 2, 0)):
        assert first_difference(a, b) is None
    assert COUNTS['cache: hits'] > 0 and 'cache: decoded' not in COUNTS
    assert len(list(folder.rglob('*.npy'))) == images


@pytest.mark.parametrize('value', ['disk:', 'memory', 'disk', 3])
def test_bad_cache_inputs_fail_at_once(value):
    from fast_parallel.hooks import FastParallelHook
    with pytest.raises(
            ValueError, match="cache_inputs must be 'auto', "
            "'disk:DIR' or None"):
        FastParallelHook(cache_inputs=value)


def test_disk_folder_is_stripped_and_expanded():
    from fast_parallel.pipeline.cache_plan import disk_folder
    assert disk_folder('disk: ~/decoded ') == os.path.expanduser('~/decoded')
    assert disk_folder('disk:/data/x') == '/data/x'
    assert disk_folder('auto') is None and disk_folder(None) is None
