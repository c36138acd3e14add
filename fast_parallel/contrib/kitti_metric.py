"""KITTI 3D evaluation without a GPU: :class:`KittiMetricCPU`.

mmdet3d's ``KittiMetric`` computes rotated BEV / 3D overlaps with a numba
CUDA kernel that fails on a machine without CUDA; under
:func:`use_cpu_rotate_iou` it uses :func:`rotate_iou_cpu_eval` instead. A
config imports this module (``custom_imports``) and sets
``val_evaluator = dict(type='KittiMetricCPU', ann_file=...)``. Importing it
imports mmdet3d; ``import fast_parallel`` does not import it.
"""
import sys
import threading
import types
from contextlib import contextmanager
from functools import lru_cache
from typing import Dict, Iterator, List

import numpy as np
from mmdet3d.evaluation.metrics import KittiMetric
from mmdet3d.registry import METRICS

from fast_parallel.contrib.kitti_iou import rotate_iou_cpu_eval

__all__ = [
    'ROTATE_IOU_MODULE', 'ROTATE_IOU_BACKENDS', 'rotate_iou_cpu_eval',
    'use_cpu_rotate_iou', 'select_kitti_rotate_iou', 'KittiMetricCPU'
]

ROTATE_IOU_MODULE = 'mmdet3d.evaluation.functional.kitti_utils.rotate_iou'
ROTATE_IOU_BACKENDS = ('auto', 'cpu', 'cuda')

_SWAP_LOCK = threading.RLock()


@contextmanager
def use_cpu_rotate_iou() -> Iterator[None]:
    """Makes mmdet3d's KITTI evaluation use :func:`rotate_iou_cpu_eval`.

    Inside the block, ``from .rotate_iou import rotate_iou_gpu_eval`` in
    ``kitti_utils/eval.py`` finds a stand-in module whose
    ``rotate_iou_gpu_eval`` is the CPU version. On exit the previous
    ``sys.modules`` entry comes back (or is removed if there was none), even
    when the block raises. Blocks in several threads run one at a time.

    ``kitti_utils/eval.py`` imports ``rotate_iou_gpu_eval`` inside
    ``bev_box_overlap`` / ``d3_box_overlap`` at every call, so a stand-in
    under that name in ``sys.modules`` is enough: no mmdet3d file is edited
    and nothing stays changed after the block; while it is open the swap is
    process-wide, hence the lock.

    Yields:
        None
    """
    stand_in = types.ModuleType(ROTATE_IOU_MODULE,
                                'CPU stand-in made by fast_parallel')
    stand_in.rotate_iou_gpu_eval = rotate_iou_cpu_eval
    with _SWAP_LOCK:
        missing = object()
        previous = sys.modules.get(ROTATE_IOU_MODULE, missing)
        sys.modules[ROTATE_IOU_MODULE] = stand_in
        try:
            yield
        finally:
            if previous is missing:
                sys.modules.pop(ROTATE_IOU_MODULE, None)
            else:
                sys.modules[ROTATE_IOU_MODULE] = previous


@lru_cache(maxsize=None)
def select_kitti_rotate_iou() -> str:
    """Chooses the rotated-IoU backend for KITTI evaluation.

    ``'cpu'`` when numba's CUDA simulator is enabled, when
    ``numba.cuda.is_available()`` is false, or when importing upstream's
    kernel module or running it on one pair of boxes raises; otherwise
    ``'cuda'`` (upstream's kernel, untouched). The answer is cached for the
    process.

    Returns:
        str: ``'cuda'`` if upstream's numba CUDA kernel imports and runs on
        one pair of boxes, else ``'cpu'``; always ``'cpu'`` under numba's
        CUDA simulator, which gives the same numbers far more slowly.
    """
    import importlib

    from numba import config, cuda
    if config.ENABLE_CUDASIM:
        return 'cpu'
    try:
        if not cuda.is_available():
            return 'cpu'
        module = importlib.import_module(ROTATE_IOU_MODULE)
        box = np.array([[0.0, 0.0, 2.0, 1.0, 0.0]], dtype=np.float32)
        module.rotate_iou_gpu_eval(box, box)
    except Exception:  # no driver, no NVVM, no device: all mean "use CPU"
        return 'cpu'
    return 'cuda'


@METRICS.register_module()
class KittiMetricCPU(KittiMetric):
    """``KittiMetric`` that can evaluate BEV / 3D boxes without a GPU.

    Same arguments and results as ``KittiMetric``, plus ``rotate_iou``.

    Args:
        *args: Passed to ``KittiMetric``.
        rotate_iou (str): ``'auto'`` (:func:`select_kitti_rotate_iou`),
            ``'cpu'`` (:func:`rotate_iou_cpu_eval` for the duration of each
            ``compute_metrics`` call) or ``'cuda'`` (upstream's kernel).
            Defaults to ``'auto'``.
        **kwargs: Passed to ``KittiMetric``.
    """

    def __init__(self, *args, rotate_iou: str = 'auto', **kwargs) -> None:
        if rotate_iou not in ROTATE_IOU_BACKENDS:
            raise ValueError(f'rotate_iou must be one of {ROTATE_IOU_BACKENDS}'
                             f', got {rotate_iou!r}')
        super().__init__(*args, **kwargs)
        self.rotate_iou = rotate_iou

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        """``KittiMetric.compute_metrics`` with the selected rotated IoU.

        Args:
            results (list[dict]): The processed results of the whole dataset.

        Returns:
            dict[str, float]: The metrics, as ``KittiMetric`` names them.
        """
        backend = self.rotate_iou
        if backend == 'auto':
            backend = select_kitti_rotate_iou()
        if backend == 'cuda':
            return super().compute_metrics(results)
        with use_cpu_rotate_iou():
            return super().compute_metrics(results)
