"""Fused optimizer steps give stock's bytes
(fast_parallel/step/fused_optim.py).

Every test runs a stock and a fused optimizer side by side, from the same
state with the same gradients, and compares parameters and every optimizer
state tensor byte for byte after every step.
"""
import copy
import importlib
import io
import pickle
from typing import Dict, List, Optional, Tuple

import pytest
import torch
from mmengine.optim import (CosineAnnealingLR, LinearLR, OptimWrapperDict,
                            build_optim_wrapper)
from mmengine.optim.optimizer import amp_optimizer_wrapper
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.fused_optim import (FusedAdam, FusedAdamW, FusedSGD,
                                            fuse_optim_wrapper, fuse_optimizer,
                                            unfuse_optimizer)

DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
YOLOX_PARAMWISE = dict(norm_decay_mult=0., bias_decay_mult=0.)

# ------------------------------------------------------------- helpers ---


class SmallNet(nn.Module):
    """Convs with biases, BatchNorm and a head: groups of every kind."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, groups=8)
        self.gn = nn.GroupNorm(2, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gn(self.dw(torch.relu(self.bn(self.stem(x)))))
        return self.head(x.mean((2, 3)))


def _twins(model: nn.Module, cfg: dict, device: str = 'cpu'):
    """Two copies of ``model`` with a wrapper each; the second one fused."""
    torch.manual_seed(0)
    stock_model = model.to(device)
    fused_model = copy.deepcopy(stock_model)
    stock = build_optim_wrapper(stock_model, copy.deepcopy(cfg))
    fused = build_optim_wrapper(fused_model, copy.deepcopy(cfg))
    summary = str(fuse_optim_wrapper(fused))
    return (stock_model, stock), (fused_model, fused), summary


def _set_grads(models: List[nn.Module],
               step: int,
               skip_every: int = 0,
               scale: float = 1.0) -> None:
    """The same random gradients on every model; every n-th one left None."""
    gen = torch.Generator().manual_seed(1000 + step)
    params = [list(m.parameters()) for m in models]
    for i, same in enumerate(zip(*params)):
        grad = torch.randn(
            same[0].shape, generator=gen, dtype=same[0].dtype) * scale
        for param in same:
            missing = skip_every and (i + step) % skip_every == 0
            param.grad = None if missing else grad.to(param.device).clone()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, for exact comparison (-0.0, NaN payloads)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _assert_same(a, b, where: str = '') -> None:
    """Same structure, same key order, same tensor bytes and dtypes."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape,
                                                b.device), where
        assert torch.equal(_bytes(a), _bytes(b)), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _assert_same(a[key], b[key], f'{where}.{key}')
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f'{where}[{i}]')
    else:
        assert a == b, f'{where}: {a!r} != {b!r}'


def _assert_twins_equal(stock: Tuple, fused: Tuple, where: str) -> None:
    """Parameters, buffers and the whole optimizer state_dict, bytewise."""
    (stock_model, stock_wrapper), (fused_model, fused_wrapper) = stock, fused
    _assert_same(stock_model.state_dict(), fused_model.state_dict(),
                 f'{where} model')
    _assert_same(stock_wrapper.state_dict(), fused_wrapper.state_dict(),
                 f'{where} optimizer')


