"""FastParallelHook through mmengine's Runner on real mmdet/mmdet3d configs.

The sample configs differ from stock only by ``custom_imports`` and the
``FastParallelHook`` line (``fast_parallel.disable`` removes the line).
"""
import glob

import pytest
import torch
from mmengine.runner import Runner
from models import CONFIGS, assert_same_tensors
from runner_utils import loss_history, sample_config
from torch.utils.data import DataLoader

from fast_parallel import FastDataParallel, PackedCollate
from fast_parallel.data.loader import FastDataLoader
from fast_parallel.step.foreach_ema import is_fused_ema
from fast_parallel.step.fused_optim import FusedSGD

# PointPillars' pipeline JIT-compiles numba code in every new process; one
# process (num_workers=0) keeps the test short. YOLOX runs with 2 workers.
OVERRIDES = {
    'yolox': {
        'train_cfg.max_epochs': 1,
        'train_cfg.val_interval': 1
    },
    'pointpillars': {
        'train_cfg.max_epochs': 1,
        'train_cfg.val_interval': 1,
        'train_dataloader.num_workers': 0,
        'val_dataloader.num_workers': 0,
        'test_dataloader.num_workers': 0,
    },
}


def _adam_reads_once(optimizer) -> bool:
    """Whether foreach resolves on for PointPillars' AdamW (CUDA: yes)."""
    from fast_parallel.step.optim_buckets import adam_foreach
    group = optimizer.param_groups[0]
    return adam_foreach(group, group['params'])


def _on_line(log: str) -> str:
    """The start-of-training line that says the fast path is on."""
    line, = [ln for ln in log.splitlines() if 'FastParallelHook: on:' in ln]
    return line


@pytest.fixture(scope='module')
def runs(sample_data, tmp_path_factory):
    """Per config and path, one Runner that trained (1 epoch) and tested."""
    cache = {}

    def get(kind, path):
        if (kind, path) not in cache:
            work_dir = tmp_path_factory.mktemp(f'{kind}_{path}')
            cfg = sample_config(CONFIGS[kind], sample_data, work_dir,
                                path == 'fast', **OVERRIDES[kind])
            runner = Runner.from_cfg(cfg)
            runner.train()
            # runner.test() runs EMAHook.before_run again, which builds a
            # new averaged model: keep the one that trained
            emas = [
                h.ema_model for h in runner.hooks if hasattr(h, 'ema_model')
            ]
            cache[kind, path] = dict(
                runner=runner,
                work_dir=work_dir,
                losses=loss_history(runner),
                emas=emas,
                test=runner.test())
        return cache[kind, path]

    return get


@pytest.mark.parametrize('kind', ['yolox', 'pointpillars'])
def test_two_lines_train_val_test_like_stock(kind, runs):
    stock, fast = runs(kind, 'stock'), runs(kind, 'fast')
    # the hook put the fast path in place, the stock run stayed stock
    fast_runner = fast['runner']
    assert isinstance(fast_runner.model, FastDataParallel)
    assert not isinstance(stock['runner'].model, FastDataParallel)
    for loop in (fast_runner.train_loop, fast_runner.val_loop,
                 fast_runner.test_loop):
        assert isinstance(loop.dataloader.collate_fn, PackedCollate)
        assert type(loop.dataloader) is FastDataLoader
    for loop in (stock['runner'].train_loop, stock['runner'].test_loop):
        assert type(loop.dataloader) is DataLoader
    # every loss of every iteration identical
    assert 'train/loss' in stock['losses']
    assert set(stock['losses']) == set(fast['losses'])
    for key, values in stock['losses'].items():
        assert len(values) == fast_runner.max_iters
        assert values == fast['losses'][key], key
    # identical test metrics and final parameters
    assert stock['test'] and stock['test'] == fast['test']
    assert_same_tensors(stock['runner'].model.state_dict(),
                        fast_runner.model.module.state_dict())
    # the training log shows the transfer figures next to data_time
    log = open(glob.glob(str(fast['work_dir'] / '*' / '*.log'))[0]).read()
    train_lines = [ln for ln in log.splitlines() if 'Epoch(train)' in ln]
    assert train_lines and all(
        'data_time' in ln and 'transfer_time' in ln and 'transfer_mb' in ln
        for ln in train_lines)
    for mode in ('train', 'val', 'test'):
        assert f'fast_parallel {mode}: per batch transfer_time' in log


