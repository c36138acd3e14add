"""Shared pieces of the batched-target tests: the devices they run on and
one run of ``tools/parity.py`` on a small upstream config."""
import json
from pathlib import Path
from typing import Sequence

import pytest
import torch

#: The CPU, and CUDA where there is one (skipped cleanly without).
DEVICES = [
    'cpu',
    pytest.param(
        'cuda',
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(), reason='needs CUDA'))
]


def small_parity(base: str,
                 transforms: Sequence[str],
                 sample_data: Path,
                 tmp_path: Path,
                 capsys,
                 load: str = "dict(type='LoadAnnotations', with_bbox=True)",
                 model: str = '') -> str:
    """``tools/parity.py`` on the upstream config ``base`` (no pretrained
    weights), trained on the sample COCO images with the pipeline
    ``LoadImageFromFile``, ``LoadAnnotations``, ``transforms``,
    ``PackDetInputs``, batch 2, 2 iterations: asserts the result is
    IDENTICAL and returns both runs' logs.

    Args:
        base (str): ``mmdet::...`` config.
        transforms (Sequence[str]): The pipeline's middle transforms, as
            config text (``"dict(type='RandomFlip', prob=0.5)"``).
        sample_data (Path): The ``sample_data`` fixture.
        tmp_path (Path): The test's folder.
        capsys: The test's ``capsys``.
        load (str): The annotations' loading step (masks too: add
            ``with_mask=True``).
        model (str): More keys of the config's ``model``, as config text
            (``", train_cfg=dict(initial_epoch=0)"``).

    Returns:
        str: The text of every ``*.log`` the runs wrote.
    """
    from conftest import load_tool

    from fast_parallel.bench.presets import data_options
    out = tmp_path / 'report.json'
    config = tmp_path / 'small.py'
    steps = [
        "dict(type='LoadImageFromFile')", load, *transforms,
        "dict(type='PackDetInputs')"
    ]
    config.write_text(f"_base_ = '{base}'\n"
                      f'model = dict(backbone=dict(init_cfg=None){model})\n'
                      'train_dataloader = dict(batch_size=2, num_workers=0, '
                      'persistent_workers=False, dataset=dict(pipeline=[\n' +
                      ''.join(f'    {step},\n' for step in steps) + ']))\n')
    code = load_tool('parity').main([
        str(config), '--iters', '2', '--out',
        str(out), '--work-dir',
        str(tmp_path), '--cfg-options', *data_options('mmdet', sample_data)
    ])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert 'result: IDENTICAL' in printed
    report = json.loads(out.read_text())
    assert report['ok'] is True and len(report['fast']['losses']) == 2
    return ''.join(p.read_text() for p in tmp_path.rglob('*.log'))
