"""Fast form of mmdet3d's ``LoadPointsFromMultiSweeps``: stock's points and
draws with two copies of the cloud instead of five.

Stock turns each prepared sweep into a points object (a copy), concatenates
them (two more) and keeps ``use_dim`` (two more). The fast form prepares
each sweep with stock's own code and writes the kept columns of every part
straight into one tensor, which the points class copies once. Inputs it
does not cover (no ``lidar_sweeps``, another points class, a sweep width
other than the cloud's) go stock's way, counted, before any draw.
Importing this module imports mmdet3d.
"""
from typing import List, Optional, Sequence, Union

import numpy as np
import torch
from mmdet3d.datasets.transforms import LoadPointsFromMultiSweeps
from mmdet3d.structures.points import BasePoints

from fast_parallel.compat.mmdet3d import sweep_methods
from fast_parallel.pipeline.object_sample import POINT_CLASSES
from fast_parallel.pipeline.stats import count

__all__ = ['FastLoadPointsFromMultiSweeps', 'kept_attribute_dims']


def kept_attribute_dims(attribute_dims: Optional[dict], kept: Sequence[int],
                        width: int) -> Optional[dict]:
    """The ``attribute_dims`` of ``points[:, kept]`` for a cloud ``width``
    columns wide, as ``BasePoints.__getitem__`` computes them."""
    keep_dims = list(set(kept).intersection(set(range(3, width))))
    if attribute_dims is None:
        return None
    attribute_dims = attribute_dims.copy()
    for key in list(attribute_dims.keys()):
        cur_attribute_dims = attribute_dims[key]
        if isinstance(cur_attribute_dims, int):
            cur_attribute_dims = [cur_attribute_dims]
        intersect_attr = list(
            set(cur_attribute_dims).intersection(set(keep_dims)))
        if len(intersect_attr) == 1:
            attribute_dims[key] = intersect_attr[0]
        elif len(intersect_attr) > 1:
            attribute_dims[key] = intersect_attr
        else:
            attribute_dims.pop(key)
    return attribute_dims


class FastLoadPointsFromMultiSweeps(LoadPointsFromMultiSweeps):
    """``LoadPointsFromMultiSweeps`` that writes the output in one pass."""

    def _stock_why(self, results: dict) -> Optional[str]:
        points = results.get('points')
        if type(points) not in POINT_CLASSES:
            return 'not an mmdet3d points object'
        if 'lidar_sweeps' not in results:
            return 'no lidar_sweeps'
        if points.points_dim != self.load_dim:
            return 'sweeps of another width than the cloud'
        return None

    def transform(self, results: dict) -> dict:
        why = self._stock_why(results)
        if why is not None:
            count(f'stock: LoadPointsFromMultiSweeps: {why}')
            return super().transform(results)
        load_points, remove_close = sweep_methods(self)
        points = results['points']
        points.tensor[:, 4] = 0
        parts: List[Union[torch.Tensor, np.ndarray]] = [points.tensor]
        ts = results['timestamp']
        if len(results['lidar_sweeps']) <= self.sweeps_num:
            choices = np.arange(len(results['lidar_sweeps']))
        elif self.test_mode:
            choices = np.arange(self.sweeps_num)
        else:
            choices = np.random.choice(
                len(results['lidar_sweeps']), self.sweeps_num, replace=False)
        for idx in choices:  # stock's preparation, line for line
            sweep = results['lidar_sweeps'][idx]
            points_sweep = load_points(sweep['lidar_points']['lidar_path'])
            points_sweep = np.copy(points_sweep).reshape(-1, self.load_dim)
            if self.remove_close:
                points_sweep = remove_close(points_sweep)
            sweep_ts = sweep['timestamp']
            lidar2sensor = np.array(sweep['lidar_points']['lidar2sensor'])
            points_sweep[:, :3] = points_sweep[:, :3] @ lidar2sensor[:3, :3]
            points_sweep[:, :3] -= lidar2sensor[:3, 3]
            points_sweep[:, 4] = ts - sweep_ts
            parts.append(points_sweep)
        results['points'] = self._joined(points, parts)
        return results

    def _joined(self, points: BasePoints,
                parts: List[Union[torch.Tensor, np.ndarray]]) -> BasePoints:
        """``points.cat(parts)[:, use_dim]``: the kept columns of each part
        written once into one tensor (float32, as ``new_point`` makes)."""
        use_dim = list(self.use_dim)
        total = sum(len(p) for p in parts)
        out = torch.empty((total, len(use_dim)),
                          dtype=torch.float32,
                          device=points.tensor.device)
        row = 0
        for part in parts:
            part = torch.as_tensor(part, dtype=torch.float32)
            rows = out[row:row + len(part)]
            for k, column in enumerate(use_dim):  # fast in either layout
                rows[:, k].copy_(part[:, column])
            row += len(part)
        return type(points)(
            out,
            points_dim=len(use_dim),
            attribute_dims=kept_attribute_dims(points.attribute_dims, use_dim,
                                               points.points_dim))
