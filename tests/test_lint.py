"""The tree passes its own lint settings (setup.cfg): flake8, isort, yapf,
the versions ``.pre-commit-config.yaml`` names."""
import subprocess
import sys

import pytest
from models import ROOT

PATHS = ['fast_parallel', 'tests', 'tools', 'configs', 'setup.py']


@pytest.mark.parametrize('tool,args', [
    ('flake8', []),
    ('isort', ['--check-only', '--diff']),
    ('yapf', ['--diff', '--recursive']),
])
def test_tree_passes(tool, args):
    done = subprocess.run([sys.executable, '-m', tool, *args, *PATHS],
                          cwd=ROOT,
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.strip() == ''
