"""mmdet3d's datasets without the second deep copy of each info: stock's
samples and draws, stock's copy where the info is read after the pipeline,
the class found again by a spawned worker, a user's subclass left stock."""
import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest
from transform_utils import same_states, set_states, states

from fast_parallel.bench.presets import load_preset
from fast_parallel.pipeline import switch_pipeline

pytest.importorskip('mmdet3d')


def _build(sample_data, preset='pointpillars', **options):
    from mmengine.registry import DATASETS, init_default_scope
    cfg = load_preset(preset, sample_data)
    init_default_scope('mmdet3d')
    dataset_cfg = copy.deepcopy(cfg.train_dataloader.dataset)
    inner = dataset_cfg.get('dataset', dataset_cfg)
    inner.update(options)
    np.random.seed(0)  # the gt-database sampler shuffles while built
    return DATASETS.build(dataset_cfg)


def _inner(dataset):
    return dataset.dataset if hasattr(dataset, 'dataset') else dataset


@pytest.mark.parametrize('serialize', [True, False])
def test_samples_without_the_copy_are_stocks(sample_data, serialize):
    """The fast class alone (the transforms stay stock): every output and
    random state, from serialized infos (unpickled) and from the list
    (deep-copied by mmengine)."""
    from fast_parallel.bench.pipeline import first_difference
    from fast_parallel.pipeline.datasets3d import FAST_DATASETS
    stock = _build(sample_data, serialize_data=serialize)
    fast = _build(sample_data, serialize_data=serialize)
    inner = _inner(fast)
    inner.__class__ = FAST_DATASETS[type(inner)]
    start = states()
    for i in range(8):
        set_states(start)
        expected = stock[i]
        after = states()
        set_states(start)
        assert first_difference(expected, fast[i]) is None
        assert same_states(after, states())
        start = after
    # infos read outside prepare_data are stock's plain dicts
    assert first_difference(
        _inner(stock).get_data_info(0), inner.get_data_info(0)) is None
    assert type(inner.get_data_info(0)) is dict


def test_show_ins_var_keeps_stocks_copy(sample_data, monkeypatch):
    """With ``show_ins_var`` the info is read after the pipeline: stock's
    deep copy is made (seen by its own deep copy's count)."""
    from fast_parallel.pipeline.datasets3d import _Fresh
    dataset = _build(sample_data, show_ins_var=True)
    switch_pipeline(dataset)
    made = []
    original = _Fresh.__deepcopy__
    monkeypatch.setattr(
        _Fresh, '__deepcopy__',
        lambda self, memo: made.append(1) or original(self, memo))
    monkeypatch.setattr(
        type(_inner(dataset)), '_show_ins_var',
        lambda self, *args: made.append('shown'))
    dataset[0]
    assert made == ['shown']  # no info handed uncopied
    _inner(dataset).show_ins_var = False
    made.clear()
    dataset[0]
    assert made == [1]


def test_a_spawned_worker_finds_the_fast_class(sample_data):
    dataset = _build(sample_data)
    line = str(switch_pipeline(dataset))
    assert line.startswith(
        'pipeline: KittiDataset, ObjectSample, GlobalRotScaleTrans, '
        'PointsRangeFilter, ObjectRangeFilter, PointShuffle fast')
    assert type(_inner(dataset)).__name__ == 'FastKittiDataset'
    code = ('import pickle, sys; d = pickle.load(sys.stdin.buffer); '
            'print(type(d.dataset).__module__, type(d.dataset).__name__)')
    out = subprocess.run([sys.executable, '-c', code],
                         input=pickle.dumps(dataset),
                         capture_output=True,
                         check=True)
    assert out.stdout.decode().split() == [
        'fast_parallel.pipeline.datasets3d', 'FastKittiDataset'
    ]


def test_a_users_dataset_subclass_stays_stock(sample_data):
    from mmdet3d.datasets import KittiDataset

    class MyKitti(KittiDataset):
        pass

    dataset = _build(sample_data)
    _inner(dataset).__class__ = MyKitti
    line = str(switch_pipeline(dataset))
    assert type(_inner(dataset)) is MyKitti
    assert line.startswith(
        'pipeline: ObjectSample, GlobalRotScaleTrans, PointsRangeFilter, '
        'ObjectRangeFilter, PointShuffle fast'), line


def test_an_info_holding_other_objects_is_copied_as_stock(
        sample_data, monkeypatch):
    """An info holding more than plain data gets stock's deep copy."""
    from mmdet3d.datasets.det3d_dataset import Det3DDataset

    from fast_parallel.pipeline.datasets3d import _Fresh
    dataset = _build(sample_data)
    switch_pipeline(dataset)
    stock_info = Det3DDataset.get_data_info
    handed = []

    def with_object(self, idx):
        info = stock_info(self, idx)
        info['extra'] = object()
        return info

    monkeypatch.setattr(Det3DDataset, 'get_data_info', with_object)
    original = _Fresh.__deepcopy__
    monkeypatch.setattr(
        _Fresh, '__deepcopy__',
        lambda self, memo: handed.append(1) or original(self, memo))
    dataset[0]
    assert handed == []  # the info with an object: stock's deep copy
    monkeypatch.setattr(Det3DDataset, 'get_data_info', stock_info)
    dataset[1]  # (an index's plainness is found once: another index)
    assert handed == [1]  # a plain info (with its boxes): handed on
