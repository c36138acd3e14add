"""fast_parallel/data/ring.py: shared slots reused across batches, never
early."""
import gc
import os
import sys

import pytest
import torch
from helpers import assert_same_tree
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader, Dataset

from fast_parallel import PackedCollate, pack, packed_collate
from fast_parallel.bench.synthetic import pointpillars_samples
from fast_parallel.data import ring as ring_module
from fast_parallel.data.ring import SharedRing


class Clouds(Dataset):
    """Different points every index, rebuilt identically in any process."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        return pointpillars_samples(1, 500 + 50 * (i % 5), 900, 5, seed=i)[0]


def stock_batch(dataset, b, size):
    return pseudo_collate(
        [dataset[i] for i in range(b * size, (b + 1) * size)])


def test_slots_are_reused_and_batches_stay_exact():
    before = dict(ring_module.RECEIVED_COUNTS)
    dataset = Clouds()
    loader = DataLoader(
        dataset, batch_size=3, num_workers=2, collate_fn=packed_collate)
    for b, packed in enumerate(loader):
        assert_same_tree(packed.to('cpu').unpack(), stock_batch(dataset, b, 3))
        del packed
    sent = ring_module.RECEIVED_COUNTS['storages'] - before['storages']
    reused = ring_module.RECEIVED_COUNTS['reused'] - before['reused']
    assert sent >= 1 and reused >= 8, ring_module.RECEIVED_COUNTS
    assert sent + reused == len(dataset) // 3


def test_held_batches_are_never_overwritten():
    # keep every unpacked batch alive: no slot frees, the workers must fall
    # back to fresh buffers, and every batch still equals stock at the end
    dataset = Clouds()
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=2,
        collate_fn=PackedCollate(ring=SharedRing(2)))
    held = [packed.unpack() for packed in loader]
    for b, batch in enumerate(held):
        assert_same_tree(batch, stock_batch(dataset, b, 4))


def _one_slot_batch():
    """One batch from a one-slot ring, its workers stopped; the slot's
    main-process record."""
    loader = DataLoader(
        Clouds(),
        batch_size=2,
        num_workers=1,
        collate_fn=PackedCollate(ring=SharedRing(1)))
    known = set(ring_module._RECEIVED_SLOTS)
    it = iter(loader)
    batch = next(it).unpack()
    del it  # workers stop: from here only this process touches the flag
    new = [
        ring_module._RECEIVED_SLOTS[k]
        for k in set(ring_module._RECEIVED_SLOTS) - known
    ]
    assert len(new) == 1
    return batch, new[0].flag


def _freed_now(flag) -> bool:
    gc.collect()
    ring_module.release_unreachable_slots()
    return int(flag[0]) == 0


def test_slot_flag_clears_when_the_last_view_goes():
    batch, flag = _one_slot_batch()
    points = batch['inputs']['points'][0]
    assert int(flag[0]) == 1
    del batch
    assert not _freed_now(flag)  # `points` still views the slot
    del points
    assert _freed_now(flag)


@pytest.mark.parametrize('handle', [
    lambda t: t.detach(),
    lambda t: t.data,
    lambda t: t.detach().numpy(),
    lambda t: t.detach().cpu().numpy()[1:],
    lambda t: torch.from_numpy(t.detach().numpy()),
    lambda t: t.untyped_storage(),
])
def test_a_handle_without_the_view_keeps_the_slot(handle):
    # the idioms that share memory without keeping the tensor object that
    # unpack returned: the slot must stay taken while any of them lives
    batch, flag = _one_slot_batch()
    kept = handle(batch['inputs']['points'][0])
    del batch
    assert not _freed_now(flag)
    del kept
    assert _freed_now(flag)


def test_detached_handles_kept_across_many_batches_stay_intact():
    # a metric's habit: keep x.detach() (or its numpy array) of every batch
    dataset = Clouds()
    loader = DataLoader(
        dataset,
        batch_size=2,
        num_workers=2,
        collate_fn=PackedCollate(ring=SharedRing(2)))
    kept = []
    for packed in loader:
        points = packed.unpack()['inputs']['points']
        kept += [(p.detach(), p.clone()) for p in points[:1]]
        kept += [(p.detach().numpy(), p.numpy().copy()) for p in points[1:]]
        del packed, points
    assert len(kept) == len(dataset)
    changed = [
        i for i, (k, c) in enumerate(kept) if (torch.as_tensor(k).view(
            torch.int32) != torch.as_tensor(c).view(torch.int32)).any()
    ]
    assert changed == []


def test_no_ring_outside_workers():
    packed = packed_collate(pointpillars_samples(2, 100, 200, 3))
    assert packed.ticket is None
    assert pack([torch.ones(3)], allocate=SharedRing().allocate).ticket \
        is None


def _shared_memory_links() -> list:
    """(descriptor, target) of this process's open shared-memory files."""
    out = []
    for fd in os.listdir('/proc/self/fd'):
        try:
            link = os.readlink(f'/proc/self/fd/{fd}')
        except OSError:  # the listing's own descriptor, closed since
            continue
        if link.startswith(('/dev/shm/', '/memfd:')):
            out.append((fd, link))
    return out


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc')
@pytest.mark.parametrize(
    'ring', ['default', 'one slot', None], ids=['default', 'one-slot', 'none'])
def test_worker_buffers_never_have_a_name_in_dev_shm(ring):
    """torch names a segment ``/dev/shm/torch_<pid>_...`` from its
    ``shm_open`` to its ``shm_unlink``: a worker killed in between (its
    trainer died) leaves it there until reboot. Every buffer a fast worker
    sends is a memfd instead (the one-slot ring, with every batch held,
    sends fresh buffers from its second batch on)."""
    ring = {
        'default': ring_module.DEFAULT_RING,
        'one slot': SharedRing(1),
        None: None
    }[ring]
    before = set(_shared_memory_links())
    dataset = Clouds()
    loader = DataLoader(
        dataset,
        batch_size=3,
        num_workers=2,
        collate_fn=PackedCollate(ring=ring))
    held = [packed.unpack() for packed in loader]
    new = [link for _, link in set(_shared_memory_links()) - before]
    assert [link for link in new if link.startswith('/dev/shm/')] == []
    assert any(link.startswith('/memfd:fast_parallel') for link in new), new
    for b, batch in enumerate(held):
        assert_same_tree(batch, stock_batch(dataset, b, 3))


def test_nameless_shared_memory_follows_the_sharing_strategy():
    import torch.multiprocessing as mp

    from fast_parallel.compat import nameless_shared_empty
    made = nameless_shared_empty(5, torch.float64)
    assert made.is_shared() and made.shape == (5, )
    assert made.dtype == torch.float64
    assert nameless_shared_empty(0, torch.uint8).shape == (0, )
    strategy = mp.get_sharing_strategy()
    mp.set_sharing_strategy('file_system')
    try:  # torch's manager cleans names there: torch's own way
        assert nameless_shared_empty(3, torch.int32).is_shared()
    finally:
        mp.set_sharing_strategy(strategy)
