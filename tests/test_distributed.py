"""FastDistributedDataParallel vs MMDistributedDataParallel: 2 gloo processes.
"""
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 2


def free_port() -> int:
    """A TCP port free on this machine right now."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, fast: bool, out: str) -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    from mmengine.dataset import pseudo_collate
    from mmengine.logging import MessageHub
    from mmengine.model import MMDistributedDataParallel
    from mmengine.optim import build_optim_wrapper
    from models import build_model, sample_batches, seed_all, snapshot

    from fast_parallel import FastDistributedDataParallel, packed_collate
    dist.init_process_group(
        'gloo',
        init_method=f'tcp://127.0.0.1:{port}',
        rank=rank,
        world_size=world)
    try:
        model = build_model('yolox')
        optim_wrapper = build_optim_wrapper(
            model, dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)))
        wrapper_cls = FastDistributedDataParallel if fast else \
            MMDistributedDataParallel
        wrapper = wrapper_cls(module=model)
        seed_all(1 + rank)
        batches = sample_batches('yolox', STEPS * world)
        hub = MessageHub.get_current_instance()
        for step in range(STEPS):
            hub.update_info('iter', step)
            samples = batches[step * world + rank]
            data = packed_collate(samples) if fast else pseudo_collate(samples)
            wrapper.train_step(data, optim_wrapper)
        if rank == 0:
            torch.save(snapshot(model), out)
    finally:
        dist.destroy_process_group()


def run(fast: bool, out: str) -> dict:
    mp.start_processes(
        _worker,
        args=(2, free_port(), fast, out),
        nprocs=2,
        join=True,
        start_method='spawn')
    return torch.load(out)


def test_fast_ddp_two_gloo_processes_equals_mm_ddp(tmp_path):
    from models import assert_same_tensors, build_model, snapshot
    stock = run(False, str(tmp_path / 'stock.pth'))
    fast = run(True, str(tmp_path / 'fast.pth'))
    n, _ = assert_same_tensors(stock, fast)
    assert n > 50
    init = snapshot(build_model('yolox'))
    assert any(not torch.equal(init[k], fast[k]) for k in init)


def test_fast_ddp_drops_device_ids_for_cpu_models(tmp_path):
    pytest.importorskip('mmdet')
    # what mmengine's Runner passes under a launcher: device_ids=[LOCAL_RANK]
    from models import build_model

    from fast_parallel import FastDistributedDataParallel
    dist.init_process_group(
        'gloo',
        init_method=f'tcp://127.0.0.1:{free_port()}',
        rank=0,
        world_size=1)
    try:
        wrapper = FastDistributedDataParallel(
            module=build_model('yolox'), device_ids=[0])
        assert wrapper.device_ids is None
        assert wrapper.src_device == torch.device('cpu')
    finally:
        dist.destroy_process_group()
