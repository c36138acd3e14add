"""Operations dispatched per training iteration, stock vs fast.

Each preset trains a few iterations under mmengine's Runner twice in this
process, on the stock path (``fast_parallel.disable``) and on the fast path,
from the same seed (so on the same batches), with the optimizer's
``foreach`` forced on so that a CPU takes the multi-tensor paths a GPU takes.
:func:`~fast_parallel.bench.opcount.count_iteration_ops` counts every
iteration;
the first ``warmup`` are left out of the medians (the optimizer creates its
state in the first step).

Count one preset in a process of its own (what ``--ops-sweep`` does)::

    python -m fast_parallel.bench.ops PRESET OUT.json --data DIR \
        [--configs-root DIR] [--iters 3] [--warmup 1] [--cfg-options ...]
"""
import argparse
import copy
import json
import statistics
from collections import Counter
from typing import Dict, List, Optional, Sequence

from mmengine.config import Config, DictAction
from mmengine.runner import Runner

from fast_parallel.bench.opcount import PHASES, count_iteration_ops
from fast_parallel.parity.runner import parity_config

PATHS = ('stock', 'fast')
#: Where the counting runs write (their logs; no checkpoints).
WORK_DIR = 'work_dirs/benchmark_ops'


def ops_config(cfg: Config,
               path: str,
               iters: int,
               work_dir: str,
               seed: int = 0) -> Config:
    """One counting run's config.

    Args:
        cfg (Config): A config (fast or not).
        path (str): 'stock' or 'fast'.
        iters (int): Training iterations.
        work_dir (str): Parent work dir.
        seed (int): Random seed. Defaults to 0.

    Returns:
        Config: ``iters`` iterations, no validation, no checkpoints, quiet
        log, ``foreach=True``.
    """
    run = parity_config(
        cfg, path, iters, False, work_dir, seed, deterministic=False)
    optimizer = run.optim_wrapper.get('optimizer', None)
    if optimizer is None:
        raise ValueError('--ops: the config has no optim_wrapper.optimizer '
                         'to force foreach=True on')
    optimizer['foreach'] = True
    run.log_level = 'WARNING'
    return run


def count_run(cfg: Config) -> List[dict]:
    """Trains one config and returns its per-iteration counts.

    Args:
        cfg (Config): From :func:`ops_config`.

    Returns:
        list[dict]: See
        :func:`~fast_parallel.bench.opcount.count_iteration_ops`.
    """
    runner = Runner.from_cfg(cfg)
    record = count_iteration_ops(runner)
    runner.train()
    return record


def _median(values: List[float]) -> float:
    return float(statistics.median(values))


def summarize(records: Dict[str, List[dict]], warmup: int) -> dict:
    """Medians, ratio and the operations that changed most.

    Args:
        records (dict): ``{'stock': [...], 'fast': [...]}`` per-iteration
            records of the same iterations.
        warmup (int): Leading iterations left out.

    Returns:
        dict: Per path ``total`` (median), ``per_iter`` (every measured
        iteration), ``phases`` (medians), ``items`` (``.item()`` calls,
        median), ``device_copies``; ``ratio``
        (fast / stock of the medians) and ``changed`` (operation -> stock
        and fast median counts, largest differences first).
    """
    out: dict = {}
    for path in PATHS:
        measured = records[path][warmup:]
        if not measured:
            raise ValueError(f'no iterations left after {warmup} warm-up')
        out[path] = dict(
            total=_median([r['total'] for r in measured]),
            per_iter=[r['total'] for r in measured],
            phases={
                p: _median([r['phases'][p] for r in measured])
                for p in PHASES
            },
            items=_median([r['items'] for r in measured]),
            device_copies=_median([r['device_copies'] for r in measured]))
    out['ratio'] = out['fast']['total'] / out['stock']['total']
    names = set()
    for path in PATHS:
        for r in records[path][warmup:]:
            names.update(r['ops'])
    med = {
        path: {
            n: _median([r['ops'].get(n, 0) for r in records[path][warmup:]])
            for n in names
        }
        for path in PATHS
    }
    diff = Counter({n: abs(med['stock'][n] - med['fast'][n]) for n in names})
    out['changed'] = {
        n: dict(stock=med['stock'][n], fast=med['fast'][n])
        for n, d in diff.most_common(8) if d
    }
    return out


