"""No DataLoader worker outlives its trainer (data/worker_exit.py).

A dead trainer leaves its workers' batches unread in their result pipe; once
the pipe is full, a worker's feeder thread blocks in ``write`` and the worker
can never exit. The fast path's epoch-loop batches carry their worker's random
states (~12 KB), so four workers prefetching two batches each fill the 64 KiB
pipe: before the fix every worker of the CenterPoint run below was still alive
15 s after the trainer's SIGKILL.
"""
import os
import re
import signal
import subprocess
import sys
import time
from typing import List

import pytest
import torch
from models import ROOT
from runner_utils import fault_env
from torch.utils.data import DataLoader, Dataset

from fast_parallel import PackedCollate
from fast_parallel.data.loader import prepare_loader
from fast_parallel.data.worker_exit import ExitWithParent, exit_with_parent

CENTERPOINT = os.path.join(
    ROOT,
    'configs/centerpoint/centerpoint_pillar02_second_secfpn_fast_sample.py')
LINUX = pytest.mark.skipif(
    not sys.platform.startswith('linux'), reason='reads /proc')


class Draws(Dataset):
    """Each sample: random numbers from the worker's streams."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        import random

        import numpy as np
        return dict(
            inputs=torch.rand(3),
            python=torch.tensor(random.random()),
            numpy=torch.tensor(np.random.rand()))


def _batches(loader: DataLoader) -> List[dict]:
    out = []
    for batch in loader:
        out.append(batch.unpack() if hasattr(batch, 'unpack') else batch)
    return out


def test_worker_init_order_and_random_streams_stay_stock():
    seen = []

    def init(worker_id):  # the loader's own init runs, with its worker id
        import random
        seen.append((worker_id, random.random()))

    def loader(fast: bool) -> DataLoader:
        made = DataLoader(
            Draws(),
            batch_size=3,
            num_workers=2,
            worker_init_fn=init,
            generator=torch.Generator().manual_seed(7),
            collate_fn=PackedCollate())
        if fast:
            prepare_loader(made, pin=False)
            assert isinstance(made.worker_init_fn, ExitWithParent)
            assert made.worker_init_fn.init_fn is init
        return made

    stock, fast = _batches(loader(False)), _batches(loader(True))
    assert len(stock) == len(fast) == 4
    for a, b in zip(stock, fast):
        for key in ('inputs', 'python', 'numpy'):
            assert torch.equal(a[key][0], b[key][0]) and torch.equal(
                torch.stack(a[key]), torch.stack(b[key]))
    # wrapping twice keeps one wrapper
    wrapper = exit_with_parent(init)
    assert exit_with_parent(wrapper) is wrapper


def _alive(pids: List[int]) -> List[int]:
    """The pids still running (a zombie has exited)."""
    out = []
    for pid in pids:
        try:
            with open(f'/proc/{pid}/stat') as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state != 'Z':
            out.append(pid)
    return out


def _children(pid: int) -> List[int]:
    found = []
    for task in os.listdir(f'/proc/{pid}/task'):
        with open(f'/proc/{pid}/task/{task}/children') as f:
            found += [int(x) for x in f.read().split()]
    return found


def _shm_names() -> set:
    """torch's named segments in ``/dev/shm``: a worker killed between
    torch's ``shm_open`` and ``shm_unlink`` would leave one (the fast path's
    buffers are nameless: ``test_ring.py``)."""
    if not os.path.isdir('/dev/shm'):
        return set()
    return {n for n in os.listdir('/dev/shm') if n.startswith('torch_')}


def _train_until(args: List[str], pattern: str, env: dict):
    """Starts tools/train.py; returns it once a log line matches."""
    proc = subprocess.Popen([sys.executable, 'tools/train.py', *args],
                            cwd=ROOT,
                            env=dict(env, PYTHONUNBUFFERED='1'),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return proc, lines
    proc.wait()
    raise AssertionError('training ended before ' + pattern + ':\n' +
                         ''.join(lines[-40:]))


@LINUX
@pytest.mark.parametrize(
    'signum', [signal.SIGKILL, signal.SIGTERM], ids=['SIGKILL', 'SIGTERM'])
def test_no_worker_outlives_a_killed_trainer(sample_data, tmp_path, signum):
    """Epoch loop, persistent workers (4, as upstream), the fast path, real
    CenterPoint batches: the trainer killed in the middle of epoch 1."""
    data = f'{sample_data}/nuscenes/'
    shm_before = _shm_names()
    proc, lines = _train_until([
        CENTERPOINT, '--work-dir',
        str(tmp_path), '--cfg-options', 'train_cfg.max_epochs=50',
        'train_dataloader.num_workers=4',
        f'train_dataloader.dataset.dataset.data_root={data}',
        'train_dataloader.dataset.dataset.pipeline.3.db_sampler.data_root='
        f'{data}',
        'train_dataloader.dataset.dataset.pipeline.3.db_sampler.info_path='
        f'{data}nuscenes_dbinfos_train.pkl', 'default_hooks.checkpoint=None'
    ], r'Epoch\(train\) +\[1\]\[ *3/\d+\]', fault_env())
    assert any('train packed (4 workers' in line for line in lines)
    workers = _children(proc.pid)
    assert len(workers) == 4, workers
    os.kill(proc.pid, signum)
    proc.wait(timeout=60)
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(workers)
    for pid in left:  # leave nothing behind, then fail
        os.kill(pid, signal.SIGKILL)
    assert left == [], f'workers alive 10 s after {signum.name}: {left}'
    assert _shm_names() - shm_before == set()


@LINUX
def test_no_worker_outlives_a_trainer_that_raises(sample_data, tmp_path):
    """An exception mid-epoch: the trainer exits with it, its workers too."""
    import shutil

    from mmengine.config import Config
    from runner_utils import with_fault_hook
    cfg = Config.fromfile(CENTERPOINT)
    data = f'{sample_data}/nuscenes/'
    cfg.train_dataloader.dataset.dataset.data_root = data
    sampler = cfg.train_dataloader.dataset.dataset.pipeline[3].db_sampler
    sampler.data_root = data
    sampler.info_path = data + 'nuscenes_dbinfos_train.pkl'
    cfg.train_dataloader.num_workers = 4
    cfg.default_hooks.checkpoint = None
    config = with_fault_hook(cfg, 'RaiseAtIterHook', tmp_path / 'raises.py')
    shm_before = _shm_names()
    proc, _ = _train_until([str(config), '--work-dir',
                            str(tmp_path / 'work')],
                           r'Epoch\(train\) +\[1\]\[ *2/\d+\]',
                           fault_env(FP_RAISE_AT_ITER='3'))
    workers = _children(proc.pid)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert 'rank 0 fails on purpose at iteration 3' in out
    deadline = time.monotonic() + 10
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(workers) == []
    assert _shm_names() - shm_before == set()
    shutil.rmtree(tmp_path / 'work', ignore_errors=True)
