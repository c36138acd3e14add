"""The batched-target switch (fast_parallel/step/targets/switch.py): which
heads it covers, the per-instance change, the YOLOX loss with batched
targets against stock's, and uncovered heads named in the log.
"""
import copy
import importlib
import random

import pytest
import torch
from mmdet.models.dense_heads import YOLOXHead
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.structures import InstanceData

from fast_parallel.step.targets.stats import TargetStats
from fast_parallel.step.targets.switch import COVERED, switch_targets

register_all_modules()

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def _yolox(num_classes: int = 80, width: int = 64) -> torch.nn.Module:
    return MODELS.build(
        dict(
            type='YOLOXHead',
            num_classes=num_classes,
            in_channels=width,
            feat_channels=width,
            train_cfg=dict(
                assigner=dict(type='SimOTAAssigner', center_radius=2.5))))


def test_the_table_names_modules_that_cover_their_pair():
    for row in COVERED:
        module = importlib.import_module(
            f'fast_parallel.step.targets.{row.package}')
        assert callable(module.supported)
        for name in row.replaces:  # a private method: the name without _
            function = getattr(module, name.lstrip('_'))
            assert function.__name__ == name.lstrip('_')


def test_switch_changes_one_instance_only():
    head, other = _yolox(), _yolox()
    keys = {k: v.clone() for k, v in head.state_dict().items()}
    outcome, stats = switch_targets(head)
    assert str(outcome) == 'targets: YOLOXHead/SimOTAAssigner batched'
    assert outcome.done and outcome.why is None
    assert [(p.name, p.done)
            for p in outcome.parts] == [('YOLOXHead/SimOTAAssigner', True)]
    assert len(stats) == 1 and stats[0].name == 'YOLOXHead/SimOTAAssigner'
    assert type(head) is YOLOXHead and 'loss_by_feat' in vars(head)
    assert 'loss_by_feat' not in vars(other)
    assert YOLOXHead.loss_by_feat.__module__ == 'mmdet.models.dense_heads.' \
        'yolox_head'
    state = head.state_dict()
    assert list(state) == list(keys)
    assert all(torch.equal(state[k], keys[k]) for k in keys)
    # a second run of the same model finds it switched, not "replaced"
    again, stats_again = switch_targets(head)
    assert again == outcome and stats_again[0] is stats[0]
    off, stats_off = switch_targets(other, enabled=False)
    assert str(off) == 'targets: left stock (fast_targets=False)'
    assert not off.done and off.why == 'fast_targets=False'
    assert stats_off == []
    assert 'loss_by_feat' not in vars(other)


def test_uncovered_heads_stay_stock_and_are_named():

    class MyYOLOXHead(YOLOXHead):
        pass

    sub = MyYOLOXHead(
        num_classes=3,
        in_channels=32,
        feat_channels=32,
        train_cfg=dict(assigner=dict(type='SimOTAAssigner')))
    outcome, stats = switch_targets(sub)
    assert str(outcome) == \
        'targets: MyYOLOXHead/SimOTAAssigner stock (not covered)'
    assert not outcome.done and outcome.parts[0].why == 'not covered'
    assert stats == [] and 'loss_by_feat' not in vars(sub)

    retina = MODELS.build(
        dict(
            type='RetinaHead',
            num_classes=3,
            in_channels=32,
            feat_channels=32,
            anchor_generator=dict(
                type='AnchorGenerator',
                octave_base_scale=4,
                scales_per_octave=3,
                ratios=[0.5, 1.0, 2.0],
                strides=[8, 16, 32, 64, 128]),
            bbox_coder=dict(type='DeltaXYWHBBoxCoder'),
            train_cfg=dict(
                assigner=dict(
                    type='MaxIoUAssigner',
                    pos_iou_thr=0.5,
                    neg_iou_thr=0.4,
                    iou_calculator=dict(type='BboxOverlaps2D', scale=2.)),
                sampler=dict(type='PseudoSampler'),
                allowed_border=-1,
                pos_weight=-1)))
    outcome, _ = switch_targets(retina)
    # RetinaHead is covered, this option is not: stock, and named with why
    assert str(outcome) == ('targets: RetinaHead/MaxIoUAssigner stock '
                            '(BboxOverlaps2D with scale or dtype options)')
    assert 'loss_by_feat' not in vars(retina)
    retina.assigner.iou_calculator.scale = 1.
    outcome, _ = switch_targets(retina)
    assert str(outcome) == 'targets: RetinaHead/MaxIoUAssigner batched'
    assert 'loss_by_feat' in vars(retina)

    wrong = _yolox()
    wrong.loss_by_feat = wrong.loss_by_feat  # someone else's per-instance
    outcome, _ = switch_targets(wrong)
    assert str(outcome) == ('targets: YOLOXHead/SimOTAAssigner stock '
                            '(loss_by_feat replaced on the instance)')


def _batch(gen: torch.Generator,
           rng: random.Random,
           num_imgs: int,
           size: int,
           num_classes: int,
           empty: bool = False):
    gts = []
    for _ in range(num_imgs):
        num = 0 if empty else rng.choice([0, 1, 4, 12])
        xy = torch.rand(num, 2, generator=gen) * (size - 40)
        wh = torch.rand(num, 2, generator=gen) * 120 + 4
        boxes = torch.cat([xy, (xy + wh).clamp(max=size)], 1)
        gts.append(
            InstanceData(
                bboxes=boxes,
                labels=torch.randint(0, num_classes, (num, ), generator=gen)))
    metas = [dict(img_shape=(size, size))] * num_imgs
    return gts, metas


