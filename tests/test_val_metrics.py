"""Validation under FastParallelHook in an ``IterBasedTrainLoop``: the final
validation is known as such, the metrics are the evaluator's alone, and
pinning is never asked for where torch has no accelerator to pin for.

Real Runner, ``CocoDataset``, ``DetDataPreprocessor`` and ``CocoMetric``
(:mod:`val_utils`).
"""
import json
import warnings

import pytest
from val_utils import MetricsRecorder, iter_runner, log_text

from fast_parallel import AccuracyParityHook, FastParallelHook
from fast_parallel.data.loader import accelerator_available

PARITY = dict(
    expected={'coco/bbox_mAP': 1.0}, tolerance=0.1, source='boxes echoed')


@pytest.fixture(scope='module')
def trained(sample_data, tmp_path_factory):
    """4 iterations, validating after 2 and 4, saving the best checkpoint."""
    work_dir = tmp_path_factory.mktemp('val_iter')
    parity, recorder = AccuracyParityHook(**PARITY), MetricsRecorder()
    runner = iter_runner(
        sample_data,
        work_dir, [dict(type='FastParallelHook'), parity, recorder],
        checkpoint=dict(
            type='CheckpointHook',
            interval=2,
            by_epoch=False,
            save_best='auto'))
    runner.train()
    return dict(
        runner=runner, work_dir=work_dir, parity=parity, recorder=recorder)


def test_last_validation_of_an_iteration_loop_is_the_final_one(trained):
    log = log_text(trained['work_dir'])
    verdicts = [ln for ln in log.splitlines() if 'accuracy parity' in ln]
    assert len(verdicts) == 2  # after iteration 2 and 4
    assert '(not the final validation) accuracy parity PASS' in verdicts[0]
    assert '(not the final validation)' not in verdicts[1]
    assert 'accuracy parity PASS: coco/bbox_mAP ' in verdicts[1]
    assert 'vs 1.0000 (tolerance 0.1000), boxes echoed' in verdicts[1]
    report = json.loads(
        (trained['work_dir'] / 'accuracy_parity.json').read_text())
    assert report['final'] is True and report['iter'] == 4
    assert report['passed'] is True


def test_val_metrics_are_the_evaluators_only(trained):
    runner, work_dir = trained['runner'], trained['work_dir']
    evaluator_keys = set(trained['recorder'].metrics[0])
    assert 'coco/bbox_mAP' in evaluator_keys
    assert all(set(m) == evaluator_keys for m in trained['recorder'].metrics)
    # scalars.json: every validation record holds the evaluator's keys
    # plus mmengine's own step and timings, no transfer figures
    scalars, = work_dir.glob('*/vis_data/scalars.json')
    records = [json.loads(ln) for ln in scalars.read_text().splitlines()]
    val = [r for r in records if 'coco/bbox_mAP' in r]
    assert len(val) == 2
    for record in val:
        assert set(record) - {'step', 'time', 'data_time'} == evaluator_keys
    # training records keep theirs
    train = [r for r in records if 'loss' in r]
    assert train and all('transfer_time' in r for r in train)
    # the logged metrics line (and every val line) carries none either
    log = log_text(work_dir)
    val_lines = [ln for ln in log.splitlines() if 'Iter(val)' in ln]
    metrics_lines = [ln for ln in val_lines if 'coco/bbox_mAP' in ln]
    assert len(metrics_lines) == 2
    assert not [ln for ln in val_lines if 'transfer_' in ln]
    assert 'fast_parallel val: per batch transfer_time' in log
    # save_best='auto' picked the evaluator's first metric
    first = next(iter(trained['recorder'].metrics[0]))
    assert first == 'coco/bbox_mAP'
    best = list(work_dir.glob('best_coco_bbox_mAP_iter_*.pth'))
    assert len(best) == 1
    best_score = max(m['coco/bbox_mAP'] for m in trained['recorder'].metrics)
    assert runner.message_hub.get_info('best_score') == best_score


@pytest.mark.parametrize('config_pin', [False, True])
def test_forced_pin_memory_without_accelerator_asks_torch_for_nothing(
        sample_data, tmp_path, config_pin):
    """``FastParallelHook(pin_memory=True)``, the config's loaders pinned or
    not: no loader of the hook's asks torch to pin where it cannot."""
    runner = iter_runner(
        sample_data,
        tmp_path, [FastParallelHook(pin_memory=True)],
        max_iters=2,
        val_interval=2,
        train_loader=dict(pin_memory=config_pin))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        runner.train()
    pin_warnings = [(w.filename, str(w.message)) for w in caught
                    if 'pin_memory' in str(w.message)]
    # torch's warnings name the caller of the iterator's __init__: the
    # iterator IterBasedTrainLoop starts before any hook runs is torch's
    # own (a stock loader pinned by its config: stock's warning, once)
    ours = [w for w in pin_warnings if 'fast_parallel' in w[0]]
    assert ours == []
    stock_started = config_pin and not accelerator_available()
    assert len(pin_warnings) == int(stock_started), pin_warnings
    log = log_text(tmp_path)
    summary, = [ln for ln in log.splitlines() if 'FastParallelHook: on:' in ln]
    loaders = (runner.train_loop.dataloader, runner.val_loop.dataloader)
    if accelerator_available():  # pinned where the DataLoader can pin
        assert all(loader.pin_memory for loader in loaders)
        assert 'pin_memory=True skipped' not in log
        assert 'train packed, rebuilt (2 workers, pinned)' in summary
    else:
        assert not any(loader.pin_memory for loader in loaders)
        assert 'FastParallelHook: pin_memory=True skipped: no accelerator ' \
            'is present' in log
        assert 'train packed, rebuilt (2 workers, not pinned)' in summary
