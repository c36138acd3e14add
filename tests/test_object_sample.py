"""mmdet3d's ``ObjectSample`` in its fast form gives stock's points, boxes
and draws: its removal step on drawn clouds (tensor level), then the
PointPillars and CenterPoint train pipelines on real files, then the
switch (the 3D form loads only where a 3D transform is met)."""
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmdet3d.datasets.transforms import ObjectSample
from mmdet3d.structures.points import LiDARPoints
from models import ROOT
from transform_utils import assert_same_run

from fast_parallel.bench.pipeline import compare_pipelines
from fast_parallel.bench.presets import load_preset
from fast_parallel.pipeline import COUNTS, switch_pipeline
from fast_parallel.pipeline.object_sample import FastObjectSample

CASES = 60


def _cloud(rng, n, dims):
    """Points around the origin, some on a few box surfaces exactly."""
    xyz = rng.uniform(-60, 60, (n, 3))
    xyz[:, 2] = rng.uniform(-3, 2, n)
    rest = rng.uniform(0, 1, (n, dims - 3))
    return np.concatenate([xyz, rest], 1).astype(np.float32)


def _boxes(rng, m):
    centre = rng.uniform(-50, 50, (m, 3))
    centre[:, 2] = rng.uniform(-2, 0, m)
    size = rng.choice([0.0, 0.3, 1.6, 4.0, 12.0], (m, 3))
    yaw = rng.uniform(-np.pi, np.pi, (m, 1))
    return np.concatenate([centre, size, yaw],
                          1).astype(rng.choice([np.float32, np.float64]))


def _same_points(a, b):
    return (type(a) is type(b) and a.points_dim == b.points_dim
            and a.attribute_dims == b.attribute_dims
            and a.tensor.dtype == b.tensor.dtype and torch.equal(
                a.tensor.view(torch.int32), b.tensor.view(torch.int32)))


@pytest.mark.parametrize('case', range(CASES))
def test_removal_is_stocks_on_drawn_clouds(case):
    rng = np.random.default_rng(case)
    dims = int(rng.choice([3, 4, 5]))
    cloud = _cloud(rng, int(rng.choice([0, 1, 50, 4000])), dims)
    boxes = _boxes(rng, int(rng.integers(1, 30)))
    if len(cloud) and case % 4 == 0:  # points on the boxes' own corners
        corners = boxes[:, :3].astype(np.float32)
        cloud[:len(corners), :3] = corners[:len(cloud)]
    if len(cloud) > 3 and case % 5 == 0:
        cloud[:3, :3] = [[np.nan, 0, 0], [np.inf, 1, 1], [0, -np.inf, 0]]
    attributes = dict(intensity=3) if dims > 3 else None
    stock_in = LiDARPoints(cloud.copy(), dims, attributes)
    fast_in = LiDARPoints(cloud.copy(), dims, attributes)
    stock = ObjectSample.remove_points_in_boxes(stock_in, boxes)
    fast = FastObjectSample.remove_points_in_boxes(fast_in, boxes)
    assert _same_points(stock, fast), case
    assert torch.equal(
        stock_in.tensor.view(torch.int32),
        fast_in.tensor.view(torch.int32))  # inputs untouched


def test_boxes_with_non_finite_faces_go_stocks_way_counted():
    rng = np.random.default_rng(7)
    cloud = _cloud(rng, 500, 4)
    boxes = _boxes(rng, 6)
    boxes[2, 6] = np.nan  # its faces are NaN
    COUNTS.clear()
    stock = ObjectSample.remove_points_in_boxes(
        LiDARPoints(cloud.copy(), 4), boxes)
    fast = FastObjectSample.remove_points_in_boxes(
        LiDARPoints(cloud.copy(), 4), boxes)
    assert _same_points(stock, fast)
    assert COUNTS == {
        'stock: ObjectSample: a sampled box with non-finite faces': 1
    }


@pytest.mark.parametrize('preset', ['pointpillars', 'centerpoint_pillar'])
def test_3d_pipelines_give_stock_samples_and_draws(sample_data, preset):
    """Every output of the recipe's train pipeline (points, boxes, labels,
    metainfo) and the random states after each sample are stock's."""
    report = compare_pipelines(
        load_preset(preset, sample_data), samples=12, rounds=3)
    assert report['first_difference'] is None, report['first_difference']
    assert report['equal'] == 12
    assert report['switch'].startswith({
        'pointpillars':
        'pipeline: KittiDataset, ObjectSample, GlobalRotScaleTrans, '
        'PointsRangeFilter, ObjectRangeFilter, PointShuffle fast',
        'centerpoint_pillar':
        'pipeline: NuScenesDataset, LoadPointsFromMultiSweeps, ObjectSample, '
        'GlobalRotScaleTrans, PointsRangeFilter, ObjectRangeFilter, '
        'PointShuffle fast'
    }[preset]), report['switch']
    assert not any(k.startswith('stock: ') for k in report['counts'])


