"""fast_parallel/step/foreach_ema.py: foreach EMA updates, bit for bit stock's.

The averaged models are the real ones ``EMAHook`` builds (mmengine's
``ExponentialMovingAverage``, ``MomentumAnnealingEMA``,
``StochasticWeightAverage``, mmdet's ``ExpMomentumEMA``) over the real
YOLOX-tiny sample model (388 floating-point tensors in its state dict, as
YOLOX-s, and 74 BN ``num_batches_tracked``). On the CPU a foreach op runs
its per-tensor fallback, so these tests prove the fused update computes
what stock computes, scalars and all; a GPU's multi-tensor kernels are
checked by ``tools/parity.py`` (EMA weights are in the checkpoint).
"""
import copy
import pickle
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace
from typing import Callable, Dict

import pytest
import torch
from mmengine.hooks import EMAHook
from mmengine.model import (ExponentialMovingAverage, MomentumAnnealingEMA,
                            StochasticWeightAverage)
from models import ROOT, build_model
from torch import nn

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step import foreach_ema
from fast_parallel.step.foreach_ema import fuse_ema, is_fused_ema, unfuse_ema

UPDATES = 5
CUDA = torch.cuda.is_available()
#: The multi-tensor kernels exist on CUDA only: the same checks run there.
DEVICES = [
    'cpu',
    pytest.param(
        'cuda',
        marks=pytest.mark.skipif(
            not CUDA, reason='foreach kernels: needs CUDA'))
]


@pytest.fixture(scope='module')
def yolox() -> nn.Module:
    return build_model('yolox')


def exp_momentum_ema() -> type:
    from mmdet.models.layers.ema import ExpMomentumEMA
    return ExpMomentumEMA


def bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.is_floating_point() else flat


