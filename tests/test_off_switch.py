"""``fast_parallel.disable`` (``--no-fast``, parity's stock run) on a config
that packs by itself: off means stock's collate, stock's batches.

The hook's fallback advice is ``collate_fn=dict(type='packed_collate')``; a
config with it must still train on the stock path (a stock model reads a
``dict`` batch, not a ``PackedBatch``).
"""
import json
import sys

import pytest
from conftest import load_tool
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from models import CONFIGS
from runner_utils import data_options
from test_tools import run_tool

import fast_parallel
from fast_parallel import PackedCollate, packed_collate
from fast_parallel.config import stock_collate_cfg

parity = load_tool('parity')
SOFT_TEACHER = ('mmdet::soft_teacher/'
                'soft-teacher_faster-rcnn_r50-caffe_fpn_180k_semi-0.1-coco.py')


@pytest.mark.parametrize('packed,stock', [
    (dict(type='packed_collate'), dict(type='pseudo_collate')),
    (dict(type=packed_collate), dict(type='pseudo_collate')),
    ('packed_collate', dict(type='pseudo_collate')),
    (packed_collate, dict(type='pseudo_collate')),
    (dict(type='packed_collate',
          inner=dict(type='default_collate')), dict(type='default_collate')),
    (PackedCollate(pseudo_collate), pseudo_collate),
    (dict(type='default_collate'), dict(type='default_collate')),
    (pseudo_collate, pseudo_collate),
])
def test_disable_puts_back_the_collate_the_packed_one_wraps(packed, stock):
    assert stock_collate_cfg(packed) == stock
    cfg = Config(
        dict(
            train_dataloader=dict(batch_size=2, collate_fn=packed),
            val_dataloader=dict(batch_size=1, collate_fn=packed),
            test_dataloader=dict(batch_size=1),
            custom_hooks=[dict(type='FastParallelHook')]))
    fast_parallel.disable(cfg)
    assert cfg.train_dataloader.collate_fn == stock
    assert cfg.val_dataloader.collate_fn == stock
    assert 'collate_fn' not in cfg.test_dataloader  # nothing added
    assert cfg.custom_hooks == []


def test_parity_identical_with_the_packed_collate_in_the_config(
        sample_data, tmp_path, capsys):
    """The stock run of parity.py used to crash ('PackedBatch' object is
    not subscriptable)."""
    out = tmp_path / 'report.json'
    code = parity.main([
        CONFIGS['yolox'], '--iters', '2', '--out',
        str(out), '--work-dir',
        str(tmp_path), '--cfg-options', *data_options('yolox', sample_data),
        'train_dataloader.collate_fn.type=packed_collate'
    ])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert 'result: IDENTICAL' in printed
    report = json.loads(out.read_text())
    # the stock run trained on stock's batches, the fast one on packed ones
    assert 'packed batches: as designed (stock 0, fast 2)' in printed
    assert len(report['stock']['losses']) == 2


def _soft_teacher_options(coco, anns) -> list:
    """Soft Teacher on the sample COCO images: 1 labelled + 1 unlabelled
    image per batch, small scales, no pretrained backbone, no validation."""
    scale = '[(200,96),(200,160)]'
    sets = 'train_dataloader.dataset.datasets'
    return [
        'train_cfg.max_iters=1', 'model.detector.backbone.init_cfg=None',
        'train_dataloader.collate_fn.type=packed_collate',
        'train_dataloader.batch_size=2', 'train_dataloader.num_workers=2',
        'train_dataloader.sampler.batch_size=2',
        'train_dataloader.sampler.source_ratio=[1,1]',
        f'{sets}.0.data_root={coco}', f'{sets}.1.data_root={coco}',
        f'{sets}.0.ann_file={anns[0]}', f'{sets}.1.ann_file={anns[1]}',
        f'{sets}.1.data_prefix.img=train2017/', f'{sets}.0.pipeline.2.scale='
        f'{scale}', f'{sets}.1.pipeline.2.unsup_teacher.0.scale={scale}',
        f'{sets}.1.pipeline.2.unsup_student.0.scale={scale}',
        'default_hooks.checkpoint=None', 'default_hooks.logger.interval=1',
        'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None',
        'test_cfg=None', 'test_dataloader=None', 'test_evaluator=None'
    ]


def test_no_fast_trains_soft_teacher_packed_by_its_config(
        sample_data, tmp_path):
    """mmdet's semi-supervised recipe (``MultiBranchDataPreprocessor``) with
    the packed collate in its config: ``--no-fast`` used to crash with
    "'PackedBatch' object has no attribute 'keys'"; the fast run trains on
    packed batches from its config."""
    coco = sample_data / 'coco'
    ann = json.loads(
        (coco / 'annotations/instances_train2017.json').read_text())
    half = len(ann['images']) // 2
    files = []
    for name, images, labelled in (('labelled', ann['images'][:half], True),
                                   ('unlabelled', ann['images'][half:],
                                    False)):
        ids = {image['id'] for image in images}
        part = dict(
            ann,
            images=images,
            annotations=[
                a for a in ann['annotations'] if a['image_id'] in ids
            ] if labelled else [])
        files.append(tmp_path / f'{name}.json')
        files[-1].write_text(json.dumps(part))
    config = tmp_path / 'soft_teacher_fast.py'
    config.write_text(
        f'_base_ = {SOFT_TEACHER!r}\n'
        "custom_imports = dict(imports=['fast_parallel'], "
        'allow_failed_imports=False)\n'
        "custom_hooks = [*_base_.custom_hooks, dict(type='FastParallelHook')]"
        '\n')
    options = _soft_teacher_options(f'{coco}/', files)
    stock = run_tool([
        sys.executable, 'tools/train.py',
        str(config), '--no-fast', '--work-dir',
        str(tmp_path / 'stock'), '--cfg-options', *options
    ])
    assert 'Iter(train) [1/1]' in stock and 'loss:' in stock
    assert 'FastParallelHook' not in stock and 'transfer_time' not in stock
    fast = run_tool([
        sys.executable, 'tools/train.py',
        str(config), '--work-dir',
        str(tmp_path / 'fast'), '--cfg-options', *options
    ])
    assert 'train packed by its config' in fast
    assert 'Iter(train) [1/1]' in fast and 'transfer_time' in fast
