"""tools/parity.py on both small configs, and its failure detection."""
import json

import pytest
import torch
from conftest import load_tool
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from models import CONFIGS

from fast_parallel import PackedBatch

parity = load_tool('parity')


def data_options(kind, root):
    if kind == 'yolox':
        coco = f'{root}/coco/'
        return [f'train_dataloader.dataset.dataset.data_root={coco}',
                f'val_dataloader.dataset.data_root={coco}',
                f'val_evaluator.ann_file={coco}annotations/'
                'instances_val2017.json']
    kitti = f'{root}/kitti/'
    return [f'train_dataloader.dataset.dataset.data_root={kitti}',
            'train_dataloader.dataset.dataset.pipeline.2.db_sampler.'
            f'data_root={kitti}',
            'train_dataloader.dataset.dataset.pipeline.2.db_sampler.'
            f'info_path={kitti}kitti_dbinfos_train.pkl',
            f'val_dataloader.dataset.data_root={kitti}',
            f'val_evaluator.ann_file={kitti}kitti_infos_val.pkl',
            # numba JIT-compiles in each new process: stay in this one
            'train_dataloader.num_workers=0', 'val_dataloader.num_workers=0']


@pytest.mark.parametrize('kind', ['yolox', 'pointpillars'])
def test_parity_identical_with_eval(kind, sample_data, tmp_path, capsys):
    out = tmp_path / 'report.json'
    code = parity.main([
        CONFIGS[kind], '--iters', '2', '--eval', '--out', str(out),
        '--work-dir', str(tmp_path), '--cfg-options',
        *data_options(kind, sample_data)
    ])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert 'result: IDENTICAL' in printed
    report = json.loads(out.read_text())
    assert report['ok'] is True
    whats = [r['what'] for r in report['rows']]
    assert 'iter 2 loss' in whats and 'iter 2 grad_norm' in whats
    assert 'params sha256' in whats
    assert report['stock']['metrics'] and \
        report['stock']['metrics'] == report['fast']['metrics']
    assert len(report['fast']['losses']) == 2


@HOOKS.register_module()
class PerturbOneValueHook(Hook):
    """Changes one value of the first packed batch (fast path only)."""

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if batch_idx == 0:
            assert isinstance(data_batch, PackedBatch)
            data_batch.buffers[torch.float32][0] += 1.0


def test_parity_catches_one_changed_value(sample_data, tmp_path, capsys):
    code = parity.main([
        CONFIGS['yolox'], '--iters', '1', '--work-dir', str(tmp_path),
        '--fast-hooks', 'PerturbOneValueHook', '--cfg-options',
        *data_options('yolox', sample_data)
    ])
    printed = capsys.readouterr().out
    assert code == 1
    assert 'result: DIFFERENT' in printed and '**NO**' in printed
