"""Checkpoints of the fused optimizer and EMA move between stock and fast.

YOLOX-tiny on the sample COCO set with its full recipe: SGD with one param
group per parameter (``paramwise_cfg``), ``ExpMomentumEMA``, Mosaic/MixUp,
``BatchSyncRandomResize``. An iteration loop of 4 iterations writes a
checkpoint at 2. Four runs end at iteration 4:

- stock and fast, uninterrupted;
- the stock run's checkpoint of iteration 2 resumed on the fast path;
- the fast run's checkpoint of iteration 2 resumed on the stock path.

All four must end with the same bytes in every parameter, buffer, EMA tensor
and optimizer state. "Stock" is the config without ``FastParallelHook``
(``fast_parallel.disable``) but with ``ExactResumeHook``, which carries the
main process's random states (``BatchSyncRandomResize``) that a plain
mmengine resume restarts from the seed, fast or not.
"""
from pathlib import Path
from typing import Dict, Optional

import pytest
import torch
from mmengine.runner import Runner
from models import CONFIGS
from runner_utils import checkpoint_tensors, differing, sample_config

from fast_parallel.step.foreach_ema import is_fused_ema
from fast_parallel.step.fused_optim import FusedSGD

ITERS, SAVED = 4, 2


def _config(sample_data: Path,
            work_dir: Path,
            fast: bool,
            resume_from: Optional[Path] = None):
    cfg = sample_config(CONFIGS['yolox'], sample_data, work_dir, fast)
    if not fast:
        cfg.custom_hooks = list(
            cfg.custom_hooks) + [dict(type='ExactResumeHook')]
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.train_cfg = dict(
        type='IterBasedTrainLoop', max_iters=ITERS, val_interval=ITERS + 1)
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', by_epoch=False, interval=SAVED)
    cfg.log_processor = dict(by_epoch=False, window_size=1)
    cfg.randomness = dict(seed=0, deterministic=True)
    if resume_from is not None:
        cfg.resume, cfg.load_from = True, str(resume_from)
    return cfg


def _train(cfg) -> Runner:
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def _end_state(work_dir: Path) -> Dict[str, torch.Tensor]:
    tensors = checkpoint_tensors(work_dir / f'iter_{ITERS}.pth')
    ckpt = torch.load(work_dir / f'iter_{ITERS}.pth')
    tensors['param_groups'] = torch.tensor(
        [[g['lr'], g['momentum'], g['weight_decay']]
         for g in ckpt['optimizer']['param_groups']],
        dtype=torch.float64)
    return tensors


@pytest.fixture(scope='module')
def ends(sample_data, tmp_path_factory):
    """The end states of the four runs, by name."""
    root = tmp_path_factory.mktemp('fused_resume')
    out = {}
    for name, fast in (('stock', False), ('fast', True)):
        runner = _train(_config(sample_data, root / name, fast))
        out[name] = _end_state(root / name)
        if fast:  # the fast run did fuse both
            assert type(runner.optim_wrapper.optimizer) is FusedSGD
            ema, = [
                h.ema_model for h in runner.hooks if hasattr(h, 'ema_model')
            ]
            assert is_fused_ema(ema)
    for name, src, fast in (('stock->fast', 'stock', True), ('fast->stock',
                                                             'fast', False)):
        work_dir = root / name.replace('>', '')
        ckpt = root / src / f'iter_{SAVED}.pth'
        runner = _train(_config(sample_data, work_dir, fast, resume_from=ckpt))
        # it went on from the checkpoint, not from the start
        assert not (work_dir / f'iter_{SAVED}.pth').exists()
        assert runner.iter == ITERS
        out[name] = _end_state(work_dir)
    return out


@pytest.mark.parametrize('name', ['fast', 'stock->fast', 'fast->stock'])
def test_same_end_as_uninterrupted_stock(ends, name):
    stock = ends['stock']
    assert sum(k.startswith('ema.') for k in stock) > 300
    assert sum(k.startswith('optim.') for k in stock) > 200
    assert differing(stock, ends[name]) == []
