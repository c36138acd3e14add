"""tools/parity.py on both small configs, its failure detection, and the
training-order row on an upstream config with a stateful batch sampler."""
import json
import os
import os.path as osp
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch
from conftest import load_tool
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.utils import get_installed_path
from models import CONFIGS, ROOT
from runner_utils import data_options

from fast_parallel import packed_collate
from fast_parallel.bench.synthetic import pointpillars_samples, yolox_samples
from fast_parallel.parity.recorder import (ParityRecorderHook,
                                           batch_sample_ids, params_checksum)
from fast_parallel.parity.report import (ORDER_ROW, compare, format_table,
                                         verdict)
from fast_parallel.parity.runner import (epoch_switch_notes, parity_config,
                                         run_once, same_cpu_threads)

parity = load_tool('parity')

#: mmdet's RetinaNet R-18: iteration loop under parity.py, the train
#: DataLoader with ``AspectRatioBatchSampler``, batch 2, 2 workers.
RETINANET_R18 = osp.join(
    get_installed_path('mmdet'), '.mim', 'configs', 'retinanet',
    'retinanet_r18_fpn_1x_coco.py')
ORDER_IMAGES = 16  # 8 batches of 2 per epoch; 2 workers x prefetch 2 = 4


def parity_options(kind, root):
    options = data_options(kind, root)
    if kind == 'pointpillars':  # numba JIT-compiles in each new process
        options += [
            'train_dataloader.num_workers=0', 'val_dataloader.num_workers=0'
        ]
    return options


