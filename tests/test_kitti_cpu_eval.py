"""fast_parallel/contrib/kitti_metric.py against mmdet3d's kernel, simulated.

The reference numbers come from one child process with
``NUMBA_ENABLE_CUDASIM=1`` (it must be set before numba is imported) that
runs upstream's ``rotate_iou_gpu_eval`` and upstream's ``KittiMetric`` on the
same inputs as this process; see ``simulator_main``.
"""
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import List

import numpy as np
import pytest
import torch
from numba import cuda

from fast_parallel.contrib.kitti_iou import _vertex_counts, rotate_iou_cpu_eval
from fast_parallel.contrib.kitti_metric import (ROTATE_IOU_MODULE,
                                                KittiMetricCPU,
                                                select_kitti_rotate_iou,
                                                use_cpu_rotate_iou)

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ['Pedestrian', 'Cyclist', 'Car']  # label ids of the infos
CRITERIA = (-1, 0, 1, 2)
# Runs ``simulator_main`` of this file in a fresh interpreter.
CHILD = ('import importlib.util, sys\n'
         'spec = importlib.util.spec_from_file_location("case", sys.argv[1])\n'
         'case = importlib.util.module_from_spec(spec)\n'
         'spec.loader.exec_module(case)\n'
         'case.simulator_main(*sys.argv[2:])\n')


def rotated_box_cases(seed: int = 0) -> tuple:
    """Boxes and query boxes (BEV, camera frame) with awkward pairs.

    Random boxes, near copies, exact copies, nested, edge-touching,
    corner-touching, disjoint, zero-area and needle-thin boxes, at KITTI-like
    and at small coordinates.

    Returns:
        tuple: ``float32[N, 5]`` boxes, ``float32[K, 5]`` query boxes.
    """
    rng = np.random.default_rng(seed)
    n = 24
    rand = np.concatenate([
        rng.uniform(-10, 10, (n, 1)),
        rng.uniform(0, 40, (n, 1)),
        rng.uniform(0.3, 5.0, (n, 2)),
        rng.uniform(-math.pi, math.pi, (n, 1))
    ],
                          axis=1)
    near = rand[:12].copy()
    near[:, :2] += rng.normal(0, 0.3, (12, 2))
    near[:, 4] += rng.normal(0, 0.2, 12)
    special = np.array([
        [0, 0, 2, 1, 0],
        [0, 0, 2, 1, 0.3],
        [0, 0, 1, 2, 0],
        [0, 0, 2, 1, math.pi / 2],
        [0, 0, 0.5, 0.25, 0.1],
        [0, 0, 10, 10, 0.7],
        [2, 0, 2, 1, 0],
        [0, 1, 2, 1, 0],
        [2, 1, 2, 1, 0],
        [1, 0, 1e-6, 1, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 1, 0.2],
        [100, 100, 1, 1, 0],
        [0.5, 0.5, 1, 1, math.pi / 4],
        [30.5, 12.25, 3.9, 1.6, 1.57],
        [30.5, 12.25, 3.9, 1.6, -1.57],
        [30.5, 12.25, 1.6, 3.9, 0.0],
        [30.5, 12.26, 3.9, 1.6, 1.5708],
    ])
    boxes = np.concatenate([rand, special]).astype(np.float32)
    query = np.concatenate([near, rand[12:20], special]).astype(np.float32)
    return boxes, query


