"""Real mmengine runs that record the batches ``train_step`` received.

Shared by the batch-order tests (``test_sampler_order.py``) and the resume
tests (``test_resume_epoch.py``): real COCO / COCO-VID annotation files of
mixed orientation, real mmdet datasets, pipelines and samplers, mmengine's
Runner and loops, and a one-parameter model (the batches are under test).
"""
import copy
import hashlib
import json
import pickle
import uuid
from typing import Any, Dict, List, Optional, Sequence

import torch
from helpers import assert_same_tree
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner

import fast_parallel  # noqa: F401  (registers FastParallelHook)
from fast_parallel import PackedBatch
from fast_parallel.data.handout import packed_batch_of
from fast_parallel.data.rebuild import started_iterators
from fast_parallel.resume.hook import random_states

NUM_IMAGES = 16  # 8 batches of 2 per epoch; 2 workers prefetch 4
PORTRAIT = {1, 2, 5, 8, 9, 12, 13}  # mixed orientation, no pattern
ITERS = 7  # > prefetch, inside one pass over the data


class OneParameter(BaseModel):
    """The smallest mmengine model: the loss is its one parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, *args: Any, mode: str = 'loss', **kwargs: Any):
        return dict(loss=self.w.sum())


def states_digest() -> str:
    """A digest of the main process's random states (Python, NumPy, torch).
    """
    states = random_states()
    states['torch'] = states['torch'].numpy().tobytes()
    states['numpy'] = (states['numpy'][1].tobytes(), ) + states['numpy'][2:]
    return hashlib.sha1(
        pickle.dumps(
            (states['python'], states['numpy'], states['torch']))).hexdigest()


class BatchRecorder(Hook):
    """Keeps a copy of every training batch, whether it came packed (and
    with its worker's random states), and the main process's random states
    as each iteration starts."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.batches: List[Any] = []
        self.states: List[str] = []
        self.packed = 0
        self.with_worker_states = 0

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch=None) -> None:
        self.states.append(states_digest())
        packed = packed_batch_of(data_batch)  # also behind a handed-out one
        if packed is not None:
            self.packed += 1
            self.with_worker_states += packed.worker_states is not None
        if isinstance(data_batch, PackedBatch):
            data_batch = data_batch.unpack()
        self.batches.append(copy.deepcopy(data_batch))


def batch_ids(batch: Any) -> list:
    """The sample identities of one collated batch, in order."""
    ids = []
    for sample in batch['data_samples']:
        frames = getattr(sample, 'video_data_samples', None)  # tracking
        ids.append(sample.metainfo['img_id'] if frames is None else tuple(
            f.metainfo['img_id'] for f in frames))
    return ids


# --------------------------------------------------------------------------
# Real annotation files: COCO images and COCO-VID videos.
# --------------------------------------------------------------------------
def _coco(images: List[dict]) -> dict:
    anns = []
    for img in images:
        for k in range(1 + img['id'] % 3):
            anns.append(
                dict(
                    id=len(anns) + 1,
                    image_id=img['id'],
                    category_id=1 + (img['id'] + k) % 2,
                    bbox=[2.0 + k, 3.0, 10.0 + img['id'], 12.0],
                    area=120.0,
                    iscrowd=0,
                    instance_id=k))
    return dict(
        images=images,
        annotations=anns,
        categories=[dict(id=1, name='a'),
                    dict(id=2, name='b')])


def _image(i: int) -> dict:
    w, h = (48, 64) if i % NUM_IMAGES in PORTRAIT else (64, 48)
    return dict(id=i, file_name=f'{i:04d}.jpg', width=w, height=h)


def _frame(video: int, frame: int) -> dict:
    w, h = (48, 64) if video in (1, 2) else (64, 48)
    i = video * 4 + frame + 1
    return dict(
        id=i,
        file_name=f'v{video}/{frame}.jpg',
        width=w,
        height=h,
        video_id=video + 1,
        frame_id=frame)