def test_a_users_object_sample_subclass_stays_stock(sample_data):
    from mmengine.registry import DATASETS, init_default_scope
    cfg = load_preset('pointpillars', sample_data)
    init_default_scope('mmdet3d')
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    transforms = dataset.dataset.pipeline.transforms
    assert type(transforms[2]) is ObjectSample

    class MyObjectSample(ObjectSample):
        pass

    transforms[2].__class__ = MyObjectSample
    line = str(switch_pipeline(dataset))
    assert type(transforms[2]) is MyObjectSample
    assert line.startswith(
        'pipeline: KittiDataset, GlobalRotScaleTrans, '
        'PointsRangeFilter, ObjectRangeFilter, PointShuffle fast;')
    transforms[2].__class__ = ObjectSample
    assert str(switch_pipeline(dataset)).startswith(
        'pipeline: KittiDataset, ObjectSample, GlobalRotScaleTrans, '
        'PointsRangeFilter, ObjectRangeFilter, PointShuffle fast')
    assert type(transforms[2]) is FastObjectSample
    assert str(switch_pipeline(dataset)).startswith(
        'pipeline: KittiDataset, ObjectSample, GlobalRotScaleTrans, '
        'PointsRangeFilter, ObjectRangeFilter, PointShuffle fast'
    )  # twice: one swap


def test_a_2d_switch_does_not_import_mmdet3d(sample_data):
    code = f'''
import sys
from mmengine.registry import DATASETS, init_default_scope
from fast_parallel.bench.presets import load_preset
from fast_parallel.pipeline import switch_pipeline
import mmdet.datasets
init_default_scope('mmdet')
cfg = load_preset('yolox_tiny_sample', {str(sample_data)!r})
dataset = DATASETS.build(cfg.train_dataloader.dataset)
print(switch_pipeline(dataset))
print(sorted(m for m in sys.modules if m.split('.')[0] == 'mmdet3d'
             or m == 'fast_parallel.pipeline.object_sample'))
'''
    done = subprocess.run([sys.executable, '-c', code],
                          cwd=ROOT,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-2].startswith('pipeline: MultiImageMixDataset, Mosaic')
    assert lines[-1] == '[]'


# -- the gt-database sampler ----------------------------------------------


@pytest.mark.parametrize('case', range(40))
def test_corners_are_stocks(case):
    from mmdet3d.structures.ops import box_np_ops

    from fast_parallel.pipeline.db_sampler import corner_box2d, corner_box3d
    rng = np.random.default_rng(case)
    n = int(rng.choice([0, 1, 7, 64]))
    dtype = rng.choice([np.float32, np.float64])
    boxes = np.concatenate([
        rng.uniform(-80, 80, (n, 3)),
        rng.choice([0.0, 0.5, 4.2, 1e4], (n, 3)),
        rng.uniform(-7, 7, (n, 1))
    ], 1).astype(dtype)
    if n and case % 6 == 0:
        boxes[0, 6] = np.nan
    stock = box_np_ops.center_to_corner_box2d(boxes[:, 0:2], boxes[:, 3:5],
                                              boxes[:, 6])
    fast = corner_box2d(boxes[:, 0:2], boxes[:, 3:5], boxes[:, 6])
    assert stock.dtype == fast.dtype and stock.shape == fast.shape
    assert stock.tobytes() == fast.tobytes()
    # points_in_rbbox's 3D corners (the removal's box faces)
    stock = box_np_ops.center_to_corner_box3d(
        boxes[:, :3], boxes[:, 3:6], boxes[:, 6], origin=(0.5, 0.5, 0), axis=2)
    fast = corner_box3d(boxes)
    assert stock.dtype == fast.dtype and stock.shape == fast.shape
    assert stock.tobytes() == fast.tobytes()


def _samplers(sample_data, preset):
    import copy

    from mmdet3d.registry import TRANSFORMS
    from mmdet3d.utils import register_all_modules

    from fast_parallel.pipeline.db_sampler import fast_sampler_class
    register_all_modules(init_default_scope=False)
    cfg = load_preset(preset, sample_data).train_dataloader.dataset
    while 'pipeline' not in cfg:
        cfg = cfg.dataset
    step = next(t for t in cfg.pipeline if t['type'] == 'ObjectSample')
    np.random.seed(0)
    stock = TRANSFORMS.build(copy.deepcopy(step['db_sampler']))
    fast = copy.deepcopy(stock)
    fast.__class__ = fast_sampler_class(fast)
    return stock, fast


def _state_of(sampler):
    return {
        name: (list(s._indices), s._idx, [id(x) for x in s._sampled_list])
        for name, s in sampler.sampler_dict.items()
    }


