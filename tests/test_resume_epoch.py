"""A resumed run trains on the uninterrupted run's batches (ExactResumeHook).

Each case trains once without interruption, writing a checkpoint every
epoch (iteration), and then resumes from one of those very checkpoints in a
new work dir, as a user resumes a run that died. The batches after the
checkpoint (sample order and the augmentation each sample got) and the main
process's random states at each of those iterations must be the
uninterrupted run's. The same resume on the stock path differs, which is
what makes each case a test of the hook.
"""
from typing import Dict, List

import pytest
import torch
from order_utils import assert_same_batches, batch_ids, train, write_ann_files

from fast_parallel.resume.hook import META_KEY, _resume_plan

#: A video set: TrackImgSampler shuffles with the seed, and the pipeline's
#: UniformRefFrameSample draws a reference frame at random for each sample.
CASE = 'TrackImgSampler'
PER_EPOCH = 8
INEXACT = 'this resumed run will not be identical'


@pytest.fixture(scope='module')
def ann_files(tmp_path_factory) -> Dict[str, str]:
    """The annotation files, written once for this module."""
    return write_ann_files(tmp_path_factory.mktemp('resume_epoch'))


class _Record:
    """What assert_same_batches compares: batches, and per iteration the
    main process's random states and whether the batch carried its
    worker's states."""

    def __init__(self, recorder, skip: int = 0) -> None:
        self.batches: List = recorder.batches[skip:]
        self.states: List[str] = recorder.states[skip:]
        self.with_worker_states = recorder.with_worker_states


def resume_pair(files, tmp_path, fast: bool, loop: str, **kw):
    """(after the checkpoint: the uninterrupted run, the resumed run)."""
    if loop == 'epoch':
        kw.update(epochs=3)
        ckpt, skip = 'epoch_2.pth', 2 * PER_EPOCH
    else:
        kw.update(iters=7)
        ckpt, skip = 'iter_4.pth', 4
    full = train(
        files,
        tmp_path / 'full',
        CASE,
        loop,
        fast=fast,
        checkpoints=True,
        **kw)
    resumed = train(
        files,
        tmp_path / 'resumed',
        CASE,
        loop,
        fast=fast,
        resume_from=str(tmp_path / 'full' / ckpt),
        **kw)
    return _Record(full, skip), _Record(resumed)


def log_text(work_dir) -> str:
    return ''.join(p.read_text() for p in work_dir.glob('*/*.log'))


def assert_same_run(full: _Record, resumed: _Record) -> None:
    assert len(resumed.batches) == len(full.batches) > 0
    assert_same_batches(full, resumed)
    assert resumed.states == full.states


def ids(record: _Record) -> list:
    # for this video set: the key frame's and the reference frame's ids
    return [batch_ids(b) for b in record.batches]


@pytest.mark.parametrize(
    'loop,workers,seed',
    [
        ('epoch', 2, None),  # no fixed seed: loaders get the checkpoint's
        ('epoch', 0, 7),  # pipeline in the main process: its random states
        ('iter', 2, None),
    ])
def test_resume_trains_on_the_uninterrupted_batches(ann_files, tmp_path, loop,
                                                    workers, seed):
    full, resumed = resume_pair(
        ann_files,
        tmp_path / 'fast',
        True,
        loop,
        workers=workers,
        seed=seed,
        persistent=False)
    assert_same_run(full, resumed)
    # only epoch loops with persistent workers need the workers' states
    assert full.with_worker_states == resumed.with_worker_states == 0

    full, resumed = resume_pair(
        ann_files,
        tmp_path / 'stock',
        False,
        loop,
        workers=workers,
        seed=seed,
        persistent=False)
    assert ids(full) != ids(resumed)


@pytest.mark.parametrize(
    'seed,exact_first',
    [
        (7, False),
        (None, False),  # the loader is built again with the checkpoint's seed
        (7, True),  # ExactResumeHook's before_run before FastParallelHook's
    ])
def test_persistent_workers_resume_exactly(ann_files, tmp_path, seed,
                                           exact_first):
    full, resumed = resume_pair(
        ann_files,
        tmp_path / 'fast',
        True,
        'epoch',
        workers=2,
        seed=seed,
        persistent=True,
        exact_first=exact_first)
    assert_same_run(full, resumed)
    assert full.with_worker_states == 3 * PER_EPOCH
    assert INEXACT not in log_text(tmp_path / 'fast' / 'resumed')
    if exact_first:
        return  # the stock path has no hooks to order

    # stock: other reference frames after the resume
    full, resumed = resume_pair(
        ann_files,
        tmp_path / 'stock',
        False,
        'epoch',
        workers=2,
        seed=seed,
        persistent=True)
    assert ids(full) != ids(resumed)


def test_persistent_workers_resume_warns_where_inexact(ann_files, tmp_path):
    kw = dict(workers=2, seed=7, persistent=True, epochs=3)
    train(
        ann_files,
        tmp_path / 'full',
        CASE,
        'epoch',
        fast=True,
        checkpoints=True,
        **kw)
    ckpt = torch.load(tmp_path / 'full' / 'epoch_2.pth', weights_only=False)
    saved = ckpt['meta'][META_KEY]
    assert sorted(saved['workers']['states']) == [0, 1]

    # a checkpoint without the workers' states (stock, older versions)
    del saved['workers']
    torch.save(ckpt, tmp_path / 'no_states.pth')
    train(
        ann_files,
        tmp_path / 'no_states',
        CASE,
        'epoch',
        fast=True,
        resume_from=str(tmp_path / 'no_states.pth'),
        **kw)
    text = log_text(tmp_path / 'no_states')
    assert INEXACT in text and 'persistent_workers=True' in text
    assert 'holds no random states of the workers' in text

    # another number of workers
    kw.update(workers=1)
    train(
        ann_files,
        tmp_path / 'one_worker',
        CASE,
        'epoch',
        fast=True,
        resume_from=str(tmp_path / 'full' / 'epoch_2.pth'),
        **kw)
    text = log_text(tmp_path / 'one_worker')
    assert INEXACT in text
    assert 'holds the random states of 2 workers, this run has 1' in text

    # distributed: only rank 0's states are in the checkpoint
    workers, reasons = _resume_plan(None, {}, {}, rank=1, world_size=2)
    assert workers is None and 'only rank 0 writes' in reasons[0]
