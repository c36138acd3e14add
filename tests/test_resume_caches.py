"""Resume with transforms that keep state across samples (``CachedMosaic``).

mmdet's ``Cached*`` transforms keep a cache of earlier results in whichever
process runs the pipeline; no checkpoint carries it. In an epoch loop with
persistent workers the cache lives on into the next epoch, so a resumed run
(empty caches) cannot be exact: ``ExactResumeHook`` must say so, naming the
transform. Without persistent workers every epoch starts with new, empty
caches in both runs: the resume is exact and says nothing.
"""
import uuid

import pytest
from mmcv.transforms import Compose
from mmengine.runner import Runner
from order_utils import BatchRecorder, OneParameter, assert_same_batches

from fast_parallel.resume.workers import stateful_transforms

INEXACT = 'this resumed run will not be identical'
PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='CachedMosaic', img_scale=(64, 64), max_cached_images=6),
    dict(type='Resize', scale=(64, 64), keep_ratio=True),
    dict(type='PackDetInputs', meta_keys=('img_id', )),
]


def _train(sample_data, work_dir, persistent: bool, resume_from=None):
    coco = sample_data / 'coco'
    loader = dict(
        dataset=dict(
            type='CocoDataset',
            data_root=str(coco) + '/',
            ann_file='annotations/instances_train2017.json',
            data_prefix=dict(img='train2017/'),
            filter_cfg=dict(filter_empty_gt=False),
            pipeline=PIPELINE),
        sampler=dict(type='DefaultSampler', shuffle=True),
        batch_size=2,
        num_workers=2,
        persistent_workers=persistent)
    recorder = BatchRecorder()
    runner = Runner(
        model=OneParameter(),
        work_dir=str(work_dir),
        experiment_name=f'caches_{uuid.uuid4().hex}',
        train_dataloader=loader,
        train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=1),
            logger=dict(type='LoggerHook', interval=1000)),
        custom_hooks=[
            dict(type='FastParallelHook'),
            dict(type='ExactResumeHook'), recorder
        ],
        randomness=dict(seed=3),
        default_scope='mmdet',
        log_level='INFO',
        load_from=resume_from,
        resume=resume_from is not None)
    runner.train()
    per_epoch = len(runner.train_dataloader)
    log = ''.join(p.read_text() for p in work_dir.glob('*/*.log'))
    return recorder, per_epoch, log


@pytest.mark.parametrize('persistent', [True, False])
def test_cached_transforms_on_resume(sample_data, tmp_path, persistent):
    full, per_epoch, _ = _train(sample_data, tmp_path / 'full', persistent)
    resumed, _, log = _train(
        sample_data,
        tmp_path / 'resumed',
        persistent,
        resume_from=str(tmp_path / 'full' / 'epoch_1.pth'))
    full.batches = full.batches[per_epoch:]
    assert len(resumed.batches) == len(full.batches) == per_epoch > 2
    if persistent:
        assert INEXACT in log
        assert 'CachedMosaic' in log and 'results_cache' in log
        # and it is so: the resumed mosaics are made from other images
        with pytest.raises(AssertionError):
            assert_same_batches(full, resumed)
    else:
        assert INEXACT not in log
        assert_same_batches(full, resumed)


def test_stateful_transforms_are_found_through_wrappers():
    from mmdet.utils import register_all_modules
    register_all_modules()
    inner = Compose([
        dict(type='LoadImageFromFile'),
        dict(
            type='RandomApply',
            transforms=[dict(type='CachedMixUp', img_scale=(64, 64))])
    ])
    outer = Compose([
        dict(type='CachedMosaic', img_scale=(64, 64)),
        dict(type='RandomFlip', prob=0.5)
    ])

    class Wrapped:  # what a dataset wrapper holds: a dataset and a pipeline

        def __init__(self) -> None:
            self.pipeline = outer
            self.dataset = type('Inner', (), {'pipeline': inner})()

    assert stateful_transforms(Wrapped()) == ['CachedMosaic', 'CachedMixUp']
    assert stateful_transforms(inner.transforms[0]) == []
