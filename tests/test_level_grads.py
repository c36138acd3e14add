"""Shared head weights' level gradients summed by foreach equal stock's
(fast_parallel/step/level_grads.py).

Each case builds one covered head from its upstream config (narrow
channels), a switched copy of it, five levels of features from a seed and a
loss of random weights on every output, and compares every parameter's
``.grad`` with stock's: None where stock's is, else dtype, shape, strides and
bits. The cases are what training does to gradients: a fresh step, a second
step without ``zero_grad``, two forwards in one backward, a retained graph
backwarded twice, and again together with a newer forward's, levels the
loss never reads, non-finite features, frozen weights, a weight given new
storage between steps.
"""
import copy
import pickle

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.hub import get_config
from torch import nn

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.level_grads import LevelGrads
from fast_parallel.step.level_switch import COVERED_HEADS, switch_level_grads

register_all_modules()
pytestmark = pytest.mark.usefixtures('mmdet_scope')

CONFIGS = {
    'FCOSHead': ('mmdet::fcos/fcos_r50-caffe_fpn_gn-head-center-normbbox-'
                 'centeronreg-giou_1x_coco.py', 'bbox_head'),
    'NASFCOSHead':
    ('mmdet::nas_fcos/'
     'nas-fcos_r50-caffe_fpn_nashead-gn-head_4xb4-1x_coco.py', 'bbox_head'),
    'ATSSHead': ('mmdet::atss/atss_r50_fpn_1x_coco.py', 'bbox_head'),
    'GFLHead': ('mmdet::gfl/gfl_r50_fpn_1x_coco.py', 'bbox_head'),
    'RetinaHead':
    ('mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', 'bbox_head'),
    'RPNHead':
    ('mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', 'rpn_head'),
}
CHANNELS = 32
LEVELS = 5
CASES = ('fresh', 'accumulate', 'two_forwards', 'retain', 'kept_graph',
         'some_levels', 'nonfinite', 'frozen', 'new_storage')


def build(name: str, **options) -> nn.Module:
    config, key = CONFIGS[name]
    cfg = dict(
        get_config(config).model[key],
        in_channels=CHANNELS,
        feat_channels=CHANNELS,
        **options)
    if name != 'RPNHead':
        cfg['num_classes'] = 3
    torch.manual_seed(0)
    return MODELS.build(cfg)


def switched(head: nn.Module) -> nn.Module:
    """A copy of ``head`` with the level sums, in a model of its own."""
    fast = copy.deepcopy(head)
    outcome = switch_level_grads(nn.ModuleList([fast]), True, True)
    assert outcome.done, outcome
    assert isinstance(fast.fast_level_grads, LevelGrads)
    return fast


def features(seed: int, batch: int = 2) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, CHANNELS, 48 >> level, 64 >> level, generator=gen)
        for level in range(LEVELS)
    ]


def loss_of(outs, seed: int, levels=None) -> torch.Tensor:
    """A different random weighting of every output element."""
    gen = torch.Generator().manual_seed(seed)
    total = 0
    for group in outs:
        for level, out in enumerate(group):
            weight = torch.randn(out.shape, generator=gen)
            if levels is None or level in levels:
                total = total + ((out * weight).sigmoid() * out).sum()
    return total


def step(head: nn.Module, case: str, seed: int) -> None:
    """One case's forwards and backwards on ``head``."""
    feats = features(seed)
    if case == 'nonfinite':
        feats[1][0, 0, 0, 0] = float('inf')
        feats[3][1, 2, 0, 1] = float('nan')
    if case == 'frozen':
        for param in list(head.parameters())[:3]:
            param.requires_grad_(False)
    if case == 'new_storage':
        loss_of(head(feats), seed).backward()
        for param in list(head.parameters())[::4]:
            param.data = param.data.clone() * 0.5
        head.zero_grad(set_to_none=True)
    if case == 'accumulate':
        loss_of(head(feats), seed).backward()
    if case == 'kept_graph':  # a graph backwarded, kept, then again
        kept = loss_of(head(feats), seed)  # with a newer one
        kept.backward(retain_graph=True)
        (kept + loss_of(head(features(seed + 1)), seed + 1)).backward()
        return
    if case == 'two_forwards':
        loss = loss_of(head(feats), seed) + loss_of(
            head(features(seed + 1)), seed + 1)
        loss.backward()
        return
    loss = loss_of(
        head(feats), seed, levels={0, 2} if case == 'some_levels' else None)
    if case == 'retain':
        loss.backward(retain_graph=True)
    loss.backward()