def run_parity_tool(kind, args, threads):
    """tools/parity.py in a new process whose torch starts on ``threads``
    CPU threads (numba's first parallel launch in a process sets OpenMP's
    count, which torch reads, to numba's: only a new process shows it)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run(
        [sys.executable, 'tools/parity.py', CONFIGS[kind], *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize('kind', ['yolox', 'pointpillars'])
def test_parity_identical_with_eval(kind, sample_data, tmp_path, capsys):
    out = tmp_path / 'report.json'
    args = [
        '--iters', '2', '--eval', '--out',
        str(out), '--work-dir',
        str(tmp_path), '--cfg-options', *parity_options(kind, sample_data)
    ]
    if kind == 'pointpillars':
        # on another CPU thread count than numba's: the stock run's KITTI
        # evaluation (numba, parallel=True) sets torch's count to numba's,
        # and the fast run must still start on the count stock started on
        threads = 1 if numba.config.NUMBA_NUM_THREADS > 1 else 2
        code, printed = run_parity_tool(kind, args, threads)
    else:
        start = torch.get_num_threads()
        code = parity.main([CONFIGS[kind], *args])
        printed = capsys.readouterr().out
        assert torch.get_num_threads() == start
    assert code == 0, printed
    assert 'result: IDENTICAL' in printed
    report = json.loads(out.read_text())
    if kind == 'pointpillars':
        note = (f'note: the stock run left torch at '
                f'{numba.config.NUMBA_NUM_THREADS} CPU threads')
        assert note in printed and (f'the fast run started at {threads}, '
                                    'as the stock run did') in printed, \
            printed[-3000:]
        assert len(report['notes']) == 1
    else:  # the sample's YOLOXModeSwitchHook, in a one-epoch run
        assert report['notes'] == [
            'YOLOXModeSwitchHook(num_last_epochs=1) switches at the start '
            "(a parity run has one epoch): both runs use the last epochs' "
            'pipeline, without Mosaic, RandomAffine, MixUp; '
            'num_last_epochs=-1 compares the mixing epochs'
        ]
        assert f"note: {report['notes'][0]}" in printed
    assert report['ok'] is True
    whats = [r['what'] for r in report['rows']]
    assert 'iter 2 loss' in whats and 'iter 2 grad_norm' in whats
    assert 'params sha256' in whats
    assert report['stock']['metrics'] and \
        report['stock']['metrics'] == report['fast']['metrics']
    assert len(report['fast']['losses']) == 2
    # packed batches: 0 and 2 by design, not "the same"
    assert 'n/a (differs by design)' in printed
    assert 'packed batches: as designed (stock 0, fast 2)' in printed
    clipped = report['stock']['grad_norm_clipped']
    if kind == 'pointpillars':  # mmdet3d's cyclic-40e schedule clips at 35
        assert report['stock']['clip_grad'] == dict(
            type='norm', max_norm=35, norm_type=2)
        assert 'iter 2 grad_norm after clip_grad' in whats
        assert len(clipped) == 2 and all(n < 35.001 for n in clipped)
        assert 'what mmengine logs as grad_norm' in printed
    else:
        assert report['stock']['clip_grad'] is None and clipped == []
        assert 'iter 2 grad_norm after clip_grad' not in whats
        assert 'the config sets no clip_grad' in printed


def test_parity_grad_norm_before_and_after_clip_grad(sample_data, tmp_path,
                                                     capsys):
    """With clip_grad, ``grad_norm`` is the norm before clipping (what
    mmengine logs), ``grad_norm after clip_grad`` what the step sees."""
    options = parity_options('yolox', sample_data)
    out = tmp_path / 'report.json'
    code = parity.main([
        CONFIGS['yolox'], '--iters', '1', '--out',
        str(out), '--work-dir',
        str(tmp_path / 'clip'), '--cfg-options', *options,
        'optim_wrapper.clip_grad.max_norm=10'
    ])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(out.read_text())
    rows = {r['what']: r for r in report['rows']}
    before = rows['iter 1 grad_norm']
    after = rows['iter 1 grad_norm after clip_grad']
    assert before['same'] and after['same']
    assert report['stock']['clip_grad'] == dict(type='norm', max_norm=10)
    assert abs(after['stock'] - 10) < 1e-3 < before['stock'] - 10
    assert 'clip_grad by norm: max_norm=10' in printed
    # the same first step without clip_grad: its gradient norm is the
    # clipped run's norm before clipping
    args = parity.parse_args(
        [CONFIGS['yolox'], '--iters', '1', '--cfg-options', *options])
    cfg = Config.fromfile(CONFIGS['yolox'])
    cfg.merge_from_dict(args.cfg_options)
    plain = run_once(
        parity_config(cfg, 'stock', 1, False, str(tmp_path / 'plain')))
    assert plain['clip_grad'] is None and plain['grad_norm_clipped'] == []
    assert abs(plain['grad_norm'][0] - before['stock']) < \
        1e-5 * before['stock']


def test_parity_catches_one_changed_value(sample_data, tmp_path, capsys):
    code = parity.main([
        CONFIGS['yolox'], '--iters', '1', '--work-dir',
        str(tmp_path), '--fast-hooks', 'PerturbFirstBatchHook',
        '--cfg-options', *parity_options('yolox', sample_data)
    ])
    printed = capsys.readouterr().out
    assert code == 1
    assert 'result: DIFFERENT' in printed and '**NO**' in printed


# --------------------------------------------------------------------------
# The training-order row
# --------------------------------------------------------------------------
def recorded(batches):
    """A run's record as ``ParityRecorderHook`` fills it from ``batches``."""
    record = {}
    hook = ParityRecorderHook(record)
    for i, batch in enumerate(batches):
        hook.before_train_iter(None, i, batch)
    # equal losses and parameters on both sides: only the order can differ
    record['losses'] = [dict(loss=1.0) for _ in batches]
    record['grad_norm'] = [2.0 for _ in batches]
    torch.manual_seed(0)
    record['checksum'] = params_checksum(torch.nn.Linear(2, 2))
    return record


def test_sample_ids_of_stock_and_packed_batches():
    samples = yolox_samples(4, size=32, max_boxes=2)
    assert batch_sample_ids(pseudo_collate(samples)) == [0, 1, 2, 3]
    assert batch_sample_ids(packed_collate(samples[::-1])) == [3, 2, 1, 0]
    clouds = pointpillars_samples(2, min_points=10, max_points=20, max_boxes=2)
    assert batch_sample_ids(pseudo_collate(clouds)) == [0, 1]  # sample_idx
    assert batch_sample_ids(packed_collate(clouds[::-1])) == [1, 0]
    # no sample index: the file the sample came from
    for sample in samples:
        del sample['data_samples'].img_id
    assert batch_sample_ids(packed_collate(
        samples[:2])) == ['synthetic/000000.jpg', 'synthetic/000001.jpg']


