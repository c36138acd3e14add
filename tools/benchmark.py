"""Stock vs fast data path, measured side by side.

Usage:
    python tools/benchmark.py [--shapes yolox pointpillars] [--workers 0 1 2 4]
        [--batches 30] [--warmup 5] [--repeats 3] [--step-ms 80]
        [--step-kind torch|python]
        [--configs] [--config-iters 10] [--quick]
        [--json OUT.json] [--plot OUT.png]
    python tools/benchmark.py --ops [--presets yolox_s pointpillars]
        [--ops-iters 3] [--ops-warmup 1] [--data data/bench] [--quick]
    python tools/benchmark.py --train [--train-preset yolox_s]
        [--arms stock stock+pin_memory fast] [--train-iters 50]
        [--train-warmup 10] [--repeats 3] [--data data/bench] [--quick]
        [--cfg-options KEY=VALUE ...] [--json OUT.json] [--plot OUT.png]

``--ops`` and ``--train`` run instead of the data-path measurements:

* ``--ops``: operations dispatched per training iteration (a count, exact on
  any machine: what a GPU launches), stock vs fast, under the real Runner,
  optimizer ``foreach`` forced on (:mod:`fast_parallel.bench.ops`);
* ``--train``: full training iterations end to end in fresh processes, arms
  ``stock``, ``stock+pin_memory`` and ``fast`` alternating, medians after
  warm-up of iteration time, data_time and samples/s
  (:mod:`fast_parallel.bench.train_time`).

Both read ``--data`` (default ``data/bench``), which they make when missing
with ``tools/make_sample_data.py``: COCO-size images (480..640 px sides) and
KITTI frames. ``--quick`` runs the small sample configs on ``data/sample``
(for tests: a few iterations, one repeat).

Measures, alternating stock and fast runs in one process, warm-up apart from
measurement, device sync around the timers, medians and ratios:

* data path: main-process time per batch from asking the DataLoader for the
  next batch until the data_preprocessor's input is on the device (stock:
  ``DataLoader`` + ``pseudo_collate`` + ``cast_data``; fast:
  ``FastDataLoader`` + ``packed_collate`` + ``PackedBatch.to(...).unpack()``,
  what FastParallelHook installs), for each ``--workers``. Between batches
  the main process computes for ``--step-ms``, standing in for the model's
  step so the workers fill the queue as in training: torch matrix products
  (``--step-kind torch``, the default, like a model's forward/backward) or a
  pure-Python spin loop (``--step-kind python``);
* worker-side collate time per batch (``pseudo_collate`` vs
  ``packed_collate``, in this process);
* copies to the device and bytes per batch;
* with ``--configs``: full training iterations of the two small configs
  (needs ``data/sample``, made by tools/make_sample_data.py): seconds per
  iteration and samples/s;
* on GPUs: transfer time per batch against bytes / pinned host-to-device
  bandwidth measured in the same run, and a scaling table over 1, 2, 4, ...
  GPUs for FastDataParallel. Without CUDA these are reported as not run.

Inputs: YOLOX-shaped batches (8 x 3x640x640 uint8, 0-100 boxes) and
PointPillars-shaped batches (6 x 15k-25k points x 4 float32, 0-40 boxes)
built by mmdet's PackDetInputs and mmdet3d's Pack3DDetInputs.
"""
import argparse
import json
import os
import os.path as osp
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
from mmengine.dataset import pseudo_collate
from mmengine.model import BaseDataPreprocessor
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

# The installed fast_parallel (pip install -e . to run a clone's edits).
from fast_parallel import packed_collate
from fast_parallel.bench.synthetic import pointpillars_samples, yolox_samples
from fast_parallel.data.loader import FastDataLoader
from fast_parallel.data.packing import stock_transfers

#: The repository (the configs, data/ and tools/ it names are found here).
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

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
        if path == 'fast':
            pinned = device.type == 'cuda'
            data = batch.to(device, non_blocking=pinned).unpack()
        else:
            data = preprocessor.cast_data(batch)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        del batch, data
    del it
    return times


def _quartiles(values: List[float]) -> Dict[str, float]:
    """min, first quartile, third quartile and max of ``values``."""
    ordered = sorted(values)
    if len(ordered) < 2:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    return dict(min=ordered[0], q1=q1, q3=q3, max=ordered[-1])


#: A spread ((q3 - q1) / median) above which the report warns.
NOISY = 0.25