@pytest.mark.parametrize('kind,name,ema', [('yolox', 'SGD', 'ExpMomentumEMA'),
                                           ('pointpillars', 'AdamW', None)])
def test_optimizer_and_ema_fused_with_stock_bytes(kind, name, ema, runs):
    stock, fast = runs(kind, 'stock'), runs(kind, 'fast')
    fast_runner, stock_runner = fast['runner'], stock['runner']
    log = open(glob.glob(str(fast['work_dir'] / '*' / '*.log'))[0]).read()
    optimizer = fast_runner.optim_wrapper.optimizer
    groups = len(optimizer.param_groups)
    assert type(stock_runner.optim_wrapper.optimizer).__name__ == name
    if kind == 'yolox':  # paramwise_cfg: one group per parameter
        # the fast run stepped with the fused optimizer, in fewer calls
        assert type(optimizer) is FusedSGD
        assert groups == len(list(fast_runner.model.parameters()))
        assert optimizer._fused_calls == 2  # with and without decay
        assert (f'; optimizer: SGD {groups} groups -> 2 fused steps'
                ) in _on_line(log)
    elif _adam_reads_once(optimizer):  # one group, counts read once
        assert type(optimizer).__name__ == 'FusedAdamW' and groups == 1
        assert ('; optimizer: AdamW 1 group -> 1 fused step, step counts '
                'read in one go') in _on_line(log)
    else:  # on a CPU foreach resolves off: nothing to fuse or read once
        assert type(optimizer).__name__ == name == 'AdamW' and groups == 1
        assert '; optimizer: AdamW 1 group, left stock' in _on_line(log)
    # the optimizer state is stock's, bit for bit, in stock's layout
    stock_state = stock_runner.optim_wrapper.state_dict()
    fast_state = fast_runner.optim_wrapper.state_dict()
    assert stock_state['param_groups'] == fast_state['param_groups']
    assert stock_state['state'].keys() == fast_state['state'].keys()
    for pid, state in stock_state['state'].items():
        assert_same_tensors(state, fast_state['state'][pid])
    emas = {'stock': stock['emas'], 'fast': fast['emas']}
    if ema is None:
        assert emas == {'stock': [], 'fast': []}
        return
    fast_ema, = emas['fast']
    stock_ema, = emas['stock']
    assert is_fused_ema(fast_ema) and not is_fused_ema(stock_ema)
    floats = [
        t for t in stock_ema.avg_parameters.values() if t.is_floating_point()
    ]  # not num_batches_tracked
    assert f'EMA ({ema}): {len(floats)} tensors in 1 multi-tensor update' \
        in log
    assert_same_tensors(stock_ema.state_dict(), fast_ema.state_dict())


@pytest.mark.parametrize('src,dst', [('fast', 'stock'), ('stock', 'fast')])
def test_checkpoints_move_between_stock_and_fast(src, dst, runs, sample_data,
                                                 tmp_path):
    kind = 'yolox'
    trained = runs(kind, src)
    ckpt = trained['work_dir'] / 'epoch_1.pth'
    # loads with weights_only=True thanks to the allow-list
    state = torch.load(ckpt)['state_dict']
    model = trained['runner'].model
    model = model.module if src == 'fast' else model
    assert list(state) == list(model.state_dict())  # no `module.` prefix
    second = Runner.from_cfg(
        sample_config(
            CONFIGS[kind],
            sample_data,
            tmp_path,
            dst == 'fast',
            load_from=str(ckpt),
            **OVERRIDES[kind]))
    metrics = second.test()  # loads `load_from` strictly, then tests
    loaded = second.model.module if dst == 'fast' else second.model
    assert_same_tensors(state, loaded.state_dict())
    # same weights, other path: the same test metrics as the source run
    assert metrics == trained['test']