def test_order_row_same_and_different():
    samples = yolox_samples(6, size=32, max_boxes=2)
    stock = recorded([pseudo_collate(samples[i:i + 2]) for i in (0, 2, 4)])
    assert stock['order'] == [[0, 1], [2, 3], [4, 5]]

    fast = recorded([packed_collate(samples[i:i + 2]) for i in (0, 2, 4)])
    assert fast['packed'] == 3
    rows = compare(stock, fast)
    assert rows[0]['what'] == ORDER_ROW
    assert rows[0]['same'] is True and rows[0]['first_difference'] is None
    assert rows[0]['stock'] == rows[0]['fast'] == '[0, 1] [2, 3] [4, 5]'

    # the second batch holds other samples: the first difference is iter 2
    order = [[0, 1], [3, 2], [4, 5]]
    fast = recorded(
        [packed_collate([samples[i] for i in ids]) for ids in order])
    rows = compare(stock, fast)
    row = rows[0]
    assert row['what'] == ORDER_ROW and row['same'] is False
    assert row['first_difference'] == dict(iter=2, stock=[2, 3], fast=[3, 2])
    assert row['detail'] == 'iter 2: stock [2, 3] / fast [3, 2]'
    assert (row['stock'], row['fast']) == ('iter 2: [2, 3]', 'iter 2: [3, 2]')
    assert verdict(rows) == 'DIFFERENT'
    assert all(r['same'] for r in rows[1:])  # only the order differs here
    table = format_table(rows)
    assert 'iter 2: [2, 3]' in table and 'iter 2: [3, 2]' in table
    assert '**NO**' in table.splitlines()[2]

    # one run made an iteration more
    fast = recorded([packed_collate(samples[i:i + 2]) for i in (0, 2)])
    row = compare(stock, fast)[0]
    assert row['first_difference'] == dict(iter=3, stock=[4, 5], fast=None)
    assert row['detail'] == 'iter 3: stock [4, 5] / fast no iteration'


def test_sample_ids_of_multibranch_batches():
    """mmdet's semi-supervised batches: ``data_samples`` is a dict of
    branches, each with a data sample or None per sample."""
    from mmdet.registry import TRANSFORMS
    from mmdet.structures import DetDataSample
    from mmdet.utils import register_all_modules
    register_all_modules()
    branches = ['sup', 'unsup_teacher', 'unsup_student']
    pack = dict(type='PackDetInputs')
    sup = TRANSFORMS.build(
        dict(type='MultiBranch', branch_field=branches, sup=pack))
    unsup = TRANSFORMS.build(
        dict(
            type='MultiBranch',
            branch_field=branches,
            unsup_teacher=[pack],
            unsup_student=[pack]))

    def image(i):
        return dict(
            img=np.full((16, 16, 3), i, np.uint8),
            img_id=i,
            img_path=f'coco/{i:06d}.jpg',
            ori_shape=(16, 16),
            img_shape=(16, 16))

    samples = [sup(image(7)), unsup(image(3)), unsup(image(5))]
    stock = pseudo_collate(samples)
    assert stock['data_samples']['sup'][1] is None  # the shape read here
    assert stock['data_samples']['unsup_student'][2].img_id == 5
    assert batch_sample_ids(stock) == [7, 3, 5]
    assert batch_sample_ids(packed_collate(samples[::-1])) == [5, 3, 7]
    # the training-order row reads them on both paths
    a = recorded([pseudo_collate(samples[:2]), pseudo_collate(samples[2:])])
    b = recorded([packed_collate(samples[:2]), packed_collate(samples[2:])])
    row = compare(a, b)[0]
    assert row['same'] and row['stock'] == row['fast'] == '[7, 3] [5]'
    c = recorded([packed_collate(samples[1:]), packed_collate(samples[:1])])
    row = compare(a, c)[0]
    assert row['first_difference'] == dict(iter=1, stock=[7, 3], fast=[3, 5])
    # branches of one sample that name different samples: both kept
    odd = {
        'data_samples': {
            'sup': [DetDataSample(metainfo=dict(img_id=1))],
            'unsup_teacher': [DetDataSample(metainfo=dict(img_id=2))]
        }
    }
    assert batch_sample_ids(odd) == [{'sup': 1, 'unsup_teacher': 2}]


