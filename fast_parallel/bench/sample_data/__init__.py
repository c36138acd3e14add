"""The small, deterministic COCO, KITTI and nuScenes sets of the tests and
demos.

:func:`make_sample_data` writes them (``tools/make_sample_data.py`` is its
command line); :mod:`.coco`, :mod:`.kitti` (with :mod:`.kitti_calib`),
:mod:`.nuscenes` and :mod:`.kitti_converter` (mmdet3d's ``create_data.py``)
hold the parts. What they write and why:
``docs/sample_data.md``.
"""
from fast_parallel.bench.sample_data.coco import (COCO_CATEGORY_IDS,
                                                  COCO_OUTPUTS, COCO_SHAPES,
                                                  COCO_SIZE, coco_is,
                                                  coco_made_with, make_coco)
from fast_parallel.bench.sample_data.kitti import (KITTI_CLASSES, PCD_RANGE,
                                                   make_kitti_raw)
from fast_parallel.bench.sample_data.kitti_calib import (KITTI_CALIB,
                                                         KITTI_GROUND_Z,
                                                         KITTI_IMAGE_SIZE,
                                                         kitti_lidar2cam,
                                                         kitti_road_plane)
from fast_parallel.bench.sample_data.kitti_converter import (
    KITTI_OUTPUTS, mmdet3d_create_data_script, run_kitti_converter,
    run_nuscenes_gt_database)
from fast_parallel.bench.sample_data.make import make_sample_data
from fast_parallel.bench.sample_data.nuscenes import (NUSCENES_CLASSES,
                                                      NUSCENES_OUTPUTS,
                                                      make_nuscenes_raw)

__all__ = [
    'COCO_CATEGORY_IDS', 'COCO_OUTPUTS', 'COCO_SHAPES', 'COCO_SIZE',
    'KITTI_CALIB', 'KITTI_CLASSES', 'KITTI_GROUND_Z', 'KITTI_IMAGE_SIZE',
    'KITTI_OUTPUTS', 'NUSCENES_CLASSES', 'NUSCENES_OUTPUTS', 'PCD_RANGE',
    'coco_is', 'coco_made_with', 'kitti_lidar2cam', 'kitti_road_plane',
    'make_coco', 'make_kitti_raw', 'make_nuscenes_raw', 'make_sample_data',
    'mmdet3d_create_data_script', 'run_kitti_converter',
    'run_nuscenes_gt_database'
]
