"""Stock vs fast data path on any mmdet / mmdet3d config, side by side.

Usage:
    python tools/parity.py CONFIG --iters N [--eval] [--atol A] [--seed S]
        [--out REPORT.json] [--work-dir DIR] [--cfg-options KEY=VALUE ...]
        [--fast-hooks HOOK_TYPE ...] [--no-deterministic] [--amp]

Trains N iterations twice from the same seed with deterministic settings:
the stock path (pseudo_collate, mmengine's own wrapping) and the fast path
(packed batches, FastDataParallel / FastDistributedDataParallel). CONFIG may
have the fast path on or off: each run switches it itself. Prints the
training order (the sample ids of every batch, img_id / sample_idx, and the
first iteration where the runs' batches differ), every loss term of every
iteration, the gradient norm of every optimizer step (``grad_norm``: before
clipping, as mmengine logs it; with ``clip_grad`` also ``grad_norm after
clip_grad``, what the step sees), how many batches arrived packed (differs by
design: stock none, fast all), a checksum of all parameters after N
iterations and, with --eval, both sets of validation metrics. Exits 0 only
when all are identical (or within --atol; the order must be identical) and
every batch of the fast run arrived packed.
--fast-hooks adds hooks (registered types) to the fast run only: to debug,
or to check that the checker catches a change: `--fast-hooks
PerturbFirstBatchHook` (shipped in fast_parallel.parity.runner, which this
tool imports) adds
1.0 to one value of the fast run's first batch, and the report must say
DIFFERENT.
"""
import argparse
import json
import os.path as osp
import sys

from mmengine.config import Config, DictAction
from tqdm import tqdm

# The installed fast_parallel (pip install -e . to run a clone's edits).
import fast_parallel  # noqa: F401
from fast_parallel.cli import use_amp
from fast_parallel.parity.report import format_table, grad_norm_note
from fast_parallel.parity.runner import cuda_determinism, run_parity


def parse_args(argv=None) -> argparse.Namespace:
    """Parses the command line."""
    parser = argparse.ArgumentParser(description='Stock vs fast, same seed')
    parser.add_argument('config')
    parser.add_argument(
        '--iters', type=int, required=True, help='training iterations per run')
    parser.add_argument(
        '--eval',
        action='store_true',
        help='validate after the last iteration')
    parser.add_argument(
        '--atol',
        type=float,
        default=0.0,
        help='absolute tolerance (0: identical, the default;'
        ' set it for multi-GPU runs)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--no-deterministic', dest='deterministic', action='store_false')
    parser.add_argument('--out', help='write a JSON report here')
    parser.add_argument(
        '--work-dir',
        help='parent of the two runs\' dirs '
        '(default: work_dirs/parity/<config name>)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings of both runs, key=value')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='both runs in mixed precision (AmpOptimWrapper, as '
        'tools/train.py --amp); needs a GPU')
    parser.add_argument(
        '--fast-hooks',
        nargs='+',
        default=[],
        help='hook types added to the fast run only')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Runs both paths and prints the table.

    Returns:
        int: 0 when every value matches, 1 otherwise.
    """
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.amp:
        use_amp(cfg, 'tools/parity.py')
    note = cuda_determinism(args.deterministic)
    if note:
        print(f'tools/parity.py: {note}', file=sys.stderr)
    name = osp.splitext(osp.basename(args.config))[0]
    work_dir = args.work_dir or osp.join('work_dirs', 'parity', name)
    with tqdm(
            total=2 * args.iters,
            desc=f'parity {name}',
            unit='iter',
            file=sys.stderr) as bar:

        def tick(path: str) -> None:
            bar.set_postfix_str(path, refresh=False)
            bar.update()

        # The runs' own output (logs, warnings, COCO tables) goes to
        # WORK_DIR/{stock,fast}/output.log; the progress bar keeps the
        # terminal.
        result = run_parity(
            cfg,
            args.iters,
            args.eval,
            work_dir,
            args.seed,
            args.deterministic,
            args.fast_hooks,
            args.atol,
            progress=tick)
    rows, ok, order = result['rows'], result['ok'], result['order']
    print(f'\n## parity: {name}, {args.iters} iterations'
          f'{" + validation" if args.eval else ""}, atol={args.atol:g}\n')
    print(format_table(rows))
    print(f'\n{grad_norm_note(result["records"]["stock"])}')
    for line in result['notes']:
        print(f'note: {line}')
    # rows whose values differ by design (packed batches) are no values
    values = [r for r in rows if not r.get('by_design')]
    different = sum(not r['same'] for r in values)
    by_design = '; '.join(
        f'{r["what"]}: {"as designed" if r["same"] else "NOT as designed"} '
        f'({r["by_design"]})' for r in rows if r.get('by_design'))
    print(f'\ntraining order: '
          f'{"IDENTICAL" if order["same"] else "DIFFERENT"} '
          f'({order["detail"]})')
    if not order['same']:
        print('  the runs trained on different batches, so the loss, '
              'gradient and parameter rows compare different things')
    print(f'result: {result["verdict"]} '
          f'({len(values) - different}/{len(values)} values match; '
          f'{by_design}); the runs\' '
          f'logs are in {work_dir}/{{stock,fast}}/output.log')
    if args.out:
        report = dict(
            config=args.config,
            iters=args.iters,
            eval=args.eval,
            atol=args.atol,
            seed=args.seed,
            ok=ok,
            verdict=result['verdict'],
            notes=result['notes'],
            order=order,
            rows=rows,
            **{
                p: {
                    k: v
                    for k, v in r.items() if k != 'params'
                }
                for p, r in result['records'].items()
            })
        with open(args.out, 'w') as f:
            json.dump(report, f, indent=1)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
