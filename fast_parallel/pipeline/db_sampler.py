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
from typing import Any, Dict, List, NamedTuple, Optional

import numpy as np
import torch
from mmdet3d.datasets.transforms import LoadPointsFromFile
from mmdet3d.datasets.transforms.data_augment_utils import box_collision_test
from mmdet3d.datasets.transforms.dbsampler import DataBaseSampler
from mmdet3d.structures.ops.box_np_ops import corners_nd
from mmdet3d.structures.points import get_points_type

from fast_parallel.compat.mmdet3d import rotation_kernel
from fast_parallel.contrib.db_sampler import (DataBaseSamplerNp124,
                                              database_path)
from fast_parallel.pipeline.points_cache import READ_NAME

__all__ = [
    'FAST_SAMPLERS', 'converted_rotation', 'corner_box2d', 'corner_box3d',
    'fast_sampler_class', 'plain_loader'
]


def converted_rotation(corners: np.ndarray,
                       angles: np.ndarray,
                       axis: int = 0) -> np.ndarray:
    """mmdet3d's ``rotation_3d_in_axis(corners, angles, axis=axis)`` on
    numpy arrays, bit for bit and without its ``array_converter``'s
    inspection: the rotation gets the tensors the converter makes
    (``torch.tensor(x, dtype=torch.float32)``) and its result comes back
    as the converter recovers it (``.numpy().astype(corners.dtype)``)."""
    rotated = rotation_kernel()(
        torch.tensor(corners, dtype=torch.float32),
        torch.tensor(angles, dtype=torch.float32),
        axis=axis)
    return rotated.cpu().numpy().astype(corners.dtype)


def corner_box2d(centers: np.ndarray, dims: np.ndarray,
                 angles: np.ndarray) -> np.ndarray:
    """mmdet3d's ``center_to_corner_box2d(centers, dims, angles)``, bit
    for bit (:func:`converted_rotation`).

    Args:
        centers (np.ndarray): ``(N, 2)``.
        dims (np.ndarray): ``(N, 2)``.
        angles (np.ndarray): ``(N,)``.

    Returns:
        np.ndarray: ``(N, 4, 2)`` corners.
    """
    corners = converted_rotation(corners_nd(dims, origin=0.5), angles)
    corners += centers.reshape([-1, 1, 2])
    return corners


def corner_box3d(boxes: np.ndarray) -> np.ndarray:
    """mmdet3d's ``center_to_corner_box3d(boxes[:, :3], boxes[:, 3:6],
    boxes[:, 6], origin=(0.5, 0.5, 0), axis=2)`` (``points_in_rbbox``'s
    corners of LiDAR boxes), bit for bit (:func:`converted_rotation`).

    Args:
        boxes (np.ndarray): ``(N, 7+)`` LiDAR boxes.

    Returns:
        np.ndarray: ``(N, 8, 3)`` corners.
    """
    corners = corners_nd(boxes[:, 3:6], origin=(0.5, 0.5, 0))
    corners = converted_rotation(corners, boxes[:, 6], axis=2)
    corners += boxes[:, :3].reshape([-1, 1, 3])
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
    """``DataBaseSamplerNp124`` with the fast ``sample_class_v2``, and the
    sampled objects' points made as one cloud."""

    def sampled_points(self, sampled: List[dict]) -> Any:
        """The sampled objects' points as one cloud: each file read and
        cut to ``use_dim`` as stock's loader does (its errors alike, in
        order), then one ``float32`` add of each object's box centre to its
        rows, where stock makes a points object per object and moves each
        (the same values: each element gets the same ``float32`` add). A
        loader with other options, or a centre that is not three values,
        goes upstream's way.

        Args:
            sampled (list[dict]): The sampled database infos.

        Returns:
            SampledCloud | list: For :meth:`lowered_cloud`.
        """
        loader = self.points_loader
        if not plain_loader(loader) or any(
                np.shape(info['box3d_lidar'][:3]) != (3, )
                for info in sampled):
            return super().sampled_points(sampled)
        read = getattr(loader, READ_NAME)
        parts = []
        for info in sampled:
            file_path = database_path(self.data_root, info)
            points = read(file_path).reshape(-1, loader.load_dim)
            parts.append(points[:, loader.use_dim])
        centres = torch.tensor(
            np.stack([info['box3d_lidar'][:3] for info in sampled]),
            dtype=torch.float32)
        counts = [len(part) for part in parts]
        # row-major in torch's memory, as stock's torch.cat gives it (numpy
        # would keep the parts' column-major order, and an empty array's
        # strides are numpy's own)
        tensor = torch.empty((sum(counts), parts[0].shape[1]),
                             dtype=torch.float32)
        np.concatenate(parts, out=tensor.numpy())
        tensor[:, :3] += torch.repeat_interleave(
            centres, torch.tensor(counts), dim=0)
        return SampledCloud(tensor, counts, get_points_type(loader.coord_type))

    def lowered_cloud(self, s_points_list: Any,
                      dz: Optional[np.ndarray]) -> Any:
        """Upstream's ``lowered_cloud`` for one :class:`SampledCloud`: each
        object's rows lowered by its ``dz`` with upstream's own call (a
        ``sub_`` of the same scalar on a view of its rows), one points
        object.

        Args:
            s_points_list: :meth:`sampled_points`'s.
            dz (np.ndarray, optional): One height per object.

        Returns:
            BasePoints: All sampled points, in order.
        """
        if not isinstance(s_points_list, SampledCloud):
            return super().lowered_cloud(s_points_list, dz)
        tensor = s_points_list.tensor
        if dz is not None:
            start = 0
            for i, count in enumerate(s_points_list.counts):
                tensor[start:start + count, 2].sub_(dz[i])
                start += count
        return s_points_list.points_class(
            tensor, points_dim=tensor.shape[1], attribute_dims=None)


class SampledCloud(NamedTuple):
    """The sampled objects' points, moved to their boxes, in one tensor."""

    tensor: torch.Tensor
    counts: List[int]
    points_class: type


def plain_loader(loader: object) -> bool:
    """Whether ``loader`` is mmdet3d's ``LoadPointsFromFile`` (or its
    cached form) reading LiDAR points without intensity or elongation
    norms, height or colour: its points are the file's ``use_dim``
    columns, as they are."""
    from fast_parallel.pipeline.points_cache import FastLoadPointsFromFile
    return type(loader) in (LoadPointsFromFile, FastLoadPointsFromFile) \
        and loader.coord_type == 'LIDAR' and not (
            loader.norm_intensity or loader.norm_elongation
            or loader.shift_height or loader.use_color)


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
