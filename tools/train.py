"""Train an mmdet / mmdet3d model, on the fast path or the stock one.

Usage:
    python tools/train.py CONFIG [--work-dir DIR] [--amp] [--auto-scale-lr]
        [--resume [CHECKPOINT]] [--fast | --no-fast]
        [--cfg-options KEY=VALUE ...] [--launcher {none,pytorch,slurm,mpi}]

As mmdet's tools/train.py; in addition ``--fast`` applies
``fast_parallel.enable`` to any config (``--no-fast`` removes the fast path
from a fast config). ``--resume`` without a path resumes from the latest
checkpoint in the work dir.
"""
import argparse

from mmengine.config import Config

# The installed fast_parallel, as mmdet's tools use the installed mmdet: to
# run a clone's edits, install it editable (pip install -e .).
import fast_parallel  # noqa: F401  (registers, allow-lists checkpoints)
from fast_parallel.cli import (build_runner, load_config, parse_common_args,
                               use_amp)


def parse_args(argv=None) -> argparse.Namespace:
    """Parses the command line (mmdet's flags plus ``--fast``)."""
    parser = argparse.ArgumentParser(description='Train a detector')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp', action='store_true', help='enable automatic mixed precision')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the learning rate to the actual batch size')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from CHECKPOINT, or from the latest checkpoint in the '
        'work dir when no path is given')
    return parse_common_args(parser, argv)


def build_config(args: argparse.Namespace) -> Config:
    """The config with every command-line switch applied."""
    cfg = load_config(args)
    if args.amp:
        use_amp(cfg, 'tools/train.py')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in \
                cfg.auto_scale_lr:
            raise RuntimeError('the config has no auto_scale_lr.'
                               'base_batch_size to scale from')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def main(argv=None) -> None:
    """Builds the Runner from the config and trains."""
    cfg = build_config(parse_args(argv))
    build_runner(cfg).train()


if __name__ == '__main__':
    main()
