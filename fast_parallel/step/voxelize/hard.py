"""mmcv's hard voxelisation of a whole batch in one pass.

mmcv 2.1.0's ``hard_voxelize_forward`` (CPU; the deterministic CUDA kernel
gives the same) walks a sample's points in order: a point outside the grid is
skipped; the first point of a voxel opens it, unless ``max_voxels`` voxels
are open already (then that voxel and every later point of it are dropped);
a voxel keeps its first ``max_points`` points. :func:`hard_voxelize_batch`
computes the same for every sample at once: the same coordinates (the
kernel's float arithmetic), voxels in order of first appearance, the same
points in each, the caps per sample; and the data preprocessor's batch column
and voxel centres. Why it is exact: ``docs/voxelize.md``.
"""
import math
from typing import List, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ['Voxels', 'grid_size', 'hard_voxelize_batch']


class Voxels(NamedTuple):
    """A batch's voxels, as the data preprocessor concatenates them."""
    #: ``(V, max_points, C)`` the points of each voxel, zero-filled.
    voxels: Tensor
    #: ``(V, 4)`` int32 ``(sample, z, y, x)``.
    coors: Tensor
    #: ``(V, )`` int32 points per voxel.
    num_points: Tensor
    #: ``(V, 3)`` float32 voxel centres.
    voxel_centers: Tensor


def _c_round(value: float) -> int:
    """C's ``round``: halfway cases away from zero."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def grid_size(voxel_size: Sequence[float],
              coors_range: Sequence[float]) -> List[int]:
    """The kernel's grid: ``round((hi - lo) / size)`` in float32, per axis.

    Args:
        voxel_size (Sequence[float]): ``[x, y, z]``.
        coors_range (Sequence[float]): ``[x0, y0, z0, x1, y1, z1]``.

    Returns:
        list[int]: ``[gx, gy, gz]``.
    """
    size = np.asarray(voxel_size, dtype=np.float32)
    lo = np.asarray(coors_range[:3], dtype=np.float32)
    hi = np.asarray(coors_range[3:6], dtype=np.float32)
    return [_c_round(float(v)) for v in (hi - lo) / size]


def hard_voxelize_batch(points: Sequence[Tensor], voxel_size: Sequence[float],
                        coors_range: Sequence[float], max_points: int,
                        max_voxels: int) -> Voxels:
    """Every sample's ``Voxelization`` output, and the preprocessor's batch.

    Args:
        points (Sequence[Tensor]): Per sample ``(N_i, C)`` float32 points,
            one device, ``C >= 3``.
        voxel_size (Sequence[float]): The layer's ``voxel_size``.
        coors_range (Sequence[float]): Its ``point_cloud_range``.
        max_points (int): Points kept per voxel (> 0).
        max_voxels (int): Voxels kept per sample (> 0).

    Returns:
        Voxels: What ``Det3DDataPreprocessor.voxelize`` concatenates from
        its per-sample calls, bit for bit.
    """
    device = points[0].device
    counts = [p.shape[0] for p in points]
    flat = torch.cat(list(points))
    channels = flat.shape[1]
    grid = grid_size(voxel_size, coors_range)
    size = torch.tensor(voxel_size, dtype=torch.float32, device=device)
    low = torch.tensor(coors_range[:3], dtype=torch.float32, device=device)
    # the kernel: floor((p - lo) / size) in float, then 0 <= c < grid
    cells = torch.floor((flat[:, :3] - low) / size)
    limit = torch.tensor(grid, dtype=torch.float32, device=device)
    inside = ((cells >= 0) & (cells < limit)).all(dim=1)
    sample = torch.repeat_interleave(
        torch.arange(len(counts), device=device),
        torch.tensor(counts, device=device),
        output_size=flat.shape[0])
    kept = inside.nonzero().squeeze(1)  # point order, ascending
    cell = cells[kept].long()
    gx, gy, gz = grid
    key = (
        (sample[kept] * gz + cell[:, 2]) * gy + cell[:, 1]) * gx + cell[:, 0]
    unique, voxel_of = torch.unique(key, return_inverse=True)
    num_unique = unique.shape[0]
    # each voxel's first point, and the voxels in order of first appearance
    first = torch.full((num_unique, ),
                       flat.shape[0],
                       dtype=torch.long,
                       device=device).scatter_reduce_(
                           0, voxel_of, kept, 'amin', include_self=True)
    order = torch.argsort(first)
    position = torch.empty_like(order)
    position[order] = torch.arange(num_unique, device=device)
    voxel_sample = sample[first[order]]
    per_sample = torch.bincount(voxel_sample, minlength=len(counts))
    starts = torch.cumsum(per_sample, 0) - per_sample
    rank = torch.arange(num_unique, device=device) - starts[voxel_sample]
    open_voxel = rank < max_voxels  # by position
    # each point's place in its voxel: a stable sort keeps point order
    point_voxel = position[voxel_of]
    sorted_voxel, by_voxel = torch.sort(point_voxel, stable=True)
    members = torch.bincount(point_voxel, minlength=num_unique)
    member_start = torch.cumsum(members, 0) - members
    slot = torch.empty_like(point_voxel)
    slot[by_voxel] = torch.arange(
        point_voxel.shape[0], device=device) - member_start[sorted_voxel]
    # index tensors, not masks: each nonzero is the one size the host needs
    takes = (open_voxel[point_voxel] &
             (slot < max_points)).nonzero().squeeze(1)
    opened = open_voxel.nonzero().squeeze(1)  # positions of kept voxels
    new_index = torch.cumsum(open_voxel, 0) - 1
    voxels = flat.new_zeros((opened.shape[0], max_points, channels))
    voxels[new_index[point_voxel[takes]], slot[takes]] = flat[kept[takes]]
    zyx = cells[first[order[opened]]].to(torch.int32)[:, [2, 1, 0]]
    num_points = members[opened].clamp(max=max_points).to(torch.int32)
    # the preprocessor: centres from (z, y, x), then the batch column
    centers = (zyx[:, [2, 1, 0]] +
               0.5) * flat.new_tensor(voxel_size) + flat.new_tensor(
                   coors_range[0:3])
    coors = torch.cat([voxel_sample[opened].to(torch.int32)[:, None], zyx],
                      dim=1)
    return Voxels(voxels, coors, num_points, centers)
