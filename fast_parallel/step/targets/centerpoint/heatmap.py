"""The gaussians of a batch's objects, as pixel indices and values.

Stock's ``draw_heatmap_gaussian`` takes ``gaussian_2d`` of the object's
diameter (float64 numpy, cast to float32), clips it at the map's edges and
takes the elementwise max with the heatmap. The max of non-negative floats
is exact in any order, so the heatmaps are the max over every object's
clipped window: :func:`gaussian_pixels` lists each window's flat heatmap
indices and float32 values (one gaussian per distinct radius, stock's own
function, cached), for one ``scatter_reduce(amax)``.
"""
import functools
from typing import List, NamedTuple, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from fast_parallel.compat.targets import upstream

__all__ = ['Drawn', 'gaussian_pixels', 'too_large']

#: A gaussian of more elements than this (radius ~4,000) is left to stock.
_MAX_ELEMENTS = 1 << 26


class Drawn(NamedTuple):
    """One object stock's loop draws."""
    task: int
    cls: int  # its class within the task (the heatmap channel)
    slot: int  # its row in the task's targets (stock's ``new_idx``)
    row: int  # its row among the batch's objects
    sample: int
    x: int
    y: int
    radius: int


def too_large(radius: int) -> bool:
    """Whether the gaussian of ``radius`` is too big to make here."""
    return (2 * radius + 1)**2 > _MAX_ELEMENTS


@functools.lru_cache(maxsize=256)
def _gaussian(radius: int) -> np.ndarray:
    """Stock's float32 gaussian of ``radius``: ``gaussian_2d`` of the
    diameter, ``sigma = diameter / 6``, cast as ``draw_heatmap_gaussian``
    casts it."""
    diameter = 2 * radius + 1
    gaussian = upstream('gaussian_2d')((diameter, diameter),
                                       sigma=diameter / 6)
    return torch.from_numpy(gaussian).to(torch.float32).numpy()


def gaussian_pixels(drawn: Sequence[Drawn], channels: Sequence[int], num: int,
                    height: int, width: int) -> Tuple[Tensor, Tensor]:
    """The flat heatmap indices and values of every drawn object's window.

    The heatmaps are one buffer: task after task, each ``(num, channels[t],
    height, width)``.

    Args:
        drawn (Sequence[Drawn]): The objects.
        channels (Sequence[int]): Classes per task.
        num (int): Samples in the batch.
        height (int): Map rows.
        width (int): Map columns.

    Returns:
        tuple[Tensor, Tensor]: int64 indices and float32 values (CPU).
    """
    offsets = np.cumsum([0] + [num * c * height * width for c in channels])
    by_radius = {}
    for d in drawn:
        by_radius.setdefault(d.radius, []).append(d)
    indices: List[np.ndarray] = []
    values: List[np.ndarray] = []
    for radius, group in by_radius.items():
        ry, rx = min(radius, height - 1), min(radius, width - 1)
        dy = np.arange(-ry, ry + 1)
        dx = np.arange(-rx, rx + 1)
        x = np.array([d.x for d in group])[:, None, None] + dx[None, None, :]
        y = np.array([d.y for d in group])[:, None, None] + dy[None, :, None]
        plane = np.array([
            offsets[d.task] +
            (d.sample * channels[d.task] + d.cls) * height * width
            for d in group
        ])[:, None, None]
        inside = (x >= 0) & (x < width) & (y >= 0) & (y < height)
        gauss = _gaussian(radius)[np.ix_(dy + radius, dx + radius)]
        indices.append((plane + y * width + x)[inside])
        values.append(np.broadcast_to(gauss, inside.shape)[inside])
    return (torch.from_numpy(np.concatenate(indices).astype(np.int64)),
            torch.from_numpy(np.ascontiguousarray(np.concatenate(values))))
