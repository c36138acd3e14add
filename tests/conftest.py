import importlib.util
import os
import sys
from pathlib import Path

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)


def load_tool(name: str):
    """Imports ``tools/<name>.py`` as a module (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location(
        f'tools_{name}', os.path.join(ROOT, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='session')
def sample_data(tmp_path_factory) -> Path:
    """The sample COCO and KITTI sets, made once per test session."""
    out = tmp_path_factory.getbasetemp() / 'sample'
    return load_tool('make_sample_data').make_sample_data(out)