def write_ann_files(root) -> Dict[str, str]:
    """Two COCO sets (16 and 8 images) and one COCO-VID set (4 x 4)."""
    sets = {
        'coco_a': _coco([_image(i) for i in range(1, NUM_IMAGES + 1)]),
        'coco_b': _coco([_image(i) for i in range(101, 109)]),
        'video': _coco([_frame(v, f) for v in range(4) for f in range(4)]),
    }
    out = {}
    for name, content in sets.items():
        out[name] = str(root / f'{name}.json')
        with open(out[name], 'w') as f:
            json.dump(content, f)
    return out


def _coco_dataset(ann_file: str) -> dict:
    return dict(
        type='CocoDataset',
        ann_file=ann_file,
        data_root='',
        data_prefix=dict(img=''),
        metainfo=dict(classes=('a', 'b')),
        filter_cfg=None,
        pipeline=[
            dict(type='LoadAnnotations', with_bbox=True),
            dict(type='PackDetInputs', meta_keys=('img_id', ))
        ])


def _concat(files: Dict[str, str]) -> dict:
    return dict(
        type='ConcatDataset',
        datasets=[
            _coco_dataset(files['coco_a']),
            _coco_dataset(files['coco_b'])
        ])


def _video(files: Dict[str, str]) -> dict:
    return dict(
        type='BaseVideoDataset',
        ann_file=files['video'],
        data_root='',
        metainfo=dict(classes=('a', 'b')),
        pipeline=[
            dict(
                type='UniformRefFrameSample',
                num_ref_imgs=1,
                frame_range=2,
                filter_key_img=True),
            dict(
                type='TransformBroadcaster',
                transforms=[dict(type='LoadTrackAnnotations')]),
            dict(type='PackTrackInputs')
        ])


#: Per sampler class: dataset, sampler, batch sampler; loops it runs in
#: (infinite samplers never end an epoch, so they run in iteration loops).
CASES: Dict[str, dict] = {
    'DefaultSampler':
    dict(
        dataset=lambda f: _coco_dataset(f['coco_a']),
        sampler=dict(type='DefaultSampler', shuffle=True)),
    'InfiniteSampler':
    dict(
        dataset=lambda f: _coco_dataset(f['coco_a']),
        sampler=dict(type='InfiniteSampler', shuffle=True),
        loops=('iter', )),
    'AspectRatioBatchSampler':
    dict(
        dataset=lambda f: _coco_dataset(f['coco_a']),
        sampler=dict(type='DefaultSampler', shuffle=True),
        batch_sampler=dict(type='AspectRatioBatchSampler')),
    'ClassAwareSampler':
    dict(
        dataset=lambda f: _coco_dataset(f['coco_a']),
        sampler=dict(type='ClassAwareSampler', num_sample_class=1)),
    'MultiSourceSampler':
    dict(
        dataset=_concat,
        sampler=dict(
            type='MultiSourceSampler', batch_size=2, source_ratio=[1, 1]),
        loops=('iter', )),
    'GroupMultiSourceSampler':
    dict(
        dataset=_concat,
        sampler=dict(
            type='GroupMultiSourceSampler', batch_size=2, source_ratio=[1, 1]),
        loops=('iter', )),
    'CustomSampleSizeSampler':
    dict(
        dataset=_concat,
        sampler=dict(type='CustomSampleSizeSampler', dataset_size=[-1, 4])),
    'MultiDataSampler':
    dict(
        dataset=_concat,
        sampler=dict(type='MultiDataSampler', dataset_ratio=[1, 2])),
    'MultiDataAspectRatioBatchSampler':
    dict(
        dataset=_concat,
        sampler=dict(type='DefaultSampler', shuffle=True),
        batch_sampler=dict(
            type='MultiDataAspectRatioBatchSampler',
            batch_size=[2, 2],
            num_datasets=2)),
    'TrackImgSampler':
    dict(dataset=_video, sampler=dict(type='TrackImgSampler')),
    'TrackAspectRatioBatchSampler':
    dict(
        dataset=_video,
        sampler=dict(type='TrackImgSampler'),
        batch_sampler=dict(type='TrackAspectRatioBatchSampler')),
}