def assert_bitwise_equal(a: nn.Module, b: nn.Module) -> int:
    """Every state-dict tensor of two averaged models, as raw bytes."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    different = [k for k in sa if not torch.equal(bits(sa[k]), bits(sb[k]))]
    assert not different, f'{len(different)} differ: {different[:5]}'
    return len(sa)


def train_a_bit(model: nn.Module, gen: torch.Generator) -> None:
    """A random change of every parameter and buffer, as a step makes."""
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.dtype.is_floating_point:
                t.add_(torch.randn(t.shape, generator=gen).to(t) * 0.05)
            else:
                t.add_(1)  # BN num_batches_tracked


def pair(cls: Callable, model: nn.Module, **kwargs) -> tuple:
    """A stock averaged model and a fused one, both of ``model``."""
    stock, fused = cls(model, **kwargs), cls(model, **kwargs)
    outcome = fuse_ema(fused)
    assert is_fused_ema(fused) and not is_fused_ema(stock), outcome
    assert outcome.done and outcome.name == f'EMA ({cls.__name__})'
    return stock, fused, str(outcome)


CASES = {
    'ema': (ExponentialMovingAverage, dict(momentum=0.0002)),
    # momentum >= 0.5 takes lerp's other formula
    'ema-large-interval2':
    (ExponentialMovingAverage, dict(momentum=0.75, interval=2)),
    'annealing': (MomentumAnnealingEMA, dict(momentum=0.0002, gamma=3)),
    'yolox-recipe': ('ExpMomentumEMA', dict(momentum=0.0001, gamma=2000)),
    'exp-fast-gamma': ('ExpMomentumEMA', dict(momentum=0.01, gamma=2)),
    'swa-interval2': (StochasticWeightAverage, dict(interval=2)),
}


def resolve(name: str) -> tuple:
    cls, kwargs = CASES[name]
    return (exp_momentum_ema() if cls == 'ExpMomentumEMA' else cls), kwargs


@pytest.mark.parametrize('update_buffers', [True, False])
@pytest.mark.parametrize('case', list(CASES))
def test_every_update_is_bitwise_stock(yolox, case, update_buffers):
    cls, kwargs = resolve(case)
    model = copy.deepcopy(yolox)
    stock, fused, summary = pair(
        cls, model, update_buffers=update_buffers, **kwargs)
    assert summary.startswith(
        f'EMA ({cls.__name__}): 388 tensors in 1 '
        if update_buffers else f'EMA ({cls.__name__}): 240 tensors in 1 ')
    gen = torch.Generator().manual_seed(0)
    for step in range(UPDATES):
        train_a_bit(model, gen)
        stock.update_parameters(model)
        fused.update_parameters(model)
        assert int(fused.steps) == step + 1
        assert assert_bitwise_equal(stock, fused) == 463  # 462 + steps
    # the average moved away from the model (the test is not vacuous)
    averaged = fused.module.state_dict()
    assert any(not torch.equal(v, averaged[k])
               for k, v in model.state_dict().items())
    # num_batches_tracked: averaged models copy it on the first update
    # only; with update_buffers=False the buffers follow the model.
    tracked = 'backbone.stem.conv.bn.num_batches_tracked'
    assert int(averaged[tracked]) == (1 if update_buffers else UPDATES)


@pytest.mark.parametrize('case', ['yolox-recipe', 'annealing', 'ema'])
def test_checkpoints_cross_between_stock_and_fused(yolox, case):
    cls, kwargs = resolve(case)
    model = copy.deepcopy(yolox)
    gen = torch.Generator().manual_seed(1)
    stock, fused, _ = pair(cls, model, update_buffers=True, **kwargs)
    for _ in range(3):
        train_a_bit(model, gen)
        stock.update_parameters(model)
        fused.update_parameters(model)
    assert list(stock.state_dict()) == list(fused.state_dict())
    # stock's checkpoint resumed fused, fused's resumed stock
    fused_resumed = cls(model, update_buffers=True, **kwargs)
    fuse_ema(fused_resumed)
    fused_resumed.load_state_dict(stock.state_dict())
    stock_resumed = cls(model, update_buffers=True, **kwargs)
    stock_resumed.load_state_dict(fused.state_dict())
    for _ in range(3):
        train_a_bit(model, gen)
        for ema in (stock, fused_resumed, stock_resumed):
            ema.update_parameters(model)
        assert_bitwise_equal(stock, fused_resumed)
        assert_bitwise_equal(stock, stock_resumed)
    assert int(fused_resumed.steps) == 6


def runner_stub(model: nn.Module, it: int) -> SimpleNamespace:
    return SimpleNamespace(model=model, iter=it, epoch=0, _resume=True)


def test_through_emahook_and_its_checkpoints(yolox):
    """The YOLOX recipe's hook: updates, save and resume, stock vs fused."""
    model = copy.deepcopy(yolox)
    cfg = dict(ema_type='ExpMomentumEMA', momentum=0.0001, update_buffers=True)
    stock, fused = EMAHook(**cfg), EMAHook(**cfg)
    for hook in (stock, fused):
        hook.before_run(runner_stub(model, 0))
    print(fuse_ema(fused.ema_model))
    assert is_fused_ema(fused.ema_model)
    gen = torch.Generator().manual_seed(2)
    for it in range(3):
        train_a_bit(model, gen)
        for hook in (stock, fused):
            hook.after_train_iter(runner_stub(model, it), it)
        assert_bitwise_equal(stock.ema_model, fused.ema_model)
    saved = []
    for hook in (stock, fused):
        checkpoint = dict(state_dict=copy.deepcopy(model.state_dict()))
        hook.before_save_checkpoint(runner_stub(model, 3), checkpoint)
        saved.append(checkpoint)
    for key in ('state_dict', 'ema_state_dict'):
        assert list(saved[0][key]) == list(saved[1][key])
        assert all(
            torch.equal(bits(v), bits(saved[1][key][k]))
            for k, v in saved[0][key].items())
    # each hook resumes the other's checkpoint, then both go on alike
    stock.after_load_checkpoint(runner_stub(model, 3), saved[1])
    fused.after_load_checkpoint(runner_stub(model, 3), saved[0])
    assert is_fused_ema(fused.ema_model)
    for it in range(3, 5):
        train_a_bit(model, gen)
        for hook in (stock, fused):
            hook.after_train_iter(runner_stub(model, it), it)
        assert_bitwise_equal(stock.ema_model, fused.ema_model)


# ------------------------------------------------------------- scalars
WEIGHTS = [
    0.0002, 0.1 + 1e-9, 0.49999999, 0.5, 0.5000001, 0.75, 1 - 1e-7, 1 / 3
] + torch.rand(
    24, generator=torch.Generator().manual_seed(5),
    dtype=torch.float64).tolist()


