"""``PointPillarsScatter.forward_batch`` for the whole batch in one pass.

mmdet3d 1.4.0's ``forward_batch`` makes a canvas per sample, picks the
sample's pillars with a mask and writes them in (``canvas[:, indices] =
voxels``), then stacks the canvases: about ten operations per sample
forward, four backward. :func:`forward_batch` writes every pillar into one
``(B, C, ny * nx)`` canvas with one ``index_put_``: the same values (each
cell is written once: hard voxelisation gives each sample's pillars distinct
cells), and, through :class:`_StockGradient`, the same gradient bits
(stock's mask-indexing backward accumulates each row into zeros, which
turns a ``-0.0`` into ``+0.0``).
"""
from typing import Any, Optional

import torch
from torch import Tensor

from fast_parallel.compat.targets import (replaced_on_instance,
                                          replaced_reason, upstream)
from fast_parallel.step.voxelize.hard import grid_size

__all__ = ['forward_batch', 'scatter_supported']


class _StockGradient(torch.autograd.Function):
    """Identity forward; backward ``0 + grad``, as stock's
    ``zeros.index_put_(rows, grad, accumulate=True)`` gives it."""

    @staticmethod
    def forward(ctx: Any, features: Tensor) -> Tensor:
        return features.view_as(features)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return torch.zeros_like(grad).add_(grad)


def scatter_supported(encoder: Any, preprocessor: Any,
                      voxel_encoder: Any) -> Optional[str]:
    """None when :func:`forward_batch` is exact for this middle encoder.

    Its pillars must be hard voxels of a grid one voxel high (distinct
    cells per sample, samples in order) with one feature row each, in order
    (``PillarFeatureNet``).

    Args:
        encoder: The middle encoder.
        preprocessor: The model's data preprocessor.
        voxel_encoder: The model's voxel encoder.

    Returns:
        Optional[str]: None, or why it stays stock (for the log).
    """
    name = type(encoder).__name__
    if type(encoder) is not upstream('PointPillarsScatter'):
        return f'{name} is not PointPillarsScatter'
    why = replaced_reason((encoder, 'PointPillarsScatter'))
    if why:
        return why
    ours = isinstance(getattr(preprocessor, 'fast_voxelize_stock', None), int)
    if (type(preprocessor) is not upstream('Det3DDataPreprocessor')
            or getattr(preprocessor, 'voxel_type', None) != 'hard'
            or replaced_on_instance(preprocessor, 'Det3DDataPreprocessor')
            and not ours):
        return 'its voxels are not hard voxels of Det3DDataPreprocessor'
    layer = preprocessor.voxel_layer
    if grid_size(layer.voxel_size, layer.point_cloud_range)[2] != 1:
        return 'its voxel grid has more than one z layer (pillars share ' \
            'cells)'
    if type(voxel_encoder) is not upstream('PillarFeatureNet'):
        return f'voxel encoder {type(voxel_encoder).__name__} is not ' \
            'PillarFeatureNet'
    return None


def forward_batch(self: Any, voxel_features: Tensor, coors: Tensor,
                  batch_size: int) -> Tensor:
    """Stock's ``PointPillarsScatter.forward_batch``, in one pass.

    Args:
        self: The ``PointPillarsScatter``.
        voxel_features (Tensor): ``(V, C)`` pillar features.
        coors (Tensor): ``(V, 4)`` ``(sample, z, y, x)``, samples in order.
        batch_size (int): Samples (the last pillar's sample + 1, as the
            detector computes it).

    Returns:
        Tensor: ``(batch_size, C, ny, nx)``.
    """
    channels, cells = self.in_channels, self.nx * self.ny
    canvas = torch.zeros(
        batch_size,
        channels,
        cells,
        dtype=voxel_features.dtype,
        device=voxel_features.device)
    sample = coors[:, 0].long()
    indices = (coors[:, 2] * self.nx + coors[:, 3]).long()
    channel = torch.arange(channels, device=voxel_features.device)
    canvas[sample[:, None], channel,
           indices[:, None]] = _StockGradient.apply(voxel_features)
    return canvas.view(batch_size, channels, self.ny, self.nx)