def _schedulers(wrapper, steps: int) -> list:
    """mmengine's LinearLR warm-up, then CosineAnnealingLR, per iteration."""
    warm = max(steps // 2, 1)
    return [
        LinearLR(wrapper, start_factor=0.1, by_epoch=False, begin=0, end=warm),
        CosineAnnealingLR(
            wrapper,
            T_max=steps - warm,
            by_epoch=False,
            begin=warm,
            end=steps,
            eta_min=1e-4),
    ]


def _run_twins(stock: Tuple,
               fused: Tuple,
               steps: int,
               skip_every: int = 3,
               scale: float = 1.0) -> None:
    """Steps both with the same grads and schedulers; compares every step."""
    scheds = [_schedulers(stock[1], steps), _schedulers(fused[1], steps)]
    for step in range(steps):
        _set_grads([stock[0], fused[0]], step, skip_every, scale)
        for _, wrapper in (stock, fused):
            wrapper.step()
        _assert_twins_equal(stock, fused, f'step {step}')
        for group in scheds:
            for sched in group:
                sched.step()
        assert (stock[1].get_lr()['lr'] == fused[1].get_lr()['lr'])


def _sgd_cfg(foreach: Optional[bool], **kwargs) -> dict:
    optimizer = dict(
        type='SGD',
        lr=0.01,
        momentum=0.9,
        weight_decay=5e-4,
        nesterov=True,
        foreach=foreach)
    optimizer.update(kwargs)
    return dict(
        type='OptimWrapper',
        optimizer=optimizer,
        paramwise_cfg=dict(YOLOX_PARAMWISE))


def _adam_cfg(kind: str, foreach: Optional[bool], **kwargs) -> dict:
    """PointPillars' AdamW (mmdet3d::pointpillars) with YOLOX-like groups."""
    optimizer = dict(
        type=kind,
        lr=0.001,
        betas=(0.95, 0.99),
        weight_decay=0.01,
        foreach=foreach)
    optimizer.update(kwargs)
    return dict(
        type='OptimWrapper',
        optimizer=optimizer,
        clip_grad=dict(max_norm=35, norm_type=2),
        paramwise_cfg=dict(
            YOLOX_PARAMWISE, custom_keys={'head': dict(lr_mult=0.5)}))


@pytest.fixture(scope='module')
def yolox_model() -> nn.Module:
    """The real YOLOX model of the sample config (240 parameters)."""
    from models import build_model
    return build_model('yolox')


# --------------------------------------------------------------- tests ---


@pytest.mark.parametrize('foreach', [False, True])
def test_yolox_sgd_matches_stock_every_step(yolox_model, foreach):
    """YOLOX recipe: 240 groups, 2 calls a step, stock's bytes every step."""
    stock, fused, summary = _twins(
        copy.deepcopy(yolox_model), _sgd_cfg(foreach))
    assert summary == 'optimizer: SGD 240 groups -> 2 fused steps'
    assert type(fused[1].optimizer) is FusedSGD
    assert isinstance(fused[1].optimizer, torch.optim.SGD)
    _run_twins(stock, fused, steps=5)
    # every param had momentum state by then, so one call per set again
    _set_grads([fused[0]], 99)
    fused[1].step()
    assert fused[1].optimizer._fused_calls == 2


def test_functional_calls_per_step(yolox_model, monkeypatch):
    """Stock calls torch's ``sgd`` once per group; fused once per set."""
    calls = []
    module = importlib.import_module('torch.optim.sgd')
    real_sgd = module.sgd

    def counting_sgd(params, *args, **kwargs):  # counts only, then delegates
        calls.append(len(params))
        return real_sgd(params, *args, **kwargs)

    monkeypatch.setattr(module, 'sgd', counting_sgd)
    stock, fused, _ = _twins(copy.deepcopy(yolox_model), _sgd_cfg(True))
    for step in range(2):
        _set_grads([stock[0], fused[0]], step)
        calls.clear()
        stock[1].step()
        assert len(calls) == 240
        calls.clear()
        fused[1].step()
        assert sorted(calls) == [83, 157]  # weight decay 5e-4 / 0 (norm, bias)


def test_yolox_ops_per_step_fewer_than_stock(yolox_model):
    """Operations dispatched per step with foreach=True (what a GPU launches).

    Measured here (aten ops, views left out): stock 803 on the first step
    and 1043 after it; fused 245 on the first step (the momentum buffers are
    cloned one by one, as in stock) and 9 after it.
    """
    stock, fused, _ = _twins(copy.deepcopy(yolox_model), _sgd_cfg(True))
    counts = []
    for step in range(3):
        _set_grads([stock[0], fused[0]], step)
        per_arm = []
        for _, wrapper in (stock, fused):
            with OpCounter() as counter:
                wrapper.optimizer.step()
            per_arm.append(counter.total)
        counts.append(tuple(per_arm))
        _assert_twins_equal(stock, fused, f'step {step}')
    assert counts == [(803, 245), (1043, 9), (1043, 9)]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('foreach', [False, True, None])
@pytest.mark.parametrize('options', [
    dict(),
    dict(nesterov=False, dampening=0.1),
    dict(nesterov=False, momentum=0.),
    dict(maximize=True),
])
def test_sgd_variants_match_stock(device, foreach, options):
    """Momentum, nesterov, dampening, no momentum, maximize; lr_mult groups."""
    cfg = _sgd_cfg(foreach, **options)
    cfg['paramwise_cfg']['custom_keys'] = {'head': dict(lr_mult=2.)}
    stock, fused, summary = _twins(SmallNet(), cfg, device)
    assert summary == 'optimizer: SGD 10 groups -> 3 fused steps'
    _run_twins(stock, fused, steps=6)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kind,options', [
    ('AdamW', dict()),
    ('AdamW', dict(amsgrad=True)),
    ('Adam', dict()),
    ('Adam', dict(amsgrad=True, maximize=True)),
])
@pytest.mark.parametrize('foreach', [False, True])
def test_adam_pointpillars_like_matches_stock(device, kind, options, foreach):
    """AdamW as in PointPillars (grad clipping included), and Adam."""
    stock, fused, summary = _twins(SmallNet(),
                                   _adam_cfg(kind, foreach, **options), device)
    read_once = foreach and not options.get('maximize')
    assert summary == (f'optimizer: {kind} 10 groups -> 3 fused steps' +
                       (', step counts read in one go' if read_once else ''))
    assert type(fused[1].optimizer) is {
        'Adam': FusedAdam,
        'AdamW': FusedAdamW
    }[kind]
    # grads large enough that clip_grad (max_norm=35) does clip
    _run_twins(stock, fused, steps=6, scale=20.)