@pytest.mark.parametrize('preset', ['pointpillars', 'centerpoint_pillar'])
def test_sampler_picks_stocks_objects_with_stocks_draws(sample_data, preset):
    """sample_class_v2 on crowded scenes (many collisions, boxes sharing
    edges, empty scenes): the same infos in the same order, the same
    sampler states and random states after."""
    stock, fast = _samplers(sample_data, preset)
    assert type(fast).__name__.startswith('Fast')
    rng = np.random.default_rng(1)
    names = list(stock.sampler_dict)
    width = next(iter(stock.db_infos.values()))[0]['box3d_lidar'].shape[0]
    for case in range(60):
        n = int(rng.choice([0, 1, 5, 40]))
        spread = float(rng.choice([2.0, 10.0, 40.0]))
        gt = np.concatenate([
            rng.uniform(-spread, spread, (n, 2)),
            rng.uniform(-2, 0, (n, 1)),
            rng.choice([0.0, 0.6, 1.8, 4.5], (n, 3)),
            rng.uniform(-np.pi, np.pi, (n, 1)),
            rng.uniform(-1, 1, (n, width - 7))
        ], 1).astype(np.float32)
        if n > 1 and case % 3 == 0:
            gt[1] = gt[0]  # two scene boxes on top of each other
        name = names[case % len(names)]
        num = int(rng.integers(1, 12))
        start = np.random.get_state()
        picks = []
        for sampler in (stock, fast):
            np.random.set_state(start)
            out = sampler.sample_class_v2(name, num, gt.copy())
            picks.append(([(s['path'], s['box3d_lidar'].tobytes())
                           for s in out], np.random.get_state()[1].copy()))
        assert picks[0][0] == picks[1][0], case
        assert np.array_equal(picks[0][1], picks[1][1])
        s_state, f_state = _state_of(stock), _state_of(fast)
        assert {k: v[:2] for k, v in s_state.items()} == \
            {k: v[:2] for k, v in f_state.items()}
    # boxes of another width than the database's: stock's error
    errors = []
    for sampler in (stock, fast):
        with pytest.raises(ValueError) as error:
            sampler.sample_class_v2(names[0], 3, np.zeros((2, width + 1)))
        errors.append(str(error.value))
    assert errors[0] == errors[1]
    # the database's infos are read, never written
    for sampler in (stock, fast):
        for infos in sampler.db_infos.values():
            assert all(np.isfinite(i['box3d_lidar']).all() for i in infos)


def test_sample_all_leaves_the_database_as_it_was(sample_data):
    import copy
    stock, fast = _samplers(sample_data, 'pointpillars')
    before = copy.deepcopy(fast.db_infos)
    gt = np.zeros((0, 7), np.float32)
    plane = np.array([0.0, 0.0, 1.0, 1.7])
    for _ in range(20):
        out = fast.sample_all(gt, np.zeros(0, np.int64), ground_plane=plane)
        out['gt_bboxes_3d'] += 1  # a user's transform writes what it got
        out['points'].tensor += 1
    for name, infos in fast.db_infos.items():
        for a, b in zip(infos, before[name]):
            assert a.keys() == b.keys()
            assert a['box3d_lidar'].tobytes() == b['box3d_lidar'].tobytes()


# -- LoadPointsFromMultiSweeps ----------------------------------------------


def _sweeps_results(rng, tmp_path, n_sweeps, load_dim):
    sweeps = []
    for k in range(n_sweeps):
        cloud = rng.uniform(
            -3, 3, (int(rng.choice([0, 1, 300])), load_dim)).astype(np.float32)
        path = tmp_path / f'sweep{k}.bin'
        cloud.tofile(path)
        pose = np.eye(4)
        pose[:3, :3] = rng.normal(size=(3, 3))
        pose[:3, 3] = rng.normal(size=3)
        sweeps.append(
            dict(
                timestamp=float(rng.uniform(0, 1)),
                lidar_points=dict(
                    lidar_path=str(path), lidar2sensor=pose.tolist())))
    points = rng.uniform(
        -3, 3, (int(rng.choice([0, 5, 400])), load_dim)).astype(np.float32)
    return dict(
        points=LiDARPoints(points, load_dim, dict(intensity=3)),
        timestamp=1.5,
        lidar_sweeps=sweeps)