def jittered_predictions(ann_file: Path, seed: int = 0) -> List[dict]:
    """LiDAR-frame predictions: each GT jittered, a few missed, a few false.

    Returns:
        list[dict]: Per val frame ``bboxes`` (float32[n, 7]), ``scores``,
        ``labels``.
    """
    from mmdet3d.structures import Box3DMode, CameraInstance3DBoxes
    rng = np.random.default_rng(seed)
    with open(ann_file, 'rb') as f:
        infos = pickle.load(f)['data_list']
    preds = []
    for info in infos:
        cam = CameraInstance3DBoxes(
            torch.tensor([x['bbox_3d'] for x in info['instances']]))
        cam2lidar = np.linalg.inv(
            np.array(info['images']['CAM2']['lidar2cam'], np.float32))
        lidar = cam.convert_to(Box3DMode.LIDAR, cam2lidar).tensor.numpy()
        n = len(lidar)
        lidar[:, :2] += rng.normal(0, 0.25, (n, 2))
        lidar[:, 2] += rng.normal(0, 0.05, n)
        lidar[:, 3:6] *= 1 + rng.normal(0, 0.05, (n, 3))
        lidar[:, 6] += rng.normal(0, 0.1, n)
        labels = np.array([x['bbox_label'] for x in info['instances']])
        keep = rng.uniform(size=n) > 0.15
        false = np.stack([
            rng.uniform(10, 40, 3),
            rng.uniform(-15, 15, 3),
            np.full(3, -1.73),
            rng.uniform(3.6, 4.2, 3),
            rng.uniform(1.5, 1.8, 3),
            rng.uniform(1.4, 1.6, 3),
            rng.uniform(-math.pi, math.pi, 3)
        ],
                         axis=1)
        preds.append(
            dict(
                bboxes=np.concatenate([lidar[keep], false]).astype(np.float32),
                scores=np.concatenate([
                    rng.uniform(0.4, 1.0, keep.sum()),
                    rng.uniform(0.1, 0.7, 3)
                ]).astype(np.float32),
                labels=np.concatenate(
                    [labels[keep],
                     np.full(3, CLASSES.index('Car'))])))
    return preds


def evaluate(metric, preds: List[dict]) -> dict:
    """``metric.compute_metrics`` on new result dicts built from ``preds``."""
    from mmdet3d.structures import LiDARInstance3DBoxes
    metric.dataset_meta = dict(classes=CLASSES)
    results = [{
        'pred_instances_3d': {
            'bboxes_3d': LiDARInstance3DBoxes(torch.from_numpy(p['bboxes'])),
            'scores_3d': torch.from_numpy(p['scores']),
            'labels_3d': torch.from_numpy(p['labels']),
        },
        'pred_instances': {},
        'sample_idx': i,
    } for i, p in enumerate(preds)]
    return metric.compute_metrics(results)


def simulator_main(inputs: str, outputs: str) -> None:
    """Child process body: upstream IoUs and ``KittiMetric``, simulated.

    Args:
        inputs (str): Pickle of ``boxes``, ``query``, ``ann_file``,
            ``preds``.
        outputs (str): Pickle written with ``iou`` (criterion -> matrix) and
            ``ap`` (the metric dict).
    """
    from numba import config
    assert config.ENABLE_CUDASIM, 'run with NUMBA_ENABLE_CUDASIM=1'
    import warnings

    from mmdet3d.evaluation.functional.kitti_utils import rotate_iou

    # The degenerate boxes divide by zero. The first NumPy warning adds
    # ``__warningregistry__`` to the kernel module's globals while other
    # simulated threads iterate them (numba's ``swapped_cuda_module``):
    # "dictionary changed size during iteration". Creating it up front keeps
    # the dict's size fixed; values are unaffected. (``np.seterr`` would not
    # do: NumPy 1.x keeps it per thread.)
    vars(rotate_iou).setdefault('__warningregistry__', {})
    warnings.simplefilter('ignore', RuntimeWarning)
    from mmdet3d.evaluation.metrics import KittiMetric
    with open(inputs, 'rb') as f:
        case = pickle.load(f)
    iou = {
        c: rotate_iou.rotate_iou_gpu_eval(case['boxes'], case['query'], c)
        for c in CRITERIA
    }
    ap = evaluate(KittiMetric(ann_file=case['ann_file']), case['preds'])
    with open(outputs, 'wb') as f:
        pickle.dump(dict(iou=iou, ap=ap), f)