def test_buckets_change_when_a_scheduler_splits_groups():
    """lr set per group between steps moves groups between buckets."""
    stock, fused, _ = _twins(SmallNet(), _sgd_cfg(True))
    for step in range(5):
        _set_grads([stock[0], fused[0]], step)
        for _, wrapper in (stock, fused):
            for i, group in enumerate(wrapper.optimizer.param_groups):
                group['lr'] = 0.01 * (1 + (i % (step + 1)))
            wrapper.step()
        _assert_twins_equal(stock, fused, f'step {step}')
    sets = {(g['lr'], g['weight_decay'])
            for g in fused[1].optimizer.param_groups}
    assert fused[1].optimizer._fused_calls == len(sets) == 8


class _PathTrace(TorchDispatchMode):
    """Per named tensor, the ops that took it, and in which argument.

    The code path each parameter takes through the functional (``foreach``
    kernel or per-tensor op, which branch) is what decides its bytes on a
    GPU, where a multi-tensor kernel and a per-tensor one need not round
    alike. CPU bytes cannot show a wrong path (there both gave the same
    bytes when tried), so this compares the paths themselves.
    """

    def __init__(self, names: Dict[int, str]) -> None:
        super().__init__()
        self.names = names
        self.trace: Dict[str, List[Tuple[str, int]]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for position, arg in enumerate(args):
            for tensor in arg if isinstance(arg, (list, tuple)) else [arg]:
                name = (
                    self.names.get(tensor.data_ptr()) if isinstance(
                        tensor, torch.Tensor) else None)
                if name is not None:
                    self.trace.setdefault(name, []).append(
                        (str(func), position))
        return func(*args, **(kwargs or {}))


def _traced_step(optimizer, params: List[torch.Tensor]) -> Dict:
    """``optimizer.step()``, returning each tensor's ops by stable name."""
    names = {}
    for i, param in enumerate(params):
        names[param.data_ptr()] = f'param {i}'
        if param.grad is not None:
            names[param.grad.data_ptr()] = f'grad {i}'
        for key, value in optimizer.state.get(param, {}).items():
            if torch.is_tensor(value):
                names[value.data_ptr()] = f'{key} {i}'
    with _PathTrace(names) as tracer:
        optimizer.step()
    # Adam's CPU step counts are read per count (.item()) by stock and in
    # one go (stack) by fast_parallel.step.adam_foreach: the same floats
    for name, ops in tracer.trace.items():
        if name.startswith('step '):
            tracer.trace[name] = [
                op for op in ops
                if op[0] not in ('aten._local_scalar_dense.default',
                                 'aten.stack.default')
            ]
    return tracer.trace


@pytest.mark.parametrize('foreach', [False, True])
def test_mixed_dtypes_devices_and_missing_grads(foreach):
    """Groups mixing dtypes (and devices); params that gain grads late.

    Every tensor must also take stock's code path: the SGD slices whose
    momentum buffers are only partly there use per-tensor ops in stock, so
    they must not share a call with slices that have all of theirs.
    """
    torch.manual_seed(0)
    f32, f64 = torch.float32, torch.float64
    spec = [((4, 3), f32), ((5, ), f64), ((2, 6), f32), ((7, ), f32),
            ((2, 2), f64), ((3, ), f32), ((6, 2), f64), ((2, ), f64)]
    devices = ['cpu'] * len(spec)
    if torch.cuda.is_available():
        devices[3:5] = ['cuda', 'cuda']
    params = [
        torch.randn(shape, dtype=dtype, device=device)
        for (shape, dtype), device in zip(spec, devices)
    ]
    groups = [
        dict(params=params[0:3]),
        dict(params=params[3:5]),
        dict(params=params[5:6], weight_decay=0.),
        dict(params=params[6:8], weight_decay=0.)
    ]
    for make in (lambda g: torch.optim.SGD(
            g, lr=0.1, momentum=0.9, weight_decay=1e-2, foreach=foreach),
                 lambda g: torch.optim.AdamW(g, lr=0.1, foreach=foreach)):
        stock_params = [p.clone() for p in params]
        fused_params = [p.clone() for p in params]
        stock = make(_regroup(groups, params, stock_params))
        fused = make(_regroup(groups, params, fused_params))
        fuse_optimizer(fused)
        for step in range(6):
            gen = torch.Generator().manual_seed(step)
            for i, (a, b) in enumerate(zip(stock_params, fused_params)):
                grad = torch.randn(a.shape, generator=gen, dtype=a.dtype)
                # param i gets its first grad at step i % 3 and loses it
                # every third step: momentum state appears param by param
                has = step >= i % 3 and (step + i) % 3 != 1
                a.grad = grad.to(a.device) if has else None
                b.grad = grad.to(b.device).clone() if has else None
            stock_path = _traced_step(stock, stock_params)
            fused_path = _traced_step(fused, fused_params)
            assert stock_path == fused_path, f'step {step}'
            _assert_same(stock_params, fused_params, f'step {step}')
            _assert_same(stock.state_dict(), fused.state_dict(),
                         f'step {step}')


def _regroup(groups: List[Dict], old: List, new: List) -> List[Dict]:
    """``groups`` with each of ``old`` params replaced by its ``new`` twin."""
    index = {id(p): i for i, p in enumerate(old)}
    return [
        dict(g, params=[new[index[id(p)]] for p in g['params']])
        for g in groups
    ]


def test_non_contiguous_state_gets_its_own_call():
    """A param whose state is laid out unlike it keeps stock's code path."""
    model = SmallNet()
    stock, fused, _ = _twins(model, _sgd_cfg(True))
    _set_grads([stock[0], fused[0]], 0)
    stock[1].step()
    fused[1].step()
    for _, wrapper in (stock, fused):  # as a checkpoint might bring it
        weight = wrapper.optimizer.param_groups[0]['params'][0]
        state = wrapper.optimizer.state[weight]
        buf = state['momentum_buffer']
        state['momentum_buffer'] = buf.transpose(0, 1).contiguous().transpose(
            0, 1)
    for step in range(1, 4):
        _set_grads([stock[0], fused[0]], step)
        stock[1].step()
        fused[1].step()
        _assert_twins_equal(stock, fused, f'step {step}')
    assert fused[1].optimizer._fused_calls == 3


@pytest.mark.parametrize('cfg', [_sgd_cfg(True), _adam_cfg('AdamW', True)])
def test_checkpoints_move_between_stock_and_fused(cfg):
    """A stock optimizer resumes a fused one's state and the reverse."""
    stock, fused, _ = _twins(SmallNet(), cfg)
    for step in range(3):
        _set_grads([stock[0], fused[0]], step, skip_every=4)
        stock[1].step()
        fused[1].step()
    reference = (copy.deepcopy(stock[0]), None)
    reference = (reference[0],
                 build_optim_wrapper(reference[0], copy.deepcopy(cfg)))
    reference[1].load_state_dict(stock[1].state_dict())
    # swap: the stock model continues from the fused checkpoint, and back
    fused_ckpt = _through_bytes(fused[1].state_dict())
    stock_ckpt = _through_bytes(stock[1].state_dict())
    stock[1].load_state_dict(fused_ckpt)
    fused[1].load_state_dict(stock_ckpt)
    assert type(fused[1].optimizer).__name__.startswith('Fused')
    for step in range(3, 7):
        _set_grads([stock[0], fused[0], reference[0]], step, skip_every=4)
        for _, wrapper in (stock, fused, reference):
            wrapper.step()
        _assert_twins_equal(reference, stock, f'stock, step {step}')
        _assert_twins_equal(reference, fused, f'fused, step {step}')


def _through_bytes(state_dict: dict) -> dict:
    """A state_dict saved and loaded, as a checkpoint would be."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def test_hooks_closure_pickle_and_unfuse():
    """Step hooks run once, the closure's loss returns, class restores."""
    net = SmallNet()
    optimizer = torch.optim.SGD([dict(params=[p]) for p in net.parameters()],
                                lr=0.1,
                                momentum=0.9)
    calls = []
    optimizer.register_step_pre_hook(lambda *a: calls.append('pre'))
    optimizer.register_step_post_hook(lambda *a: calls.append('post'))
    assert fuse_optimizer(optimizer) == fuse_optimizer(optimizer)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = net(torch.ones(1, 3, 8, 8)).sum()
        loss.backward()
        return loss

    assert isinstance(optimizer.step(closure), torch.Tensor)
    assert calls == ['pre', 'post']
    assert all(p.grad is not None for p in net.parameters())
    optimizer.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    clone = pickle.loads(pickle.dumps(optimizer))
    assert type(clone) is FusedSGD
    assert type(copy.deepcopy(optimizer)) is FusedSGD
    unfuse_optimizer(optimizer)
    assert type(optimizer) is torch.optim.SGD
    assert 'Fused' not in repr(optimizer)


def test_left_stock_with_a_reason():
    """Other optimizers, fused, capturable, differentiable stay stock."""
    params = [nn.Parameter(torch.randn(3))]
    cases = [
        (torch.optim.RMSprop(params), 'RMSprop left stock'),
        (torch.optim.SGD(params, lr=0.1, fused=True), 'fused=True'),
        (torch.optim.Adam(params, capturable=True), 'capturable=True'),
        (torch.optim.AdamW(params,
                           differentiable=True), 'differentiable=True'),
    ]
    for optimizer, reason in cases:
        stock_type = type(optimizer)
        outcome = fuse_optimizer(optimizer)
        assert reason in str(outcome) and 'left stock' in str(outcome)
        assert not outcome.done and outcome.name == 'optimizer'
        assert type(optimizer) is stock_type
    assert fuse_optimizer(cases[1][0]).why == 'fused=True is out of scope'


def test_fused_flag_set_later_runs_stock_step():
    """A group switched to ``fused=True`` after fusing gets stock's step."""
    net = SmallNet()
    stock = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    twin = copy.deepcopy(net)
    fused = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    fuse_optimizer(fused)
    calls = []
    fused.register_step_post_hook(lambda *a: calls.append(1))
    for optimizer in (stock, fused):
        optimizer.param_groups[0]['fused'] = True
    for step in range(2):
        _set_grads([net, twin], step)
        stock.step()
        fused.step()
        _assert_same(stock.state_dict(), fused.state_dict(), f'{step}')
    _assert_same(net.state_dict(), twin.state_dict())
    assert calls == [1, 1]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kind,options', [
    ('AdamW', dict()),
    ('AdamW', dict(amsgrad=True)),
    ('Adam', dict(weight_decay=0.01)),
    ('Adam', dict(weight_decay=0.)),
])
def test_one_adam_group_reads_its_step_counts_once(device, kind, options):
    """PointPillars' AdamW: one group, foreach. Nothing to fuse, but torch
    reads each parameter's CPU step count with two .item() calls per step;
    the fused step reads them in one go, with stock's bytes, also while
    missing grads make the counts differ from parameter to parameter."""
    from fast_parallel.bench.opcount import OpCounter
    cfg = dict(
        type='OptimWrapper',
        optimizer=dict(
            dict(type=kind, lr=0.001, betas=(0.95, 0.99), foreach=True),
            **options),
        clip_grad=dict(max_norm=35, norm_type=2))
    stock, fused, summary = _twins(SmallNet(), cfg, device)
    assert summary == (f'optimizer: {kind} 1 group -> 1 fused step, step '
                       'counts read in one go')
    scheds = [_schedulers(stock[1], 6), _schedulers(fused[1], 6)]
    counts = []
    for step in range(6):
        _set_grads([stock[0], fused[0]], step, skip_every=3, scale=20.)
        items = []
        for _, wrapper in (stock, fused):
            with OpCounter() as counter:
                wrapper.step()
            items.append(counter.ops['_local_scalar_dense'])
        _assert_twins_equal(stock, fused, f'step {step}')
        with_grad = sum(p.grad is not None for p in stock[0].parameters())
        # clip_grad's norm: one .item() on both; Adam: 2 per count on stock
        assert items == [1 + 2 * with_grad, 1], f'step {step}'
        counts.append({
            float(state['step'])
            for state in fused[1].optimizer.state.values()
        })
        for group in scheds:
            for sched in group:
                sched.step()
    assert max(map(len, counts)) > 1  # the counts did differ