def noise_warnings(results: dict, quick: bool) -> List[str]:
    """Warnings a reader needs before trusting a ratio of the data path."""
    out = []
    if quick:
        out.append('--quick: a few batches, one repeat: a check that the '
                   'tool works, not a measurement')
    for shape, by_workers in results['data_path'].items():
        for workers, r in by_workers.items():
            q = {p: (r[f'{p}_q1_ms'], r[f'{p}_q3_ms']) for p in PATHS}
            where = f'{shape}, {workers} workers'
            if q['stock'][0] <= q['fast'][1] and q['fast'][0] <= \
                    q['stock'][1]:
                out.append(f'{where}: the quartile ranges of stock '
                           f'({q["stock"][0]:.2f}-{q["stock"][1]:.2f} ms) '
                           f'and fast ({q["fast"][0]:.2f}-'
                           f'{q["fast"][1]:.2f} ms) overlap: the ratio is '
                           'within the noise')
                continue
            for path in PATHS:
                spread = (q[path][1] - q[path][0]) / r[f'{path}_ms']
                if spread > NOISY:
                    out.append(f'{where}, {path}: quartiles {q[path][0]:.2f}'
                               f'-{q[path][1]:.2f} ms, {spread:.0%} of the '
                               'median: the ratio\'s size is uncertain (its '
                               'direction is not: the ranges do not overlap)')
    return out


def collate_times(samples: list, n: int) -> Dict[str, float]:
    """Median seconds of each collate function on one batch (in-process)."""
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
    """Copies and bytes per batch, stock and packed."""
    copies, nbytes = stock_transfers(pseudo_collate(samples))
    packed = packed_collate(samples)
    return dict(
        stock=dict(copies=copies, bytes=nbytes),
        fast=dict(copies=packed.num_copies, bytes=packed.nbytes))


def config_iterations(iters: int, repeats: int) -> Dict[str, dict]:
    """Seconds per training iteration of the small configs, both paths."""
    from mmengine.config import Config

    from fast_parallel.parity.runner import parity_config, run_once
    configs = {
        'yolox':
        'configs/yolox/yolox_tiny_fast_sample.py',
        'pointpillars':
        'configs/pointpillars/pointpillars_hv_secfpn_fast_sample.py',
    }
    out = {}
    for kind, path in configs.items():
        cfg = Config.fromfile(osp.join(ROOT, path))
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
    """Pinned host-to-device bandwidth; scaling needs 2+ GPUs."""
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


