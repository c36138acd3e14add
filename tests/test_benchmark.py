"""tools/benchmark.py runs in quick mode and writes well-formed JSON.

No timing is asserted: speed is reported by the benchmark, not tested.
"""
import json
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from conftest import ROOT, load_tool

benchmark = load_tool('benchmark')


def test_quick_mode_writes_complete_json(tmp_path):
    out, png = tmp_path / 'bench.json', tmp_path / 'bench.png'
    benchmark.main(['--quick', '--json', str(out), '--plot', str(png)])
    results = json.loads(out.read_text())
    assert set(results) >= {
        'machine', 'settings', 'data_path', 'collate', 'transfers', 'gpu'
    }
    assert results['settings']['step_kind'] == 'torch'
    for shape in ('yolox', 'pointpillars'):
        by_workers = results['data_path'][shape]
        assert set(by_workers) == {'0', '2'}
        for r in by_workers.values():
            assert r['stock_ms'] > 0 and r['fast_ms'] > 0
            assert r['ratio'] == r['fast_ms'] / r['stock_ms']
            assert r['samples'] == results['settings']['batches']
            for path in ('stock', 'fast'):
                assert r[f'{path}_min_ms'] <= r[f'{path}_q1_ms'] <= \
                    r[f'{path}_ms'] <= r[f'{path}_q3_ms'] <= \
                    r[f'{path}_max_ms']
        copies = results['transfers'][shape]
        assert copies['fast']['copies'] < copies['stock']['copies']
        assert copies['fast']['bytes'] >= copies['stock']['bytes']
    assert results['transfers']['yolox']['stock']['copies'] == 40
    assert results['gpu']['run'] in (True, False)
    assert png.stat().st_size > 1000
    assert results['warnings'][0].startswith('--quick')


def _image_step_saving(config: str, batch: int) -> int:
    """Operations stock's image step of ``config``'s data preprocessor
    takes more than the batched one, on ``batch`` images of one size."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    from torch import nn

    from fast_parallel.bench.opcount import OpCounter
    from fast_parallel.step.images import switch_images
    init_default_scope('mmdet')
    built = [
        MODELS.build(Config.fromfile(config).model.data_preprocessor)
        for _ in range(2)
    ]
    holder = nn.Module()
    holder.data_preprocessor = built[1]
    assert switch_images(holder).done
    totals = []
    for pre in built:
        with OpCounter() as counter:  # (not training: no batch augments)
            pre(
                dict(inputs=[torch.zeros((3, 64, 64), dtype=torch.uint8)] *
                     batch))
        totals.append(counter.total)
    return totals[0] - totals[1]


def test_ops_mode_counts_fewer_operations_same_step(tmp_path):
    """--ops on the YOLOX-tiny sample (240 groups, ExpMomentumEMA): the
    optimizer and EMA fused, the model's own step untouched."""
    out = tmp_path / 'ops.json'
    benchmark.main(['--ops', '--quick', '--json', str(out)])
    r = json.loads(out.read_text())['ops']['yolox_tiny_sample']
    stock, fast = r['stock'], r['fast']
    assert len(stock['per_iter']) == len(fast['per_iter']) == 1
    # the issue's bar (for YOLOX-s): at most 0.65 of stock's operations
    assert r['ratio'] == fast['total'] / stock['total'] <= 0.65
    # the model's forward/backward is the same work on both paths; the
    # batched loss leaves out stock's priors repeat and its three
    # tensor-to-bool syncs (a compare and an .item() each), and the kept
    # priors are one copy a level instead of grid_priors' work
    from mmdet.models.task_modules.prior_generators import MlvlPointGenerator

    from fast_parallel.bench.opcount import OpCounter
    with OpCounter() as made:
        MlvlPointGenerator([8, 16, 32], offset=0).grid_priors([(8, 8), (4, 4),
                                                               (2, 2)],
                                                              device='cpu',
                                                              with_stride=True)
    kept = made.total - 3
    assert kept > 3 * 5
    # and the data preprocessor makes the batch's (square, padded) images
    # for the whole batch: counted on the config's preprocessor
    images = _image_step_saving('configs/yolox/yolox_tiny_fast_sample.py',
                                r['batch_size'])
    assert images >= r['batch_size']
    assert 0 <= stock['phases']['train_step'] - fast['phases'][
        'train_step'] - kept - images <= 8
    # the targets are their own phase on both paths (per image on stock,
    # batched on fast; at batch 2 an image the batched path sends the stock
    # way can make fast's phase the larger one)
    assert stock['phases']['targets'] > 0 and fast['phases']['targets'] > 0
    assert sum(fast['phases'].values()) == fast['total']
    assert fast['items'] < stock['items']
    # 240 groups, 2 hyper-parameter sets: a few foreach calls, not ~1,000
    assert stock['phases']['optimizer_step'] > 240 * 4
    assert fast['phases']['optimizer_step'] <= 2 * 5
    # EMA: per-tensor mul_/add_ (and .item()s of its step count) gone
    assert stock['phases']['after_iter_hooks'] > 388 * 2
    assert fast['phases']['after_iter_hooks'] < 20
    assert r['changed']['mul_'] == dict(stock=388, fast=0)
    assert fast['device_copies'] < stock['device_copies']


