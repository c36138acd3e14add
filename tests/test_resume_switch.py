"""Exact resume across a worker restart (``YOLOXModeSwitchHook``).

The YOLOX-tiny sample recipe as it ships: ``EpochBasedTrainLoop`` of 4
epochs, ``YOLOXModeSwitchHook(num_last_epochs=1)`` (it switches the pipeline
off Mosaic/MixUp at the start of epoch 3 and restarts the persistent
workers to do it), ``EMAHook``, ``SyncNormHook``, 2 persistent workers, a
checkpoint every epoch, seed 0. One run goes through; each of its
checkpoints right before (``epoch_1``), at (``epoch_2``: the switch is the
next thing the run does) and after (``epoch_3``) the switch is resumed in a
new work dir. Every run must end with the uninterrupted run's bytes in every
parameter, buffer, EMA tensor and optimizer state.
"""
from pathlib import Path
from typing import Dict, Optional

import pytest
import torch
from mmengine.runner import Runner
from models import CONFIGS
from runner_utils import checkpoint_tensors, differing, sample_config

from fast_parallel.resume.workers import decide_start

EPOCHS = 4
INEXACT = 'this resumed run will not be identical'


def _config(sample_data: Path,
            work_dir: Path,
            resume_from: Optional[Path] = None):
    cfg = sample_config(CONFIGS['yolox'], sample_data, work_dir, fast=True)
    assert cfg.train_dataloader.persistent_workers is True
    assert cfg.train_dataloader.num_workers == 2
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=1)
    cfg.train_cfg = dict(
        type='EpochBasedTrainLoop', max_epochs=EPOCHS, val_interval=EPOCHS + 1)
    cfg.randomness = dict(seed=0, deterministic=True)
    if resume_from is not None:
        cfg.resume, cfg.load_from = True, str(resume_from)
    return cfg


def _end_state(work_dir: Path) -> Dict[str, torch.Tensor]:
    return checkpoint_tensors(work_dir / f'epoch_{EPOCHS}.pth')


def _log(work_dir: Path) -> str:
    return ''.join(p.read_text() for p in work_dir.glob('*/*.log'))


@pytest.fixture(scope='module')
def whole(sample_data, tmp_path_factory):
    """The uninterrupted run: its work dir and end state."""
    work_dir = tmp_path_factory.mktemp('switch') / 'whole'
    Runner.from_cfg(_config(sample_data, work_dir)).train()
    return work_dir, _end_state(work_dir)


def test_checkpoints_record_the_restart(whole):
    work_dir, _ = whole
    restarts = {}
    for epoch in (1, 2, 3):
        ckpt = torch.load(work_dir / f'epoch_{epoch}.pth', weights_only=False)
        workers = ckpt['meta']['fast_parallel_resume']['workers']
        assert sorted(workers['states']) == [0, 1]
        restarts[epoch] = workers['restarts']
    # the hook switched at the start of epoch index 2 (the third epoch)
    assert restarts == {
        1: [],
        2: [],
        3: [dict(epoch=2, hooks=['YOLOXModeSwitchHook'])]
    }


@pytest.mark.parametrize('saved,message', [
    (1, 'start from the random states the checkpoint holds'),
    (2, 'YOLOXModeSwitchHook restarted the train DataLoader workers at '
     'epoch 2, as in the interrupted run: they start afresh'),
    (3, 'YOLOXModeSwitchHook switched again'),
])
def test_resume_around_the_switch_is_exact(sample_data, whole, tmp_path, saved,
                                           message):
    work_dir, end = whole
    assert sum(k.startswith('ema.') for k in end) > 300
    resumed = tmp_path / 'resumed'
    runner = Runner.from_cfg(
        _config(
            sample_data, resumed, resume_from=work_dir / f'epoch_{saved}.pth'))
    runner.train()
    assert not (resumed / f'epoch_{saved}.pth').exists()  # it did resume
    assert differing(end, _end_state(resumed)) == []
    log = _log(resumed)
    assert message in log
    assert INEXACT not in log


def test_decide_start_is_honest_where_it_cannot_tell():
    saved = dict(states={}, restarts=[dict(epoch=1, hooks=[])])
    fresh, message, exact = decide_start(True, saved, set(), 3)
    assert fresh and not exact and 'cannot tell' in message
    # no history (an older checkpoint): it says so
    fresh, message, exact = decide_start(True, dict(states={}), set(), 3)
    assert not fresh and not exact and 'does not say' in message
    # a hook restarting the workers for the first time: afresh, exact
    fresh, message, exact = decide_start(True, dict(states={}, restarts=[]),
                                         set(), 3)
    assert fresh and exact


def test_a_switch_before_the_first_start_resumes_from_the_states():
    """A switch-once hook that switched before the workers first started
    (YOLOX with ``num_last_epochs`` >= ``max_epochs - 1``) restarted
    nothing; resumed later it switches again and drops the iterator: the
    workers must go on from the checkpoint's states, not afresh (found by
    tests/test_clusters.py: before, a fresh start changed the numbers)."""
    saved = dict(states={0: {}}, restarts=[], switched=['YOLOXModeSwitchHook'])
    fresh, message, exact = decide_start(True, saved, {'YOLOXModeSwitchHook'},
                                         1)
    assert not fresh and exact
    assert 'before its workers first started' in message
    # a checkpoint without the record (older fast_parallel) starts afresh
    fresh, _, _ = decide_start(True, dict(saved, switched=[]),
                               {'YOLOXModeSwitchHook'}, 1)
    assert fresh
