"""The stock vs fast data path, measured side by side (``tools/benchmark.py``).

Main-process time per batch, worker-side collate time, copies and bytes per
batch, optionally whole iterations of the small configs, and on GPUs the
pinned host-to-device bandwidth; see ``docs/benchmark.md``.
"""
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
from mmengine.dataset import pseudo_collate
from mmengine.model import BaseDataPreprocessor
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from fast_parallel.bench.synthetic import pointpillars_samples, yolox_samples
from fast_parallel.data.collate import packed_collate
from fast_parallel.data.handout import move_handed, take
from fast_parallel.data.loader import FastDataLoader
from fast_parallel.data.packing import stock_transfers

#: YOLOX-shaped batches (8 x 3x640x640 uint8, 0-100 boxes) and
#: PointPillars-shaped batches (6 x 15k-25k points x 4 float32, 0-40 boxes),
#: built by mmdet's PackDetInputs and mmdet3d's Pack3DDetInputs.
SHAPES: Dict[str, Callable[[], list]] = {
    'yolox': lambda: yolox_samples(8),
    'pointpillars': lambda: pointpillars_samples(6),
}
PATHS = ('stock', 'fast')
COLLATE = {'stock': pseudo_collate, 'fast': packed_collate}
#: The DataLoader class of each path (FastParallelHook switches to the fast
#: one).
LOADER = {'stock': DataLoader, 'fast': FastDataLoader}


class _Pool(Dataset):
    """Hands out pre-built packed samples: the pipeline costs nothing."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int):
        return self.samples[i % len(self.samples)]


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _busy(seconds: float) -> None:
    """Pure-Python spin for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


_STEP_INPUT = torch.randn(256, 256)


