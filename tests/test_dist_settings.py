"""Distributed runs get stock's wrapper settings, on the fast path too.

``fast_parallel.enable`` adds no ``model_wrapper_cfg``: the Runner builds the
wrapper it builds for stock and ``FastParallelHook`` switches its class in
place. On a machine without CUDA, ``fast_parallel.cli`` gives both paths
``device_ids=None`` and nothing else.
"""
import glob
import json
import os
import sys
import uuid

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config
from models import CONFIGS
from runner_utils import data_options
from test_distributed import free_port
from test_tools import run_tool

import fast_parallel
from fast_parallel.cli import (apply_common_args, build_runner,
                               cpu_model_wrapper_cfg)

CONFIG = CONFIGS['yolox']

#: YOLOX-tiny on the backbone's stages 2 and 3 only: stage 4 (with its SPP)
#: still runs but leaves the loss, so its parameters get no gradient, and
#: DDP needs ``find_unused_parameters=True``.
UNUSED_STAGE = [
    'model.backbone.out_indices=(2,3)', 'model.neck.in_channels=[96,192]',
    'model.bbox_head.strides=[8,16]'
]

cpu_only = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason='the CPU launcher path (gloo, device_ids=None) is under test')


def test_enable_adds_no_wrapper_and_disable_keeps_its_settings():
    cfg = fast_parallel.disable(Config.fromfile(CONFIG))
    cfg.launcher = 'pytorch'
    fast_parallel.enable(cfg)
    assert cfg.get('model_wrapper_cfg', None) is None
    # a config that names the fast wrapper: the stock run gets its parent,
    # with the same settings
    cfg.model_wrapper_cfg = dict(
        type='FastDistributedDataParallel',
        find_unused_parameters=True,
        bucket_cap_mb=5)
    fast_parallel.disable(cfg)
    assert cfg.model_wrapper_cfg == dict(
        type='MMDistributedDataParallel',
        find_unused_parameters=True,
        bucket_cap_mb=5)
    fast_parallel.enable(cfg)  # a user's wrapper config stays as it is
    assert cfg.model_wrapper_cfg.type == 'MMDistributedDataParallel'
    cfg.model_wrapper_cfg = dict(type='FastDataParallel')
    assert fast_parallel.disable(cfg).model_wrapper_cfg is None


def test_cpu_model_wrapper_cfg_is_stocks_with_device_ids_none():
    cfg = Config(dict(find_unused_parameters=True))
    assert cpu_model_wrapper_cfg(cfg) == dict(
        type='MMDistributedDataParallel',
        device_ids=None,
        broadcast_buffers=False,
        find_unused_parameters=True)
    assert cpu_model_wrapper_cfg(Config())['find_unused_parameters'] is False
    own = dict(detect_anomalous_params=True, device_ids=[0])
    cfg = Config(dict(model_wrapper_cfg=own, find_unused_parameters=True))
    assert cpu_model_wrapper_cfg(cfg) == dict(
        detect_anomalous_params=True, device_ids=None)
    named = dict(type='FastDistributedDataParallel', static_graph=True)
    assert cpu_model_wrapper_cfg(Config(dict(model_wrapper_cfg=named))) == \
        dict(named, device_ids=None)
    other = dict(type='MMFullyShardedDataParallel')
    assert cpu_model_wrapper_cfg(Config(dict(model_wrapper_cfg=other))) == \
        other


def _runner_wrapper(sample_data, tmp_path, fast: bool, **overrides):
    """The wrapper of a one-rank gloo run after FastParallelHook.before_run.
    """
    cfg = Config.fromfile(CONFIG)
    cfg.merge_from_dict(
        dict(
            option.split('=', 1)
            for option in data_options('yolox', sample_data)))
    cfg.merge_from_dict(overrides)
    cfg.experiment_name = f'settings_{uuid.uuid4().hex}'
    apply_common_args(cfg, CONFIG, str(tmp_path / cfg.experiment_name),
                      'pytorch', fast)
    runner = build_runner(cfg)
    for hook in runner.hooks:
        if type(hook).__name__ == 'FastParallelHook':
            hook.before_run(runner)
    return runner.model


@cpu_only
@pytest.mark.parametrize(
    'wrapper_cfg', [
        None,
        dict(
            broadcast_buffers=False,
            find_unused_parameters=True,
            bucket_cap_mb=5),
        dict(type='FastDistributedDataParallel', bucket_cap_mb=5),
    ],
    ids=['runner_default', 'own_cfg', 'named_fast_wrapper'])
def test_fast_ddp_keeps_every_setting_of_stock(sample_data, tmp_path,
                                               monkeypatch, wrapper_cfg):
    from mmengine.model import MMDistributedDataParallel

    from fast_parallel import FastDistributedDataParallel
    for key, value in dict(
            RANK='0',
            LOCAL_RANK='0',
            WORLD_SIZE='1',
            MASTER_ADDR='127.0.0.1',
            MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    for key in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'):  # the Runner sets them
        monkeypatch.setenv(key, os.environ.get(key, '1'))
    overrides = dict(find_unused_parameters=True)
    if wrapper_cfg is not None:
        overrides['model_wrapper_cfg'] = wrapper_cfg
    try:
        stock = _runner_wrapper(sample_data, tmp_path, False, **overrides)
        fast = _runner_wrapper(sample_data, tmp_path, True, **overrides)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert type(stock) is MMDistributedDataParallel
    assert type(fast) is FastDistributedDataParallel
    settings = ('broadcast_buffers', 'find_unused_parameters',
                'bucket_bytes_cap', 'device_ids', 'static_graph',
                'gradient_as_bucket_view', 'detect_anomalous_params')
    assert {k: getattr(fast, k) for k in settings} == \
        {k: getattr(stock, k) for k in settings}
    if wrapper_cfg is None:  # mmengine's own wrapper: its settings, stated
        assert fast.broadcast_buffers is False
        assert fast.find_unused_parameters is True
    elif 'type' not in wrapper_cfg:
        assert fast.broadcast_buffers is False
        assert fast.find_unused_parameters is True
        assert fast.bucket_bytes_cap == 5 * 1024 * 1024
    else:  # a config-named wrapper: DDP's defaults, as stock gives one
        assert fast.broadcast_buffers is True
        assert fast.find_unused_parameters is False


def _losses(work_dir) -> list:
    scalars, = glob.glob(str(work_dir / '*' / 'vis_data' / 'scalars.json'))
    with open(scalars) as f:
        lines = [json.loads(line) for line in f]
    return [{
        k: v
        for k, v in line.items() if k.startswith('loss')
    } for line in lines if 'loss' in line]


@cpu_only
def test_dist_train_unused_stage_stock_and_fast_equal(sample_data, tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS='1')
    losses = {}
    for flag in ('--no-fast', '--fast'):
        work = tmp_path / flag.strip('-')
        env['PORT'] = str(free_port())
        run_tool([
            'bash', 'tools/dist_train.sh', CONFIG, '2', flag, '--work-dir',
            str(work), '--cfg-options', *data_options('yolox', sample_data),
            'randomness.seed=0', 'find_unused_parameters=True', *UNUSED_STAGE,
            'train_cfg.max_epochs=1', 'train_cfg.val_interval=2',
            'default_hooks.checkpoint.interval=2'
        ],
                 env=env)
        losses[flag] = _losses(work)
    # 8 images, 2 per process and iteration, 2 processes: 2 iterations
    assert len(losses['--fast']) == 2
    assert all(line['loss'] > 0 for line in losses['--fast'])
    assert losses['--fast'] == losses['--no-fast']
