"""``--ops`` and ``--train`` of ``tools/benchmark.py``: run, print tables.

Both read a data folder, made by
:func:`~fast_parallel.bench.sample_data.make_sample_data` when missing
(:func:`ensure_data`), and the repository configs under
``args.configs_root`` (:func:`~fast_parallel.bench.presets.config_path`).
"""
import argparse
import json
import os.path as osp
import subprocess
import sys
import tempfile

import torch
from tqdm import tqdm


def ensure_data(root: str, quick: bool) -> str:
    """The benchmark data folder, made (as ``tools/make_sample_data.py``
    makes it) if needed.

    Args:
        root (str): The folder.
        quick (bool): Small sample images (the tests' data) instead of
            COCO-size ones.

    Returns:
        str: ``root``, absolute.
    """
    from fast_parallel.bench.sample_data import make_sample_data
    if quick:
        out = make_sample_data(root)
    else:
        out = make_sample_data(
            root, coco_images=64, kitti_frames=12, coco_size=(480, 640))
    return str(out)


def _count_in_subprocess(args: argparse.Namespace, name: str, size: int,
                         data: str) -> dict:
    """One sweep point, counted by ``python -m fast_parallel.bench.ops`` in
    a new process (a run at a large batch leaves much memory behind)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = osp.join(tmp, 'ops.json')
        options = [f'{k}={v}' for k, v in (args.cfg_options or {}).items()]
        command = [
            sys.executable, '-m', 'fast_parallel.bench.ops', name, out,
            '--data', data, '--configs-root', args.configs_root, '--iters',
            str(args.ops_iters), '--warmup',
            str(args.ops_warmup), '--cfg-options',
            f'train_dataloader.batch_size={size}', *options
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def ops_section(args: argparse.Namespace, data: str) -> dict:
    """``--ops``: op counts of each preset, then of each of
    ``--ops-configs``, stock vs fast.

    With ``--ops-sweep`` the presets of ``--sweep-presets`` are counted again
    at every batch size given, each in a process of its own (the size the
    config has is counted once and used for both tables).

    Args:
        args (argparse.Namespace): The command line (``presets``,
            ``configs_root``, ``cfg_options``, ``ops_iters``, ``ops_warmup``,
            ``ops_sweep``, ``sweep_presets``, ``ops_configs``).
        data (str): The data folder.

    Returns:
        dict: :func:`~fast_parallel.bench.ops.count_preset`, by preset or
        config; with a sweep, ``sweep``: preset -> batch size -> the same.
    """
    from fast_parallel.bench.ops import WORK_DIR, count_preset
    from fast_parallel.bench.presets import load_config, load_preset
    out: dict = {}
    sweep: dict = {}
    sizes = sorted(set(args.ops_sweep or []))
    for name in args.presets:
        cfg = load_preset(name, data, args.configs_root)
        if args.cfg_options:
            cfg.merge_from_dict(args.cfg_options)
        if name in args.sweep_presets:
            for size in sizes:
                sweep.setdefault(name, {})[size] = _count_in_subprocess(
                    args, name, size, data)
        own = cfg.train_dataloader.batch_size
        out[name] = sweep[name][own] if own in sweep.get(
            name, {}) else count_preset(cfg, args.ops_iters, args.ops_warmup,
                                        WORK_DIR)
    for config in args.ops_configs or []:
        cfg = load_config(config)
        if args.cfg_options:
            cfg.merge_from_dict(args.cfg_options)
        out[config] = count_preset(cfg, args.ops_iters, args.ops_warmup,
                                   WORK_DIR)
    if sweep:
        out['sweep'] = sweep
    return out


def train_section(args: argparse.Namespace, data: str) -> dict:
    """``--train``: end-to-end iteration times of the arms.

    Args:
        args (argparse.Namespace): The command line (``train_preset``,
            ``configs_root``, ``cfg_options``, ``arms``, ``repeats``,
            ``train_iters``, ``train_warmup``).
        data (str): The data folder.

    Returns:
        dict: :func:`~fast_parallel.bench.train_time.run_arms`.
    """
    from fast_parallel.bench.presets import (PRESETS, config_path,
                                             preset_options)
    from fast_parallel.bench.train_time import run_arms
    config = PRESETS[args.train_preset].config
    if '::' in config:
        raise ValueError(f'--train runs repository configs; '
                         f'{args.train_preset} is {config}')
    options = preset_options(args.train_preset, data) + [
        f'{k}={v}' for k, v in (args.cfg_options or {}).items()
    ]
    total = len(args.arms) * args.repeats
    with tqdm(total=total, desc='train arms', file=sys.stderr) as bar:
        return run_arms(
            config_path(config, args.configs_root),
            args.arms,
            args.train_iters,
            args.train_warmup,
            args.repeats,
            options,
            progress=bar.update)


def pipeline_section(args: argparse.Namespace, data: str) -> dict:
    """``--pipeline``: worker CPU per sample of each preset and each of
    ``--pipeline-configs``, stock against fast (and cached), with a bytes
    check of every sample.

    Args:
        args (argparse.Namespace): The command line (``presets``,
            ``pipeline_configs``, ``pipeline_samples``,
            ``pipeline_warmup``, ``configs_root``,
            ``cfg_options``).
        data (str): The data folder.

    Returns:
        dict: :func:`~fast_parallel.bench.pipeline.compare_pipelines`, by
        preset or config.
    """
    from fast_parallel.bench.pipeline import compare_pipelines
    from fast_parallel.bench.presets import load_config, load_preset
    configs = [(name, load_preset(name, data, args.configs_root))
               for name in args.presets]
    configs += [(config, load_config(config))
                for config in args.pipeline_configs or []]
    out = {}
    for name, cfg in configs:
        if args.cfg_options:
            cfg.merge_from_dict(args.cfg_options)
        out[name] = compare_pipelines(
            cfg, args.pipeline_samples, warmup=args.pipeline_warmup)
    return out


def _spread(values) -> str:
    return ' / '.join(f'{v:.2f}' for v in values)


def format_pipeline(results: dict) -> str:
    """One line per preset: CPU per sample, ratios, spread, bytes check."""
    lines = [
        'worker CPU per sample (this thread\'s CPU time, arms alternating, '
        'after untimed warm-up samples; spread: min / median / max over '
        'rounds)'
    ]
    for name, r in results.items():
        differs = r['first_difference']
        lines.append(
            f'{name}: stock {r["stock_ms"]:.1f} ms, fast '
            f'{r["fast_ms"]:.1f} ms ({r["ratio"]:.2f}; '
            f'{_spread(r["spread"])}), cached {r["fast_cached_ms"]:.1f} ms '
            f'({r["cached_ratio"]:.2f}; {_spread(r["cached_spread"])}); '
            f'{r["equal"]}/{r["samples"]} samples and random states equal '
            f'(after {r.get("warmup", 0)} warm-up samples' +
            (f'; {len(r["one_time"])} with a one-time event left out of '
             'the times' if r.get('one_time') else '') + ')' +
            (f' (first difference: {differs})' if differs else ''))
        lines.append(f'    {r["switch_cached"]}')
    return '\n'.join(lines)


def run_modes(args: argparse.Namespace, machine: dict,
              device: torch.device) -> dict:
    """``--ops``, ``--train`` and / or ``--pipeline``: run each, print its
    table.

    Args:
        args (argparse.Namespace): The command line (``ops``, ``train``,
            ``data``, ``quick``, ``configs_root`` and what the sections
            read).
        machine (dict): What the results name as the machine.
        device (torch.device): The device the runs use.

    Returns:
        dict: ``machine``, then ``pipeline``, ``ops`` and / or ``train``.
    """
    from fast_parallel.bench.ops import format_ops, format_sweep
    from fast_parallel.bench.train_time import format_train
    results: dict = dict(machine=machine)
    where = f'{machine["device"]}, {machine["cpus"]} CPUs, torch ' \
        f'{machine["torch"]}'
    data = args.data  # --ops-configs name their own
    if args.train or args.presets:
        data = ensure_data(args.data, args.quick)
    if getattr(args, 'pipeline', False):
        results['pipeline'] = pipeline_section(args, data)
        print(format_pipeline(results['pipeline']))
    if args.ops:
        results['ops'] = ops_section(args, data)
        sweep = results['ops'].pop('sweep', None)
        print(format_ops(results['ops']))
        if sweep:
            results['ops_sweep'] = sweep
            print()
            print(format_sweep(sweep))
    if args.train:
        results['train'] = train_section(args, data)
        print(
            format_train(results['train'], where, cuda=device.type == 'cuda'))
        if args.quick:
            print('WARNING: --quick: a few iterations, one run per arm; a '
                  'check that the tool works, not a measurement')
    return results
