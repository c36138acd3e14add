"""The gt-database side of ``ObjectSample``: the sampled objects' points
made as one cloud (drawn files, loader options, errors alike), and the
database files kept in the run's shared-memory cache (hits are stock's
bytes, a changed file is read again, the PointPillars pipeline with the
cache gives stock's samples and draws)."""
import copy
import os

import numpy as np
import pytest
from transform_utils import same_states, set_states, states

pytest.importorskip('mmdet3d')

from fast_parallel.bench.pipeline import first_difference  # noqa: E402
from fast_parallel.bench.presets import load_preset  # noqa: E402
from fast_parallel.pipeline import COUNTS, switch_pipeline  # noqa: E402


def _samplers(sample_data, **loader):
    from mmdet3d.registry import TRANSFORMS
    from mmdet3d.utils import register_all_modules

    from fast_parallel.pipeline.db_sampler import fast_sampler_class
    register_all_modules(init_default_scope=True)  # whatever ran before
    cfg = load_preset('pointpillars', sample_data).train_dataloader.dataset
    step = next(t for t in cfg.dataset.pipeline if t['type'] == 'ObjectSample')
    sampler_cfg = copy.deepcopy(step['db_sampler'])
    assert sampler_cfg['type'] == 'DataBaseSamplerNp124'
    sampler_cfg['points_loader'].update(loader)
    np.random.seed(0)
    stock = TRANSFORMS.build(copy.deepcopy(sampler_cfg))
    fast = copy.deepcopy(stock)
    fast.__class__ = fast_sampler_class(fast)
    return stock, fast


def _database(rng, tmp_path, n, load_dim, box_dtype,
              counts=(0, 1, 2, 57, 800)):
    infos = []
    for k in range(n):
        count = int(rng.choice(counts))
        cloud = rng.uniform(-2, 2, (count, load_dim)).astype(np.float32)
        path = tmp_path / f'obj{k}.bin'
        cloud.tofile(path)
        box = np.concatenate([
            rng.uniform(-40, 40, 3),
            rng.uniform(0.5, 4, 3),
            rng.uniform(-3, 3, 1)
        ]).astype(box_dtype)
        infos.append(
            dict(
                path=path.name,
                box3d_lidar=box,
                name='Car',
                num_points_in_gt=count))
    return infos


