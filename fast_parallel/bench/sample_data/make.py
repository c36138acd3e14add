"""Writes the sample COCO and KITTI sets, with a progress line per step.

What and why: ``docs/sample_data.md``.
"""
import contextlib
import math
import time
from pathlib import Path
from typing import Iterator, Tuple

from fast_parallel.bench.sample_data.coco import (COCO_SIZE, coco_is,
                                                  coco_made_with, make_coco)
from fast_parallel.bench.sample_data.common import all_exist
from fast_parallel.bench.sample_data.kitti import make_kitti_raw
from fast_parallel.bench.sample_data.kitti_converter import (
    KITTI_OUTPUTS, run_kitti_converter, run_nuscenes_gt_database)
from fast_parallel.bench.sample_data.nuscenes import (NUSCENES_OUTPUTS,
                                                      make_nuscenes_raw)


@contextlib.contextmanager
def _progress(what: str) -> Iterator[None]:
    """Prints ``make_sample_data: WHAT ...``, then ``done in N s``.

    Args:
        what (str): The step.

    Yields:
        None: While the step runs; the time follows on the same line.
    """
    print(f'make_sample_data: {what} ...', end=' ', flush=True)
    start = time.perf_counter()
    yield
    print(f'done in {time.perf_counter() - start:.1f} s', flush=True)


def make_sample_data(out: Path,
                     coco_images: int = 8,
                     kitti_frames: int = 6,
                     seed: int = 0,
                     skip_existing: bool = True,
                     coco_size: Tuple[int, int] = COCO_SIZE,
                     nuscenes_frames: int = 4) -> Path:
    """Writes ``out/coco``, ``out/kitti`` and ``out/nuscenes``; see
    ``docs/sample_data.md``.

    Args:
        out (Path): Output folder.
        coco_images (int): COCO train images; val gets ``ceil(n / 2)``.
            Defaults to 8.
        kitti_frames (int): KITTI train frames; val and test get
            ``ceil(n / 2)`` each. Defaults to 6.
        seed (int): Random seed. Defaults to 0.
        skip_existing (bool): Leave a part alone when all its outputs exist
            (COCO: made with the same images, size and seed). Defaults to
            True.
        coco_size (tuple[int, int]): Least and largest COCO image side.
            Defaults to ``COCO_SIZE`` (128, 160).
        nuscenes_frames (int): nuScenes train key frames (each with 10
            sweeps); val gets ``ceil(n / 2)``. Defaults to 4.

    Returns:
        Path: ``out``, absolute.

    Raises:
        ValueError: If ``coco_images``, ``kitti_frames`` or
            ``nuscenes_frames`` is below 1.
    """
    if coco_images < 1 or kitti_frames < 1 or nuscenes_frames < 1:
        raise ValueError('need at least one COCO image, one KITTI frame and '
                         'one nuScenes frame')
    out = Path(out).resolve()
    coco, kitti, nuscenes = out / 'coco', out / 'kitti', out / 'nuscenes'
    made_with = coco_made_with(coco_images, tuple(coco_size), seed)
    if skip_existing and coco_is(coco, made_with):
        print(f'{coco}: already there, skipped')
    else:
        val = math.ceil(coco_images / 2)
        with _progress(f'COCO {coco_images} train + {val} val images, '
                       f'{coco_size[0]}-{coco_size[1]} px, in {coco}'):
            make_coco(coco, coco_images, val, seed, tuple(coco_size))
    if skip_existing and all_exist(kitti, KITTI_OUTPUTS):
        print(f'{kitti}: already there, skipped')
    else:
        extra = math.ceil(kitti_frames / 2)
        with _progress(f'KITTI {kitti_frames} train + {extra} val + {extra} '
                       f'test frames, in {kitti}'):
            make_kitti_raw(kitti, kitti_frames, extra, extra, seed)
        with _progress('KITTI infos and gt database (mmdet3d create_data.py '
                       f'kitti --with-plane; log: {kitti}/create_data.log)'):
            run_kitti_converter(kitti)
    if skip_existing and all_exist(nuscenes, NUSCENES_OUTPUTS):
        print(f'{nuscenes}: already there, skipped')
    else:
        val = math.ceil(nuscenes_frames / 2)
        with _progress(f'nuScenes {nuscenes_frames} train + {val} val key '
                       f'frames with sweeps, in {nuscenes}'):
            make_nuscenes_raw(nuscenes, nuscenes_frames, val, seed)
        with _progress('nuScenes gt database (mmdet3d create_data.py '
                       'nuscenes --only-gt-database; log: '
                       f'{nuscenes}/create_data.log)'):
            run_nuscenes_gt_database(nuscenes)
    return out
