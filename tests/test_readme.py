"""The README's commands work as printed.

Every command in the README (lines of its ``bash`` blocks, and inline code
that starts with ``python``, ``.venv/bin/python``, ``tools/...sh`` or
``make``) is checked: the tool or config it names exists and the tool's own
argument parser accepts its flags. The cheap ones of the "for example"
block run for real, from the repository root, with this environment's
``python`` first on ``PATH`` (what ``source .venv/bin/activate`` gives).
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from conftest import load_tool

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text()
#: Commands run for real (seconds each), with the exit code they must give.
CHEAP = {
    'python tools/make_sample_data.py --out data/sample': 0,
    'python tools/demo.py --packing-only': 0,
    'python tools/parity.py configs/yolox/yolox_tiny_fast_sample.py '
    '--iters 1 --fast-hooks PerturbFirstBatchHook': 1,
}
_INLINE = re.compile(r'`((?:\.venv/bin/)?python [^`]+|tools/\w+\.sh [^`]+|'
                     r'make [a-z][^`]*)`')


def readme_commands() -> List[str]:
    """Every command the README prints."""
    commands = []
    for block in re.findall(r'```bash\n(.*?)```', README, re.S):
        for line in block.splitlines():
            line = line.split('  #')[0].strip()
            if line and not line.startswith('#'):
                commands.append(line)
    commands += [m.group(1) for m in _INLINE.finditer(README)]
    return commands


def _placeholder(arg: str) -> bool:
    """``CONFIG``, ``GPUS``, ``OUT.json``, ``/path/to/...``: not literal."""
    return bool(re.fullmatch(r'[A-Z][A-Z_]*(\.\w+)?', arg)) or \
        arg.startswith('/path/to')


def check(command: str) -> None:
    """Asserts the command's files exist and its tool parses its flags."""
    argv = shlex.split(command)
    if argv[0] in ('source', 'pip'):
        return
    if argv[0] == 'make':
        makefile = (ROOT / 'Makefile').read_text()
        targets = [a for a in argv[1:] if '=' not in a]
        for target in targets:
            assert re.search(rf'^{target}:', makefile, re.M), command
        return
    if argv[0].endswith('python'):
        argv = argv[1:]
        if argv[:2] == ['-m', 'pytest']:
            for arg in argv[2:]:
                if not arg.startswith('-'):
                    assert (ROOT / arg).exists(), command
            return
    script = argv[0]
    assert (ROOT / script).exists(), command
    args = argv[1:]
    for arg in args:
        if arg.endswith('.py') and not _placeholder(arg):
            assert (ROOT / arg).exists(), f'{command}: no {arg}'
    if script.endswith('.sh') or any(_placeholder(a) for a in args):
        return
    tool = load_tool(Path(script).stem)
    try:
        tool.parse_args(args)
    except SystemExit as exit_:
        raise AssertionError(f'{command}: the tool refuses its flags '
                             f'({exit_.code})') from None


def test_readme_lists_the_commands():
    commands = readme_commands()
    assert len(commands) > 15
    for cheap in CHEAP:
        assert cheap in commands, cheap


@pytest.mark.parametrize('command', readme_commands())
def test_command_names_real_files_and_flags(command):
    check(command)


@pytest.mark.parametrize('command', list(CHEAP))
def test_cheap_command_runs_as_printed(command):
    env = dict(os.environ)
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env['PATH']
    done = subprocess.run(['bash', '-c', command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == CHEAP[command], done.stderr[-3000:]
    if CHEAP[command] == 1:
        assert 'result: DIFFERENT' in done.stdout


def _without_scope(tree, scope):
    """``tree`` (dicts and lists) without its ``_scope_=scope`` keys."""
    if isinstance(tree, dict):
        return {k: _without_scope(v, scope) for k, v in tree.items()
                if not (k == '_scope_' and v == scope)}
    if isinstance(tree, (list, tuple)):
        return [_without_scope(v, scope) for v in tree]
    return tree


def test_pointpillars_cpu_block_is_a_working_config(tmp_path):
    """The README's PointPillars-on-a-CPU block loads as a config on top of
    mmdet3d's recipe, imports what it names, changes just the db sampler's
    and the evaluators' types, and those types are registered."""
    from mmdet3d.datasets.transforms.dbsampler import DataBaseSampler
    from mmdet3d.evaluation.metrics import KittiMetric
    from mmdet3d.registry import METRICS, TRANSFORMS
    from mmengine.config import Config
    (block, ) = [b for b in re.findall(r'```python\n(.*?)```', README, re.S)
                 if 'DataBaseSamplerNp124' in b]
    path = tmp_path / 'pointpillars_cpu.py'
    path.write_text(block)
    cfg = Config.fromfile(str(path))  # imports its custom_imports
    # upstream's recipe alone, read the same way
    (base_line, ) = [ln for ln in block.splitlines()
                     if ln.startswith('_base_ = ')]
    assert 'mmdet3d::pointpillars/' in base_line
    (tmp_path / 'upstream.py').write_text(base_line + '\n')
    base = Config.fromfile(str(tmp_path / 'upstream.py'))
    pipeline = cfg.train_dataloader.dataset.dataset.pipeline
    expected = base.train_dataloader.dataset.dataset.pipeline
    (step, ) = [s for s in expected if s.type == 'ObjectSample']
    # upstream names no type: ObjectSample builds DataBaseSampler then
    assert step.db_sampler.get('type', 'DataBaseSampler') == 'DataBaseSampler'
    step.db_sampler['type'] = 'DataBaseSamplerNp124'
    # all else as upstream (``_base_.train_pipeline`` from another package
    # comes with ``_scope_='mmdet3d'``, mmdet3d's own scope)
    assert _without_scope(pipeline, 'mmdet3d') == expected
    assert issubclass(TRANSFORMS.get('DataBaseSamplerNp124'), DataBaseSampler)
    for key in ('val_evaluator', 'test_evaluator'):
        assert cfg[key].type == 'KittiMetricCPU', key
        assert {k: v for k, v in cfg[key].items() if k != 'type'} == {
            k: v for k, v in base[key].items() if k != 'type'}, key
        metric = METRICS.build(cfg[key])
        assert isinstance(metric, KittiMetric), key
        assert type(metric).__name__ == 'KittiMetricCPU'
    assert '_step' not in cfg