#: Samplers whose iteration draws from the main process's global random
#: state: with workers the hook cannot restart them exactly, so they stay
#: on the stock path (with a warning) and must still train on stock's
#: batches.
STOCK_WITH_WORKERS = {'GroupMultiSourceSampler'}


def train(files: Dict[str, str],
          work_dir,
          case: str,
          loop: str,
          workers: int,
          fast: bool,
          persistent: bool = True,
          iters: int = ITERS,
          epochs: int = 2,
          seed: Optional[int] = 7,
          resume_from: Optional[str] = None,
          checkpoints: bool = False,
          exact_first: bool = False,
          collate: Any = None,
          extra_hooks: Sequence[Hook] = (),
          log_level: str = 'WARNING') -> BatchRecorder:
    """Trains the one-parameter model; returns what the batches were.

    Args:
        files (dict): From :func:`write_ann_files`.
        work_dir: The run's work dir.
        case (str): A key of :data:`CASES`.
        loop (str): 'iter' or 'epoch'.
        workers (int): DataLoader workers.
        fast (bool): With ``FastParallelHook`` and ``ExactResumeHook``.
        persistent (bool): ``persistent_workers`` when there are workers.
        iters (int): Iterations of an iteration loop.
        epochs (int): Epochs of an epoch loop.
        seed (int, optional): ``randomness.seed``; None draws one.
        resume_from (str, optional): A checkpoint to resume from.
        checkpoints (bool): Write a checkpoint every epoch / iteration.
        exact_first (bool): List ``ExactResumeHook`` before
            ``FastParallelHook`` (both VERY_HIGH: it runs first).
        collate: The loader config's ``collate_fn``; None: mmengine's
            default.
        extra_hooks (Sequence[Hook]): More hooks, after the recorder.
        log_level (str): The Runner's log level.

    Returns:
        BatchRecorder: The batches, in training order.
    """
    spec = CASES[case]
    loader = dict(
        dataset=spec['dataset'](files),
        sampler=spec['sampler'],
        batch_size=2,
        num_workers=workers,
        persistent_workers=persistent and workers > 0)
    if collate is not None:
        loader['collate_fn'] = collate
    if 'batch_sampler' in spec:
        loader['batch_sampler'] = spec['batch_sampler']
    train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters) \
        if loop == 'iter' else dict(type='EpochBasedTrainLoop',
                                    max_epochs=epochs)
    recorder = BatchRecorder()
    hooks: List[Any] = [
        dict(type='FastParallelHook'),
        dict(type='ExactResumeHook')
    ] if fast else []
    if exact_first:
        hooks.reverse()
    checkpoint = dict(
        type='CheckpointHook', interval=1, by_epoch=loop
        == 'epoch') if checkpoints else None
    runner = Runner(
        model=OneParameter(),
        work_dir=str(work_dir),
        experiment_name=f'order_{uuid.uuid4().hex}',
        train_dataloader=loader,
        train_cfg=train_cfg,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(
            checkpoint=checkpoint,
            logger=dict(type='LoggerHook', interval=1000)),
        custom_hooks=hooks + [recorder, *extra_hooks],
        randomness=dict(seed=seed),
        default_scope='mmdet',
        log_level=log_level,
        load_from=resume_from,
        resume=resume_from is not None)
    runner.train()
    # Workers still running (persistent ones, infinite samplers) would stop
    # only when garbage collection reaches the loader, where torch's join
    # waits 5 s per worker: stop them now.
    loop = runner.train_loop
    for holder, attr in started_iterators(loop, loop.dataloader):
        it = getattr(holder, attr)
        if hasattr(it, '_shutdown_workers'):
            it._shutdown_workers()
    recorder.collate_fn = loop.dataloader.collate_fn
    return recorder


def assert_same_batches(stock: BatchRecorder, fast: BatchRecorder) -> None:
    stock_ids = [batch_ids(b) for b in stock.batches]
    fast_ids = [batch_ids(b) for b in fast.batches]
    assert fast_ids == stock_ids, f'stock {stock_ids}\nfast  {fast_ids}'
    assert_same_tree(stock.batches, fast.batches)