def assert_same_grads(stock: nn.Module, fast: nn.Module) -> None:
    for (name, a), b in zip(stock.named_parameters(), fast.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is None:
            continue
        assert a.grad.dtype == b.grad.dtype and a.grad.shape == b.grad.shape
        assert a.grad.stride() == b.grad.stride(), name
        assert torch.equal(a.grad.view(torch.int32),
                           b.grad.view(torch.int32)), name


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('name', COVERED_HEADS)
def test_level_sums_equal_stock_bits(name: str, case: str) -> None:
    if name == 'NASFCOSHead' and case == 'nonfinite':
        pytest.skip('mmcv 2.1.0\'s CPU modulated deformable convolution '
                    '(NAS-FCOS\'s head) crashes on NaN offsets, stock too')
    stock = build(name)
    fast = switched(stock)
    for seed in (3, 4):
        step(stock, case, seed)
        step(fast, case, seed)
        assert_same_grads(stock, fast)
        stock.zero_grad(set_to_none=True)
        fast.zero_grad(set_to_none=True)
    state = fast.fast_level_grads
    assert state.stock == 0 and state.fast >= 2
    assert not state.arrivals and not state.stock_passes


@pytest.mark.parametrize('name', ['FCOSHead', 'RPNHead'])
def test_backward_adds_become_one_foreach_per_level(name: str) -> None:
    """Stock adds each weight used on every level L - 1 times; the switched
    head adds none of them and runs L - 1 ``_foreach_add_``."""
    stock = build(name)
    fast = switched(stock)
    per_level = [
        n for n, p in stock.named_parameters() if not n.startswith('scales.')
    ]
    counts = []
    for head in (stock, fast):
        loss = loss_of(head(features(5)), 5)
        counter = OpCounter()
        with counter:
            loss.backward()
        counts.append(counter.ops)
    assert counts[0]['add'] - counts[1]['add'] == \
        (LEVELS - 1) * len(per_level)
    assert counts[1]['_foreach_add_'] == LEVELS - 1
    assert counts[0]['_foreach_add_'] == 0
    assert_same_grads(stock, fast)


def test_stock_way_forwards_are_counted_and_exact() -> None:
    """Autocast (stock sums half gradients), a hooked weight: stock's sums,
    counted; a forward without grad changes nothing."""
    stock = build('ATSSHead')
    fast = switched(stock)
    state = fast.fast_level_grads
    with torch.no_grad():
        outs = [fast(features(1)), stock(features(1))]
    assert state.fast == 0 and state.stock == 0
    for a, b in zip(*outs):
        assert all(map(torch.equal, a, b))
    for head in (stock, fast):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            outs = head(features(2))
        loss_of(outs, 2).backward()
    assert state.stock == 1 and state.fast == 0
    assert_same_grads(stock, fast)
    for head in (stock, fast):
        head.zero_grad(set_to_none=True)
        next(head.parameters()).register_hook(lambda g: g * 2)
        loss_of(head(features(3)), 3).backward()
    assert state.stock == 2 and state.fast == 0
    assert 'gradient hook' in state.stock_reason((features(1), ))
    assert_same_grads(stock, fast)


def test_a_weight_replaced_on_its_module_keeps_stock_sums() -> None:
    stock = build('RetinaHead')
    fast = switched(stock)
    for head in (stock, fast):
        head.retina_cls.weight = nn.Parameter(head.retina_cls.weight * 2)
        loss_of(head(features(6)), 6).backward()
    assert fast.fast_level_grads.stock == 1
    assert_same_grads(stock, fast)


def test_weights_held_outside_the_head_are_left_to_autograd() -> None:
    head = build('RPNHead')
    other = nn.Conv2d(CHANNELS, CHANNELS, 3)
    other.weight = head.rpn_conv.weight  # tied with a module outside
    stock = nn.ModuleList([head, other])
    fast = copy.deepcopy(stock)
    assert switch_level_grads(fast, True, True).done
    state = fast[0].fast_level_grads
    assert all(p is not fast[0].rpn_conv.weight for p in state.params)
    assert len(state.params) == len(list(head.parameters())) - 1
    for model in (stock, fast):
        outs = model[0](features(7))
        extra = model[1](features(7)[0]).sum()
        (loss_of(outs, 7) + extra).backward()
    assert_same_grads(stock, fast)


def test_copies_and_pickles_of_a_switched_head_train_the_same() -> None:
    stock = build('FCOSHead')
    fast = switched(stock)
    loss_of(fast(features(8)), 8).backward()  # aliases and hooks exist
    fast.zero_grad(set_to_none=True)
    # a deep copy stays switched; pickle rebuilds the instance's methods
    # before its attributes, so they come back as the class's (stock's)
    for other, sums in ((copy.deepcopy(fast), 1),
                        (pickle.loads(pickle.dumps(fast)), 0)):
        assert other.fast_level_grads.head is other
        before = other.fast_level_grads.fast
        stock.zero_grad(set_to_none=True)
        for head in (stock, other):
            loss_of(head(features(9)), 9).backward()
        assert_same_grads(stock, other)
        assert other.fast_level_grads.fast == before + sums


def test_switch_names_what_stays_stock() -> None:
    head = build('FCOSHead')

    class MyFCOS(type(head)):
        pass

    mine = copy.deepcopy(head)
    mine.__class__ = MyFCOS
    replaced = copy.deepcopy(head)
    replaced.forward_single = replaced.forward_single
    model = nn.ModuleList([mine, replaced])
    outcome = switch_level_grads(model, True, True)
    assert not outcome.done
    assert [p.why for p in outcome.parts
            ] == ['not covered', 'forward_single replaced on the instance']
    off = switch_level_grads(nn.ModuleList([build('RPNHead')]), False, True)
    assert not off.done and off.why == 'fast_shared_grads=False'
    ddp = switch_level_grads(nn.ModuleList([build('RPNHead')]), True, False)
    assert not ddp.done and 'DistributedDataParallel' in ddp.why
    assert switch_level_grads(nn.Linear(2, 2), True, True) is None
    on = switch_level_grads(nn.ModuleList([build('GFLHead')]), True, True)
    assert str(on).startswith('shared head weights: GFLHead ')


def test_weights_read_more_than_once_are_left_to_autograd() -> None:
    """mmcv's weight-standardised convolution reads its weight three times,
    and a weight tied inside the head is read by two modules: stock sums
    those uses in one sequence, so they stay with autograd (named)."""
    stock = build('RetinaHead', conv_cfg=dict(type='ConvWS'))
    stock.reg_convs[1].conv.weight = stock.reg_convs[0].conv.weight
    fast = switched(stock)
    state = fast.fast_level_grads
    assert state.left and 'ConvWS2d' in state.left
    held = {id(p) for p in state.params}
    assert id(fast.reg_convs[0].conv.weight) not in held
    assert all(id(m.conv.weight) not in held for m in fast.cls_convs)
    assert id(fast.retina_cls.weight) in held
    for head in (stock, fast):
        loss_of(head(features(11)), 11).backward()
    assert_same_grads(stock, fast)


def test_second_order_passes_through_the_head_are_an_error() -> None:
    """create_graph=True through the head (a penalty on the gradients, or
    on the features' gradients) would reach an alias more than once: a
    clear error, never other numbers."""
    fast = switched(build('ATSSHead'))
    with pytest.raises(RuntimeError, match='fast_shared_grads=False'):
        loss_of(fast(features(1)), 1).backward(create_graph=True)
    fast.zero_grad(set_to_none=True)
    feats = [f.requires_grad_() for f in features(2)]
    with pytest.raises(RuntimeError, match='create_graph=True'):
        torch.autograd.grad(loss_of(fast(feats), 2), feats, create_graph=True)


def _checkpointed(head: nn.Module, reentrant: bool) -> tuple:
    return checkpoint.checkpoint(
        lambda *feats: tuple(
            out for group in head(list(feats)) for out in group),
        *[f.requires_grad_() for f in features(3)],
        use_reentrant=reentrant)


@pytest.mark.parametrize('reentrant', [True, False])
def test_a_checkpointed_head_keeps_stock_sums(reentrant: bool) -> None:
    """A checkpoint runs the head without grad or under saved-tensor hooks,
    and again inside the backward pass: stock's sums, counted. Beside a
    plain call in one pass: exact where the checkpoint's backward is a pass
    of its own (reentrant), else a clear error (the two forwards' gradients
    meet in one sum on stock)."""
    stock = build('RPNHead')
    fast = switched(stock)
    for head in (stock, fast):
        loss_of([_checkpointed(head, reentrant)], 3).backward()
    assert fast.fast_level_grads.stock >= 1
    assert fast.fast_level_grads.fast == 0
    assert_same_grads(stock, fast)
    stock.zero_grad(set_to_none=True)
    fast.zero_grad(set_to_none=True)
    for head in (stock, fast):
        both = loss_of([_checkpointed(head, reentrant)], 3) + loss_of(
            head(features(4)), 4)
        if head is fast and not reentrant:
            with pytest.raises(RuntimeError, match='checkpointed'):
                both.backward()
            return
        both.backward()
    assert fast.fast_level_grads.fast == 1
    assert_same_grads(stock, fast)


def test_hooks_and_freezing_after_the_forward_act_as_on_stock() -> None:
    """A tensor hook (that changes the gradient) and a post-accumulate hook
    registered between forward and backward run on the summed gradient;
    a weight frozen between them gets no ``.grad``."""
    stock = build('GFLHead')
    fast = switched(stock)
    seen = {}
    for name, head in (('stock', stock), ('fast', fast)):
        outs = head(features(5))
        conv = head.cls_convs[0].conv
        conv.weight.register_hook(lambda g: g * 3)
        head.gfl_cls.weight.register_post_accumulate_grad_hook(
            lambda p, name=name: seen.update({name: p.grad.clone()}))
        head.reg_convs[0].conv.weight.requires_grad_(False)
        loss_of(outs, 5).backward()
    assert fast.fast_level_grads.fast == 1
    assert fast.reg_convs[0].conv.weight.grad is None
    assert torch.equal(seen['stock'], seen['fast'])
    assert_same_grads(stock, fast)


def test_a_pickled_model_switched_again_sums_again() -> None:
    fast = switched(build('RetinaHead'))
    back = pickle.loads(pickle.dumps(nn.ModuleList([fast])))
    assert switch_level_grads(back, True, True).done
    loss_of(back[0](features(6)), 6).backward()
    assert back[0].fast_level_grads.fast == 1


def test_a_pass_that_raised_leaves_nothing_behind() -> None:
    """A pass that raises midway (caught), then the same retained graph
    backwarded again, then a mixed pass refused (caught) and a clean step:
    stock's gradients each time, nothing left on the aliases."""
    stock = build('RetinaHead')
    fast = switched(stock)
    for head in (stock, fast):
        outs = head(features(12))
        failed = []

        def once(grad, failed=failed):
            if not failed:
                failed.append(1)
                raise ValueError('once')

        outs[0][2].register_hook(once)
        loss = loss_of(outs, 12)
        with pytest.raises(ValueError, match='once'):
            loss.backward(retain_graph=True)
        head.zero_grad(set_to_none=True)
        loss.backward()
    assert_same_grads(stock, fast)
    with torch.autograd.graph.save_on_cpu():
        kept = fast(features(13))  # the stock way: saved-tensor hooks
    with pytest.raises(RuntimeError, match='one the stock way'):
        (loss_of(kept, 13) + loss_of(fast(features(14)), 14)).backward()
    for head in (stock, fast):
        head.zero_grad(set_to_none=True)
        loss_of(head(features(15)), 15).backward()
    assert_same_grads(stock, fast)
    state = fast.fast_level_grads
    assert all(a is None or a.grad is None for sets in state.aliases
               for level in sets for a in level)


def test_hooks_that_change_their_value_fail_as_on_stock() -> None:
    for head in (build('RPNHead'), switched(build('RPNHead'))):
        outs = head(features(16))
        head.rpn_conv.weight.register_hook(lambda g: g.double())
        with pytest.raises(RuntimeError, match='has changed the type'):
            loss_of(outs, 16).backward()


def test_second_order_to_the_outputs_only_is_exact() -> None:
    """create_graph=True that stops at the head's outputs never enters it:
    no error, stock's first-order gradients after."""
    stock = build('GFLHead')
    fast = switched(stock)
    for head in (stock, fast):
        outs = head(features(17))
        flat = [o for group in outs for o in group]
        grads = torch.autograd.grad(loss_of(outs, 17), flat, create_graph=True)
        (sum(g.pow(2).sum() for g in grads) + loss_of(outs, 18)).backward()
    assert_same_grads(stock, fast)