@pytest.mark.parametrize('use_l1', [False, True])
def test_yolox_loss_equals_stock_losses_and_gradients(use_l1):
    """The switched head's losses and every gradient equal stock's bits,
    over batches with and without ground truths (the `num_pos == 0` path).
    """
    torch.manual_seed(0)
    stock_head = _yolox(num_classes=5, width=32)
    stock_head.use_l1 = use_l1
    fast_head = copy.deepcopy(stock_head)
    _, (stats, ) = switch_targets(fast_head)
    gen, rng = torch.Generator().manual_seed(1), random.Random(1)
    size, calls = 256, 0
    for case in range(5):
        num_imgs = rng.randint(1, 4)
        gts, metas = _batch(gen, rng, num_imgs, size, 5, empty=case == 4)
        feats = [
            torch.randn(num_imgs, 32, size // s, size // s, generator=gen)
            for s in (8, 16, 32)
        ]
        results = []
        for head in (stock_head, fast_head):
            head.zero_grad()
            losses = head.loss_by_feat(*head(tuple(feats)), gts, metas)
            sum(losses.values()).backward()
            results.append((losses, {
                n: p.grad.clone()
                for n, p in head.named_parameters() if p.grad is not None
            }))
        calls += 1
        (stock_losses, stock_grads), (fast_losses, fast_grads) = results
        assert list(stock_losses) == list(fast_losses)
        for name, value in stock_losses.items():
            other = fast_losses[name]
            assert value.dtype == other.dtype and value.shape == other.shape
            assert torch.equal(value, other), (case, name)
        assert list(stock_grads) == list(fast_grads)
        for name, grad in stock_grads.items():
            assert torch.equal(grad, fast_grads[name]), (case, name)
    assert stats.calls == calls and stats.samples > 0
    assert stats.stock == 0


def test_stats_report_the_stock_samples():
    stats = TargetStats('YOLOXHead/SimOTAAssigner', 'images')
    stats.add(8, 0)
    stats.add(8, 2)
    assert stats.pop() == ('YOLOXHead/SimOTAAssigner batched for 14 of 16 '
                           'images, 2 computed the stock way')
    assert stats.pop() is None
    assert (stats.calls, stats.samples, stats.stock) == (2, 16, 2)


@MODELS.register_module(force=True)
class PlainYOLOXHead(YOLOXHead):
    """A user's subclass: the same targets, but not a covered class."""


def test_an_uncovered_head_is_named_in_the_start_line(sample_data, tmp_path):
    """Through mmengine's Runner: the YOLOX-tiny sample with a subclass head
    trains on stock targets, and the start-of-run line says so."""
    import glob

    from mmengine.runner import Runner
    from models import CONFIGS
    from runner_utils import sample_config
    cfg = sample_config(
        CONFIGS['yolox'], sample_data, tmp_path, True, **{
            'train_cfg.max_epochs': 1,
            'train_cfg.val_interval': 2,
            'model.bbox_head.type': 'PlainYOLOXHead'
        })
    runner = Runner.from_cfg(cfg)
    runner.train()
    head = runner.model.module.bbox_head
    assert type(head) is PlainYOLOXHead
    assert 'loss_by_feat' not in vars(head)
    assert not hasattr(head, 'fast_target_stats')
    log = open(glob.glob(str(tmp_path / '*' / '*.log'))[0]).read()
    line, = [ln for ln in log.splitlines() if 'FastParallelHook: on:' in ln]
    assert '; targets: PlainYOLOXHead/SimOTAAssigner stock (not covered); ' \
        'pipeline: ' in line
    assert 'batched for' not in log


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_yolox_half_outputs_are_batched_and_equal_stock(dtype):
    """Under AMP the head's outputs are half: YOLOXHead (80 classes, 320
    px), batches of 4 images with random boxes, outputs cast as autocast
    gives them. Every image is batched (none the stock way), and the losses
    and every gradient are stock's bits."""
    torch.manual_seed(0)
    stock_head = _yolox(num_classes=80, width=32)
    fast_head = copy.deepcopy(stock_head)
    _, (stats, ) = switch_targets(fast_head)
    gen, rng = torch.Generator().manual_seed(2), random.Random(2)
    size = 320
    for case in range(3):
        gts, metas = _batch(gen, rng, 4, size, 80)
        feats = [
            torch.randn(4, 32, size // s, size // s, generator=gen)
            for s in (8, 16, 32)
        ]
        results = []
        for head in (stock_head, fast_head):
            head.zero_grad()
            outs = [[o.to(dtype) for o in level]
                    for level in head(tuple(feats))]
            losses = head.loss_by_feat(*outs, gts, metas)
            sum(losses.values()).backward()
            results.append((losses, {
                n: p.grad.clone()
                for n, p in head.named_parameters() if p.grad is not None
            }))
        (stock_losses, stock_grads), (fast_losses, fast_grads) = results
        for name, value in stock_losses.items():
            other = fast_losses[name]
            assert value.dtype == other.dtype, name
            assert torch.equal(value, other), (case, name)
        assert list(stock_grads) == list(fast_grads)
        for name, grad in stock_grads.items():
            assert torch.equal(grad, fast_grads[name]), (case, name)
    assert (stats.samples, stats.stock) == (12, 0)
