"""Full training iterations timed end to end, one fresh process per run.

Arms:

- ``stock``: the config without fast_parallel (``fast_parallel.disable``);
- ``stock+pin_memory``: the same with the train DataLoader's
  ``pin_memory=True``, the one-line change a user could make instead
  (without an accelerator torch pins nothing: the arm runs stock);
- ``fast``: the config with ``FastParallelHook`` (data path, fused optimizer,
  foreach EMA).

Each run trains ``iters`` iterations of the config (no validation, no
checkpoints) in a new Python process, so no arm inherits another's warm
caches, workers or allocator; the arms alternate (their order rotates every
repeat). mmengine's ``IterTimerHook`` gives each iteration's time and
data_time; on a GPU a hook synchronises the device at the end of every
iteration, before the timer reads the clock, so that an iteration's time
includes its kernels. The first ``warmup`` iterations of every run are left
out; the medians pool the measured iterations of every repeat.

Run one arm by hand::

    python -m fast_parallel.bench.train_time CONFIG ARM ITERS OUT.json \\
        [--cfg-options ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.config import Config, DictAction
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from fast_parallel.bench.presets import without_accuracy_check
from fast_parallel.data.loader import accelerator_available
from fast_parallel.parity.runner import parity_config

ARMS = ('stock', 'stock+pin_memory', 'fast')


@HOOKS.register_module()
class SyncAtIterEndHook(Hook):
    """Waits for the GPU at the end of each training iteration.

    Its priority puts it before ``IterTimerHook`` (NORMAL) in
    ``after_train_iter``, so the iteration's time covers its kernels.
    """

    priority = 'ABOVE_NORMAL'

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        """Synchronises every visible GPU."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()


def arm_config(cfg: Config,
               arm: str,
               iters: int,
               work_dir: str,
               seed: int = 0) -> Config:
    """One run's config.

    Args:
        cfg (Config): The config (fast or not).
        arm (str): One of :data:`ARMS`.
        iters (int): Training iterations.
        work_dir (str): Parent work dir.
        seed (int): Random seed. Defaults to 0.

    Returns:
        Config: The arm's config.
    """
    if arm not in ARMS:
        raise ValueError(f'unknown arm {arm!r}; one of {ARMS}')
    run = parity_config(
        cfg,
        'fast' if arm == 'fast' else 'stock',
        iters,
        False,
        work_dir,
        seed,
        deterministic=False)
    if arm == 'stock+pin_memory' and accelerator_available():
        # without an accelerator torch pins nothing, and warns
        run.train_dataloader.pin_memory = True
    run.custom_hooks = list(run.get('custom_hooks', None)
                            or []) + [dict(type='SyncAtIterEndHook')]
    run.log_level = 'WARNING'
    return run


def run_arm(cfg: Config) -> dict:
    """Trains one arm's config in this process.

    Args:
        cfg (Config): From :func:`arm_config`.

    Returns:
        dict: ``time`` and ``data_time`` (seconds, per iteration) and
        ``batch_size``.
    """
    from mmengine.runner import Runner
    runner = Runner.from_cfg(cfg)
    runner.train()
    scalars = runner.message_hub.log_scalars
    return dict(
        time=scalars['train/time'].data[0].tolist(),
        data_time=scalars['train/data_time'].data[0].tolist(),
        batch_size=runner.train_dataloader.batch_size)


def _median(values: List[float]) -> float:
    return float(statistics.median(values))


def summarize(runs: Dict[str, List[dict]], warmup: int) -> dict:
    """Medians per arm over the measured iterations of all its runs.

    Args:
        runs (dict): Arm -> the records of its runs (:func:`run_arm`).
        warmup (int): Leading iterations of each run left out.

    Returns:
        dict: Per arm ``time_s``, ``data_time_s`` (medians),
        ``samples_per_s``, ``min_time_s``/``max_time_s`` and
        ``per_repeat_time_s`` (each run's median): the spread, ``iters``
        (measured), the raw ``times_s``/``data_times_s`` and ``ratio`` (its
        median time / stock's).
    """
    out = {}
    for arm, records in runs.items():
        times = [t for r in records for t in r['time'][warmup:]]
        data = [t for r in records for t in r['data_time'][warmup:]]
        if not times:
            raise ValueError(f'{arm}: no iterations left after {warmup} '
                             'warm-up')
        batch = records[0]['batch_size']
        out[arm] = dict(
            time_s=_median(times),
            data_time_s=_median(data),
            samples_per_s=batch / _median(times),
            min_time_s=min(times),
            max_time_s=max(times),
            per_repeat_time_s=[_median(r['time'][warmup:]) for r in records],
            iters=len(times),
            batch_size=batch,
            times_s=times,
            data_times_s=data)
    if 'stock' in out:
        for arm in out:
            out[arm]['ratio'] = out[arm]['time_s'] / out['stock']['time_s']
    return out


