"""``pip install .`` where torch, mmcv & co. are already installed.

A new virtual environment sees this environment's packages (torch, mmcv with
its ops, mmengine, mmdet: a user's training environment) through a ``.pth``
file; pip installs the package from a copy of the repository's tracked
files, offline. Nothing but fast_parallel may be installed, upgraded or
removed, and ``import fast_parallel`` must work there. The copy's tools
run there must import that installed package, not the copy's files.

pip replaces an installed distribution only when its version does not
satisfy a requirement. The test checks exactly that for every requirement
of the installed package (its ``Requires-Dist``, extras left out) and
installs with ``--no-deps``: this project's own environment holds
``setuptools<70`` (mmengine 0.10 needs ``pkg_resources``, mmcv 2.1 builds
with it) below what torch 2.13's metadata asks for, so an offline resolver
would stop on torch's own requirement, which is no requirement of ours.
"""
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PINNED = ('torch', 'mmcv', 'mmengine', 'mmdet', 'mmdet3d')


def _requirements(name):
    lines = (ROOT / 'requirements' / f'{name}.txt').read_text().splitlines()
    return [
        ln.strip() for ln in lines if ln.strip() and not ln.startswith('#')
    ]


def test_package_requirements_are_ranges():
    import setuptools  # noqa: F401 (setup.py reads requirements/*.txt)
    text = (ROOT / 'setup.py').read_text()
    assert "read_requirements('package')" in text
    for name in ('package', 'package-mmdet3d'):
        for req in _requirements(name):
            project = re.split(r'[<>=!~\[ ]', req, 1)[0].lower()
            assert '==' not in req, req
            if project in PINNED:
                assert '>=' in req, req


#: Prints the requirements of the installed fast_parallel that the installed
#: distributions do not satisfy (what pip would install or replace).
UNSATISFIED = '''
from importlib.metadata import requires, version, PackageNotFoundError
from packaging.requirements import Requirement
bad = []
for line in requires('fast_parallel'):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({'extra': ''}):
        continue  # an extra's requirement
    try:
        have = version(req.name)
    except PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        bad.append((str(req), have))
print('unsatisfied:', bad)
'''


def _tracked_copy(dest: Path) -> Path:
    """The repository's tracked files (what a clone has) under ``dest``."""
    files = subprocess.run(['git', 'ls-files'],
                           cwd=ROOT,
                           check=True,
                           capture_output=True,
                           text=True).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


needs_git = pytest.mark.skipif(shutil.which('git') is None, reason='needs git')


@pytest.fixture(scope='module')
def installed(tmp_path_factory) -> dict:
    """A new venv that sees this environment, with ``pip install`` of a
    copy of the repository's tracked files (not editable).

    Returns:
        dict: ``tmp_path``, ``python`` (the venv's), ``inner`` (its
        site-packages), ``src`` (the copy) and ``out`` (pip's output).
    """
    tmp_path = tmp_path_factory.mktemp('install')
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
    python = venv / 'bin' / 'python'
    inner = subprocess.run(
        [str(python), '-c', 'import site; print(site.getsitepackages()[0])'],
        check=True,
        capture_output=True,
        text=True).stdout.strip()
    # the user's environment: every package of this one, visible there
    Path(inner, 'user_env.pth').write_text(site.getsitepackages()[0] + '\n')
    src = _tracked_copy(tmp_path / 'clone')
    done = subprocess.run([
        str(python), '-m', 'pip', 'install', '--no-index', '--no-deps',
        '--no-build-isolation', '--no-cache-dir',
        '--disable-pip-version-check',
        str(src)
    ],
                          capture_output=True,
                          text=True,
                          cwd=tmp_path,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    return dict(
        tmp_path=tmp_path, python=python, inner=inner, src=src, out=out)


@needs_git
def test_pip_install_replaces_nothing(installed):
    import mmcv
    import mmengine
    import torch
    tmp_path, python, inner, out = (
        installed[k] for k in ('tmp_path', 'python', 'inner', 'out'))
    installed = re.search(r'Successfully installed (.*)', out)
    assert installed and [
        n.replace('-', '_') for n in installed.group(1).split()
    ] == ['fast_parallel_0.1.0'], out[-3000:]
    assert 'Successfully uninstalled' not in out, out[-3000:]
    check = subprocess.run([
        str(python), '-c',
        UNSATISFIED + 'import fast_parallel, torch, mmcv, mmcv.ops, mmengine; '
        'print(fast_parallel.__file__); '
        'print(torch.__version__, mmcv.__version__, mmengine.__version__)'
    ],
                           capture_output=True,
                           text=True,
                           cwd=tmp_path,
                           timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    unsatisfied, where, versions = check.stdout.split('\n')[:3]
    assert unsatisfied == 'unsatisfied: []'
    assert where.startswith(inner)  # the installed copy, not the repo's
    assert versions.split() == [
        torch.__version__, mmcv.__version__, mmengine.__version__
    ]


#: ``sitecustomize`` for the tool runs below: at exit, each process that
#: imported fast_parallel says from where.
WHERE = """import atexit, sys
def _where():
    module = sys.modules.get('fast_parallel')
    if module is not None:
        sys.stderr.write('fast_parallel from: ' + module.__file__ + '\\n')
atexit.register(_where)
"""


@needs_git
def test_tools_run_the_installed_package(installed):
    """The clone's tools (and their torchrun workers) import the installed
    fast_parallel, not the clone's: neither ``sys.path`` nor ``PYTHONPATH``
    puts the clone first."""
    from test_distributed import free_port
    tmp_path, python, inner, src = (
        installed[k] for k in ('tmp_path', 'python', 'inner', 'src'))
    hook = tmp_path / 'where'
    hook.mkdir(exist_ok=True)
    (hook / 'sitecustomize.py').write_text(WHERE)
    env = dict(
        os.environ,
        PYTHONPATH=str(hook),
        PYTHON=str(python),
        OMP_NUM_THREADS='1')
    config = str(src / 'configs/yolox/yolox_tiny_fast_sample.py')
    tools = src / 'tools'
    runs = [[str(python), str(tools / f'{name}.py'), '--help']
            for name in ('train', 'test', 'parity', 'benchmark', 'demo')]
    runs += [['bash',
              str(tools / 'dist_train.sh'), config, '1', '--help'],
             [
                 'bash',
                 str(tools / 'dist_test.sh'), config, 'x.pth', '1', '--help'
             ]]
    for argv in runs:
        env['PORT'] = str(free_port())
        done = subprocess.run(
            argv,
            cwd=tmp_path,
            env=env,
            timeout=300,
            capture_output=True,
            text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        assert 'usage:' in done.stdout, argv
        where = re.findall(r'fast_parallel from: (.*)', done.stderr)
        assert where, (argv, done.stderr[-3000:])
        assert all(w.startswith(inner) for w in where), (argv, where)
        assert not any(w.startswith(str(src)) for w in where)