def test_packed_batches_row_differs_by_design():
    samples = yolox_samples(4, size=32, max_boxes=2)
    stock = recorded([pseudo_collate(samples[i:i + 2]) for i in (0, 2)])
    fast = recorded([packed_collate(samples[i:i + 2]) for i in (0, 2)])

    def packed_row(rows):
        (row, ) = [r for r in rows if r['what'] == 'packed batches']
        (line, ) = [
            ln for ln in format_table(rows).splitlines()
            if ln.startswith('| packed batches')
        ]
        return row, line

    rows = compare(stock, fast)
    row, line = packed_row(rows)
    assert (row['stock'], row['fast'], row['same'],
            row['by_design']) == (0, 2, True, 'stock 0, fast 2')
    assert 'n/a (differs by design)' in line and 'yes' not in line
    assert verdict(rows) == 'IDENTICAL'
    # a "fast" run that trained on unpacked batches fails the row
    rows = compare(stock, stock)
    row, line = packed_row(rows)
    assert row['same'] is False
    assert '**NO** (must be stock 0, fast 2)' in line
    assert verdict(rows) == 'DIFFERENT'


@pytest.fixture(scope='module')
def mixed_coco(tmp_path_factory):
    """A COCO set of 16 train images, landscape and portrait mixed."""
    from mmdet.datasets import CocoDataset
    root = tmp_path_factory.mktemp('order') / 'coco'
    load_tool('make_sample_data').make_coco(root, ORDER_IMAGES, 1, seed=0)
    ds = CocoDataset(
        data_root=str(root),
        ann_file='annotations/instances_train2017.json',
        data_prefix=dict(img='train2017/'),
        pipeline=[],
        filter_cfg=dict(filter_empty_gt=True, min_size=32))
    portrait = [
        ds.get_data_info(i)['width'] < ds.get_data_info(i)['height']
        for i in range(len(ds))
    ]
    # AspectRatioBatchSampler groups by orientation; more batches than the
    # workers prefetch
    assert len(ds) >= 14 and 0 < sum(portrait) < len(ds)
    return root


def test_parity_training_order_aspect_ratio_sampler(mixed_coco, tmp_path,
                                                    capsys):
    """An upstream config, iteration loop, stateful batch sampler: the fast
    run must train on stock's batches, and the report must say so."""
    assert osp.exists(RETINANET_R18), RETINANET_R18
    out = tmp_path / 'report.json'
    code = parity.main([
        RETINANET_R18, '--iters', '2', '--out',
        str(out), '--work-dir',
        str(tmp_path), '--cfg-options',
        f'train_dataloader.dataset.data_root={mixed_coco}/',
        'train_dataloader.dataset.pipeline.2.scale=(128,128)',
        'train_dataloader.batch_size=2', 'train_dataloader.num_workers=2',
        'model.backbone.init_cfg=None'
    ])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    (row, ) = [r for r in report['rows'] if r['what'] == ORDER_ROW]
    stock, fast = report['stock']['order'], report['fast']['order']
    assert len(stock) == 2 and all(len(ids) == 2 for ids in stock)
    assert all(isinstance(i, int) for ids in stock for i in ids)  # img_id
    assert row['same'], f"training order {row['detail']}\n{printed}"
    assert fast == stock
    assert row['stock'] == row['fast'] == ' '.join(f'[{a}, {b}]'
                                                   for a, b in stock)
    assert 'training order: IDENTICAL' in printed
    assert code == 0, printed
    assert 'result: IDENTICAL' in printed
    assert report['ok'] is True and report['verdict'] == 'IDENTICAL'


