"""fast_parallel.compat: upstream internals are checked, missing ones fail
loudly with a message that names them; optional parts degrade to stock."""
import pytest
import torch
import torch.utils.data.dataloader as torch_dataloader
from mmengine.runner import loops
from torch.utils.data import DataLoader

from fast_parallel import compat
from fast_parallel.compat import CompatError
from fast_parallel.data.loader import FastDataLoader, switch_to_fast_loader
from fast_parallel.step import fused_optim


def test_this_stack_has_every_internal():
    compat.check_dataloader_internals.cache_clear()
    compat.check_dataloader_internals()
    runner_like = type(
        'Runner', (),
        dict(
            _train_dataloader={},
            _val_dataloader=None,
            _test_dataloader=None,
            _randomness_cfg={}))()
    compat.check_runner(runner_like)
    assert fused_optim.MISSING_INTERNALS == []


def test_missing_torch_internal_is_named(monkeypatch):
    monkeypatch.delattr(torch_dataloader._BaseDataLoaderIter, '_next_data')
    compat.check_dataloader_internals.cache_clear()
    try:
        with pytest.raises(CompatError) as error:
            switch_to_fast_loader(DataLoader([1, 2]))
    finally:
        monkeypatch.undo()
        compat.check_dataloader_internals.cache_clear()
    message = str(error.value)
    assert '_BaseDataLoaderIter._next_data' in message
    assert f'torch {compat.installed_version("torch")}' in message
    assert 'checked on torch 2.13.0' in message
    assert 'remove FastParallelHook' in message
    # with the internal back, the same call works
    loader = DataLoader([1, 2])
    assert switch_to_fast_loader(loader) and type(loader) is FastDataLoader


@pytest.mark.parametrize('attr', ['_train_dataloader', '_randomness_cfg'])
def test_missing_runner_internal_is_named(attr):
    names = dict(
        _train_dataloader={},
        _val_dataloader=None,
        _test_dataloader=None,
        _randomness_cfg={})
    del names[attr]
    runner_like = type('Runner', (), names)()
    with pytest.raises(
            CompatError,
            match=f'mmengine internal '
            f'`Runner.{attr}`.*checked on mmengine 0.10.7'):
        compat.check_runner(runner_like)


def test_missing_mmengine_iterator_class(monkeypatch):
    monkeypatch.delattr(loops, '_InfiniteDataloaderIterator')
    with pytest.raises(CompatError, match='_InfiniteDataloaderIterator'):
        compat.infinite_iterator_class()


def test_fused_optimizer_degrades_to_stock(monkeypatch):
    monkeypatch.setattr(fused_optim, 'MISSING_INTERNALS',
                        ['torch.optim.sgd.sgd'])
    params = [
        dict(params=[torch.zeros(2, requires_grad=True)]) for _ in range(3)
    ]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    outcome = fused_optim.fuse_optimizer(optimizer)
    assert type(optimizer) is torch.optim.SGD
    assert not outcome.done and 'torch.optim.sgd.sgd' in outcome.why
    assert 'left stock' in str(outcome)


def test_checks_leave_the_global_random_state_alone():
    compat.check_dataloader_internals.cache_clear()
    before = torch.get_rng_state()
    compat.check_dataloader_internals()
    assert torch.equal(before, torch.get_rng_state())


def test_loop_progress_counts_epochs_in_epoch_loops():
    from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
    epoch_loop = EpochBasedTrainLoop.__new__(EpochBasedTrainLoop)
    epoch_loop._epoch, epoch_loop._iter = 2, 8
    iter_loop = IterBasedTrainLoop.__new__(IterBasedTrainLoop)
    iter_loop._epoch, iter_loop._iter = 0, 8
    assert compat.loop_progress(epoch_loop) == 2
    assert compat.loop_progress(iter_loop) == 8


def test_every_method_a_family_stands_for_is_upstream():
    """``STANDS_FOR``'s names are methods of the upstream classes on this
    stack (a renamed one would otherwise never be seen set on an
    instance)."""
    from mmdet.models.dense_heads import AnchorHead

    from fast_parallel.compat.targets import STANDS_FOR, UPSTREAM, upstream
    for kind, names in STANDS_FOR.items():
        # 'ATSSHead.loss': a second set of the class's methods (its losses)
        name = kind.split('.')[0]
        cls = AnchorHead if name == 'AnchorHead' else upstream(name)
        assert name == 'AnchorHead' or name in UPSTREAM
        for name in names:
            assert callable(getattr(cls, name, None)), f'{kind}.{name}'
