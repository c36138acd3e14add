"""The fast path trains on stock's batches, for every registered sampler.

Every sampler and batch sampler that mmengine, mmdet and mmdet3d register
in ``DATA_SAMPLERS`` runs under mmengine's real Runner, on real mmdet
datasets (COCO and COCO-VID annotation files of mixed orientation, more
batches per epoch than two workers prefetch), once on the stock path and
once with ``FastParallelHook``, in iteration and epoch loops, with 0 and 2
(persistent) workers. The sequence of batches the model's ``train_step``
received (sample ids and every tensor) must be stock's.

The model is a single parameter: the batches are what is under test, and
the Runner, loops, samplers, datasets, pipelines and the data_preprocessor
are the real ones.
"""
from typing import Dict

import pytest
from mmengine.registry import DATA_SAMPLERS as MMENGINE_SAMPLERS
from order_utils import (CASES, NUM_IMAGES, STOCK_WITH_WORKERS, BatchRecorder,
                         assert_same_batches, train, write_ann_files)


@pytest.fixture(scope='module')
def ann_files(tmp_path_factory) -> Dict[str, str]:
    """The annotation files, written once for this module."""
    return write_ann_files(tmp_path_factory.mktemp('sampler_order'))


def registered_samplers() -> set:
    """Every class name in the three DATA_SAMPLERS registries."""
    from mmdet3d.registry import DATA_SAMPLERS as MMDET3D_SAMPLERS
    from mmdet3d.utils import register_all_modules as mmdet3d_modules
    from mmdet.registry import DATA_SAMPLERS as MMDET_SAMPLERS
    from mmdet.utils import register_all_modules as mmdet_modules
    mmdet_modules(init_default_scope=False)
    mmdet3d_modules(init_default_scope=False)
    names = set()
    for registry in (MMENGINE_SAMPLERS, MMDET_SAMPLERS, MMDET3D_SAMPLERS):
        registry.import_from_location()
        names.update(registry.module_dict)
    return names


def test_every_registered_sampler_has_a_case():
    missing = registered_samplers() - set(CASES)
    assert not missing, f'samplers without an order test: {missing}'


_stock_cache: Dict[tuple, BatchRecorder] = {}


def stock_run(files, tmp_path, case: str, loop: str,
              workers: int) -> BatchRecorder:
    """The stock run to compare with (random augmentations draw from the
    main process without workers, from seeded workers with them)."""
    key = case, loop, workers
    if key not in _stock_cache:
        _stock_cache[key] = train(
            files, tmp_path / 'stock', case, loop, workers, fast=False)
    return _stock_cache[key]


PARAMS = [(case, loop, workers) for case, spec in CASES.items()
          for loop in spec.get('loops', ('iter', 'epoch'))
          for workers in (0, 2)]


@pytest.mark.parametrize('case,loop,workers', PARAMS)
def test_fast_trains_on_stock_batches(ann_files, tmp_path, case, loop,
                                      workers):
    stock = stock_run(ann_files, tmp_path, case, loop, workers)
    assert stock.packed == 0
    fast = train(ann_files, tmp_path / 'fast', case, loop, workers, True)
    assert_same_batches(stock, fast)
    if workers and case in STOCK_WITH_WORKERS:
        assert fast.packed == 0  # left on the stock path, as warned
    else:
        assert fast.packed == len(fast.batches) > 0


@pytest.mark.parametrize('case',
                         ['AspectRatioBatchSampler', 'MultiSourceSampler'])
def test_non_persistent_workers(ann_files, tmp_path, case):
    stock = stock_run(ann_files, tmp_path, case, 'iter', 2)
    fast = train(
        ann_files, tmp_path / 'fast', case, 'iter', 2, True, persistent=False)
    assert_same_batches(stock, fast)
    assert fast.packed == len(fast.batches)


@pytest.mark.parametrize('case',
                         ['AspectRatioBatchSampler', 'InfiniteSampler'])
def test_iteration_loop_past_one_pass(ann_files, tmp_path, case):
    """Past the end of the data: mmengine restarts a finite (rebuilt)
    loader; an InfiniteSampler goes on drawing."""
    iters = NUM_IMAGES // 2 + 3
    stock = train(
        ann_files, tmp_path / 'stock', case, 'iter', 2, False, iters=iters)
    fast = train(
        ann_files, tmp_path / 'fast', case, 'iter', 2, True, iters=iters)
    assert len(fast.batches) == iters
    assert_same_batches(stock, fast)


def test_left_on_stock_path_says_which(ann_files, tmp_path):
    train(ann_files, tmp_path, 'GroupMultiSourceSampler', 'iter', 2, True)
    text = ''.join(p.read_text() for p in tmp_path.glob('*/*.log'))
    assert 'the train DataLoader (GroupMultiSourceSampler + BatchSampler) ' \
        'stays on the stock data path' in text
    assert 'NumPy' in text
