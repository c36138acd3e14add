"""The packing demo: tensors, copies and bytes per batch, stock vs packed.

Usage: python tools/demo.py

For a YOLOX-shaped batch (8 images 3x640x640 uint8, 0-100 boxes each) and a
PointPillars-shaped batch (6 clouds of 15k-25k points x 4 float32, 0-40 LiDAR
boxes each), built with mmdet's PackDetInputs and mmdet3d's Pack3DDetInputs,
prints what stock ``cast_data`` copies to the device and what
``packed_collate`` copies.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.dataset import pseudo_collate  # noqa: E402

from fast_parallel import packed_collate  # noqa: E402
from fast_parallel.packing import stock_transfers  # noqa: E402
from fast_parallel.synthetic import (pointpillars_samples,  # noqa: E402
                                     yolox_samples)


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


def main() -> None:
    """Prints the packing table."""
    print(packing_table())


if __name__ == '__main__':
    main()
