"""Nothing lost on a crash: SIGKILL mid-training, ``--resume``, same weights.

YOLOX-tiny on the sample COCO set with its full training recipe (Mosaic,
RandomAffine, MixUp, BatchSyncRandomResize every 2 iterations, EMA), an
iteration-based schedule of 8 iterations, checkpoints and validation every
4, deterministic settings, 2 DataLoader workers. One run goes through; the
other is killed with SIGKILL when iteration 6 starts and is continued with
``tools/train.py --resume``. Both must end with the same bytes in every
parameter, buffer, EMA tensor and optimizer state.
"""
import signal
import subprocess
import sys

from models import CONFIGS, ROOT
from runner_utils import (checkpoint_tensors, differing, fault_env,
                          sample_config, with_fault_hook)


def resume_config(sample_data, tmp_path):
    cfg = sample_config(CONFIGS['yolox'], sample_data, tmp_path, fast=True)
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.train_cfg = dict(
        type='IterBasedTrainLoop', max_iters=8, val_interval=4)
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', by_epoch=False, interval=4, max_keep_ckpts=3)
    cfg.log_processor = dict(by_epoch=False, window_size=1)
    cfg.randomness = dict(seed=0, deterministic=True)
    return with_fault_hook(cfg, 'CrashAtIterHook',
                           tmp_path / 'resume_config.py')


def train(config, work_dir, *extra, kill_at=None):
    env = fault_env() if kill_at is None else \
        fault_env(FP_KILL_AT_ITER=str(kill_at))
    return subprocess.run([
        sys.executable, 'tools/train.py',
        str(config), '--work-dir',
        str(work_dir), *extra
    ],
                          cwd=ROOT,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=600)


def final_state(work_dir):
    return checkpoint_tensors(work_dir / 'iter_8.pth')


def run_pair(sample_data, tmp_path):
    config = resume_config(sample_data, tmp_path)
    whole, crashed = tmp_path / 'whole', tmp_path / 'crashed'
    done = train(config, whole)
    assert done.returncode == 0, done.stderr[-3000:]
    killed = train(config, crashed, kill_at=6)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (crashed / 'iter_4.pth').exists()
    assert not (crashed / 'iter_8.pth').exists()
    resumed = train(config, crashed, '--resume')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'resumed epoch: 0, iter: 4' in resumed.stdout + resumed.stderr
    return final_state(whole), final_state(crashed)


def test_sigkill_then_resume_ends_with_identical_weights(
        sample_data, tmp_path):
    whole, resumed = run_pair(sample_data, tmp_path)
    assert len(whole) > 400
    assert differing(whole, resumed) == []


def test_enable_adds_the_hook_once_and_disable_removes_it():
    from mmengine.config import Config

    import fast_parallel
    cfg = fast_parallel.disable(Config.fromfile(CONFIGS['yolox']))
    kinds = [h['type'] for h in cfg.custom_hooks]
    assert 'ExactResumeHook' not in kinds and 'EMAHook' in kinds
    fast_parallel.enable(fast_parallel.enable(cfg))
    kinds = [h['type'] for h in cfg.custom_hooks]
    assert kinds.count('ExactResumeHook') == 1
    assert kinds.count('FastParallelHook') == 1
