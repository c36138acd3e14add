"""A real Runner that trains and validates in seconds on the sample COCO set.

mmengine's Runner and ``IterBasedTrainLoop``, mmdet's ``CocoDataset``
(``tools/make_sample_data.py`` images), pipeline, ``DetDataPreprocessor``
and ``CocoMetric``; the model is one parameter that predicts each image's
ground-truth boxes, so the validations are real COCO evaluations and take
no model time.
"""
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from mmdet.utils import register_all_modules
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from mmengine.structures import InstanceData

import fast_parallel  # noqa: F401  (registers FastParallelHook)

register_all_modules(init_default_scope=False)


class BoxEcho(BaseModel):
    """One parameter; predicts the ground-truth boxes, shifted by it."""

    def __init__(self) -> None:
        super().__init__(
            data_preprocessor=dict(
                type='mmdet.DetDataPreprocessor', pad_size_divisor=32))
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self,
                inputs: torch.Tensor,
                data_samples=None,
                mode: str = 'tensor') -> Any:
        if mode == 'loss':
            return dict(loss=self.w.sum() + 0 * inputs.float().mean())
        for sample in data_samples:
            gt = sample.gt_instances
            boxes = getattr(gt.bboxes, 'tensor', gt.bboxes)  # BaseBoxes
            sample.pred_instances = InstanceData(
                bboxes=boxes + self.w.detach(),
                scores=torch.ones(len(gt)),
                labels=gt.labels)
        return data_samples


class MetricsRecorder(Hook):
    """Keeps the metrics every ``after_val_epoch`` was handed."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.metrics: List[Dict[str, float]] = []

    def after_val_epoch(self, runner, metrics=None) -> None:
        self.metrics.append(dict(metrics or {}))


def coco_loader(data: Path, workers: int, **extra: Any) -> dict:
    """The sample COCO val set (4 images of 128-160 px), batches of 2."""
    return dict(
        batch_size=2,
        num_workers=workers,
        persistent_workers=workers > 0,
        sampler=dict(type='DefaultSampler', shuffle=False),
        dataset=dict(
            type='CocoDataset',
            data_root=str(data / 'coco') + '/',
            ann_file='annotations/instances_val2017.json',
            data_prefix=dict(img='val2017/'),
            test_mode=False,
            pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True),
                dict(
                    type='PackDetInputs',
                    meta_keys=('img_id', 'ori_shape', 'img_shape'))
            ]),
        **extra)


def iter_runner(data: Path,
                work_dir: Path,
                hooks: List[Any],
                max_iters: int = 4,
                val_interval: int = 2,
                workers: int = 2,
                checkpoint: Optional[dict] = None,
                train_loader: Optional[dict] = None,
                val_loader: Optional[dict] = None,
                metrics: Optional[List[dict]] = None,
                with_test: bool = False) -> Runner:
    """An ``IterBasedTrainLoop`` run validating every ``val_interval``.

    Args:
        data (Path): The ``sample_data`` folder.
        work_dir (Path): The work dir.
        hooks (list): ``custom_hooks``.
        max_iters (int): Training iterations. Defaults to 4.
        val_interval (int): Iterations between validations (the last one
            ends training). Defaults to 2.
        workers (int): Train DataLoader workers (validation: 1).
        checkpoint (dict, optional): The ``CheckpointHook`` config; None
            saves none. Defaults to None.
        train_loader (dict, optional): Keys merged into the train
            DataLoader config. Defaults to None.
        val_loader (dict, optional): Keys merged into the val DataLoader
            config (one worker). Defaults to None.
        metrics (list[dict], optional): Metrics evaluated after
            ``CocoMetric``. Defaults to None.
        with_test (bool): Also a test loop, as the val loop. Defaults to
            False.

    Returns:
        Runner: Not run yet.
    """
    evaluator = [
        dict(
            type='CocoMetric',
            metric='bbox',
            ann_file=str(
                data / 'coco' / 'annotations' / 'instances_val2017.json'))
    ] + list(metrics or [])
    val_loader = {**coco_loader(data, 1), **(val_loader or {})}
    test = dict(
        test_dataloader=val_loader, test_cfg=dict(),
        test_evaluator=evaluator) if with_test else {}
    return Runner(
        model=BoxEcho(),
        work_dir=str(work_dir),
        experiment_name=f'val_{uuid.uuid4().hex}',
        train_dataloader=coco_loader(data, workers, **(train_loader or {})),
        train_cfg=dict(
            type='IterBasedTrainLoop',
            max_iters=max_iters,
            val_interval=val_interval),
        val_dataloader=val_loader,
        val_cfg=dict(),
        val_evaluator=evaluator,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(
            logger=dict(type='LoggerHook', interval=1), checkpoint=checkpoint),
        log_processor=dict(by_epoch=False),
        custom_hooks=hooks,
        randomness=dict(seed=0),
        default_scope='mmdet',
        **test)


def log_text(work_dir: Path) -> str:
    """The text of every log file under ``work_dir``."""
    return ''.join(p.read_text() for p in Path(work_dir).glob('*/*.log'))
