import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)

from runner_utils import START_THREADS  # noqa: E402


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


@pytest.fixture
def mmdet_scope():
    """Build in mmdet's scope whatever scope an earlier test left current
    (the anchor3d tests leave mmdet3d's); for a module,
    ``pytestmark = pytest.mark.usefixtures('mmdet_scope')``."""
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmdet'):
        yield


@pytest.fixture(autouse=True)
def same_cpu_threads():
    """Every test starts on the CPU thread count the tests started on.

    A test may leave it changed (numba's parallel kernels, e.g. in mmdet3d's
    KITTI evaluation, set OpenMP's count, which torch reads as its own),
    and a bit-for-bit comparison of two runs needs both on the same count.
    """
    torch.set_num_threads(START_THREADS)
    yield