def ensure_data(root: str, quick: bool) -> str:
    """The benchmark data folder, made by tools/make_sample_data.py if needed.

    Args:
        root (str): The folder.
        quick (bool): Small sample images (the tests' data) instead of
            COCO-size ones.

    Returns:
        str: ``root``, absolute.
    """
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'make_sample_data', osp.join(ROOT, 'tools', 'make_sample_data.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    if quick:
        out = tool.make_sample_data(root)
    else:
        out = tool.make_sample_data(
            root, coco_images=64, kitti_frames=12, coco_size=(480, 640))
    return str(out)


def ops_section(args: argparse.Namespace, data: str) -> dict:
    """``--ops``: op counts of each preset, stock vs fast."""
    from fast_parallel.bench.ops import count_preset
    from fast_parallel.bench.presets import load_preset
    out = {}
    for name in args.presets:
        cfg = load_preset(name, data)
        if args.cfg_options:
            cfg.merge_from_dict(args.cfg_options)
        out[name] = count_preset(cfg, args.ops_iters, args.ops_warmup,
                                 'work_dirs/benchmark_ops')
    return out


def train_section(args: argparse.Namespace, data: str) -> dict:
    """``--train``: end-to-end iteration times of the arms."""
    from fast_parallel.bench.presets import PRESETS, data_options
    from fast_parallel.bench.train_time import run_arms
    config, kind = PRESETS[args.train_preset]
    options = data_options(kind, data) + [
        f'{k}={v}' for k, v in (args.cfg_options or {}).items()
    ]
    total = len(args.arms) * args.repeats
    with tqdm(total=total, desc='train arms', file=sys.stderr) as bar:
        return run_arms(
            osp.join(ROOT, config),
            args.arms,
            args.train_iters,
            args.train_warmup,
            args.repeats,
            options,
            progress=bar.update)


def parse_args(argv=None) -> argparse.Namespace:
    """Parses the command line."""
    from mmengine.config import DictAction

    from fast_parallel.bench.presets import PRESETS
    from fast_parallel.bench.train_time import ARMS
    parser = argparse.ArgumentParser(description='stock vs fast data path')
    parser.add_argument(
        '--shapes', nargs='+', default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument('--workers', nargs='+', type=int, default=[0, 1, 2, 4])
    parser.add_argument('--batches', type=int, default=30)
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--step-ms', type=float, default=80.0)
    parser.add_argument(
        '--step-kind',
        choices=list(STEPS),
        default='torch',
        help='main-process work between batches')
    parser.add_argument(
        '--configs',
        action='store_true',
        help='also time full iterations of the small configs')
    parser.add_argument('--config-iters', type=int, default=10)
    parser.add_argument(
        '--quick',
        action='store_true',
        help='a few batches, workers 0 and 2, one repeat')
    parser.add_argument(
        '--device',
        default='auto',
        help="'auto' (cuda if available), 'cpu' or 'cuda'")
    parser.add_argument(
        '--ops',
        action='store_true',
        help='count operations per training iteration')
    parser.add_argument(
        '--presets',
        nargs='+',
        choices=list(PRESETS),
        default=['yolox_s', 'pointpillars'],
        help='configs --ops counts')
    parser.add_argument('--ops-iters', type=int, default=3)
    parser.add_argument('--ops-warmup', type=int, default=1)
    parser.add_argument(
        '--train',
        action='store_true',
        help='time full training iterations, arm by arm')
    parser.add_argument(
        '--train-preset', choices=list(PRESETS), default='yolox_s')
    parser.add_argument('--arms', nargs='+', choices=ARMS, default=ARMS)
    parser.add_argument('--train-iters', type=int, default=50)
    parser.add_argument('--train-warmup', type=int, default=10)
    parser.add_argument(
        '--data',
        default=None,
        help='data folder of --ops/--train (made if missing; '
        'default data/bench, data/sample with --quick)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='config overrides for --ops/--train')
    parser.add_argument('--json', help='write the results here')
    parser.add_argument('--plot', help='write a bar chart (PNG) here')
    args = parser.parse_args(argv)
    explicit = set(argv if argv is not None else sys.argv[1:])
    if args.quick:
        args.workers, args.batches, args.warmup = [0, 2], 4, 1
        args.repeats, args.step_ms, args.config_iters = 1, 20.0, 4
        if '--presets' not in explicit:
            args.presets = ['yolox_tiny_sample']
        if '--train-preset' not in explicit:
            args.train_preset = 'yolox_tiny_sample'
        if '--train-iters' not in explicit:
            args.train_iters, args.train_warmup = 3, 1
        if '--ops-iters' not in explicit:
            args.ops_iters = 1
    if args.data is None:
        args.data = osp.join(ROOT, 'data', 'sample' if args.quick else 'bench')
    return args


def main(argv=None) -> dict:
    """Runs the measurements, prints tables, writes JSON / plot.

    Returns:
        dict: The results (what ``--json`` writes).
    """
    args = parse_args(argv)
    device = torch.device(('cuda' if torch.cuda.is_available() else 'cpu'
                           ) if args.device == 'auto' else args.device)
    machine = dict(
        platform=platform.platform(),
        processor=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        torch=torch.__version__,
        device=(torch.cuda.get_device_name(device)
                if device.type == 'cuda' else str(device)))
    if args.ops or args.train:
        return _modes(args, machine, device)
    results: dict = dict(
        machine=machine,
        settings=dict(
            batches=args.batches,
            warmup=args.warmup,
            repeats=args.repeats,
            step_ms=args.step_ms,
            step_kind=args.step_kind,
            workers=args.workers),
        data_path={},
        collate={},
        transfers={})
    samples = {s: SHAPES[s]() for s in args.shapes}
    runs = len(args.shapes) * len(args.workers) * args.repeats * 2
    with tqdm(total=runs, desc='data path', file=sys.stderr) as bar:
        for shape in args.shapes:
            for workers in args.workers:
                times: Dict[str, List[float]] = {p: [] for p in PATHS}
                for _ in range(args.repeats):
                    for path in PATHS:  # alternate stock and fast
                        times[path] += data_path_times(path, samples[shape],
                                                       workers, args.batches,
                                                       args.warmup,
                                                       args.step_ms / 1e3,
                                                       device, args.step_kind)
                        bar.update()
                med = {p: statistics.median(times[p]) for p in PATHS}
                results['data_path'].setdefault(shape, {})[str(workers)] = \
                    dict(stock_ms=med['stock'] * 1e3,
                         fast_ms=med['fast'] * 1e3,
                         ratio=med['fast'] / med['stock'],
                         samples=len(times['fast']),
                         **{f'{p}_{q}_ms': v * 1e3 for p in PATHS
                            for q, v in _quartiles(times[p]).items()})
    for shape in args.shapes:
        col = collate_times(samples[shape], 10 if args.quick else 30)
        results['collate'][shape] = dict(
            stock_ms=col['stock'] * 1e3,
            fast_ms=col['fast'] * 1e3,
            ratio=col['fast'] / col['stock'])
        results['transfers'][shape] = transfer_figures(samples[shape])
    if args.configs:
        results['iterations'] = config_iterations(args.config_iters,
                                                  args.repeats)
    results['gpu'] = gpu_section()
    results['warnings'] = noise_warnings(results, args.quick)
    print(format_report(results))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return results


def _modes(args: argparse.Namespace, machine: dict,
           device: torch.device) -> dict:
    """``--ops`` and/or ``--train``: run, print, write JSON / plot."""
    from fast_parallel.bench.ops import format_ops
    from fast_parallel.bench.train_time import format_train
    results: dict = dict(machine=machine)
    where = f'{machine["device"]}, {machine["cpus"]} CPUs, torch ' \
        f'{machine["torch"]}'
    data = ensure_data(args.data, args.quick)  # both modes read it
    if args.ops:
        results['ops'] = ops_section(args, data)
        print(format_ops(results['ops']))
    if args.train:
        results['train'] = train_section(args, data)
        print(
            format_train(results['train'], where, cuda=device.type == 'cuda'))
        if args.quick:
            print('WARNING: --quick: a few iterations, one run per arm; a '
                  'check that the tool works, not a measurement')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)
    if args.plot and args.train:
        plot_train(results['train'], args.plot)
    return results


def plot_train(result: dict, path: str) -> None:
    """Bars of median iteration time and data_time per arm, min-max whiskers
    and the number of measured iterations."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    arms = list(result['arms'])
    r = result['arms']
    times = [r[a]['time_s'] * 1e3 for a in arms]
    spread = [[t - r[a]['min_time_s'] * 1e3 for a, t in zip(arms, times)],
              [r[a]['max_time_s'] * 1e3 - t for a, t in zip(arms, times)]]
    data = [r[a]['data_time_s'] * 1e3 for a in arms]
    x = range(len(arms))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([i - 0.2 for i in x],
           times,
           0.4,
           yerr=spread,
           capsize=4,
           label='iteration (median, min-max)')
    ax.bar([i + 0.2 for i in x], data, 0.4, label='data_time (median)')
    ax.set_xticks(list(x))
    ax.set_xticklabels([f'{a}\n{r[a]["iters"]} iterations' for a in arms],
                       fontsize=8)
    ax.set_ylabel('ms')
    ax.set_title(osp.basename(result['settings']['config']))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def format_report(results: dict) -> str:
    """Markdown tables of the results."""
    lines = [
        '## Main-process data path per batch (median, quartiles, '
        'min-max)', '',
        '| batch | workers | stock ms | stock q1-q3 | stock min-max | '
        'fast ms | fast q1-q3 | fast min-max | fast / stock | batches |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: '
        '| ---: |'
    ]

    def spread(r: dict, path: str) -> str:
        return (f'{r[f"{path}_q1_ms"]:.2f}-{r[f"{path}_q3_ms"]:.2f} | '
                f'{r[f"{path}_min_ms"]:.2f}-{r[f"{path}_max_ms"]:.2f}')

    for shape, by_workers in results['data_path'].items():
        for workers, r in by_workers.items():
            lines.append(f'| {shape} | {workers} | {r["stock_ms"]:.2f} | '
                         f'{spread(r, "stock")} | {r["fast_ms"]:.2f} | '
                         f'{spread(r, "fast")} | {r["ratio"]:.2f} | '
                         f'{r["samples"]} |')
    lines += [
        '', '## Worker-side collate, copies and bytes per batch', '',
        '| batch | collate stock ms | collate fast ms | copies stock |'
        ' copies fast | bytes stock | bytes fast |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: |'
    ]
    for shape, c in results['collate'].items():
        t = results['transfers'][shape]
        lines.append(f'| {shape} | {c["stock_ms"]:.2f} | {c["fast_ms"]:.2f} '
                     f'| {t["stock"]["copies"]} | {t["fast"]["copies"]} | '
                     f'{t["stock"]["bytes"]:,} | {t["fast"]["bytes"]:,} |')
    if 'iterations' in results:
        lines += [
            '', '## Full training iterations (small configs)', '',
            '| config | stock s/iter | fast s/iter | stock samples/s |'
            ' fast samples/s | fast / stock time | per-repeat stock |'
            ' per-repeat fast |',
            '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |'
        ]
        for kind, r in results['iterations'].items():
            spread = {
                p: ', '.join(f'{t:.3f}' for t in r[p].get('per_repeat', []))
                for p in PATHS
            }
            lines.append(
                f'| {kind} | {r["stock"]["s_per_iter"]:.3f} | '
                f'{r["fast"]["s_per_iter"]:.3f} | '
                f'{r["stock"]["samples_per_s"]:.2f} | '
                f'{r["fast"]["samples_per_s"]:.2f} | {r["ratio"]:.2f} | '
                f'{spread["stock"]} | {spread["fast"]} |')
    gpu = results['gpu']
    lines += ['', '## GPU', '']
    if gpu['run']:
        lines.append(f'{gpu["device"]}: pinned host-to-device '
                     f'{gpu["pinned_h2d_bytes_per_s"] / 1e9:.1f} GB/s, '
                     f'{gpu["gpus"]} GPU(s)')
    else:
        lines.append(f'not run: {gpu["reason"]}')
    lines += [''] + [f'WARNING: {w}' for w in results.get('warnings', [])]
    return '\n'.join(lines)


def plot(results: dict, path: str) -> None:
    """Charts of the data path (median, quartile bars, batch counts), the
    worker-side collate time and, with ``--configs``, whole iterations."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    panels = 3 if 'iterations' in results else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 + 4 * panels, 4.5))
    labels, bars = [], {p: [] for p in PATHS}
    errs = {p: [[], []] for p in PATHS}
    for shape, by_workers in results['data_path'].items():
        for workers, r in by_workers.items():
            labels.append(f'{shape}\n{workers} workers\n'
                          f'n={r["samples"]}')
            for p in PATHS:
                bars[p].append(r[f'{p}_ms'])
                errs[p][0].append(r[f'{p}_ms'] - r[f'{p}_q1_ms'])
                errs[p][1].append(r[f'{p}_q3_ms'] - r[f'{p}_ms'])
    x = range(len(labels))
    ax = axes[0]
    for offset, p in ((-0.2, 'stock'), (0.2, 'fast')):
        ax.bar([i + offset for i in x],
               bars[p],
               0.4,
               yerr=errs[p],
               capsize=3,
               label=p)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel('ms per batch (median, q1-q3)')
    ax.set_title('main process: next() to input on device')
    ax.legend()
    ax = axes[1]
    shapes = list(results['collate'])
    for offset, p in ((-0.2, 'stock'), (0.2, 'fast')):
        ax.bar([i + offset for i in range(len(shapes))],
               [results['collate'][s][f'{p}_ms'] for s in shapes],
               0.4,
               label=p)
    ax.set_xticks(list(range(len(shapes))))
    ax.set_xticklabels(shapes)
    ax.set_ylabel('ms per batch (median)')
    ax.set_title('worker: collate')
    ax.legend()
    if 'iterations' in results:
        ax = axes[2]
        kinds = list(results['iterations'])
        for offset, p in ((-0.2, 'stock'), (0.2, 'fast')):
            r = [results['iterations'][k][p] for k in kinds]
            med = [v['s_per_iter'] for v in r]
            lo = [m - min(v['per_repeat']) for m, v in zip(med, r)]
            hi = [max(v['per_repeat']) - m for m, v in zip(med, r)]
            ax.bar([i + offset for i in range(len(kinds))],
                   med,
                   0.4,
                   yerr=[lo, hi],
                   capsize=3,
                   label=p)
        ax.set_xticks(list(range(len(kinds))))
        ax.set_xticklabels(kinds)
        ax.set_ylabel('s per iteration (median, per-repeat range)')
        ax.set_title('whole training iteration')
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == '__main__':
    main()