@pytest.mark.parametrize('expected,verdict', [(0.0, 'PASS'), (0.5, 'FAIL')])
def test_accuracy_parity_hook_verdict_line_and_json(expected, verdict, runs):
    import json

    from fast_parallel import AccuracyParityHook
    trained = runs('yolox', 'fast')
    runner = trained['runner']
    hook = AccuracyParityHook(
        expected={'coco/bbox_mAP': expected}, tolerance=0.01, source='test')
    runner.register_hook(hook)
    try:
        metrics = runner.val()  # a standalone validation is final
    finally:
        runner._hooks.remove(hook)
    report = json.loads(
        (trained['work_dir'] / 'accuracy_parity.json').read_text())
    assert report['final'] is True
    assert report['passed'] is (verdict == 'PASS')
    measured = report['metrics']['coco/bbox_mAP']['measured']
    assert measured == metrics['coco/bbox_mAP']
    log = open(glob.glob(str(trained['work_dir'] / '*' / '*.log'))[0]).read()
    assert f'accuracy parity {verdict}: coco/bbox_mAP' in log


def test_accuracy_parity_hook_missing_metric_fails():
    from fast_parallel import AccuracyParityHook
    hook = AccuracyParityHook({
        'a': 1.0,
        'b': 2.0
    },
                              tolerance={
                                  'a': 0.1,
                                  'b': 0.0
                              })
    report = hook.check({'a': 1.05})
    assert report['metrics']['a']['passed'] is True
    assert report['metrics']['b']['passed'] is False
    assert report['passed'] is False


@pytest.mark.parametrize(
    'kind,workers,fused',
    [('yolox', ('2 workers', '1 worker'), 'optimizer: SGD {groups} groups -> '
      '2 fused steps; EMA (ExpMomentumEMA): '),
     ('pointpillars', ('0 workers', '0 workers'), 'optimizer: AdamW 1 '
      'group{adam}; voxels: Det3DDataPreprocessor batched, '
      'PointPillarsScatter batched; targets: Anchor3DHead/Max3DIoUAssigner '
      'batched')])
def test_one_line_says_the_fast_path_is_on(kind, workers, fused, runs):
    fast = runs(kind, 'fast')
    runner = fast['runner']
    log = open(glob.glob(str(fast['work_dir'] / '*' / '*.log'))[0]).read()
    summary = _on_line(log)
    device = runner.model.module.data_preprocessor.device
    pinned = 'pinned' if device.type == 'cuda' else 'not pinned'
    groups = len(runner.optim_wrapper.optimizer.param_groups)
    assert (f'FastParallelHook: on: wrapper FastDataParallel ({device}); '
            f'loaders: train packed ({workers[0]}, {pinned}), '
            f'val packed ({workers[1]}, {pinned}); ' + fused.format(
                groups=groups,
                adam=' -> 1 fused step, step counts read in one go'
                if _adam_reads_once(runner.optim_wrapper.optimizer) else
                ', left stock (nothing to fuse: no two groups share their '
                'hyper-parameters)')) in summary
    head = runner.model.module.bbox_head
    assert f'; targets: {head.fast_target_stats.name} batched; pipeline: ' \
        in summary
    pipeline = summary.split('; pipeline: ', 1)[1]  # the line's last part
    if kind == 'yolox':
        assert pipeline.startswith(
            'MultiImageMixDataset, Mosaic, MixUp, YOLOXHSVRandomAug, Pad, '
            'PackDetInputs fast; '
            'RandomAffine stock (no exact faster form); inputs cached in '
            'shared memory (up to '), pipeline
    else:
        assert pipeline.startswith(
            'KittiDataset, ObjectSample, GlobalRotScaleTrans, '
            'PointsRangeFilter, ObjectRangeFilter, PointShuffle fast; '
            'inputs cached in shared memory (up to 0.0 GB; '
        ) and pipeline.endswith(' available): gt-database files'), pipeline
    assert summary.endswith({
        'yolox':
        'MultiImageMixDataset, Mosaic, MixUp, YOLOXHSVRandomAug, Pad, '
        'PackDetInputs fast; RandomAffine stock (no exact faster form); '
        'inputs cached in shared memory (up to 0.0 GB; ',
        'pointpillars':
        ' available): gt-database files'
    }[kind]) or kind == 'yolox' and summary.endswith(
        ' available): images; Mosaic/MixUp resizes cached too (up to 0.0 GB)'
        '; Mosaic decodes only the patches RandomAffine reads'), summary
    # every sample of the epoch took the batched targets, counted, logged
    stats = head.fast_target_stats
    assert stats.calls > 0 and stats.samples >= stats.calls
    assert stats.stock == 0
    assert (f'FastParallelHook: targets: {stats.name} batched for '
            f'{stats.samples} of {stats.samples} ') in log
