"""fast_parallel/wrappers: FastDataParallel on CPU against the bare model."""
import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.logging import MessageHub
from mmengine.model import is_model_wrapper
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODEL_WRAPPERS
from models import (assert_same_tensors, build_model, sample_batches, seed_all,
                    snapshot)

from fast_parallel import (FastDataParallel, FastDistributedDataParallel,
                           PackedBatch, packed_collate)

OPTIM = {
    'yolox':
    dict(
        optimizer=dict(
            type='SGD',
            lr=0.01,
            momentum=0.9,
            weight_decay=5e-4,
            nesterov=True)),
    'pointpillars':
    dict(
        optimizer=dict(type='AdamW', lr=0.001, weight_decay=0.01),
        clip_grad=dict(max_norm=35, norm_type=2)),
}
STEPS = {'yolox': 3, 'pointpillars': 2}


def train(kind: str, fast: bool):
    """K optimizer steps; returns the losses and the final parameters."""
    model = build_model(kind)
    optim_wrapper = build_optim_wrapper(model, OPTIM[kind])
    runner_model = FastDataParallel(model) if fast else model
    seed_all(1)
    hub = MessageHub.get_current_instance()
    losses = []
    for i, samples in enumerate(sample_batches(kind, STEPS[kind])):
        hub.update_info('iter', i)
        data = packed_collate(samples) if fast else pseudo_collate(samples)
        if fast:
            assert isinstance(data, PackedBatch)
        log_vars = runner_model.train_step(data, optim_wrapper)
        losses.append({k: v.detach().clone() for k, v in log_vars.items()})
    return losses, snapshot(model), runner_model


@pytest.mark.parametrize('kind', ['yolox', 'pointpillars'])
def test_fast_data_parallel_cpu_equals_bare_model(kind):
    stock_losses, stock_params, _ = train(kind, fast=False)
    fast_losses, fast_params, wrapper = train(kind, fast=True)
    assert len(fast_losses) == STEPS[kind]
    for step, (a, b) in enumerate(zip(stock_losses, fast_losses)):
        assert list(a) == list(b)
        for key in a:
            assert torch.equal(a[key], b[key]), f'step {step} {key}'
    n, _ = assert_same_tensors(stock_params, fast_params)
    assert n > 50
    # the parameters really moved: the comparison is not of two inits
    init = snapshot(build_model(kind))
    assert any(not torch.equal(init[k], fast_params[k]) for k in init)
    # figures were recorded; CPU to CPU copies nothing
    last = wrapper.transfer_stats.last['train']
    assert last['transfer_copies'] == 0 and last['transfer_time'] > 0


@pytest.mark.parametrize('kind', ['yolox', 'pointpillars'])
def test_val_and_test_step_predictions_equal(kind):
    model = build_model(kind).eval()
    wrapper = FastDataParallel(model)
    samples = sample_batches(kind, 1)[0]
    MessageHub.get_current_instance().update_info('iter', 0)
    with torch.no_grad():
        stock = model.val_step(pseudo_collate(samples))
        fast = wrapper.val_step(packed_collate(samples))
        fast_test = wrapper.test_step(packed_collate(samples))
    assert len(stock) == len(fast) == len(fast_test) == len(samples)
    field = 'pred_instances' if kind == 'yolox' else 'pred_instances_3d'
    for a, b, c in zip(stock, fast, fast_test):
        pa, pb, pc = (getattr(x, field) for x in (a, b, c))
        for key in pa.keys():
            va, vb, vc = (getattr(p, key) for p in (pa, pb, pc))
            va, vb, vc = (getattr(v, 'tensor', v) for v in (va, vb, vc))
            assert torch.equal(va, vb) and torch.equal(va, vc), key


def test_wrappers_are_registered_model_wrappers():
    model = build_model('yolox')
    wrapper = FastDataParallel(model)
    assert MODEL_WRAPPERS.get('FastDataParallel') is FastDataParallel
    assert MODEL_WRAPPERS.get('FastDistributedDataParallel') is \
        FastDistributedDataParallel
    assert is_model_wrapper(wrapper) and wrapper.module is model
    # the wrapper adds a `module.` prefix, which mmengine strips on save
    assert set(wrapper.module.state_dict()) == set(model.state_dict())
    assert wrapper.src_device == torch.device('cpu')


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs 2+ GPUs')
def test_multi_gpu_losses_match_one_gpu_within_tolerance():
    kind = 'yolox'
    samples = sample_batches(kind, 1, batch_size=4)[0]
    MessageHub.get_current_instance().update_info('iter', 0)
    one = FastDataParallel(build_model(kind).cuda())
    two = FastDataParallel(build_model(kind), device_ids=[0, 1])
    ow_one = build_optim_wrapper(one.module, OPTIM[kind])
    ow_two = build_optim_wrapper(two.module, OPTIM[kind])
    a = one.train_step(packed_collate(samples), ow_one)
    b = two.train_step(packed_collate(samples), ow_two)
    assert set(a) == set(b)
    assert b['loss'].device == torch.device('cuda', 0)
    with torch.no_grad():
        preds = two.val_step(packed_collate(samples))
    assert len(preds) == len(samples)
