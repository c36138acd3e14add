"""Writes small, deterministic COCO, KITTI and nuScenes sets for tests and
demos.

Usage:
    python tools/make_sample_data.py [--out data] [--coco-images 8]
        [--coco-size 128 160] [--kitti-frames 6] [--nuscenes-frames 4]
        [--seed 0] [--no-skip-existing]

The sample configs (``configs/*/*_fast_sample.py``) read ``data/sample``:
``python tools/make_sample_data.py --out data/sample``. The makers live in
:mod:`fast_parallel.bench.sample_data`; what they write and why is in
``docs/sample_data.md``.
"""
import argparse
from pathlib import Path
from typing import Dict, Optional, Sequence

# The installed fast_parallel (pip install -e . to run a clone's edits).
from fast_parallel.bench.sample_data import (COCO_CATEGORY_IDS, COCO_SHAPES,
                                             COCO_SIZE, coco_is,
                                             coco_made_with, make_coco,
                                             make_kitti_raw, make_nuscenes_raw,
                                             make_sample_data)

# The names this tool had before its makers moved (the tests use them).
_coco_made_with = coco_made_with
_coco_is = coco_is

__all__ = [
    'COCO_CATEGORY_IDS', 'COCO_SHAPES', 'COCO_SIZE', 'build_parser', 'main',
    'make_coco', 'make_kitti_raw', 'make_nuscenes_raw', 'make_sample_data',
    'parse_args'
]


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, with a help text for every option.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    parser = argparse.ArgumentParser(
        description='Writes a small, deterministic COCO set (OUT/coco), '
        'KITTI set (OUT/kitti, with the infos and gt database of mmdet3d\'s '
        'create_data.py) and nuScenes set (OUT/nuscenes: key frames with '
        'sweeps, 1.x infos, gt database) for the tests and demos; the '
        'sample configs read --out data/sample. Everything follows from '
        '--seed.')
    parser.add_argument(
        '--out',
        type=Path,
        default=Path('data'),
        help='folder to write coco/ and kitti/ into '
        '(default: %(default)s)')
    parser.add_argument(
        '--coco-images',
        type=int,
        default=8,
        help='COCO train images; val gets half, rounded up '
        '(default: %(default)s)')
    parser.add_argument(
        '--coco-size',
        type=int,
        nargs=2,
        default=list(COCO_SIZE),
        metavar=('MIN', 'MAX'),
        help='least and largest COCO image side in pixels, '
        'width and height drawn independently (default: '
        '%(default)s; the benchmarks use 480 640)')
    parser.add_argument(
        '--kitti-frames',
        type=int,
        default=6,
        help='KITTI train frames; val and test get half each, '
        'rounded up (default: %(default)s)')
    parser.add_argument(
        '--nuscenes-frames',
        type=int,
        default=4,
        help='nuScenes train key frames, each with 10 sweeps; val gets '
        'half, rounded up (default: %(default)s)')
    parser.add_argument(
        '--seed',
        type=int,
        default=0,
        help='random seed of every image, box and point '
        '(default: %(default)s)')
    parser.add_argument(
        '--skip-existing',
        default=True,
        action=argparse.BooleanOptionalAction,
        help='leave a set alone when all its files exist '
        '(COCO: made with the same images, size and seed); '
        '--no-skip-existing writes them all again')
    return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses the command line.

    Args:
        argv (Sequence[str], optional): Arguments; ``sys.argv[1:]`` if None.

    Returns:
        argparse.Namespace: The options.
    """
    return build_parser().parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """Command-line entry point.

    Args:
        argv (Sequence[str], optional): Arguments; ``sys.argv[1:]`` if None.

    Returns:
        dict[str, str]: Paths of the ``coco``, ``kitti`` and ``nuscenes``
        folders.
    """
    args = parse_args(argv)
    out = make_sample_data(args.out, args.coco_images, args.kitti_frames,
                           args.seed, args.skip_existing, args.coco_size,
                           args.nuscenes_frames)
    return {name: str(out / name) for name in ('coco', 'kitti', 'nuscenes')}


if __name__ == '__main__':
    main()