@pytest.fixture(scope='module')
def val_ann_file(sample_data) -> Path:
    return sample_data / 'kitti' / 'kitti_infos_val.pkl'


@pytest.fixture(scope='module')
def case(val_ann_file) -> dict:
    boxes, query = rotated_box_cases()
    # Above 8 vertices the kernel overflows its local array (the simulator
    # raises IndexError): keep such pairs out of the reference run.
    assert _vertex_counts(boxes, query).max() <= 8
    return dict(
        boxes=boxes,
        query=query,
        ann_file=str(val_ann_file),
        preds=jittered_predictions(val_ann_file))


class SimulatorRun:
    """``simulator_main`` in a child process, started now, awaited on demand.

    The child runs while this process does its own (CPU) half of a test.

    Args:
        case (dict): The inputs (see ``simulator_main``).
        folder (Path): Where inputs and outputs are written.
    """

    def __init__(self, case: dict, folder: Path) -> None:
        inputs, self.outputs = folder / 'inputs.pkl', folder / 'outputs.pkl'
        self.log = folder / 'child.log'
        with open(inputs, 'wb') as f:
            pickle.dump(case, f)
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM='1')
        with open(self.log, 'w') as log:
            self.child = subprocess.Popen([
                sys.executable, '-c', CHILD, __file__,
                str(inputs),
                str(self.outputs)
            ],
                                          env=env,
                                          stdout=log,
                                          stderr=subprocess.STDOUT)
        self.result = None

    def get(self) -> dict:
        """Waits for the child; returns its ``iou`` and ``ap``."""
        if self.result is None:
            self.child.wait()
            assert self.child.returncode == 0, self.log.read_text()[-3000:]
            with open(self.outputs, 'rb') as f:
                self.result = pickle.load(f)
        return self.result