def foreach_vs_per_tensor(dtype: torch.dtype,
                          device: str = 'cpu') -> Dict[str, int]:
    """Per op, how many weights give other bytes foreach than per tensor.

    Python-float weights/alphas around lerp's 0.5 switch, tiny, near 1,
    random; odd sizes exercise the vector loops' tails.
    """
    gen = torch.Generator().manual_seed(3)
    sizes = [1, 7, 31, 64, 1000, 4099]
    avg = [torch.randn(n, generator=gen).to(device, dtype) for n in sizes]
    src = [torch.randn(n, generator=gen).to(device, dtype) for n in sizes]
    ops = {
        'lerp': (lambda a, s, w: a.lerp_(s, w),
                 lambda a, s, w: torch._foreach_lerp_(a, s, w)),
        'mul': (lambda a, s, w: a.mul_(1 - w),
                lambda a, s, w: torch._foreach_mul_(a, 1 - w)),
        'add': (lambda a, s, w: a.add_(s, alpha=w),
                lambda a, s, w: torch._foreach_add_(a, s, alpha=w)),
    }
    differ = dict.fromkeys(ops, 0)
    for name, (per_tensor, foreach) in ops.items():
        for weight in WEIGHTS:
            expected = [
                per_tensor(a.clone(), s, weight) for a, s in zip(avg, src)
            ]
            fused = [a.clone() for a in avg]
            foreach(fused, src, weight)
            differ[name] += not all(
                torch.equal(bits(x), bits(y)) for x, y in zip(expected, fused))
    return differ


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('dtype', foreach_ema.FOREACH_DTYPES)
def test_foreach_scalars_round_as_the_per_tensor_ops(dtype, device):
    assert foreach_vs_per_tensor(dtype, device) == dict(lerp=0, mul=0, add=0)


@pytest.mark.skipif(not CUDA, reason='foreach kernels: needs CUDA')
@pytest.mark.parametrize('update_buffers', [True, False])
@pytest.mark.parametrize('case', ['yolox-recipe', 'ema', 'swa-interval2'])
def test_every_update_is_bitwise_stock_on_cuda(yolox, case, update_buffers):
    cls, kwargs = resolve(case)
    model = copy.deepcopy(yolox).cuda()
    stock, fused, _ = pair(cls, model, update_buffers=update_buffers, **kwargs)
    gen = torch.Generator().manual_seed(7)
    for _ in range(UPDATES):
        train_a_bit(model, gen)
        stock.update_parameters(model)
        fused.update_parameters(model)
        assert_bitwise_equal(stock, fused)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_reduced_precision_keeps_the_stock_avg_func(yolox, dtype):
    """Why float16/bfloat16 are not fused, and that they stay exact."""
    print(f'\n{dtype}: weights giving other bytes foreach than per tensor: '
          f'{foreach_vs_per_tensor(dtype)} of {len(WEIGHTS)}')
    model = copy.deepcopy(yolox)
    model.bbox_head.to(dtype)  # a mixed model: float32 and reduced groups
    stock, fused, summary = pair(
        exp_momentum_ema(), model, momentum=0.01, gamma=2, update_buffers=True)
    assert summary.endswith(
        '310 tensors in 1 multi-tensor update, 78 reduced-precision tensors '
        'one by one (stock avg_func)')
    gen = torch.Generator().manual_seed(6)
    for _ in range(3):
        train_a_bit(model, gen)
        stock.update_parameters(model)
        fused.update_parameters(model)
        assert_bitwise_equal(stock, fused)


# -------------------------------------------------------- left stock
class CustomEMA(ExponentialMovingAverage):

    def avg_func(self, averaged_param, source_param, steps) -> None:
        averaged_param.copy_(source_param)


