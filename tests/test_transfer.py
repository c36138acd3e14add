"""The per-batch hot path asks the driver nothing: ``PackedBatch.pinned``.

``fast_parallel/data/packing.py`` records whether a batch's buffers are
page-locked from how they were made; ``fast_parallel/wrappers/transfer.py``
``move_batch`` reads that flag instead of calling ``Tensor.is_pinned`` (a
CUDA driver query per buffer). Pinning needs an accelerator: on a CPU build
:class:`FakePinning` lets the pinning code run (it allocates what a pinned
allocation would hold, in pageable memory), so the flag logic is tested
here; the tests that ask the real allocator skip without CUDA.
"""
import pickle
from collections import Counter
from typing import Any, Callable, Dict, Optional

import pytest
import torch
from helpers import assert_same_tree
from mmengine.dataset import pseudo_collate
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.pin_memory import pin_memory as pin_thread_step

from fast_parallel import PackedBatch, pack, packed_collate
from fast_parallel.bench.synthetic import yolox_samples
from fast_parallel.data import ring as ring_module
from fast_parallel.wrappers.transfer import TransferMixin

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason='pinning needs CUDA')
#: What would be a driver query (or a sync) if made per batch.
QUERIES = ('is_pinned', 'pin_memory', 'item', 'tolist', 'synchronize')