def run_arms(config: str,
             arms: Sequence[str],
             iters: int,
             warmup: int,
             repeats: int,
             cfg_options: Sequence[str] = (),
             work_dir: str = 'work_dirs/benchmark_train',
             timeout: float = 3600,
             progress=None) -> dict:
    """Every arm ``repeats`` times, alternating, each in a fresh process.

    Args:
        config (str): Config file.
        arms (Sequence[str]): Arms to run (:data:`ARMS`).
        iters (int): Iterations per run, warm-up included.
        warmup (int): Leading iterations of each run left out.
        repeats (int): Runs per arm.
        cfg_options (Sequence[str]): ``key=value`` overrides.
        work_dir (str): Parent work dir of the runs.
        timeout (float): Seconds one run may take. Defaults to 3600.
        progress (callable, optional): Called after each run.

    Returns:
        dict: :func:`summarize` of the runs, plus ``order`` (the arm order
        of the runs) and the ``settings``.
    """
    if iters <= warmup:
        raise ValueError(f'--train-iters ({iters}) must exceed the warm-up '
                         f'({warmup})')
    runs: Dict[str, List[dict]] = {arm: [] for arm in arms}
    order = []
    for repeat in range(repeats):
        shift = repeat % len(arms)
        for arm in list(arms[shift:]) + list(arms[:shift]):
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, 'arm.json')
                cmd = [
                    sys.executable, '-m', 'fast_parallel.bench.train_time',
                    config, arm,
                    str(iters), out, '--work-dir', work_dir
                ]
                if cfg_options:
                    cmd += ['--cfg-options', *cfg_options]
                done = subprocess.run(
                    cmd,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    env=_env())
                if done.returncode != 0:
                    raise RuntimeError(
                        f'benchmark arm {arm} failed ({done.returncode}):\n'
                        f'{done.stderr[-3000:]}')
                with open(out) as f:
                    runs[arm].append(json.load(f))
            order.append(arm)
            if progress is not None:
                progress()
    result = summarize(runs, warmup)
    return dict(
        arms=result,
        order=order,
        settings=dict(
            config=config,
            iters=iters,
            warmup=warmup,
            repeats=repeats,
            cfg_options=list(cfg_options)))


def _env() -> Dict[str, str]:
    """This environment, with the fast_parallel that runs here the one the
    child imports (a clone's or an installed one alike)."""
    import fast_parallel
    package = os.path.dirname(os.path.abspath(fast_parallel.__file__))
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (os.path.dirname(package), env.get('PYTHONPATH')) if p)
    return env


#: Spread ((max - min) / median of an arm's iterations) above which the
#: table carries a warning.
NOISY = 0.2


def warnings_for(result: dict, cuda: bool) -> List[str]:
    """What a reader of the table must know before trusting a ratio.

    Args:
        result (dict): :func:`run_arms`' result.
        cuda (bool): Whether the runs had a GPU.

    Returns:
        list[str]: Warning lines (empty when none).
    """
    out = []
    for arm, r in result['arms'].items():
        spread = (r['max_time_s'] - r['min_time_s']) / r['time_s']
        if spread > NOISY:
            out.append(f'{arm}: iteration times spread {spread:.0%} of the '
                       f'median ({r["min_time_s"] * 1e3:.1f}-'
                       f'{r["max_time_s"] * 1e3:.1f} ms): differences '
                       'between arms smaller than that are noise')
        if r['iters'] < 20:
            out.append(f'{arm}: only {r["iters"]} measured iterations')
    if not cuda and 'stock+pin_memory' in result['arms']:
        out.append('no CUDA: pin_memory does nothing, stock+pin_memory runs '
                   "stock's code (any difference is noise)")
    return out


def format_train(result: dict, machine: str, cuda: bool = False) -> str:
    """A markdown table of :func:`run_arms`' result, warnings below it."""
    s = result['settings']
    lines = [
        f'## Training iterations end to end '
        f'({os.path.basename(s["config"])}, '
        f'{s["iters"] - s["warmup"]} measured iterations x '
        f'{s["repeats"]} runs per arm, fresh processes; {machine})', '',
        '| arm | iteration ms (median) | min-max ms | data_time ms | '
        'samples/s | time / stock | per-run medians ms | iterations |',
        '| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |'
    ]
    for arm, r in result['arms'].items():
        spread = ', '.join(f'{t * 1e3:.1f}' for t in r['per_repeat_time_s'])
        ratio = f'{r["ratio"]:.2f}' if 'ratio' in r else '-'
        lines.append(f'| {arm} | {r["time_s"] * 1e3:.1f} | '
                     f'{r["min_time_s"] * 1e3:.1f}-'
                     f'{r["max_time_s"] * 1e3:.1f} | '
                     f'{r["data_time_s"] * 1e3:.2f} | '
                     f'{r["samples_per_s"]:.2f} | {ratio} | {spread} | '
                     f'{r["iters"]} |')
    lines += [f'WARNING: {w}' for w in warnings_for(result, cuda)]
    return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Runs one arm and writes its record as JSON (the child process)."""
    parser = argparse.ArgumentParser(description='one benchmark arm')
    parser.add_argument('config')
    parser.add_argument('arm', choices=ARMS)
    parser.add_argument('iters', type=int)
    parser.add_argument('out')
    parser.add_argument('--work-dir', default='work_dirs/benchmark_train')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    without_accuracy_check(cfg)
    record = run_arm(arm_config(cfg, args.arm, args.iters, args.work_dir))
    with open(args.out, 'w') as f:
        json.dump(record, f)


if __name__ == '__main__':
    main()
