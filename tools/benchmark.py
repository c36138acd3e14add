"""Stock vs fast data path, measured side by side.

Usage:
    python tools/benchmark.py [--shapes yolox pointpillars] [--workers 0 1 2 4]
        [--batches 30] [--warmup 5] [--repeats 3] [--step-ms 80]
        [--step-kind torch|python]
        [--configs] [--config-iters 10] [--quick]
        [--json OUT.json] [--plot OUT.png]
    python tools/benchmark.py --ops [--presets yolox_s pointpillars]
        [--ops-iters 3] [--ops-warmup 1] [--ops-sweep 2 8 16]
        [--data data/bench] [--configs-root .] [--quick]
        [--ops-configs my_config.py mmdet::retinanet/...py]
    python tools/benchmark.py --pipeline [--presets yolox_s ...]
        [--pipeline-configs CONFIG ...] [--pipeline-samples 200]
        [--pipeline-warmup N]
        [--data data/bench] [--json docs/benchmark_pipeline.json]
    python tools/benchmark.py --train [--train-preset yolox_s]
        [--arms stock stock+pin_memory fast] [--train-iters 50]
        [--train-warmup 10] [--repeats 3] [--data data/bench]
        [--configs-root .] [--quick]
        [--cfg-options KEY=VALUE ...] [--json OUT.json] [--plot OUT.png]

By default: the data path, stock and fast runs alternating in this process
(main-process time per batch for each ``--workers``, worker-side collate,
copies and bytes per batch, ``--configs`` whole iterations of the small
configs, GPU bandwidth): :mod:`fast_parallel.bench.datapath`, its tables
:mod:`fast_parallel.bench.report`, its charts :mod:`fast_parallel.bench.plot`.
``--ops`` (operations per training iteration, :mod:`fast_parallel.bench.ops`),
``--pipeline`` (worker CPU per sample, :mod:`fast_parallel.bench.pipeline`)
and ``--train`` (full training iterations in fresh processes,
:mod:`fast_parallel.bench.train_time`) run instead, on ``--data`` (default
``data/bench`` of this clone, made as ``tools/make_sample_data.py`` makes it
when missing; :mod:`fast_parallel.bench.modes`), with the repository configs
of ``--configs-root`` (default: this clone). ``--quick``: the small sample
configs on ``data/sample``, a few iterations, one repeat (for tests). How to
read the results: ``docs/benchmark.md``.
"""
import argparse
import json
import os
import os.path as osp
import platform
import sys

import torch

# The installed fast_parallel (pip install -e . to run a clone's edits).
from fast_parallel.bench.datapath import SHAPES, STEPS, measure
from fast_parallel.bench.modes import run_modes
from fast_parallel.bench.plot import plot, plot_train
from fast_parallel.bench.report import format_report, noise_warnings

#: The clone this tool is in: the default home of the configs and data.
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


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
    parser.add_argument(
        '--ops-configs',
        nargs='+',
        default=[],
        metavar='CONFIG',
        help='--ops: also count these configs (files, or mmdet::... / '
        'mmdet3d::...) on the data they name, the two config lines added '
        'where FastParallelHook is missing (then no preset unless '
        '--presets is given)')
    parser.add_argument('--ops-iters', type=int, default=3)
    parser.add_argument('--ops-warmup', type=int, default=1)
    parser.add_argument(
        '--ops-sweep',
        type=int,
        nargs='+',
        metavar='BATCH',
        help='--ops: count the --sweep-presets again at these batch sizes')
    parser.add_argument(
        '--sweep-presets',
        nargs='+',
        choices=list(PRESETS),
        default=['yolox_s', 'yolox_tiny_sample'],
        help='the presets --ops-sweep counts (those also in --presets)')
    parser.add_argument(
        '--pipeline',
        action='store_true',
        help='worker CPU per sample of the train pipelines, stock vs fast '
        'vs fast with the decoded-input cache, with a bytes check')
    parser.add_argument(
        '--pipeline-configs',
        nargs='+',
        default=[],
        metavar='CONFIG',
        help='--pipeline: also these configs (then no preset unless '
        '--presets is given)')
    parser.add_argument('--pipeline-samples', type=int, default=200)
    parser.add_argument(
        '--pipeline-warmup',
        type=int,
        default=None,
        help='--pipeline: untimed samples per arm first, to the steady '
        'state a long-running worker is in (default: min(samples, 150))')
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
        help='data folder of --ops/--train (made if missing; default '
        'data/bench of this clone, data/sample with --quick)')
    parser.add_argument(
        '--configs-root',
        default=ROOT,
        help='the folder holding the repository configs (configs/...) '
        'that --configs, --ops and --train run (default: this clone)')
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
    if (args.ops_configs or args.pipeline_configs) and \
            '--presets' not in explicit:
        args.presets = []
    if args.quick and '--pipeline-samples' not in explicit:
        args.pipeline_samples = 6
    if args.quick and '--pipeline-warmup' not in explicit:
        args.pipeline_warmup = 2
    if args.data is None:
        args.data = osp.join(ROOT, 'data', 'sample' if args.quick else 'bench')
    return args


def main(argv=None) -> dict:
    """Runs the measurements, prints tables, writes JSON / plot.

    Args:
        argv (list[str], optional): The command line; ``sys.argv[1:]`` when
            None.

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
    modes = args.ops or args.train or args.pipeline
    if modes:
        results = run_modes(args, machine, device)
    else:
        results = measure(
            machine,
            device,
            args.shapes,
            args.workers,
            args.batches,
            args.warmup,
            args.repeats,
            args.step_ms,
            args.step_kind,
            quick=args.quick,
            configs=args.configs,
            config_iters=args.config_iters,
            configs_root=args.configs_root)
        results['warnings'] = noise_warnings(results, args.quick)
        print(format_report(results))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)
    if args.plot and not modes:
        plot(results, args.plot)
    elif args.plot and args.train:
        plot_train(results['train'], args.plot)
    return results


if __name__ == '__main__':
    main()