def _torch_step(seconds: float) -> None:
    """Torch matrix products for ``seconds`` (what a model step runs)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(_STEP_INPUT, _STEP_INPUT)


#: The main-process work between batches, standing in for the model's step.
STEPS: Dict[str, Callable[[float], None]] = {
    'torch': _torch_step,
    'python': _busy,
}


def data_path_times(path: str,
                    samples: list,
                    workers: int,
                    batches: int,
                    warmup: int,
                    step: float,
                    device: torch.device,
                    step_kind: str = 'torch') -> List[float]:
    """Main-process seconds per batch, next() to input on the device.

    Stock: ``DataLoader`` + ``pseudo_collate`` + ``cast_data``; fast:
    ``FastDataLoader`` + ``packed_collate`` (yielding stock's structure)
    + :func:`~fast_parallel.data.handout.move_handed`, what
    FastParallelHook installs. The device is synchronised
    around the timer.

    Args:
        path (str): 'stock' or 'fast'.
        samples (list): One batch worth of packed samples.
        workers (int): DataLoader workers.
        batches (int): Measured batches.
        warmup (int): Batches before measuring.
        step (float): Seconds of main-process work between batches.
        device (torch.device): Where the batch goes.
        step_kind (str): 'torch' or 'python': what that work is (STEPS).
            Defaults to 'torch'.

    Returns:
        list[float]: One time per measured batch.
    """
    loader = LOADER[path](
        _Pool(samples),
        batch_size=len(samples),
        num_workers=workers,
        collate_fn=COLLATE[path],
        pin_memory=device.type == 'cuda')
    preprocessor = BaseDataPreprocessor().to(device)
    times = []
    it = iter(loader)
    work = STEPS[step_kind]
    for i in range(warmup + batches):
        work(step)
        _sync(device)
        start = time.perf_counter()
        batch = next(it)
        if path == 'fast':  # what the wrappers do with a handed-out batch
            data = move_handed(
                take(batch), device, device.type == 'cuda',
                preprocessor.cast_data)[0]
        else:
            data = preprocessor.cast_data(batch)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        del batch, data
    del it
    return times


def quartiles(values: List[float]) -> Dict[str, float]:
    """Min, first quartile, third quartile and max of ``values``.

    Args:
        values (list[float]): At least one value.

    Returns:
        dict[str, float]: Keys ``min``, ``q1``, ``q3``, ``max``.
    """
    ordered = sorted(values)
    if len(ordered) < 2:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    return dict(min=ordered[0], q1=q1, q3=q3, max=ordered[-1])


def collate_times(samples: list, n: int) -> Dict[str, float]:
    """Median seconds of each collate function on one batch (in-process).

    Args:
        samples (list): One batch worth of packed samples.
        n (int): Calls per collate function.

    Returns:
        dict[str, float]: Seconds, by path.
    """
    out = {}
    for path in PATHS:
        ts = []
        for _ in range(n):
            start = time.perf_counter()
            COLLATE[path](samples)
            ts.append(time.perf_counter() - start)
        out[path] = statistics.median(ts)
    return out


def transfer_figures(samples: list) -> Dict[str, Dict[str, int]]:
    """Copies and bytes per batch, stock and packed.

    Args:
        samples (list): One batch worth of packed samples.

    Returns:
        dict[str, dict[str, int]]: ``copies`` and ``bytes``, by path.
    """
    copies, nbytes = stock_transfers(pseudo_collate(samples))
    packed = packed_collate(samples)
    return dict(
        stock=dict(copies=copies, bytes=nbytes),
        fast=dict(copies=packed.num_copies, bytes=packed.nbytes))


def config_iterations(iters: int,
                      repeats: int,
                      configs_root: str = '.') -> Dict[str, dict]:
    """Seconds per training iteration of the small configs, both paths.

    Needs ``data/sample`` (made by ``tools/make_sample_data.py``); the first
    two iterations of every run warm up.

    Args:
        iters (int): Iterations per run.
        repeats (int): Runs per path, alternating stock and fast.
        configs_root (str): The folder holding the repository's
            ``configs/`` (a clone's root). Defaults to the current directory.

    Returns:
        dict[str, dict]: By config kind: ``s_per_iter``, ``samples_per_s``
        and ``per_repeat`` of each path, and the fast / stock ``ratio``.
    """
    from mmengine.config import Config

    from fast_parallel.bench.presets import config_path
    from fast_parallel.parity.runner import parity_config, run_once
    configs = {
        'yolox':
        'configs/yolox/yolox_tiny_fast_sample.py',
        'pointpillars':
        'configs/pointpillars/pointpillars_hv_secfpn_fast_sample.py',
    }
    out = {}
    for kind, path in configs.items():
        cfg = Config.fromfile(config_path(path, configs_root))
        cfg.log_level = 'WARNING'
        times: Dict[str, List[float]] = {p: [] for p in PATHS}
        per_repeat: Dict[str, List[float]] = {p: [] for p in PATHS}
        batch = None
        for r in range(repeats):
            for p in PATHS:
                run_cfg = parity_config(
                    cfg,
                    p,
                    iters,
                    False,
                    f'work_dirs/benchmark/{kind}',
                    r,
                    deterministic=False)
                record = run_once(run_cfg)
                measured = record['iter_time'][2:]  # first ones warm up
                times[p] += measured
                per_repeat[p].append(statistics.median(measured))
                batch = record['batch_size']
        out[kind] = {
            p:
            dict(
                s_per_iter=statistics.median(times[p]),
                samples_per_s=batch / statistics.median(times[p]),
                per_repeat=per_repeat[p])
            for p in PATHS
        }
        out[kind]['ratio'] = out[kind]['fast']['s_per_iter'] / \
            out[kind]['stock']['s_per_iter']
    return out


def gpu_section() -> dict:
    """Pinned host-to-device bandwidth and the GPU count.

    Returns:
        dict: ``run`` False and a ``reason`` without CUDA; else ``device``,
        ``pinned_h2d_bytes_per_s`` and ``gpus``.
    """
    if not torch.cuda.is_available():
        return dict(run=False, reason='no CUDA device on this machine')
    device = torch.device('cuda', 0)
    host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
    host.to(device)
    _sync(device)
    start = time.perf_counter()
    for _ in range(5):
        host.to(device, non_blocking=True)
    _sync(device)
    bandwidth = 5 * host.numel() / (time.perf_counter() - start)
    return dict(
        run=True,
        device=torch.cuda.get_device_name(0),
        pinned_h2d_bytes_per_s=bandwidth,
        gpus=torch.cuda.device_count())


def measure(machine: dict,
            device: torch.device,
            shapes: List[str],
            workers: List[int],
            batches: int,
            warmup: int,
            repeats: int,
            step_ms: float,
            step_kind: str = 'torch',
            quick: bool = False,
            configs: bool = False,
            config_iters: int = 10,
            configs_root: str = '.') -> dict:
    """Every data-path measurement, stock and fast runs alternating.

    Warm-up apart from measurement, medians and ratios; between batches the
    main process computes for ``step_ms`` (:data:`STEPS`) so the workers fill
    the queue as in training.

    Args:
        machine (dict): What the results name as the machine.
        device (torch.device): Where the batches go.
        shapes (list[str]): Keys of :data:`SHAPES`.
        workers (list[int]): DataLoader worker counts, one table row each.
        batches (int): Measured batches per run.
        warmup (int): Batches before measuring, per run.
        repeats (int): Runs per path and row.
        step_ms (float): Milliseconds of main-process work between batches.
        step_kind (str): Key of :data:`STEPS`. Defaults to 'torch'.
        quick (bool): Fewer collate calls. Defaults to False.
        configs (bool): Also time whole iterations of the small configs
            (:func:`config_iterations`). Defaults to False.
        config_iters (int): Iterations per config run. Defaults to 10.
        configs_root (str): The folder holding the repository's
            ``configs/``, for ``configs``. Defaults to the current directory.

    Returns:
        dict: ``machine``, ``settings``, ``data_path``, ``collate``,
        ``transfers``, (``iterations``) and ``gpu``; the report adds
        ``warnings`` (:func:`~fast_parallel.bench.report.noise_warnings`).
    """
    results: dict = dict(
        machine=machine,
        settings=dict(
            batches=batches,
            warmup=warmup,
            repeats=repeats,
            step_ms=step_ms,
            step_kind=step_kind,
            workers=workers),
        data_path={},
        collate={},
        transfers={})
    samples = {s: SHAPES[s]() for s in shapes}
    runs = len(shapes) * len(workers) * repeats * 2
    with tqdm(total=runs, desc='data path', file=sys.stderr) as bar:
        for shape in shapes:
            for n in workers:
                times: Dict[str, List[float]] = {p: [] for p in PATHS}
                for _ in range(repeats):
                    for path in PATHS:  # alternate stock and fast
                        times[path] += data_path_times(path, samples[shape], n,
                                                       batches, warmup,
                                                       step_ms / 1e3, device,
                                                       step_kind)
                        bar.update()
                med = {p: statistics.median(times[p]) for p in PATHS}
                results['data_path'].setdefault(shape, {})[str(n)] = \
                    dict(stock_ms=med['stock'] * 1e3,
                         fast_ms=med['fast'] * 1e3,
                         ratio=med['fast'] / med['stock'],
                         samples=len(times['fast']),
                         **{f'{p}_{q}_ms': v * 1e3 for p in PATHS
                            for q, v in quartiles(times[p]).items()})
    for shape in shapes:
        col = collate_times(samples[shape], 10 if quick else 30)
        results['collate'][shape] = dict(
            stock_ms=col['stock'] * 1e3,
            fast_ms=col['fast'] * 1e3,
            ratio=col['fast'] / col['stock'])
        results['transfers'][shape] = transfer_figures(samples[shape])
    if configs:
        results['iterations'] = config_iterations(config_iters, repeats,
                                                  configs_root)
    results['gpu'] = gpu_section()
    return results