@pytest.mark.parametrize('groups', [1, 2])
def test_nothing_to_fuse_stays_stock(groups):
    """One group, or groups that all differ: the optimizer stays stock."""
    net = SmallNet()
    params = [
        dict(params=[p], lr=0.01 * (i + 1) if groups == 2 else 0.01)
        for i, p in enumerate(net.head.parameters())
    ]
    if groups == 1:
        params = [dict(params=list(net.head.parameters()), lr=0.01)]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    outcome = fuse_optimizer(optimizer)
    assert type(optimizer) is torch.optim.SGD
    assert not outcome.done and outcome.why.startswith('nothing to fuse')
    assert str(outcome) == (
        f'optimizer: SGD {groups} group{"s" * (groups > 1)}, '
        'left stock (nothing to fuse: no two groups share '
        'their hyper-parameters)')


def test_optim_wrapper_dict():
    """Each optimizer of an OptimWrapperDict is fused; both match stock."""

    def build(net: SmallNet) -> OptimWrapperDict:
        return OptimWrapperDict(
            backbone=build_optim_wrapper(
                nn.Sequential(net.stem, net.bn), _sgd_cfg(True)),
            head=build_optim_wrapper(
                nn.Sequential(net.dw, net.gn, net.head),
                _adam_cfg('AdamW', True)))

    net = SmallNet()
    twin = copy.deepcopy(net)
    stock, fused = build(net), build(twin)
    outcome = fuse_optim_wrapper(fused)
    assert str(outcome) == (
        'backbone: optimizer: SGD 4 groups -> 2 fused steps; '
        'head: optimizer: AdamW 6 groups -> 2 fused steps, step counts '
        'read in one go')
    assert outcome.done and [p.done for p in outcome.parts] == [True, True]
    for step in range(3):
        _set_grads([net, twin], step)
        for wrapper in (*stock.values(), *fused.values()):
            wrapper.step()  # OptimWrapperDict.step is not implemented
        _assert_same(net.state_dict(), twin.state_dict(), f'{step}')
        _assert_same(stock.state_dict(), fused.state_dict(), f'{step}')


