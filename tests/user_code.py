"""A user's own hook and metric that read ``data_batch`` and keep tensors.

What issue 40 found: hooks and metrics that digest the batch, and a metric
that keeps ``x.detach()`` of every validation sample beside a clone made at
the same moment. Used by ``tests/test_user_view.py`` and, for a whole sample
config, from the command line (one arm per process)::

    python tests/user_code.py CONFIG DATA_ROOT WORK_DIR {fast,stock} OUT.json
"""
import hashlib
import json
import sys
from typing import Any, List, Optional

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, METRICS
from mmengine.structures import BaseDataElement

STAGES = ('train', 'val', 'test')


def digest(obj: Any) -> str:
    """A hash of a batch: container types, keys, metainfo, every tensor's
    dtype, shape, strides and bytes."""
    h = hashlib.sha1()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h, obj: Any) -> None:
    h.update(type(obj).__name__.encode())
    if isinstance(obj, torch.Tensor):
        h.update(f'{obj.dtype}{tuple(obj.shape)}{obj.stride()}'.encode())
        h.update(obj.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(f'{obj.dtype}{obj.shape}'.encode() + obj.tobytes())
    elif isinstance(obj, BaseDataElement):
        for key in sorted(obj.metainfo_keys()):
            h.update(key.encode())
            _feed(h, obj.metainfo[key])
        for key in sorted(obj.keys()):
            h.update(key.encode())
            _feed(h, getattr(obj, key))
    elif hasattr(obj, 'tensor') and isinstance(obj.tensor, torch.Tensor):
        _feed(h, obj.tensor)  # mmdet / mmdet3d boxes and points
    elif isinstance(obj, dict):
        for key in obj:
            h.update(repr(key).encode())
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(str(len(obj)).encode())
        for item in obj:
            _feed(h, item)
    else:
        h.update(repr(obj).encode())


def read(data_batch: Any) -> str:
    """What users' code does with a batch: index it, read a sample's path
    and boxes, digest it all; a ``TypeError`` is what the fast path used to
    raise."""
    try:
        samples = data_batch['data_samples']
        paths = [
            s.metainfo.get('img_path', s.metainfo.get('lidar_path'))
            for s in samples
        ]
        return digest([data_batch, paths, [kept(s) for s in samples]])
    except TypeError as e:
        return f'raised {type(e).__name__}: {e}'


def kept(sample: Any) -> Optional[torch.Tensor]:
    """The tensor a metric would keep of a sample: its gt boxes."""
    for field in ('gt_instances', 'gt_instances_3d'):
        instances = sample.get(field)
        if instances is None:
            continue
        for key in ('bboxes', 'bboxes_3d'):
            boxes = instances.get(key)
            if boxes is not None:
                return getattr(boxes, 'tensor', boxes)
    return None


@HOOKS.register_module()
class UserBatchReader(Hook):
    """Digests ``data_batch`` in all six ``*_iter`` hooks."""

    priority = 'LOW'

    def __init__(self) -> None:
        self.reads: List[list] = []
        self.metrics: List[dict] = []

    def after_val_epoch(self, runner, metrics=None) -> None:
        self.metrics.append(dict(metrics or {}))

    def after_test_epoch(self, runner, metrics=None) -> None:
        self.metrics.append(dict(metrics or {}))

    def _read(self, where: str, batch_idx: int, data_batch: Any) -> None:
        self.reads.append([where, batch_idx, read(data_batch)])


def _reader(where: str):

    def method(self, runner, batch_idx, data_batch=None, outputs=None):
        self._read(where, batch_idx, data_batch)

    def before(self, runner, batch_idx, data_batch=None):
        self._read(where, batch_idx, data_batch)

    return before if where.startswith('before') else method


for _stage in STAGES:
    for _when in ('before', 'after'):
        _name = f'{_when}_{_stage}_iter'
        setattr(UserBatchReader, _name, _reader(_name))


@METRICS.register_module()
class KeepingMetric(BaseMetric):
    """Digests ``data_batch`` in ``process`` and keeps each sample's gt
    boxes (or, where no sample has any, the batch's point clouds) as
    ``.detach()``, ``.detach().numpy()`` and ``torch.from_numpy`` of it,
    beside clones; ``compute_metrics`` counts the kept tensors that changed
    since."""

    default_prefix = 'user'
    reads: List[str] = []
    kept: List[tuple] = []

    def process(self, data_batch: Any, data_samples: list) -> None:
        KeepingMetric.reads.append(read(data_batch))
        sources, points = list(data_samples), []
        try:
            sources += list(data_batch['data_samples'])
            inputs = data_batch['inputs']
            points = inputs.get('points', []) if isinstance(inputs,
                                                            dict) else []
        except TypeError:
            pass
        # a sample without gt boxes (3D val sets): keep its points instead
        tensors = [kept(sample) for sample in sources]
        tensors += [p for p in points if all(t is None for t in tensors)]
        for boxes in tensors:
            if boxes is None:
                continue
            clone = boxes.clone()
            KeepingMetric.kept += [
                (boxes.detach(), clone),
                (boxes.detach().numpy(), clone.numpy()),
                (torch.from_numpy(boxes.detach().cpu().numpy()), clone)
            ]
        self.results.append(0)

    def compute_metrics(self, results: list) -> dict:
        changed = sum(not np.array_equal(
            np.asarray(k).view(np.uint8),
            np.asarray(c).view(np.uint8)) for k, c in KeepingMetric.kept)
        return dict(changed=changed, kept=len(KeepingMetric.kept))


def run_arm(config: str,
            data: str,
            work_dir: str,
            fast: bool,
            val_workers: int = 2) -> dict:
    """Trains a sample config two epochs (validating after each, 2 train
    and ``val_workers`` persistent val workers, val batches of 1), then
    tests, with the reader hook and the keeping metric; returns what they
    saw."""
    from pathlib import Path

    from runner_utils import sample_config

    from fast_parallel.cli import build_runner
    cfg = sample_config(config, Path(data), Path(work_dir), fast)
    cfg.train_dataloader.num_workers = 2
    for name in ('val_dataloader', 'test_dataloader'):
        cfg[name].num_workers = val_workers
        cfg[name].batch_size = 1
        cfg[name].persistent_workers = True
    cfg.train_cfg.max_epochs = 2
    cfg.train_cfg.val_interval = 1
    evaluators = cfg.val_evaluator
    if isinstance(evaluators, dict):
        evaluators = [evaluators]
    cfg.val_evaluator = list(evaluators) + [dict(type='KeepingMetric')]
    cfg.test_evaluator = cfg.val_evaluator
    cfg.custom_hooks = list(cfg.get('custom_hooks',
                                    [])) + [dict(type='UserBatchReader')]
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=-1)
    KeepingMetric.reads, KeepingMetric.kept = [], []
    runner = build_runner(cfg)
    runner.train()
    runner.test()
    reader = next(h for h in runner.hooks if isinstance(h, UserBatchReader))
    last = reader.metrics[-1]
    from fast_parallel.data.ring import RECEIVED_COUNTS
    return dict(
        memory=_memory_kb(),
        ring=dict(RECEIVED_COUNTS),
        reads=reader.reads,
        process=KeepingMetric.reads,
        changed=last['user/changed'],
        kept=last['user/kept'],
        evaluations=len(reader.metrics))


def _memory_kb() -> dict:
    """This process's resident and shared-memory resident kB, and the
    shared-memory file descriptors it holds (torch's tensor segments)."""
    import os
    out = {}
    with open('/proc/self/status') as f:
        for line in f:
            key = line.split(':')[0]
            if key in ('VmRSS', 'RssShmem', 'RssAnon'):
                out[key] = int(line.split()[1])
    fds = 0
    for fd in os.listdir('/proc/self/fd'):
        try:
            fds += 'torch_' in os.readlink(f'/proc/self/fd/{fd}') or \
                '/dev/shm' in os.readlink(f'/proc/self/fd/{fd}')
        except OSError:
            pass
    out['shm_fds'] = fds
    return out


if __name__ == '__main__':
    config, data, work_dir, arm, out = sys.argv[1:6]
    result = run_arm(config, data, work_dir, arm == 'fast')
    with open(out, 'w') as f:
        json.dump(result, f)