class FakePinning(TorchDispatchMode):
    """Runs the pinning code on a CPU build of torch.

    A factory call asking for ``pin_memory=True`` gets a pageable tensor
    instead (and is counted); asking the driver (``is_pinned``,
    ``Tensor.pin_memory``, which asks first) fails the test.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pinned_allocations = 0

    def __torch_dispatch__(self,
                           func: Callable,
                           types: Any,
                           args=(),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = dict(kwargs or {})
        name = func.overloadpacket.__name__
        if name in ('is_pinned', '_pin_memory'):
            raise AssertionError(f'{name}: a driver query on the hot path')
        if kwargs.get('pin_memory'):
            self.pinned_allocations += 1
            kwargs['pin_memory'] = False
        return func(*args, **kwargs)


class CountCalls(TorchFunctionMode):
    """Counts torch functions and ``Tensor`` methods called, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_function__(self,
                           func: Callable,
                           types: Any,
                           args=(),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        self.calls[getattr(func, '__name__', repr(func))] += 1
        return func(*args, **(kwargs or {}))

    def queries(self) -> Dict[str, int]:
        return {q: self.calls[q] for q in QUERIES if self.calls[q]}


class Wrapper(TransferMixin):
    """The part of the model wrappers under test."""


def batch() -> PackedBatch:
    return pack(pseudo_collate(yolox_samples(2, size=32)))


def fake_pinned(packed: PackedBatch) -> PackedBatch:
    with FakePinning() as mode:
        out = packed.pin_memory()
    assert mode.pinned_allocations == (0 if packed.pinned else len(
        packed.buffers))
    return out


# ------------------------------------------------------------ the flag
def test_fresh_batches_are_not_pinned():
    tree = pseudo_collate(yolox_samples(2, size=32))
    assert not pack(tree).pinned
    assert not pack(tree, pin_memory=False).pinned
    assert not packed_collate(yolox_samples(2, size=32)).pinned
    assert not PackedBatch({}, [], None).pinned


def test_pack_with_pin_memory_is_pinned():
    tree = pseudo_collate(yolox_samples(2, size=32))
    with FakePinning() as mode:
        packed = pack(tree, pin_memory=True)
    assert packed.pinned
    assert mode.pinned_allocations == len(packed.buffers) > 1
    assert_same_tree(packed.unpack(), tree)


def test_pin_thread_path_sets_the_flag_without_asking():
    packed = batch()
    with FakePinning() as mode, CountCalls() as calls:
        pinned = pin_thread_step(packed)  # what the pin thread calls
    assert pinned.pinned and not packed.pinned
    assert mode.pinned_allocations == len(packed.buffers)
    assert calls.queries() == {}
    assert all(pinned.buffers[dt] is not b for dt, b in packed.buffers.items())
    assert_same_tree(pinned.unpack(), packed.unpack())


def test_already_pinned_batches_are_not_pinned_again():
    packed = fake_pinned(batch())
    with FakePinning() as mode, CountCalls() as calls:
        again = packed.pin_memory()
    assert again is packed and mode.pinned_allocations == 0
    assert calls.queries() == {}


def test_flag_through_to_replace_and_pickling():
    packed = fake_pinned(batch())
    assert packed.to('cpu').pinned  # the same buffers
    assert packed.to('cpu').buffers[torch.uint8] is \
        packed.buffers[torch.uint8]
    assert not packed.to('meta').pinned  # other memory
    # An unpickled tensor lives in fresh (or shared) memory, never pinned.
    loaded = pickle.loads(pickle.dumps(packed))
    assert not loaded.pinned and not pickle.loads(pickle.dumps(batch())).pinned
    assert loaded.to('cpu').pinned is False
    assert fake_pinned(loaded).pinned


class Samples(Dataset):

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        return yolox_samples(1, size=32, seed=i)[0]


def test_ring_batches_are_pinned_by_copy_and_release_their_slot():
    before = dict(ring_module.RECEIVED_COUNTS)
    loader = DataLoader(
        Samples(), batch_size=2, num_workers=1, collate_fn=packed_collate)
    for b, packed in enumerate(loader):
        assert not packed.pinned  # shared-memory ring buffers: pageable
        pinned = fake_pinned(packed)
        assert pinned.pinned
        stock = pseudo_collate([Samples()[i] for i in (2 * b, 2 * b + 1)])
        assert_same_tree(pinned.unpack(), stock)
    after = ring_module.RECEIVED_COUNTS
    arrived = after['storages'] + after['reused'] - before['storages'] - \
        before['reused']
    assert arrived == 2


@needs_cuda
def test_real_pinning_matches_the_flag():
    tree = pseudo_collate(yolox_samples(2, size=32))
    for packed in (pack(tree, pin_memory=True), pack(tree).pin_memory()):
        assert packed.pinned
        assert all(b.is_pinned() for b in packed.buffers.values())
    assert not any(b.is_pinned() for b in pack(tree).buffers.values())


@needs_cuda
def test_real_pin_thread_pins_ring_batches():
    loader = DataLoader(
        Samples(),
        batch_size=2,
        num_workers=1,
        pin_memory=True,
        collate_fn=packed_collate)
    for packed in loader:
        assert packed.pinned
        assert all(b.is_pinned() for b in packed.buffers.values())


# ---------------------------------------------------------- move_batch
class SeeCopies(TorchDispatchMode):
    """Records the ``non_blocking`` of every ``_to_copy``."""

    def __init__(self) -> None:
        super().__init__()
        self.non_blocking = []

    def __torch_dispatch__(self,
                           func: Callable,
                           types: Any,
                           args=(),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        if func.overloadpacket.__name__ == '_to_copy':
            self.non_blocking.append(bool(kwargs.get('non_blocking')))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('pinned', [False, True])
def test_move_batch_asks_no_driver(pinned):
    packed = fake_pinned(batch()) if pinned else batch()
    # 'meta' is a device other than the CPU: the path a GPU takes, where
    # the old code asked ``is_pinned`` of every buffer.
    device = torch.device('meta')
    with CountCalls() as calls, SeeCopies() as copies:
        out = Wrapper().move_batch(packed, device, 'train')
    assert calls.queries() == {}
    assert calls.calls['is_pinned'] == 0
    assert copies.non_blocking == [pinned] * len(packed.buffers)
    assert out['inputs'][0].device == device
    with CountCalls() as calls:
        Wrapper().move_batch(packed, torch.device('cpu'), 'train')
    assert calls.queries() == {}


def test_handed_out_batch_moves_one_copy_per_buffer_with_stocks_cast():
    from mmengine.model import BaseDataPreprocessor

    from fast_parallel.data.handout import hand_out
    packed = fake_pinned(batch())
    tree = hand_out(packed)
    device = torch.device('meta')  # another device than the CPU
    preprocessor = BaseDataPreprocessor().to(device)
    module = torch.nn.Module()
    module.data_preprocessor = preprocessor
    wrapper = Wrapper()
    wrapper.module = module
    with SeeCopies() as copies:
        out = wrapper.move_batch(tree, device, 'train')
    assert copies.non_blocking == [True] * len(packed.buffers)
    assert type(out) is dict and out is not tree
    assert all(t.device == device for t in out['inputs'])
    assert all(t.device.type == 'cpu' for t in tree['inputs'])  # unchanged
    last = wrapper.transfer_stats.last['train']
    assert last['transfer_copies'] == len(packed.buffers)
    # a leaf a hook replaced: torch's own .to moves it, counted
    tree = hand_out(batch())
    tree['inputs'][1] = tree['inputs'][1].clone()
    out = wrapper.move_batch(tree, device, 'train')
    assert out['inputs'][1].device == device
    stats = wrapper.transfer_stats
    assert stats.last['train']['transfer_copies'] == len(packed.buffers) + 1
    assert stats.pop_totals('train')['stock_leaves'] == 1


def test_transfer_figures_stay_out_of_checkpoints():
    from mmengine.logging import MessageHub
    hub = MessageHub.get_instance('test_transfer_figures_stay_out')
    assert MessageHub.get_current_instance() is hub
    Wrapper().move_batch(batch(), torch.device('cpu'), 'train')
    logged = {k for k in hub.log_scalars if k.startswith('train/transfer')}
    assert logged == {
        'train/transfer_time', 'train/transfer_copies', 'train/transfer_mb'
    }
    saved = hub.state_dict()['log_scalars']
    assert not [k for k in saved if k.startswith('train/transfer')]
