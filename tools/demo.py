"""``make demo``: the fast path on both small configs, checked against stock.

Usage: python tools/demo.py [--iters-yolox 4] [--iters-pointpillars 3]
                            [--packing-only]

1. Prints, for a YOLOX-shaped batch (8 images 3x640x640 uint8, 0-100 boxes
   each) and a PointPillars-shaped batch (6 clouds of 15k-25k points x 4
   float32, 0-40 LiDAR boxes each), built with mmdet's PackDetInputs and
   mmdet3d's Pack3DDetInputs, what stock ``cast_data`` copies to the device
   and what ``packed_collate`` copies.
2. Makes the sample COCO and KITTI sets in data/sample if they are missing
   (tools/make_sample_data.py).
3. Runs tools/parity.py --eval on the two small configs and prints both
   tables. Exits non-zero if either differs.
"""
import argparse
import os
import os.path as osp
import subprocess
import sys

from mmengine.dataset import pseudo_collate

# The installed fast_parallel (pip install -e . to run a clone's edits).
from fast_parallel import packed_collate
from fast_parallel.bench.synthetic import pointpillars_samples, yolox_samples
from fast_parallel.data.packing import stock_transfers

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

SMALL_CONFIGS = {
    'yolox': 'configs/yolox/yolox_tiny_fast_sample.py',
    'pointpillars':
    'configs/pointpillars/pointpillars_hv_secfpn_fast_sample.py',
}


def packing_table() -> str:
    """Builds the stock-vs-packed table for both batch shapes.

    Returns:
        str: A Markdown table.
    """
    rows = [
        '| batch | path | tensors | copies to device | bytes | dtypes |',
        '| --- | --- | ---: | ---: | ---: | --- |',
    ]
    shapes = [('YOLOX 8x3x640x640', yolox_samples(8)),
              ('PointPillars 6x(15k-25k)x4', pointpillars_samples(6))]
    for name, samples in shapes:
        stock = pseudo_collate(samples)
        copies, nbytes = stock_transfers(stock)
        packed = packed_collate(samples)
        dtypes = ', '.join(
            str(dt).replace('torch.', '') for dt in packed.buffers)
        rows.append(f'| {name} | stock | {copies} | {copies} | '
                    f'{nbytes:,} | {dtypes} |')
        rows.append(f'| {name} | packed | {packed.num_leaves} | '
                    f'{packed.num_copies} | {packed.nbytes:,} | {dtypes} |')
    return '\n'.join(rows)


def parse_args(argv=None) -> argparse.Namespace:
    """Parses the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--iters-yolox', type=int, default=4)
    parser.add_argument('--iters-pointpillars', type=int, default=3)
    parser.add_argument(
        '--packing-only',
        action='store_true',
        help='print the packing table and stop')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Runs the demo.

    Returns:
        int: 0 when both parity checks are identical.
    """
    args = parse_args(argv)
    os.chdir(ROOT)
    print('## Copies per batch: stock cast_data vs packed_collate\n')
    print(packing_table(), flush=True)
    if args.packing_only:
        return 0
    # the small configs read data/sample/{coco,kitti}
    subprocess.run(
        [sys.executable, 'tools/make_sample_data.py', '--out', 'data/sample'],
        check=True)
    codes = []
    for kind, iters in (('yolox', args.iters_yolox),
                        ('pointpillars', args.iters_pointpillars)):
        cmd = [
            sys.executable, 'tools/parity.py', SMALL_CONFIGS[kind], '--iters',
            str(iters), '--eval', '--out',
            f'work_dirs/demo/parity_{kind}.json', '--work-dir',
            f'work_dirs/demo/{kind}'
        ]
        print(f'\n$ {" ".join(cmd[1:])}', flush=True)
        codes.append(subprocess.run(cmd).returncode)
    print('\ndemo: both parity checks identical'
          if not any(codes) else '\ndemo: a parity check FAILED')
    return int(any(codes))


if __name__ == '__main__':
    sys.exit(main())
