"""Hard voxelisation of the whole batch in ``Det3DDataPreprocessor``.

mmdet3d's data preprocessor voxelises a batch sample by sample (mmcv's
``Voxelization``: three host reads each, for the sizes).
:func:`switch_voxelize` puts :func:`voxelize` on one preprocessor instance
in place of the class's: for ``voxel_type='hard'`` it returns
:func:`~fast_parallel.step.voxelize.hard.hard_voxelize_batch`'s voxels,
equal to stock's bit for bit; any other call runs the class's method.
"""
from types import MethodType
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor, nn

from fast_parallel.compat.targets import replaced_reason, upstream
from fast_parallel.outcome import Outcome
from fast_parallel.step.stock_batches import count_stock_batch
from fast_parallel.step.voxelize.hard import hard_voxelize_batch
from fast_parallel.step.voxelize.scatter import (forward_batch,
                                                 scatter_supported)

__all__ = ['supported', 'switch_voxelize', 'voxelize']


def supported(preprocessor: Any) -> Optional[str]:
    """None when :func:`voxelize` is exact for this preprocessor.

    Args:
        preprocessor: A data preprocessor.

    Returns:
        Optional[str]: None, or why it stays stock (for the log).
    """
    name = type(preprocessor).__name__
    if type(preprocessor) is not upstream('Det3DDataPreprocessor'):
        return f'{name} is not Det3DDataPreprocessor'
    if not preprocessor.voxel:
        return 'voxel=False'
    if preprocessor.voxel_type != 'hard':
        return f"voxel_type='{preprocessor.voxel_type}'"
    layer = preprocessor.voxel_layer
    if type(layer) not in (upstream('VoxelizationByGridShape'),
                           upstream('Voxelization')):
        return f'voxel_layer {type(layer).__name__}'
    why = replaced_reason((preprocessor, 'Det3DDataPreprocessor'),
                          (layer, 'Voxelization'))
    if why:
        return why
    if not layer.deterministic:
        return 'deterministic=False'
    if layer.max_num_points <= 0 or any(int(m) <= 0 for m in layer.max_voxels):
        return 'max_num_points or max_voxels not positive (dynamic)'
    return None


def _batch_reason(points: Any) -> Optional[str]:
    """Why this batch's points take the stock path, or None."""
    if not isinstance(points, (list, tuple)) or not points:
        return 'no list of point clouds'
    first = points[0]
    for cloud in points:
        if (type(cloud) is not Tensor or cloud.dtype != torch.float32
                or cloud.dim() != 2 or cloud.shape[1] < 3
                or cloud.shape[1] != first.shape[1]
                or cloud.device != first.device):
            return 'points not (N, C) float32 on one device'
        if cloud.shape[0] == 0 and cloud.device.type == 'cuda':
            # mmcv's deterministic CUDA kernel fails on an empty cloud
            return 'an empty point cloud on CUDA'
    return None


@torch.no_grad()  # as stock's
def voxelize(self: Any, points: List[Tensor],
             data_samples: Any) -> Dict[str, Tensor]:
    """Stock's ``Det3DDataPreprocessor.voxelize``, the batch in one pass.

    Args:
        self: The preprocessor.
        points (list[Tensor]): The batch's point clouds.
        data_samples: The batch's data samples (hard voxelisation does not
            read them).

    Returns:
        dict: ``voxels``, ``coors``, ``num_points``, ``voxel_centers``.
    """
    why = _batch_reason(points)
    if why is not None:
        count_stock_batch(self, 'fast_voxelize_stock',
                          'voxels: a batch voxelised', why)
        return type(self).voxelize(self, points, data_samples)
    layer = self.voxel_layer
    max_voxels = layer.max_voxels[0] if layer.training else \
        layer.max_voxels[1]
    out = hard_voxelize_batch(points, layer.voxel_size,
                              layer.point_cloud_range, layer.max_num_points,
                              int(max_voxels))
    return dict(
        num_points=out.num_points,
        voxel_centers=out.voxel_centers,
        voxels=out.voxels,
        coors=out.coors)


def _voxelizing_preprocessor(preprocessor: Any) -> Outcome:
    """The preprocessor's part of :func:`switch_voxelize`."""
    name = type(preprocessor).__name__
    if isinstance(getattr(preprocessor, 'fast_voxelize_stock', None), int):
        why = None  # switched by an earlier run
    else:
        why = supported(preprocessor)
    if why is not None:
        return Outcome(name, False, why, text=f'{name} stock ({why})')
    if 'voxelize' not in vars(preprocessor):
        preprocessor.fast_voxelize_stock = 0
        preprocessor.voxelize = MethodType(voxelize, preprocessor)
    return Outcome(name, True, text=f'{name} batched')


def _pillar_scatter(model: nn.Module, preprocessor: Any) -> Optional[Outcome]:
    """The middle encoder's part of :func:`switch_voxelize` (None where the
    model has no ``PointPillarsScatter``)."""
    for prefix in ('', 'pts_'):
        encoder = getattr(model, f'{prefix}middle_encoder', None)
        if encoder is not None:
            voxel_encoder = getattr(model, f'{prefix}voxel_encoder', None)
            break
    else:
        return None
    name = type(encoder).__name__
    if getattr(encoder, 'fast_scatter', False):
        why = None  # switched by an earlier run
    else:
        why = scatter_supported(encoder, preprocessor, voxel_encoder)
    if why is not None:
        if type(encoder) is not upstream('PointPillarsScatter'):
            return None  # another middle encoder: nothing to say
        return Outcome(name, False, why, text=f'{name} stock ({why})')
    if not getattr(encoder, 'fast_scatter', False):
        encoder.fast_scatter = True
        encoder.forward_batch = MethodType(forward_batch, encoder)
    return Outcome(name, True, text=f'{name} batched')


def switch_voxelize(model: nn.Module,
                    enabled: bool = True) -> Optional[Outcome]:
    """Gives ``model``'s data preprocessor the batched hard voxelisation,
    and its ``PointPillarsScatter`` the one-pass scatter.

    Args:
        model (nn.Module): The model (a wrapper's module is looked into).
        enabled (bool): False leaves both stock. Defaults to True.

    Returns:
        Outcome | None: ``voxels: ...`` for the start line, e.g. ``voxels:
        Det3DDataPreprocessor batched, PointPillarsScatter batched``; None
        where the model does not voxelise.
    """
    from mmengine.model import is_model_wrapper
    if is_model_wrapper(model):
        model = model.module
    preprocessor = getattr(model, 'data_preprocessor', None)
    if not getattr(preprocessor, 'voxel', False):
        return None
    if not enabled:
        return Outcome('voxels', False, 'fast_voxelize=False')
    parts = [_voxelizing_preprocessor(preprocessor)]
    scatter = _pillar_scatter(model, preprocessor)
    if scatter is not None:
        parts.append(scatter)
    done = any(part.done for part in parts)
    return Outcome(
        'voxels',
        done,
        None if done else '; '.join(part.why for part in parts),
        text='voxels: ' + ', '.join(map(str, parts)),
        parts=tuple(parts))
