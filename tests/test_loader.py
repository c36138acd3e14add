"""fast_parallel/data/loader.py: torch's DataLoader minus the per-batch
label."""
import pytest
import torch
from helpers import assert_same_tree
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fast_parallel import PackedBatch, packed_collate
from fast_parallel.data.loader import FastDataLoader, switch_to_fast_loader


class Draws(Dataset):
    """Each item depends on the worker's torch seed: order and seeding show.
    """

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return dict(index=torch.tensor(i), draw=torch.rand(3))


class Stream(IterableDataset):

    def __iter__(self):
        return iter(torch.arange(5).split(1))


def batches(cls, workers, collate_fn=None, **kwargs):
    torch.manual_seed(7)
    loader = cls(
        Draws(),
        batch_size=3,
        shuffle=True,
        num_workers=workers,
        collate_fn=collate_fn,
        **kwargs)
    return [b.unpack() if isinstance(b, PackedBatch) else b for b in loader]


@pytest.mark.parametrize('workers', [0, 2])
def test_same_batches_as_torch(workers):
    stock = batches(DataLoader, workers)
    fast = batches(FastDataLoader, workers)
    assert len(stock) == 4
    assert_same_tree(fast, stock)
    assert_same_tree(
        batches(FastDataLoader, workers, packed_collate),
        batches(DataLoader, workers, pseudo_collate))


def test_persistent_workers_epochs_match():
    torch.manual_seed(3)
    stock = DataLoader(
        Draws(),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        persistent_workers=True)
    epochs_stock = [list(stock) for _ in range(2)]
    torch.manual_seed(3)
    fast = FastDataLoader(
        Draws(),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        persistent_workers=True)
    epochs_fast = [list(fast) for _ in range(2)]
    assert_same_tree(epochs_fast, epochs_stock)
    assert type(fast._iterator).__module__ == 'fast_parallel.data.loader'


@pytest.mark.parametrize('workers', [0, 2])
def test_profiler_still_sees_the_label(workers):
    loader = FastDataLoader(Draws(), batch_size=4, num_workers=workers)
    with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert len(list(loader)) == 3
    names = [e.name for e in prof.events()]
    assert sum(n.startswith('enumerate(DataLoader)#') for n in names) >= 3


def test_iterable_datasets_keep_torch_next():
    assert [int(x) for x in FastDataLoader(Stream(), batch_size=None)] == \
        list(range(5))


def test_switch_to_fast_loader_switches_only_plain_dataloaders():
    plain = DataLoader(Draws(), batch_size=2)
    assert switch_to_fast_loader(plain) and type(plain) is FastDataLoader
    assert not switch_to_fast_loader(plain)  # already fast

    class Custom(DataLoader):
        pass

    custom = Custom(Draws(), batch_size=2)
    assert not switch_to_fast_loader(custom) and type(custom) is Custom


def test_an_inherited_base_seed_is_taken_by_one_iterator():
    """A rebuilt loader's first iterator gives its workers its
    predecessor's base seed; the next ones (one per pass over the data
    without persistent workers) draw their own, as stock's do, and the
    global generator moves as in stock."""
    from fast_parallel.data.loader import FastDataLoader
    from fast_parallel.data.loader_state import loader_state
    stock = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    fast = FastDataLoader(list(range(8)), batch_size=2)
    loader_state(fast).base_seed = 12345
    torch.manual_seed(3)
    stock_seeds = [iter(stock)._base_seed for _ in range(3)]
    torch.manual_seed(3)
    fast_seeds = [iter(fast)._base_seed for _ in range(3)]
    assert fast_seeds == [12345] + stock_seeds[1:]
    assert loader_state(fast).base_seed is None