@pytest.mark.parametrize('case', range(30))
def test_sweeps_are_stocks(case, tmp_path):

    from mmdet3d.datasets.transforms import LoadPointsFromMultiSweeps

    from fast_parallel.pipeline.sweeps import FastLoadPointsFromMultiSweeps
    rng = np.random.default_rng(case)
    load_dim = int(rng.choice([5, 6]))
    use_dim = [[0, 1, 2, 4], [0, 1, 2, 3, 4], [4, 3, 0], 5][case % 4]
    if isinstance(use_dim, int):
        use_dim = min(use_dim, load_dim)
    kwargs = dict(
        sweeps_num=int(rng.choice([1, 3, 10])),
        load_dim=load_dim,
        use_dim=use_dim,
        remove_close=bool(case % 3 == 0),
        test_mode=bool(case % 5 == 0))
    results = _sweeps_results(rng, tmp_path, int(rng.choice([0, 2, 6])),
                              load_dim)
    stock = LoadPointsFromMultiSweeps(**kwargs)
    fast = LoadPointsFromMultiSweeps(**kwargs)
    fast.__class__ = FastLoadPointsFromMultiSweeps
    assert_same_run(stock, fast, results)


def test_sweeps_without_a_covered_input_go_stocks_way(tmp_path):
    import copy

    from mmdet3d.datasets.transforms import LoadPointsFromMultiSweeps

    from fast_parallel.pipeline.sweeps import FastLoadPointsFromMultiSweeps
    rng = np.random.default_rng(3)
    results = _sweeps_results(rng, tmp_path, 3, 5)
    del results['lidar_sweeps']
    stock = LoadPointsFromMultiSweeps(sweeps_num=2, pad_empty_sweeps=True)
    fast = LoadPointsFromMultiSweeps(sweeps_num=2, pad_empty_sweeps=True)
    fast.__class__ = FastLoadPointsFromMultiSweeps
    COUNTS.clear()
    assert _same_points(
        stock(copy.deepcopy(results))['points'],
        fast(copy.deepcopy(results))['points'])
    assert COUNTS == {'stock: LoadPointsFromMultiSweeps: no lidar_sweeps': 1}
    # sweeps of another width than the cloud: stock's error
    wide = _sweeps_results(rng, tmp_path, 3, 5)
    wide['points'] = LiDARPoints(np.ones((9, 6), np.float32), 6)
    errors = []
    for transform in (stock, fast):
        with pytest.raises(AssertionError) as error:
            transform(copy.deepcopy(wide))
        errors.append(str(error.value))
    assert errors[0] == errors[1] and 'dimension' in errors[0]


# -- ObjectSample.transform's own paths -----------------------------------


def _object_samples(sample_data, **kwargs):
    import copy

    from mmdet3d.registry import TRANSFORMS
    from mmdet3d.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    cfg = load_preset('pointpillars', sample_data).train_dataloader.dataset
    step = copy.deepcopy(
        next(t for t in cfg.dataset.pipeline if t['type'] == 'ObjectSample'))
    step.update(kwargs)
    np.random.seed(0)
    stock = TRANSFORMS.build(copy.deepcopy(step))
    np.random.seed(0)
    fast = TRANSFORMS.build(copy.deepcopy(step))
    fast.__class__ = FastObjectSample
    assert fast.switch_parts() == {}
    return stock, fast


def _scene(rng, points_class=LiDARPoints, dims=4):
    from mmdet3d.structures import LiDARInstance3DBoxes
    boxes = np.array([[10.0, 2.0, -1.6, 3.9, 1.6, 1.5, 0.3]], np.float32)
    return dict(
        points=points_class(
            rng.uniform(-20, 40, (3000, dims)).astype(np.float32), dims),
        gt_bboxes_3d=LiDARInstance3DBoxes(boxes),
        gt_labels_3d=np.zeros(1, np.int64),
        plane=np.array([0.0, 0.0, 1.0, 1.7]))


@pytest.mark.parametrize('options', [
    dict(),
    dict(use_ground_plane=True),
    dict(sample_2d=True),
    dict(use_ground_plane=True, drop_plane=True),
    dict(points_class='DepthPoints'),
    dict(dims=5)
])
def test_object_sample_paths_are_stocks(sample_data, options):
    """Ground plane on and missing, sample_2d, a scene of another points
    class or width than the database's: stock's output or error."""
    from mmdet3d.structures.points import DepthPoints
    options = dict(options)
    drop = options.pop('drop_plane', False)
    points_class = {
        'DepthPoints': DepthPoints
    }.get(options.pop('points_class', None), LiDARPoints)
    dims = options.pop('dims', 4)
    stock, fast = _object_samples(sample_data, **options)
    rng = np.random.default_rng(5)
    COUNTS.clear()
    for _ in range(8):
        results = _scene(rng, points_class, dims)
        if drop:
            del results['plane']
        kind, out = assert_same_run(stock, fast, results)
        if kind == 'ok':
            assert len(out['gt_labels_3d']) > 1  # something was pasted
    # sample_2d goes to stock's transform (mmdet3d 1.4.0's sample_all has
    # no gt_bboxes_2d: stock's TypeError), counted; the rest is fast's
    assert COUNTS == ({
        'stock: ObjectSample: sample_2d': 8
    } if options.get('sample_2d') else {})
