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
import platform
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


def _nan_is_cell_zero(device: torch.device) -> bool:
    """Whether the kernel's float-to-int conversion makes a NaN cell 0
    (CUDA, ARM CPUs) rather than INT_MIN, which is outside the grid (x86).
    """
    return device.type != 'cpu' or platform.machine().lower() in ('aarch64',
                                                                  'arm64')


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
    # one small tensor: size, low corner, grid (float32, as the kernel's)
    params = torch.tensor([*voxel_size, *coors_range[:3], *grid],
                          dtype=torch.float32,
                          device=device)
    size, low, limit = params[:3], params[3:6], params[6:9]
    # the kernel: floor((p - lo) / size) in float, then 0 <= c < grid
    cells = torch.floor((flat[:, :3] - low) / size)
    if _nan_is_cell_zero(device):  # the kernel's int(NaN) there
        cells = torch.where(torch.isnan(cells), 0., cells)
    inside = ((cells >= 0) & (cells < limit)).all(dim=1)
    # each point's sample, made on the host from the shapes
    host = np.repeat(np.arange(len(counts)), counts)
    sample = torch.from_numpy(host).to(device, non_blocking=True)
    kept = inside.nonzero().squeeze(1)  # point order, ascending
    gx, gy, gz = grid
    strides = torch.from_numpy(np.array([1, gx, gx * gy], dtype=np.int64))
    key = (cells[kept].long() * strides.to(device)).sum(1) + \
        sample[kept] * (gx * gy * gz)
    unique, voxel_of = torch.unique(key, return_inverse=True)
    num_unique = unique.shape[0]
    # each voxel's first point, and the voxels in order of first appearance
    first = torch.full((num_unique, ),
                       flat.shape[0],
                       dtype=torch.long,
                       device=device).scatter_reduce_(
                           0, voxel_of, kept, 'amin', include_self=True)
    order = torch.argsort(first)
    position = torch.argsort(order)  # the inverse permutation
    first = first[order]
    voxel_sample = sample[first]
    per_sample = torch.bincount(voxel_sample, minlength=len(counts))
    ends = torch.cumsum(per_sample, 0)
    rank = torch.arange(
        num_unique, device=device) + (per_sample - ends)[voxel_sample]
    open_voxel = rank < max_voxels  # by position
    # each point's place in its voxel: a stable sort keeps point order
    sorted_voxel, by_voxel = torch.sort(position[voxel_of], stable=True)
    members = torch.bincount(sorted_voxel, minlength=num_unique)
    slot = torch.arange(
        sorted_voxel.shape[0],
        device=device) - (torch.cumsum(members, 0) - members)[sorted_voxel]
    # index tensors, not masks: each nonzero is the one size the host needs
    takes = (open_voxel[sorted_voxel] & (slot < max_points)).nonzero()[:, 0]
    opened = open_voxel.nonzero()[:, 0]  # positions of kept voxels
    new_index = torch.cumsum(open_voxel, 0) - 1
    voxels = flat.new_zeros((opened.shape[0], max_points, channels))
    voxels[new_index[sorted_voxel[takes]],
           slot[takes]] = flat[kept[by_voxel[takes]]]
    xyz = cells[first[opened]].to(torch.int32)
    zyx = xyz[:, [2, 1, 0]]
    num_points = members[opened].clamp(max=max_points).to(torch.int32)
    # the preprocessor: centres from the cells (its coors[:, [2, 1, 0]]),
    # then the batch column
    centers = (xyz + 0.5) * size + low
    coors = torch.cat([voxel_sample[opened].to(torch.int32)[:, None], zyx],
                      dim=1)
    return Voxels(voxels, coors, num_points, centers)
