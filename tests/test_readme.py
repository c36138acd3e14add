"""The commands of the README and of every page in docs/ work as printed.

Every command in README.md and docs/*.md (lines of their ``bash`` blocks,
and inline code that starts with ``python``, ``.venv/bin/python``,
``tools/...sh`` or ``make``) is checked: the tool or config it names exists
and the tool's own argument parser accepts its flags. The cheap ones of the
"for example" block run for real, from the repository root, with this
environment's ``python`` first on ``PATH`` (what ``source
.venv/bin/activate`` gives). The README stays one short page whose first
screen carries what a user needs; its config blocks load; the pages' links
lead somewhere.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import load_tool

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text()
#: README.md and every docs/*.md, by path relative to the repository.
PAGES: Dict[str, str] = {
    'README.md': README,
    **{
        f'docs/{p.name}': p.read_text()
        for p in sorted((ROOT / 'docs').glob('*.md'))
    },
}
#: The README's length limit, and what its first screen must hold.
README_MAX_LINES = 260
FIRST_SCREEN_LINES = 60
FIRST_SCREEN = (
    "custom_imports = dict(imports=['fast_parallel'], "
    "allow_failed_imports=False)",
    "custom_hooks = [dict(type='FastParallelHook')]",
    '*_base_.custom_hooks',
    'pip install',
    'FastParallelHook: on:',
    'fast_parallel.disable(cfg)',
    '--no-fast',
    'tools/parity.py my_config.py',
    '`make demo`',
    '`make test`',
    'No GPU has timed it yet',
    '40 -> 3',
    '18 -> 2',
    'GPU iteration time | not measured',
)
#: Commands run for real (seconds each), with the exit code they must give.
CHEAP = {
    'python tools/make_sample_data.py --out data/sample':
    0,
    'python tools/demo.py --packing-only':
    0,
    'python tools/parity.py configs/yolox/yolox_tiny_fast_sample.py '
    '--iters 1 --fast-hooks PerturbFirstBatchHook':
    1,
}
_INLINE = re.compile(r'`((?:\.venv/bin/)?python [^`]+|tools/\w+\.sh [^`]+|'
                     r'make [a-z][^`]*)`')
_LINK = re.compile(r'\]\(([^)\s]+)\)')


def page_commands(text: str) -> List[str]:
    """Every command a page prints."""
    commands = []
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        for line in block.splitlines():
            line = line.split('  #')[0].strip()
            if line and not line.startswith('#'):
                commands.append(line)
    commands += [m.group(1) for m in _INLINE.finditer(text)]
    return commands


def readme_commands() -> List[str]:
    """Every command the README prints."""
    return page_commands(README)


def all_commands() -> List[Tuple[str, str]]:
    """``(page, command)`` for every command of README.md and docs/*.md."""
    return [(page, command) for page, text in PAGES.items()
            for command in dict.fromkeys(page_commands(text))]


def python_blocks(text: str) -> List[str]:
    """The page's ``python`` code blocks."""
    return re.findall(r'```python\n(.*?)```', text, re.S)


def _placeholder(arg: str) -> bool:
    """``CONFIG``, ``GPUS``, ``OUT.json``, ``/path/to/...``: not literal."""
    return bool(re.fullmatch(r'[A-Z][A-Z_]*(\.\w+)?', arg)) or \
        arg.startswith('/path/to')


def _readers_file(arg: str) -> bool:
    """``my_config.py``: the reader's own file, not in this repository (the
    tool's flags are still checked)."""
    return bool(re.fullmatch(r'my_\w*\.py', arg))


def _upstream_config(name: str) -> Path:
    """Where ``mmdet::x.py`` / ``mmdet3d::x.py`` is in the installed
    package (what ``mmengine.hub.get_config`` reads)."""
    import importlib.util
    package, rel = name.split('::')
    root = Path(importlib.util.find_spec(package).origin).parent
    return root / '.mim' / 'configs' / rel


def check(command: str) -> None:
    """Asserts the command's files exist and its tool parses its flags."""
    argv = shlex.split(command)
    while re.fullmatch(r'[A-Z_][A-Z0-9_]*=\S*', argv[0]):
        argv = argv[1:]  # the shell's variable assignments before a command
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
        if re.fullmatch(r'mmdet3?d?::\S+\.py', arg):
            assert _upstream_config(arg).is_file(), f'{command}: no {arg}'
        elif arg.endswith('.py') and not (_placeholder(arg)
                                          or _readers_file(arg)):
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
    commands = [command for _, command in all_commands()]
    assert len(commands) > 15
    for cheap in CHEAP:
        assert cheap in commands, cheap
    readme = readme_commands()
    for command in ('make demo', 'make test',
                    'python tools/parity.py my_config.py --iters 4 --eval'):
        assert command in readme, command


def test_docs_pages_are_checked():
    """The pages the README's first screen moved out are there and read."""
    for page in ('docs/design.md', 'docs/benchmark.md', 'docs/reliability.md',
                 'docs/tools.md', 'docs/troubleshooting.md',
                 'docs/parity-examples.md', 'docs/resume.md'):
        assert page in PAGES, page
    assert any(page != 'README.md' for page, _ in all_commands())


@pytest.mark.parametrize('page,command', all_commands())
def test_command_names_real_files_and_flags(page, command):
    check(command)


def _measured_counts() -> List[str]:
    """The README's operation and .item() figures, from the benchmark's
    JSON (``docs/benchmark_ops.json``), as the README writes them."""
    import json
    ops = json.loads((ROOT / 'docs' / 'benchmark_ops.json').read_text())['ops']
    out = []
    for name in ('yolox_s', 'pointpillars'):
        r = ops[name]
        out.append(f'{r["stock"]["total"]:,.0f} -> {r["fast"]["total"]:,.0f} '
                   f'({r["ratio"]:.2f})')
        out.append(f'{r["stock"]["items"]:.0f} -> {r["fast"]["items"]:.0f}')
    for name in ('rtmdet_tiny', 'retinanet_r50', 'faster_rcnn_r50',
                 'centerpoint_pillar'):  # the zoo row
        r = ops[name]
        out.append(f'{r["stock"]["total"]:,.0f} -> {r["fast"]["total"]:,.0f} '
                   f'({r["ratio"]:.2f})')
    return out


def test_readme_is_one_short_page():
    lines = README.splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    first_screen = '\n'.join(lines[:FIRST_SCREEN_LINES])
    for needed in FIRST_SCREEN + tuple(_measured_counts()):
        assert needed in first_screen, needed


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped."""
    slug = re.sub(r'[^\w\- ]', '', heading.strip().lower())
    return slug.replace(' ', '-')


def _links() -> List[Tuple[str, str]]:
    return [(page, link) for page, text in PAGES.items()
            for link in dict.fromkeys(_LINK.findall(text))
            if not re.match(r'[a-z]+:', link)]


@pytest.mark.parametrize('page,link', _links())
def test_links_lead_somewhere(page, link):
    """Every relative link (and its ``#anchor``) of README and docs."""
    path, _, anchor = link.partition('#')
    target = (ROOT / page).parent / path if path else ROOT / page
    assert target.exists(), f'{page}: {link}'
    if anchor:
        text = target.read_text()
        headings = re.findall(r'^#+ (.*)$',
                              re.sub(r'```.*?```', '', text, flags=re.S), re.M)
        assert anchor in {_anchor(h) for h in headings}, f'{page}: {link}'


def test_readme_config_blocks_load(tmp_path):
    """The two lines load as a config and register the hook; the ``_base_``
    form keeps the base's ``custom_hooks`` and adds the two hooks."""
    from mmengine.config import Config
    from mmengine.registry import HOOKS
    (two_lines, ) = [
        b for b in python_blocks(README)
        if 'FastParallelHook' in b and '_base_' not in b
    ]
    path = tmp_path / 'two_lines.py'
    path.write_text(two_lines)
    cfg = Config.fromfile(str(path))
    assert [h['type'] for h in cfg.custom_hooks] == ['FastParallelHook']
    assert HOOKS.get('FastParallelHook') is not None
    (based, ) = [
        b for b in python_blocks(README) if '*_base_.custom_hooks' in b
    ]
    path = tmp_path / 'my_config.py'
    path.write_text(based)
    cfg = Config.fromfile(str(path))
    (base_line, ) = [
        ln for ln in based.splitlines() if ln.startswith('_base_ = ')
    ]
    (tmp_path / 'upstream.py').write_text(base_line + '\n')
    base = Config.fromfile(str(tmp_path / 'upstream.py'))
    assert base.custom_hooks  # the form is shown on a base that has some
    assert cfg.custom_hooks == base.custom_hooks + [
        dict(type='FastParallelHook'),
        dict(type='ExactResumeHook')
    ]


@pytest.mark.parametrize('command', list(CHEAP))
def test_cheap_command_runs_as_printed(command):
    env = dict(os.environ)
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env['PATH']
    done = subprocess.run(['bash', '-c', command],
                          cwd=ROOT,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert done.returncode == CHEAP[command], done.stderr[-3000:]
    if CHEAP[command] == 1:
        assert 'result: DIFFERENT' in done.stdout


def _without_scope(tree, scope):
    """``tree`` (dicts and lists) without its ``_scope_=scope`` keys."""
    if isinstance(tree, dict):
        return {
            k: _without_scope(v, scope)
            for k, v in tree.items() if not (k == '_scope_' and v == scope)
        }
    if isinstance(tree, (list, tuple)):
        return [_without_scope(v, scope) for v in tree]
    return tree


def test_pointpillars_cpu_block_is_a_working_config(tmp_path):
    """The PointPillars-on-a-CPU block (README or docs) loads as a config on
    top of mmdet3d's recipe, imports what it names, changes just the db
    sampler's and the evaluators' types, and those types are registered."""
    from mmdet3d.datasets.transforms.dbsampler import DataBaseSampler
    from mmdet3d.evaluation.metrics import KittiMetric
    from mmdet3d.registry import METRICS, TRANSFORMS
    from mmengine.config import Config
    (block, ) = [
        b for text in PAGES.values() for b in python_blocks(text)
        if 'DataBaseSamplerNp124' in b
    ]
    path = tmp_path / 'pointpillars_cpu.py'
    path.write_text(block)
    cfg = Config.fromfile(str(path))  # imports its custom_imports
    # upstream's recipe alone, read the same way
    (base_line, ) = [
        ln for ln in block.splitlines() if ln.startswith('_base_ = ')
    ]
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
        assert {
            k: v
            for k, v in cfg[key].items() if k != 'type'
        } == {
            k: v
            for k, v in base[key].items() if k != 'type'
        }, key
        metric = METRICS.build(cfg[key])
        assert isinstance(metric, KittiMetric), key
        assert type(metric).__name__ == 'KittiMetricCPU'
    assert '_step' not in cfg
