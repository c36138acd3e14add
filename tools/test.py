"""Test (evaluate) a checkpoint of an mmdet / mmdet3d model.

Usage:
    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out RESULTS.pkl]
        [--show] [--show-dir DIR] [--wait-time SECONDS] [--tta]
        [--json METRICS.json] [--fast | --no-fast]
        [--cfg-options KEY=VALUE ...] [--launcher {none,pytorch,slurm,mpi}]

As mmdet's tools/test.py: prints the metrics (and writes them to ``--json``);
``--out`` dumps the predictions with mmengine's ``DumpResults``; ``--show`` /
``--show-dir`` turn on the config's visualization hook; ``--tta`` tests with
the config's ``tta_model`` and ``tta_pipeline`` (for mmdet, its defaults
where the config has none).
"""
import argparse
import json

from mmengine.dist import is_main_process

# The installed fast_parallel (pip install -e . to run a clone's edits).
import fast_parallel  # noqa: F401  (registers, allow-lists checkpoints)
from fast_parallel.cli import (build_runner, load_config, parse_common_args,
                               tta_config, visualize_config)


def parse_args(argv=None) -> argparse.Namespace:
    """Parses the command line (mmdet's flags plus ``--fast``)."""
    parser = argparse.ArgumentParser(description='Test (and eval) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save logs and results')
    parser.add_argument('--out', help='dump predictions to this pickle file')
    parser.add_argument(
        '--show', action='store_true', help='show prediction results')
    parser.add_argument(
        '--show-dir',
        help='directory where painted images will be saved. If specified, '
        'it will be automatically saved to the work_dir/timestamp/show_dir')
    parser.add_argument(
        '--wait-time', type=float, default=2, help='the interval of show (s)')
    parser.add_argument('--tta', action='store_true', help='test time augment')
    parser.add_argument('--json', help='write the metrics to this JSON file')
    return parse_common_args(parser, argv)


def main(argv=None) -> dict:
    """Builds the Runner, loads the checkpoint, tests and prints metrics.

    Returns:
        dict: The metrics.
    """
    args = parse_args(argv)
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        visualize_config(cfg, args.show, args.show_dir, args.wait_time)
    if args.tta:
        tta_config(cfg)
    if args.out is not None:
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ValueError('--out must be a .pkl file')
        evaluators = cfg.test_evaluator
        if isinstance(evaluators, dict):
            evaluators = [evaluators]
        cfg.test_evaluator = list(evaluators) + [
            dict(type='DumpResults', out_file_path=args.out)
        ]
    metrics = build_runner(cfg).test()
    if is_main_process():
        printable = {
            k: float(v) if isinstance(v, (int, float)) else str(v)
            for k, v in metrics.items()
        }
        print(json.dumps(printable, indent=1))
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(printable, f, indent=1)
    return metrics


if __name__ == '__main__':
    main()