def test_cuda_determinism_sets_the_cublas_workspace_or_says_what_to_set():
    from fast_parallel.parity.runner import cuda_determinism
    env = {}
    note = cuda_determinism(
        True, env, cuda_available=True, cuda_initialized=False)
    assert env == {'CUBLAS_WORKSPACE_CONFIG': ':4096:8'}
    assert 'CUBLAS_WORKSPACE_CONFIG=:4096:8' in note
    # already set (by the user, or by the first call): left as it is
    env = {'CUBLAS_WORKSPACE_CONFIG': ':16:8'}
    assert cuda_determinism(
        True, env, cuda_available=True, cuda_initialized=True) is None
    assert env == {'CUBLAS_WORKSPACE_CONFIG': ':16:8'}
    # CUDA started before: too late to set, so it says what to export
    with pytest.raises(RuntimeError, match='export CUBLAS_WORKSPACE_CONFIG'):
        cuda_determinism(True, {}, cuda_available=True, cuda_initialized=True)
    # no CUDA, or not deterministic: nothing to do
    for deterministic, cuda in ((True, False), (False, True)):
        env = {}
        assert cuda_determinism(
            deterministic, env, cuda_available=cuda,
            cuda_initialized=False) is None
        assert env == {}


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA (mixed precision)')
def test_amp_parity_on_cuda(sample_data, tmp_path, capsys):
    """The documented AMP parity run: both runs under AmpOptimWrapper, the
    targets batched for float16 outputs, every value identical."""
    code = parity.main([
        CONFIGS['yolox'], '--iters', '2', '--amp', '--work-dir',
        str(tmp_path), '--cfg-options', *parity_options('yolox', sample_data)
    ])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert 'result: IDENTICAL' in printed
    log = (tmp_path / 'fast' / 'output.log').read_text()
    assert 'AmpOptimWrapper' in log
    assert 'computed the stock way' not in log


@pytest.mark.skipif(torch.cuda.is_available(), reason='--amp works here')
def test_amp_parity_without_gpu_is_a_clear_error():
    with pytest.raises(SystemExit, match='--amp needs a GPU'):
        parity.main([CONFIGS['yolox'], '--iters', '1', '--amp'])


def test_each_run_starts_on_the_thread_count_of_the_start():
    """What a run leaves (numba's first launch sets OpenMP's count) is put
    back before the next run and on exit, with a note naming it."""
    start = torch.get_num_threads()
    other = 1 if start > 1 else 2
    notes = []
    with same_cpu_threads(notes) as start_run:
        start_run('stock')
        assert notes == []
        torch.set_num_threads(other)
        start_run('fast')
        assert torch.get_num_threads() == start
        torch.set_num_threads(other)
    assert torch.get_num_threads() == start
    assert notes == [
        f'the stock run left torch at {other} CPU threads (numba\'s '
        f'parallel kernels, e.g. mmdet3d\'s KITTI evaluation, set them); '
        f'the fast run started at {start}, as the stock run did'
    ]


def test_epoch_switch_notes_say_which_pipeline_a_parity_run_uses():
    """An iteration-based parity run has one epoch: the recipes' epoch
    switches happen at its start or never, and the report says which."""
    yolox = Config.fromfile(CONFIGS['yolox'])
    rtmdet = Config.fromfile(
        osp.join(
            get_installed_path('mmdet'), '.mim', 'configs', 'rtmdet',
            'rtmdet_tiny_8xb32-300e_coco.py'))
    assert epoch_switch_notes(yolox)[0].startswith(
        'YOLOXModeSwitchHook(num_last_epochs=1) switches at the start')
    assert epoch_switch_notes(rtmdet) == [
        'PipelineSwitchHook(switch_epoch=280) never switches in a parity '
        'run: both runs use the first pipeline; switch_epoch=0 compares '
        'its switch_pipeline'
    ]
    for cfg, kind, key, value in ((yolox, 'YOLOXModeSwitchHook',
                                   'num_last_epochs', -1),
                                  (rtmdet, 'PipelineSwitchHook',
                                   'switch_epoch', 0)):
        for hook in cfg.custom_hooks:
            if hook['type'] == kind:
                hook[key] = value
    assert 'never switches in a parity run: both runs mix' in \
        epoch_switch_notes(yolox)[0]
    assert 'switches at the start' in epoch_switch_notes(rtmdet)[0]
    assert epoch_switch_notes(Config(dict(custom_hooks=[]))) == []