def test_train_mode_runs_every_arm_in_fresh_processes(tmp_path):
    out, png = tmp_path / 'train.json', tmp_path / 'train.png'
    benchmark.main(
        ['--train', '--quick', '--json',
         str(out), '--plot',
         str(png)])
    r = json.loads(out.read_text())['train']
    assert r['order'] == ['stock', 'stock+pin_memory', 'fast']
    assert r['settings']['iters'] == 3 and r['settings']['warmup'] == 1
    for arm, a in r['arms'].items():
        assert a['iters'] == 2 and a['time_s'] > 0 and a['data_time_s'] >= 0
        assert a['samples_per_s'] == a['batch_size'] / a['time_s']
        assert len(a['per_repeat_time_s']) == 1
    assert r['arms']['stock']['ratio'] == 1.0
    assert png.stat().st_size > 1000


def test_ops_counts_a_users_config_with_the_two_lines_added(tmp_path):
    """--ops-configs: an upstream config as a user has it (no fast lines),
    on the data its --cfg-options name; no preset counted beside it."""
    out = tmp_path / 'ops.json'
    coco = osp.join(ROOT, 'data', 'sample', 'coco') + '/'
    name = 'mmdet::yolox/yolox_tiny_8xb8-300e_coco.py'
    benchmark.main([
        '--ops', '--quick', '--ops-configs', name, '--json',
        str(out), '--cfg-options', 'train_dataloader.batch_size=2',
        'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        f'train_dataloader.dataset.dataset.data_root={coco}'
    ])
    ops = json.loads(out.read_text())['ops']
    assert list(ops) == [name]
    r = ops[name]
    assert r['batch_size'] == 2
    # the hook was added: optimizer and EMA fused, targets batched
    assert r['fast']['phases']['optimizer_step'] < 20 < \
        r['stock']['phases']['optimizer_step']
    assert r['fast']['phases']['targets'] < r['stock']['phases']['targets']
    assert r['ratio'] == r['fast']['total'] / r['stock']['total'] < 1


def test_load_config_adds_the_hook_once():
    from fast_parallel.bench.presets import load_config

    def fast_hooks(cfg):
        return [h for h in cfg.custom_hooks if h['type'] == 'FastParallelHook']

    # a repository config: the hook already there, its accuracy check
    # (a final validation against published figures) dropped
    own = load_config(
        osp.join(ROOT, 'configs', 'yolox', 'yolox_s_fast_8xb8-300e_coco.py'))
    assert len(fast_hooks(own)) == 1
    assert 'AccuracyParityHook' not in [h['type'] for h in own.custom_hooks]
    upstream = load_config('mmdet::retinanet/retinanet_r50_fpn_1x_coco.py')
    assert len(fast_hooks(upstream)) == 1
    assert upstream.custom_imports['imports'][0] == 'fast_parallel'
    with pytest.raises(FileNotFoundError, match='no_such.py'):
        load_config('no_such.py')


def test_pipeline_mode_checks_every_sample_and_writes_the_issue_fields(
        tmp_path, capsys):
    """--pipeline on the YOLOX-tiny sample: three arms, every sample and
    its random states equal, the JSON fields the docs name, one line per
    preset."""
    out = tmp_path / 'pipeline.json'
    # the arms run on 1 torch / 0 OpenCV threads; the process's come back
    cv_before = cv2.getNumThreads()
    torch.set_num_threads(2)
    cv2.setNumThreads(2)
    try:
        benchmark.main([
            '--pipeline', '--quick', '--pipeline-samples', '9', '--json',
            str(out)
        ])
        assert torch.get_num_threads() == 2 and cv2.getNumThreads() == 2
    finally:
        cv2.setNumThreads(cv_before)
    r = json.loads(out.read_text())['pipeline']['yolox_tiny_sample']
    for key in ('stock_ms', 'fast_ms', 'fast_cached_ms', 'samples', 'equal'):
        assert key in r
    assert r['samples'] == r['equal'] == 9, r['first_difference']
    assert r['stock_ms'] > 0 and r['fast_ms'] > 0 and r['fast_cached_ms'] > 0
    assert len(r['spread']) == len(r['cached_spread']) == 3
    assert 'Mosaic' in r['by_transform']['fast']
    assert 'inputs cached in shared memory' in r['switch_cached']
    assert 'inputs not cached (cache_inputs=None)' in r['switch']
    assert r['counts']['cache: hits'] > 0
    printed = capsys.readouterr().out
    assert 'yolox_tiny_sample: stock ' in printed
    assert '9/9 samples and random states equal (after 2 warm-up ' \
        'samples' in printed
    # the warm-up samples are untimed and compared too
    assert r['warmup'] == 2 and r['first_difference'] is None


def test_a_one_time_event_leaves_its_sample_out_of_every_arm():
    """A numba compile in one arm's sample (~0.2 s where samples take ~3
    ms) is not per-sample work: that sample leaves every arm's times, the
    arms stay paired; samples of ordinary spread all stay."""
    from fast_parallel.bench.pipeline import _one_time
    rng = np.random.default_rng(0)
    total = {
        arm: list(rng.uniform(0.8, 1.2, 300) * scale)
        for arm, scale in (('stock', 3e-3), ('fast', 2e-3), ('fast_cached',
                                                             2e-3))
    }
    assert _one_time(total) == set()
    total['stock'][41] = 0.24
    total['fast_cached'][7] = 0.05
    assert _one_time(total) == {7, 41}
    total['fast'][3] = 0.038  # (~19 times its median: kept)
    assert _one_time(total) == {7, 41}
    # more than 1 % of the samples is a recurring tail: none left out
    total['fast'][60:62] = [0.2, 0.2]
    assert _one_time(total) == set()
