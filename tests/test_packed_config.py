"""A loader packed by its config from the start: the data path's gain for
loops that must stay on the stock sampling path.

mmdet's ``GroupMultiSourceSampler`` with workers draws its groups from the
main process's NumPy state as its iterator starts, so ``FastParallelHook``
cannot restart an iteration loop's started loader exactly and leaves it
stock. With ``collate_fn=dict(type='packed_collate')`` in the config the
workers pack from the first batch: nothing needs restarting, the sampler
stays stock's, and every batch crosses in one buffer per dtype. Real
Runner, datasets, samplers and pipelines (:mod:`order_utils`).
"""
from typing import Any, Dict, List

import pytest
import torch
from mmengine.hooks import Hook
from order_utils import ITERS, assert_same_batches, train, write_ann_files
from torch.utils.data import default_collate

from fast_parallel import PackedBatch, pack
from fast_parallel.data.collate import build_collate, is_packed_collate
from fast_parallel.data.packing import stock_transfers

PACKED = dict(type='packed_collate')


class CopyCounter(Hook):
    """Per training batch: the copies stock's ``cast_data`` makes of it, and
    the copies the packed batch's move makes (one per buffer)."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.stock: List[int] = []
        self.fast: List[int] = []

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch=None) -> None:
        if isinstance(data_batch, PackedBatch):
            self.fast.append(data_batch.num_copies)
            data_batch = data_batch.unpack()
        self.stock.append(stock_transfers(data_batch)[0])


@pytest.fixture(scope='module')
def ann_files(tmp_path_factory) -> Dict[str, str]:
    return write_ann_files(tmp_path_factory.mktemp('packed_config'))


def train_with_collate(files, work_dir, case: str, loop: str, workers: int,
                       collate: Any) -> Dict[str, Any]:
    """``order_utils.train(..., fast=True)`` with the loader's
    ``collate_fn`` set in its config."""
    copies = CopyCounter()
    recorder = train(
        files,
        work_dir,
        case,
        loop,
        workers,
        True,
        collate=collate,
        extra_hooks=[copies],
        log_level='INFO')
    log = ''.join(p.read_text() for p in work_dir.glob('*/*.log'))
    return dict(
        recorder=recorder,
        copies=copies,
        log=log,
        collate_fn=recorder.collate_fn)


def test_stock_sampler_loop_gets_packed_batches_from_its_config(
        ann_files, tmp_path):
    case = 'GroupMultiSourceSampler'
    stock = train(ann_files, tmp_path / 'stock', case, 'iter', 2, False)
    # FastParallelHook alone: stock path, and the warning says the line
    fallback = train(ann_files, tmp_path / 'fallback', case, 'iter', 2, True)
    assert fallback.packed == 0
    assert_same_batches(stock, fallback)
    log = ''.join(p.read_text()
                  for p in (tmp_path / 'fallback').glob('*/*.log'))
    assert 'stays on the stock data path' in log
    assert ("set the packed collate in its config from the start: "
            "`train_dataloader.collate_fn=dict(type='packed_collate')`") in log
    # with that line: stock's sampler, every batch packed, stock's batches
    fast = train_with_collate(ann_files, tmp_path / 'fast', case, 'iter', 2,
                              PACKED)
    recorder = fast['recorder']
    assert recorder.packed == len(recorder.batches) == ITERS
    assert_same_batches(stock, recorder)
    assert 'stays on the stock data path' not in fast['log']
    assert 'FastParallelHook: on: wrapper FastDataParallel (cpu); loaders: ' \
        'train packed by its config (2 workers, not pinned)' in fast['log']
    # the gain: one copy per dtype instead of one per tensor
    copies = fast['copies']
    assert len(copies.fast) == len(copies.stock) == ITERS
    assert all(f < s for f, s in zip(copies.fast, copies.stock))
    assert max(copies.fast) <= 2  # float32 boxes, int64 labels
    print(f'copies per batch: stock {copies.stock}, packed {copies.fast}')


def test_config_packed_collate_in_an_epoch_loop_reports_worker_states(
        ann_files, tmp_path):
    """Persistent workers in an epoch loop: the config's packed collate
    also carries the workers' random states (ExactResumeHook), packed once.
    """
    case = 'AspectRatioBatchSampler'
    stock = train(ann_files, tmp_path / 'stock', case, 'epoch', 2, False)
    fast = train_with_collate(ann_files, tmp_path / 'fast', case, 'epoch', 2,
                              PACKED)
    recorder = fast['recorder']
    assert recorder.packed == recorder.with_worker_states == len(
        recorder.batches) > 0
    assert_same_batches(stock, recorder)
    assert is_packed_collate(fast['collate_fn'])


def test_packed_collate_inner_packs_another_collate():
    collate = build_collate(
        dict(type='packed_collate', inner=dict(type='default_collate')))
    assert is_packed_collate(collate)
    samples = [
        dict(x=torch.arange(3.) + i, y=torch.tensor(i)) for i in range(4)
    ]
    got = collate(samples).unpack()
    want = default_collate(samples)
    assert list(got) == list(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert collate(samples).num_copies == pack(want).num_copies == 2
