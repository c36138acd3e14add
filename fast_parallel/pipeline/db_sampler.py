"""Fast forms of mmdet3d's gt-database sampler: stock's picks and draws.

``DataBaseSampler.sample_class_v2`` deep-copies the picked database infos,
turns boxes into corners through mmdet3d's ``array_converter`` (an
``inspect`` of the function at each call) and tests every pair of boxes for
collision, scene boxes against scene boxes included. The fast form reads
the infos without copying them (``sample_all`` only reads them), makes the
corners with the converter's own conversions around the function it wraps,
and tests the picked rows only (a row reads only its two boxes). The draws
are the class samplers' own. Why each is exact: ``docs/pipeline.md``.
Importing this module imports mmdet3d.
"""
from typing import Dict, List, Optional

import numpy as np
import torch
from mmdet3d.datasets.transforms.data_augment_utils import box_collision_test
from mmdet3d.datasets.transforms.dbsampler import DataBaseSampler
from mmdet3d.structures.ops.box_np_ops import corners_nd

from fast_parallel.compat.mmdet3d import rotation_kernel
from fast_parallel.contrib.db_sampler import DataBaseSamplerNp124

__all__ = ['FAST_SAMPLERS', 'corner_box2d', 'fast_sampler_class']


def corner_box2d(centers: np.ndarray, dims: np.ndarray,
                 angles: np.ndarray) -> np.ndarray:
    """mmdet3d's ``center_to_corner_box2d(centers, dims, angles)``, bit
    for bit: the rotation gets the tensors ``array_converter`` makes
    (``torch.tensor(x, dtype=torch.float32)``) and its result comes back
    as the converter recovers it (``.numpy().astype(corners.dtype)``).

    Args:
        centers (np.ndarray): ``(N, 2)``.
        dims (np.ndarray): ``(N, 2)``.
        angles (np.ndarray): ``(N,)``.

    Returns:
        np.ndarray: ``(N, 4, 2)`` corners.
    """
    corners = corners_nd(dims, origin=0.5)
    rotated = rotation_kernel()(torch.tensor(corners, dtype=torch.float32),
                                torch.tensor(angles, dtype=torch.float32))
    corners = rotated.cpu().numpy().astype(corners.dtype)
    corners += centers.reshape([-1, 1, 2])
    return corners


class _FastSampleClass:
    """``sample_class_v2`` without the copies and the scene-pair tests."""

    def sample_class_v2(self, name: str, num: int,
                        gt_bboxes: np.ndarray) -> List[dict]:
        """Stock's ``sample_class_v2``: the same picks, draws and order.

        Args:
            name (str): Class of objects to be sampled.
            num (int): Number of sampled boxes.
            gt_bboxes (np.ndarray): The boxes to avoid.

        Returns:
            list[dict]: The picked infos that collide with nothing (the
            database's own dicts: ``sample_all`` only reads them).
        """
        sampled = self.sampler_dict[name].sample(num)
        num_gt = gt_bboxes.shape[0]
        num_sampled = len(sampled)
        gt_bboxes_bv = corner_box2d(gt_bboxes[:, 0:2], gt_bboxes[:, 3:5],
                                    gt_bboxes[:, 6])
        sp_boxes = np.stack([i['box3d_lidar'] for i in sampled], axis=0)
        boxes = np.concatenate([gt_bboxes, sp_boxes], axis=0)
        sp_boxes_new = boxes[num_gt:]
        sp_boxes_bv = corner_box2d(sp_boxes_new[:, 0:2], sp_boxes_new[:, 3:5],
                                   sp_boxes_new[:, 6])
        total_bv = np.concatenate([gt_bboxes_bv, sp_boxes_bv], axis=0)
        # stock's matrix from row num_gt on: the only rows it reads
        coll_mat = box_collision_test(total_bv[num_gt:], total_bv)
        rows = np.arange(num_sampled)
        coll_mat[rows, rows + num_gt] = False
        valid_samples = []
        for i in range(num_sampled):
            if coll_mat[i].any():
                coll_mat[:, num_gt + i] = False
            else:
                valid_samples.append(sampled[i])
        return valid_samples


class FastDataBaseSampler(_FastSampleClass, DataBaseSampler):
    """mmdet3d's ``DataBaseSampler`` with the fast ``sample_class_v2``."""


class FastDataBaseSamplerNp124(_FastSampleClass, DataBaseSamplerNp124):
    """``DataBaseSamplerNp124`` with the fast ``sample_class_v2``."""


#: Sampler class (exact) -> its fast form.
FAST_SAMPLERS: Dict[type, type] = {
    DataBaseSampler: FastDataBaseSampler,
    DataBaseSamplerNp124: FastDataBaseSamplerNp124,
}


def fast_sampler_class(sampler: object) -> Optional[type]:
    """The fast class for ``sampler``: itself where it is one already,
    None where it is another class or has its own ``sample_class_v2`` /
    ``sample_all`` set on the instance."""
    cls = type(sampler)
    if cls in FAST_SAMPLERS.values():
        return cls
    own = vars(sampler)
    if 'sample_class_v2' in own or 'sample_all' in own:
        return None
    return FAST_SAMPLERS.get(cls)
