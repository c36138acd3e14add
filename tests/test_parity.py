"""tools/parity.py on both small configs, and its failure detection."""
import json

import pytest
import torch
from conftest import load_tool
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from models import CONFIGS
from runner_utils import data_options

from fast_parallel import PackedBatch

parity = load_tool('parity')


def parity_options(kind, root):
    options = data_options(kind, root)
    if kind == 'pointpillars':  # numba JIT-compiles in each new process
        options += ['train_dataloader.num_workers=0',
                    'val_dataloader.num_workers=0']
    return options


@pytest.mark.parametrize('kind', ['yolox', 'pointpillars'])
def test_parity_identical_with_eval(kind, sample_data, tmp_path, capsys):
    out = tmp_path / 'report.json'
    code = parity.main([
        CONFIGS[kind], '--iters', '2', '--eval', '--out', str(out),
        '--work-dir', str(tmp_path), '--cfg-options',
        *parity_options(kind, sample_data)
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
        *parity_options('yolox', sample_data)
    ])
    printed = capsys.readouterr().out
    assert code == 1
    assert 'result: DIFFERENT' in printed and '**NO**' in printed
