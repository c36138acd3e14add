"""``pip install .`` where torch, mmcv & co. are already installed.

A new virtual environment sees this environment's packages (torch, mmcv with
its ops, mmengine, mmdet: a user's training environment) through a ``.pth``
file; pip installs the package from a copy of the repository's tracked
files, offline. Nothing but fast_parallel may be installed, upgraded or
removed, and ``import fast_parallel`` must work there.

pip replaces an installed distribution only when its version does not
satisfy a requirement. The test checks exactly that for every requirement
of the installed package (its ``Requires-Dist``, extras left out) and
installs with ``--no-deps``: this project's own environment holds
``setuptools<70`` (mmengine 0.10 needs ``pkg_resources``, mmcv 2.1 builds
with it) below what torch 2.13's metadata asks for, so an offline resolver
would stop on torch's own requirement, which is no requirement of ours.
"""
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
    return [ln.strip() for ln in lines if ln.strip() and
            not ln.startswith('#')]


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
    files = subprocess.run(['git', 'ls-files'], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.skipif(shutil.which('git') is None, reason='needs git')
def test_pip_install_replaces_nothing(tmp_path):
    import mmcv
    import mmengine
    import torch
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
    python = venv / 'bin' / 'python'
    inner = subprocess.run(
        [str(python), '-c', 'import site; print(site.getsitepackages()[0])'],
        check=True, capture_output=True, text=True).stdout.strip()
    # the user's environment: every package of this one, visible there
    Path(inner, 'user_env.pth').write_text(site.getsitepackages()[0] + '\n')
    src = _tracked_copy(tmp_path / 'clone')
    done = subprocess.run(
        [str(python), '-m', 'pip', 'install', '--no-index', '--no-deps',
         '--no-build-isolation', '--no-cache-dir',
         '--disable-pip-version-check', str(src)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    installed = re.search(r'Successfully installed (.*)', out)
    assert installed and [n.replace('-', '_') for n in installed.group(
        1).split()] == ['fast_parallel_0.1.0'], out[-3000:]
    assert 'Successfully uninstalled' not in out, out[-3000:]
    check = subprocess.run(
        [str(python), '-c', UNSATISFIED +
         'import fast_parallel, torch, mmcv, mmcv.ops, mmengine; '
         'print(fast_parallel.__file__); '
         'print(torch.__version__, mmcv.__version__, mmengine.__version__)'],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    unsatisfied, where, versions = check.stdout.split('\n')[:3]
    assert unsatisfied == 'unsatisfied: []'
    assert where.startswith(inner)  # the installed copy, not the repo's
    assert versions.split() == [torch.__version__, mmcv.__version__,
                                mmengine.__version__]
