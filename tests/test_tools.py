"""tools/train.py, test.py and dist_train.sh on the small YOLOX config."""
import glob
import json
import os
import subprocess
import sys

import torch
from mmengine.fileio import load
from models import CONFIGS, ROOT
from runner_utils import data_options
from test_distributed import free_port

CONFIG = CONFIGS['yolox']


def options(root):
    return data_options('yolox', root) + ['randomness.seed=0']


def run_tool(args, timeout=600, env=None):
    done = subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def train(work_dir, sample_data, *extra):
    return run_tool([
        sys.executable, 'tools/train.py', CONFIG, '--work-dir',
        str(work_dir), *extra, '--cfg-options', *options(sample_data),
        'train_cfg.val_interval=2'
    ])


def test_train_resume_and_test(sample_data, tmp_path):
    work = tmp_path / 'run'
    out = train(work, sample_data, '--cfg-options', 'train_cfg.max_epochs=1')
    assert 'transfer_time' in out and (work / 'epoch_1.pth').exists()
    # the stopped run continues from its last checkpoint
    out = train(work, sample_data, '--resume', '--cfg-options',
                'train_cfg.max_epochs=2')
    assert 'resumed epoch: 1, iter: 4' in out
    assert 'Epoch(train) [1]' not in out and 'Epoch(train) [2]' in out
    assert (work / 'epoch_2.pth').exists()
    ckpt = torch.load(work / 'epoch_2.pth')  # weights_only=True
    assert ckpt['meta']['epoch'] == 2 and ckpt['meta']['iter'] == 8
    # the checkpoint evaluates with tools/test.py, on the stock path too
    metrics_file = tmp_path / 'metrics.json'
    out = run_tool([
        sys.executable, 'tools/test.py', CONFIG,
        str(work / 'epoch_2.pth'), '--no-fast', '--work-dir',
        str(tmp_path / 'test'), '--json',
        str(metrics_file), '--out',
        str(tmp_path / 'preds.pkl'), '--cfg-options', *options(sample_data)
    ])
    metrics = json.loads(metrics_file.read_text())
    assert 'coco/bbox_mAP' in metrics and 'coco/bbox_mAP' in out
    assert (tmp_path / 'preds.pkl').exists()
    # mmdet's --tta (the config's tta_model / tta_pipeline: DetTTAModel,
    # flip on and off), fast and stock: the same predictions; --show-dir
    # paints them
    preds = {}
    for arm in ('--fast', '--no-fast'):
        preds[arm] = tmp_path / f'tta{arm}.pkl'
        extra = ['--show-dir', 'painted'] if arm == '--fast' else []
        out = run_tool([
            sys.executable, 'tools/test.py', CONFIG,
            str(work / 'epoch_2.pth'), arm, '--tta', '--work-dir',
            str(tmp_path / f'tta{arm}'), '--out',
            str(preds[arm]), *extra, '--cfg-options', *options(sample_data)
        ])
    fast, stock = (load(preds[arm]) for arm in ('--fast', '--no-fast'))
    assert len(fast) == len(stock) == 4
    for a, b in zip(fast, stock):
        assert a['img_id'] == b['img_id']
        for key in ('bboxes', 'scores', 'labels'):
            x, y = a['pred_instances'][key], b['pred_instances'][key]
            assert x.dtype == y.dtype and torch.equal(x, y), key
    painted = glob.glob(str(tmp_path / 'tta--fast' / '*' / 'painted' / '*'))
    assert len(painted) == 4


def test_train_fast_switch_on_a_stock_config(sample_data, tmp_path):
    from mmengine.config import Config

    from fast_parallel import disable
    stock = disable(Config.fromfile(CONFIG))
    stock.custom_imports = dict(imports=[])
    stock_file = tmp_path / 'stock_config.py'
    stock.dump(str(stock_file))
    assert 'FastParallelHook' not in stock_file.read_text()
    work = tmp_path / 'work'
    run_tool([
        sys.executable, 'tools/train.py',
        str(stock_file), '--fast', '--work-dir',
        str(work), '--cfg-options', *options(sample_data),
        'train_cfg.max_epochs=1', 'train_cfg.val_interval=2'
    ])
    log = open(glob.glob(str(work / '*' / '*.log'))[0]).read()
    assert 'FastParallelHook' in log and 'transfer_time' in log


def test_dist_train_two_gloo_processes(sample_data, tmp_path):
    env = dict(
        os.environ,
        PORT=str(free_port()),
        PYTHON=sys.executable,
        OMP_NUM_THREADS='1')
    out = run_tool([
        'bash', 'tools/dist_train.sh', CONFIG, '2', '--work-dir',
        str(tmp_path), '--cfg-options', *options(sample_data),
        'train_cfg.max_epochs=1', 'train_cfg.val_interval=2'
    ],
                   env=env)
    log = open(glob.glob(str(tmp_path / '*' / '*.log'))[0]).read()
    assert 'Distributed launcher: pytorch' in log
    # 8 images, 2 per process and iteration, 2 processes: 2 iterations
    assert 'Epoch(train) [1][2/2]' in log and 'transfer_time' in log
    assert (tmp_path / 'epoch_1.pth').exists(), out[-2000:]


def test_amp_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        import pytest
        pytest.skip('this machine has a GPU: --amp works here')
    done = subprocess.run(
        [sys.executable, 'tools/train.py', CONFIGS['yolox'], '--amp'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300)
    assert done.returncode != 0
    assert '--amp needs a GPU' in done.stderr
    assert 'Traceback' not in done.stderr
