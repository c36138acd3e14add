"""fast_parallel/data/loader.py: torch's DataLoader minus the per-batch
label."""
import pytest
import torch
from helpers import assert_same_tree
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fast_parallel import PackedBatch, packed_collate
from fast_parallel.data.loader import FastDataLoader, make_fast


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


def test_make_fast_switches_only_plain_dataloaders():
    plain = DataLoader(Draws(), batch_size=2)
    assert make_fast(plain) and type(plain) is FastDataLoader
    assert not make_fast(plain)  # already fast

    class Custom(DataLoader):
        pass

    custom = Custom(Draws(), batch_size=2)
    assert not make_fast(custom) and type(custom) is Custom