def count_preset(cfg: Config,
                 iters: int,
                 warmup: int,
                 work_dir: str,
                 seed: int = 0) -> dict:
    """Counts stock and fast on one config; see :func:`summarize`.

    Args:
        cfg (Config): The config, its data in place.
        iters (int): Measured iterations.
        warmup (int): Iterations before them.
        work_dir (str): Parent work dir of the runs.
        seed (int): Random seed. Defaults to 0.

    Returns:
        dict: :func:`summarize`'s result plus ``batch_size``.
    """
    records = {
        path:
        count_run(
            ops_config(
                copy.deepcopy(cfg), path, warmup + iters, work_dir, seed))
        for path in PATHS
    }
    summary = summarize(records, warmup)
    summary['batch_size'] = cfg.train_dataloader.batch_size
    return summary


def _phases(r: dict) -> str:
    p = r['phases']
    hooks = p['before_iter_hooks'] + p['after_iter_hooks']
    return (f'{p["train_step"]:,.0f} / {p["targets"]:,.0f} / '
            f'{p["optimizer_step"]:,.0f} / {hooks:,.0f}')


def format_ops(results: Dict[str, dict]) -> str:
    """Markdown tables of :func:`count_preset` results by preset name."""
    lines = [
        '## Operations dispatched per training iteration (median, '
        'views left out, optimizer foreach=True)', '',
        '| config | batch | stock ops | fast ops | fast / stock | '
        '`.item()` stock / fast | stock: step / targets / optimizer / '
        'hooks | fast: step / targets / optimizer / hooks | '
        'copies to device stock / fast |',
        '| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |'
    ]
    for name, r in results.items():
        lines.append(
            f'| {name} | {r["batch_size"]} | {r["stock"]["total"]:,.0f} | '
            f'{r["fast"]["total"]:,.0f} | {r["ratio"]:.2f} | '
            f'{r["stock"]["items"]:.0f} / {r["fast"]["items"]:.0f} | '
            f'{_phases(r["stock"])} | {_phases(r["fast"])} | '
            f'{r["stock"]["device_copies"]:.0f} / '
            f'{r["fast"]["device_copies"]:.0f} |')
    lines += [
        '', '(step: the rest of `train_step`: data preprocessor, forward, '
        'loss, backward; targets: the heads\' training targets.)', '',
        'Operations that changed most (median per iteration, '
        'stock -> fast):', ''
    ]
    for name, r in results.items():
        changed = ', '.join(f'{op} {c["stock"]:,.0f} -> {c["fast"]:,.0f}'
                            for op, c in r['changed'].items())
        lines.append(f'- {name}: {changed or "none"}')
    return '\n'.join(lines)


def format_sweep(sweeps: Dict[str, Dict[int, dict]]) -> str:
    """Markdown table of batch-size sweeps (:func:`count_preset` per size).

    Args:
        sweeps (dict): Preset name -> batch size -> result.

    Returns:
        str: One row per preset and batch size, with the growth of each
        path's count over the smallest batch.
    """
    lines = [
        '## Operations per iteration against the batch size', '',
        '| config | batch | stock ops | fast ops | stock targets | '
        'fast targets | `.item()` stock / fast | growth over the smallest '
        'batch stock / fast |', '| --- | ---: | ---: | ---: | ---: | ---: | '
        '---: | ---: |'
    ]
    for name, by_size in sweeps.items():
        first = by_size[min(by_size)]
        for size in sorted(by_size):
            r = by_size[size]
            growth = ' / '.join(f'{r[p]["total"] / first[p]["total"] - 1:+.1%}'
                                for p in PATHS)
            lines.append(
                f'| {name} | {size} | {r["stock"]["total"]:,.0f} | '
                f'{r["fast"]["total"]:,.0f} | '
                f'{r["stock"]["phases"]["targets"]:,.0f} | '
                f'{r["fast"]["phases"]["targets"]:,.0f} | '
                f'{r["stock"]["items"]:.0f} / {r["fast"]["items"]:.0f} | '
                f'{growth} |')
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Counts one preset and writes :func:`count_preset`'s result as JSON
    (the child process of a sweep)."""
    from fast_parallel.bench.presets import PRESETS, load_preset
    parser = argparse.ArgumentParser(description='operation counts of one '
                                     'benchmark preset, stock vs fast')
    parser.add_argument('preset', choices=list(PRESETS))
    parser.add_argument('out', help='write the counts here (JSON)')
    parser.add_argument('--data', required=True, help='the data folder')
    parser.add_argument(
        '--configs-root',
        default='.',
        help='the folder the repository configs (configs/...) are in '
        '(default: the current directory)')
    parser.add_argument('--iters', type=int, default=3)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--work-dir', default=WORK_DIR)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args(argv)
    cfg = load_preset(args.preset, args.data, args.configs_root)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    counts = count_preset(cfg, args.iters, args.warmup, args.work_dir)
    with open(args.out, 'w') as f:
        json.dump(counts, f)


if __name__ == '__main__':
    main()