@pytest.fixture(scope='module')
def simulated(case, tmp_path_factory):
    run = SimulatorRun(case, tmp_path_factory.mktemp('cudasim'))
    yield run
    if run.child.poll() is None:  # a test failed before waiting for it
        run.child.kill()
        run.child.wait()


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: identical float32 bits, or both NaN."""
    return (a.view(np.int32) == b.view(np.int32)) | (np.isnan(a) & np.isnan(b))


def test_kitti_metric_cpu_equals_simulated_upstream(case, simulated):
    metric = KittiMetricCPU(ann_file=case['ann_file'], rotate_iou='cpu')
    ap = evaluate(metric, case['preds'])  # while the child runs
    assert ap == simulated.get()['ap']
    assert ROTATE_IOU_MODULE not in sys.modules or \
        sys.modules[ROTATE_IOU_MODULE].__doc__ != 'CPU stand-in made by ' \
        'fast_parallel'
    moderate = {k: v for k, v in ap.items() if k.endswith('moderate_strict')}
    assert len(moderate) == 3 * 3 * 2  # 3 classes x bbox/bev/3d x AP11/AP40
    # With 13 val Cars, KITTI's 40 recall points cap AP40 near 13/40 (upstream
    # get_thresholds keeps one threshold per detection), hence small figures.
    assert 0 < ap['pred_instances_3d/KITTI/Car_3D_AP40_moderate_strict'] \
        < ap['pred_instances_3d/KITTI/Car_BEV_AP40_moderate_strict'] <= 100


@pytest.mark.parametrize('criterion', CRITERIA)
def test_rotate_iou_equals_simulated_kernel(case, simulated, criterion):
    cpu = rotate_iou_cpu_eval(case['boxes'], case['query'], criterion)
    ref = simulated.get()['iou'][criterion]
    assert cpu.dtype == ref.dtype == np.float32
    assert cpu.shape == ref.shape == (len(case['boxes']), len(case['query']))
    bad = np.argwhere(~same_bits(cpu, ref))
    assert len(bad) == 0, [(tuple(i), cpu[tuple(i)], ref[tuple(i)])
                           for i in bad[:5]]
    # not a trivial case: overlaps, and the kernel's NaN / inf for the
    # zero-area boxes (which it finds to contain whole other boxes)
    assert (ref > 0).sum() > 50
    if criterion != 2:
        assert np.isnan(ref).any() and np.isinf(ref).any()


def test_rotate_iou_edge_cases():
    box = np.array([[0, 0, 2, 1, 0.3]], np.float32)
    assert rotate_iou_cpu_eval(np.zeros((0, 5)), box).shape == (0, 1)
    assert rotate_iou_cpu_eval(box, np.zeros((0, 5))).dtype == np.float32
    # float64 input is cast like upstream; criterion 2 gives the area
    assert rotate_iou_cpu_eval(box.astype(np.float64), box, 2)[0, 0] == \
        pytest.approx(2.0, rel=1e-6)
    # A box and itself turned by pi: the kernel collects 10 vertices and
    # overflows its 8-vertex array (UB on a GPU, IndexError simulated); the
    # CPU version keeps them all and finds the full overlap.
    flipped = np.array([[0, 0, 2, 1, 0], [0, 0, 2, 1, math.pi]], np.float32)
    assert _vertex_counts(flipped[:1], flipped[1:])[0, 0] > 8
    assert rotate_iou_cpu_eval(flipped[:1], flipped[1:])[0, 0] == \
        pytest.approx(1.0, abs=1e-6)


def test_use_cpu_rotate_iou_is_scoped(monkeypatch):
    from mmdet3d.evaluation.functional.kitti_utils.eval import bev_box_overlap
    boxes, query = rotated_box_cases()
    missing = object()
    before = sys.modules.get(ROTATE_IOU_MODULE, missing)
    with use_cpu_rotate_iou():
        # upstream's own call site picks the CPU version up
        np.testing.assert_array_equal(
            bev_box_overlap(boxes, query), rotate_iou_cpu_eval(boxes, query))
    assert sys.modules.get(ROTATE_IOU_MODULE, missing) is before
    placeholder = type(sys)('placeholder')
    monkeypatch.setitem(sys.modules, ROTATE_IOU_MODULE, placeholder)
    with pytest.raises(RuntimeError, match='inside'):
        with use_cpu_rotate_iou():
            stand_in = sys.modules[ROTATE_IOU_MODULE]
            assert stand_in.rotate_iou_gpu_eval is rotate_iou_cpu_eval
            raise RuntimeError('inside')
    assert sys.modules[ROTATE_IOU_MODULE] is placeholder


def test_registry_and_selection(val_ann_file):
    from mmdet3d.registry import METRICS
    from mmengine.registry import DefaultScope

    # other tests leave another default scope behind (e.g. mmdet's)
    with DefaultScope.overwrite_default_scope('mmdet3d'):
        metric = METRICS.build(
            dict(type='KittiMetricCPU', ann_file=str(val_ann_file)))
    assert isinstance(metric, KittiMetricCPU) and metric.rotate_iou == 'auto'
    with pytest.raises(ValueError, match='rotate_iou'):
        KittiMetricCPU(ann_file=str(val_ann_file), rotate_iou='gpu')
    assert select_kitti_rotate_iou() in ('cpu', 'cuda')
    if not cuda.is_available():
        assert select_kitti_rotate_iou() == 'cpu'


@pytest.mark.skipif(cuda.is_available(), reason='upstream works with CUDA')
def test_upstream_metric_needs_cuda(case):
    """Why this module exists: stock KittiMetric fails on a CPU machine."""
    from mmdet3d.evaluation.metrics import KittiMetric
    from numba.cuda.cudadrv.error import CudaSupportError
    with pytest.raises(CudaSupportError):
        evaluate(KittiMetric(ann_file=case['ann_file']), case['preds'])