class Tied(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.bn = nn.BatchNorm1d(4)


def test_what_is_left_stock():
    small = Tied()
    custom = CustomEMA(small)
    outcome = fuse_ema(custom)
    assert not outcome.done and outcome.name == 'EMA (CustomEMA)'
    assert str(outcome) == f'EMA (CustomEMA): left stock: {outcome.why}'
    assert type(custom) is CustomEMA
    own = ExponentialMovingAverage(small)
    own.avg_func = lambda *args: None
    assert fuse_ema(own).why == 'the instance sets its own avg_func'
    # a view of part of another averaged tensor: stock's sequence of
    # updates through both is not reproduced
    viewed = ExponentialMovingAverage(small, update_buffers=True)
    viewed.avg_parameters['bn.bias'] = viewed.avg_parameters['bn.weight'][1:]
    assert 'overlap in part' in fuse_ema(viewed).why
    assert type(viewed) is ExponentialMovingAverage
    assert fuse_ema(nn.Linear(2, 2)).why == 'not a BaseAveragedModel'
    # named_parameters() lists a tied weight once: that one fuses
    untied = ExponentialMovingAverage(small, update_buffers=False)
    assert str(fuse_ema(untied)) == (
        'EMA (ExponentialMovingAverage): 5 tensors in 1 multi-tensor '
        'update, 3 buffers in 2 multi-tensor copies')


@pytest.fixture(scope='module')
def rtmdet() -> nn.Module:
    """mmdet's RTMDet-tiny model: its SepBN head shares each conv across
    the three levels (``share_conv=True``)."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.hub import get_config
    from mmengine.registry import DefaultScope
    register_all_modules()
    cfg = get_config('mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py')
    cfg.model.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    model.init_weights()
    return model


@pytest.mark.parametrize('update_buffers', [True, False])
@pytest.mark.parametrize('case', list(CASES))
def test_tied_weights_update_in_stock_order(rtmdet, case, update_buffers):
    """A tensor under several names is updated once per name, as stock
    does: one round per repeat, every update bitwise stock's."""
    cls, kwargs = resolve(case)
    model = copy.deepcopy(rtmdet)
    names = model.state_dict() if update_buffers else dict(
        model.named_parameters())
    unique = {t.data_ptr() for t in names.values()}
    stock, fused, summary = pair(
        cls, model, update_buffers=update_buffers, **kwargs)
    if update_buffers:  # the state dict names each shared conv 3 times
        assert len(unique) < len(names)
        assert 'names of tied tensors in 2 more rounds' in summary, summary
    else:  # named_parameters() names a shared parameter once
        assert len(unique) == len(names)
        assert 'tied' not in summary, summary
    gen = torch.Generator().manual_seed(1)
    for _ in range(UPDATES):
        train_a_bit(model, gen)
        stock.update_parameters(model)
        fused.update_parameters(model)
        assert_bitwise_equal(stock, fused)
    source = model.state_dict()
    moved = [
        k for k, v in stock.module.state_dict().items()
        if v.is_floating_point() and not torch.equal(v, source[k])
    ]
    assert moved  # the average moved away from the model


def test_fuse_is_idempotent_reversible_and_pickles(monkeypatch):
    ema = exp_momentum_ema()(Tied(), update_buffers=False)
    first = fuse_ema(ema)
    assert fuse_ema(ema) == first
    assert repr(ema).startswith('ExpMomentumEMA(')
    assert isinstance(ema, exp_momentum_ema())
    saved = pickle.dumps(ema)
    # a fresh process makes the fused class when unpickling asks for it,
    # as here once the module global is gone
    monkeypatch.delattr(foreach_ema, 'FusedExpMomentumEMA')
    loaded = pickle.loads(saved)
    assert is_fused_ema(loaded) and type(loaded).__name__ == \
        'FusedExpMomentumEMA'
    assert is_fused_ema(copy.deepcopy(ema))
    unfuse_ema(ema)
    assert type(ema) is exp_momentum_ema()


def test_importing_never_imports_mmdet():
    code = ('import sys, fast_parallel.step.foreach_ema; '
            'assert "mmdet" not in sys.modules')
    subprocess.run([sys.executable, '-c', code], check=True, cwd=ROOT)


# ------------------------------------------------------------ op counts
def count_per_update(ema: nn.Module, model: nn.Module) -> Counter:
    ema.update_parameters(model)  # steps == 0: the first copy
    train_a_bit(model, torch.Generator().manual_seed(4))
    with OpCounter() as mode:
        ema.update_parameters(model)
    return mode.ops


@pytest.mark.parametrize('case,update_buffers', [('yolox-recipe', True),
                                                 ('ema', False)])
def test_operations_per_update(yolox, case, update_buffers):
    cls, kwargs = resolve(case)
    model = copy.deepcopy(yolox)
    stock, fused, summary = pair(
        cls, model, update_buffers=update_buffers, **kwargs)
    stock_ops = count_per_update(stock, model)
    fused_ops = count_per_update(fused, model)
    print(f'\n{summary}\nstock: {sum(stock_ops.values())} ops per update '
          f'{dict(stock_ops)}\nfused: {sum(fused_ops.values())} '
          f'{dict(fused_ops)}')
    foreach = {k: v for k, v in fused_ops.items() if k.startswith('_foreach')}
    if update_buffers:  # YOLOX: ExpMomentumEMA over 388 tensors
        assert stock_ops['mul_'] == 388 and stock_ops['add_'] == 389
        # avg_func's float(1 + steps), once per tensor: a sync on a GPU
        assert stock_ops['_local_scalar_dense'] == 390
        assert foreach == {'_foreach_mul_': 1, '_foreach_add_': 1}
    else:
        assert stock_ops['lerp_'] == 240 and stock_ops['copy_'] == 222
        assert foreach == {'_foreach_lerp_': 1, '_foreach_copy_': 2}
    # the rest: steps read once and steps += 1
    assert fused_ops['_local_scalar_dense'] == 1 and fused_ops['add_'] == 1
    assert sum(fused_ops.values()) == sum(foreach.values()) + 2
