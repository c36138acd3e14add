"""Invariant 9 through a real Runner: the user's own hook and metric read
``data_batch`` in all six ``*_iter`` hooks and in ``Evaluator.process``,
keep ``.detach()`` / NumPy handles of its tensors, and see exactly what they
see on the stock path; a batch taken by hand from the loaders is stock's.

mmengine's Runner, mmdet's ``CocoDataset``, pipeline, ``DetDataPreprocessor``
and ``CocoMetric`` (:mod:`val_utils`); the hook and metric:
:mod:`user_code`.
"""
import pytest
from mmengine.dataset import pseudo_collate
from user_code import KeepingMetric, UserBatchReader, digest, read
from val_utils import iter_runner

import fast_parallel

SIX = {
    f'{w}_{s}_iter'
    for w in ('before', 'after')
    for s in ('train', 'val', 'test')
}


def _run(sample_data, work_dir, fast: bool) -> dict:
    KeepingMetric.reads, KeepingMetric.kept = [], []
    reader = UserBatchReader()
    hooks = [reader] + ([dict(type='FastParallelHook')] if fast else [])
    runner = iter_runner(
        sample_data,
        work_dir,
        hooks,
        max_iters=6,
        val_interval=1,
        val_loader=dict(batch_size=1),  # 4 batches, 1 worker
        metrics=[dict(type='KeepingMetric')],
        with_test=True)
    runner.train()
    runner.test()
    batch = next(iter(runner.val_dataloader))  # by hand, after the run
    return dict(
        runner=runner,
        reads=reader.reads,
        process=list(KeepingMetric.reads),
        metrics=reader.metrics,
        by_hand=batch)


@pytest.fixture(scope='module')
def arms(sample_data, tmp_path_factory):
    return {
        arm: _run(sample_data, tmp_path_factory.mktemp(arm), arm == 'fast')
        for arm in ('stock', 'fast')
    }


def test_hooks_read_stocks_batch_in_every_iter_hook(arms):
    stock, fast = arms['stock'], arms['fast']
    assert isinstance(fast['runner'].model, fast_parallel.FastDataParallel)
    assert {where for where, _, _ in stock['reads']} == SIX
    assert not [r for r in stock['reads'] if r[2].startswith('raised')]
    assert fast['reads'] == stock['reads']


def test_evaluator_process_reads_stocks_batch(arms):
    stock, fast = arms['stock'], arms['fast']
    assert len(stock['process']) == 28  # 6 validations, a test: 4 each
    assert not [r for r in stock['process'] if r.startswith('raised')]
    assert fast['process'] == stock['process']


def test_kept_handles_are_never_overwritten(arms):
    for arm in ('stock', 'fast'):
        last = arms[arm]['metrics'][-1]
        assert last['user/changed'] == 0, arm
        assert last['user/kept'] > 24 * 3  # outputs and the batch's samples
    assert [m['user/kept'] for m in arms['fast']['metrics']] == \
        [m['user/kept'] for m in arms['stock']['metrics']]


def test_a_batch_taken_by_hand_is_stocks(arms):
    stock, fast = arms['stock']['by_hand'], arms['fast']['by_hand']
    assert type(fast) is dict and type(stock) is dict
    assert digest(fast) == digest(stock)
    dataset = arms['fast']['runner'].val_dataloader.dataset
    assert digest(fast) == digest(pseudo_collate([dataset[0]]))
    assert read(fast) == read(stock)