def test_amp_optim_wrapper_loss_scaling(monkeypatch):
    """AmpOptimWrapper: the scaler unscales, skips inf steps, then steps."""
    # AmpOptimWrapper insists on an accelerator; on CPU, give it torch's
    # CPU GradScaler instead of the CUDA one it builds.
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available',
                        lambda: True)
    cfg = _sgd_cfg(True)
    cfg.update(type='AmpOptimWrapper', clip_grad=dict(max_norm=1.0))
    arms = []
    for fuse in (False, True):
        net = SmallNet()
        torch.manual_seed(0)
        net.load_state_dict(SmallNet().state_dict())
        wrapper = build_optim_wrapper(net, copy.deepcopy(cfg))
        wrapper.loss_scaler = torch.amp.GradScaler('cpu', init_scale=2.**8)
        if fuse:
            assert 'SGD' in str(fuse_optim_wrapper(wrapper))
        arms.append((net, wrapper))
    for step in range(4):
        for net, wrapper in arms:
            torch.manual_seed(step)
            loss = net(torch.randn(2, 3, 8, 8)).square().mean()
            if step == 2:  # an overflow: the scaler must skip this step
                loss = loss * float('inf')
            wrapper.update_params(loss)
        _assert_same(arms[0][0].state_dict(), arms[1][0].state_dict(),
                     f'step {step}')
        _assert_same(arms[0][1].state_dict(), arms[1][1].state_dict(),
                     f'step {step}')
    assert arms[1][1].loss_scaler.get_scale() < 2.**8  # it did back off