@pytest.mark.parametrize('case', range(24))
def test_sampled_points_as_one_cloud_are_stocks(sample_data, tmp_path, case):
    """``sampled_points`` then ``lowered_cloud`` (what ``sample_all``
    makes of them) against upstream's steps: drawn point counts (0 and 1
    included, every object empty in some cases), box centres in float32
    and float64, load widths and kept columns, with and without a ground
    plane's heights."""
    rng = np.random.default_rng(case)
    load_dim = [4, 5, 6][case % 3]
    use_dim = [list(range(load_dim)), [0, 1, 2], [3, 0, 1, 2]][case // 3 % 3]
    stock, fast = _samplers(sample_data, load_dim=load_dim, use_dim=use_dim)
    for sampler in (stock, fast):
        sampler.data_root = str(tmp_path)
    infos = _database(rng, tmp_path, int(rng.integers(1, 9)), load_dim,
                      [np.float32, np.float64][case % 2],
                      (0, ) if case % 6 == 5 else (0, 1, 2, 57, 800))
    dz = None if case % 4 == 0 else rng.uniform(-2, 2, len(infos))
    parts = [s.sampled_points(infos) for s in (stock, fast)]
    assert type(parts[1]).__name__ == 'SampledCloud'  # one cloud
    a, b = (s.lowered_cloud(p, dz) for s, p in zip((stock, fast), parts))
    assert first_difference(a, b) is None
    assert a.tensor.shape == (sum(i['num_points_in_gt']
                                  for i in infos), len(use_dim))


@pytest.mark.parametrize('loader', [
    dict(norm_intensity=True),
    dict(shift_height=True),
    dict(coord_type='DEPTH'),
])
def test_other_loaders_and_errors_are_upstreams(sample_data, tmp_path, loader):
    rng = np.random.default_rng(0)
    stock, fast = _samplers(sample_data, **loader)
    for sampler in (stock, fast):
        sampler.data_root = str(tmp_path)
    # (a height shift of no point is numpy's error, on either path)
    infos = _database(rng, tmp_path, 4, 4, np.float32, counts=(1, 57))
    parts = [s.sampled_points(infos) for s in (stock, fast)]
    assert type(parts[1]) is list and len(parts[1]) == len(infos)
    dz = rng.uniform(-2, 2, len(infos))
    assert first_difference(
        stock.lowered_cloud(parts[0], dz), fast.lowered_cloud(parts[1],
                                                              dz)) is None


def test_broken_database_files_raise_stocks_errors(sample_data, tmp_path):
    rng = np.random.default_rng(3)
    stock, fast = _samplers(sample_data)
    for sampler in (stock, fast):
        sampler.data_root = str(tmp_path)
    infos = _database(rng, tmp_path, 3, 4, np.float32)
    broken = [
        lambda: (tmp_path / infos[1]['path']).write_bytes(b'\0' * 12),
        lambda: (tmp_path / infos[1]['path']).write_bytes(b'\0' * 7),
        lambda: os.remove(tmp_path / infos[2]['path']),
    ]
    for breaking in broken:
        breaking()
        errors = []
        for sampler in (stock, fast):
            with pytest.raises(Exception) as error:
                sampler.sampled_points(infos)
            errors.append((type(error.value), str(error.value)))
        assert errors[0] == errors[1]
        infos = _database(rng, tmp_path, 3, 4, np.float32)
    # a centre of another size: upstream's assertion
    infos[0]['box3d_lidar'] = infos[0]['box3d_lidar'][:2]
    for sampler in (stock, fast):
        with pytest.raises(AssertionError):
            sampler.sampled_points(infos)


def test_database_cache_hits_are_the_files_bytes(sample_data, tmp_path):
    from mmdet3d.datasets.transforms import LoadPointsFromFile

    from fast_parallel.pipeline.cache import DecodedCache
    from fast_parallel.pipeline.points_cache import FastLoadPointsFromFile
    rng = np.random.default_rng(1)
    infos = _database(rng, tmp_path, 5, 4, np.float32)
    paths = [str(tmp_path / i['path']) for i in infos]
    stock = LoadPointsFromFile(coord_type='LIDAR', load_dim=4, use_dim=4)
    fast = copy.deepcopy(stock)
    fast.__class__ = FastLoadPointsFromFile
    fast._fp_cache = DecodedCache(paths,
                                  sum(os.path.getsize(p) for p in paths))
    COUNTS.clear()
    for _ in range(2):  # read, then kept
        for path in paths:
            got = [
                t(dict(lidar_points=dict(lidar_path=path)))['points']
                for t in (stock, fast)
            ]
            assert first_difference(got[0], got[1]) is None
            got[1].tensor += 1  # a transform writes what it got
    assert COUNTS == {
        'cache: gt-database files read': 5,
        'cache: gt-database hits': 5
    }
    read = fast.read_points(paths[3])
    assert type(read.base) is bytes and not read.flags.writeable
    # a file changed since: read again, its new bytes
    cloud = np.ones((3, 4), np.float32)
    cloud.tofile(paths[3])
    os.utime(paths[3], ns=(1, 1))
    assert np.array_equal(fast.read_points(paths[3]), cloud.reshape(-1))
    assert COUNTS['cache: file changed since it was cached'] == 1


def test_pipeline_with_the_database_cache_is_stocks(sample_data):
    """PointPillars' train pipeline: the start line names the cached files,
    every sample and random state after it is stock's, read or hit."""
    from mmengine.registry import DATASETS, init_default_scope

    from fast_parallel.pipeline.points_cache import FastLoadPointsFromFile
    cfg = load_preset('pointpillars', sample_data)
    init_default_scope('mmdet3d')
    built = []
    for _ in range(2):
        np.random.seed(0)
        built.append(
            DATASETS.build(copy.deepcopy(cfg.train_dataloader.dataset)))
    stock, fast = built
    line = str(switch_pipeline(fast, cache_inputs='auto', forked=True))
    assert 'inputs cached in shared memory (up to 0.0 GB; ' in line and \
        line.endswith(': gt-database files'), line
    step = next(
        t for t in fast.dataset.pipeline.transforms
        if type(t).__name__ == 'FastObjectSample')
    loader = step.db_sampler.points_loader
    assert type(loader) is FastLoadPointsFromFile
    infos = [
        i for name in step.db_sampler.sample_classes
        for i in step.db_sampler.group_db_infos[name]
    ]
    assert loader._fp_cache.capacity == sum(i['num_points_in_gt'] * 4 * 4
                                            for i in infos)
    COUNTS.clear()
    start = states()
    for i in range(3 * len(stock)):
        set_states(start)
        expected = stock[i % len(stock)]
        after = states()
        set_states(start)
        assert first_difference(expected, fast[i % len(fast)]) is None, i
        assert same_states(after, states())
        start = after
    assert COUNTS['cache: gt-database hits'] > 0
    assert 0 < loader._fp_cache.used <= loader._fp_cache.capacity
