"""A ring of shared-memory buffers that DataLoader workers reuse.

Packing cuts a batch to one buffer per dtype, but a fresh shared-memory
buffer per batch still costs the main process a file-descriptor hand-over,
an ``mmap`` and, later, an ``munmap`` of every page. Here each worker keeps a
few slots of shared buffers (``slots_per_worker``, default 4: the
DataLoader's default prefetch of 2, one batch in use, one spare) and writes
each batch into a free one. A slot's storages cross the queue once; after
that a batch carries only ``(worker pid, slot, generation)`` and the sizes,
and the main process maps nothing.

A slot is free again when nothing in the main process references its memory
any more: the per-batch buffer tensors are plain (non-view) tensors on the
cached storage, every tensor ``unpack`` returns is a view of one of them, and
a ``weakref.finalize`` on each buffer clears the slot's shared flag once all
of them are gone. With ``pin_memory`` that is right after the pin thread's
copy; on the CPU it is when the step (and anything that kept a view, e.g. an
evaluator holding ground truth) lets go. A worker that finds no free slot
never waits: it packs into fresh buffers, exactly as without the ring. So a
slot is never written while anything can still read it, and the numbers the
model sees are the same bytes either way.
"""
import os
import weakref
from typing import Dict, List, Optional, Tuple

import torch
from torch.utils.data import get_worker_info

Sizes = Dict[torch.dtype, int]
_Key = Tuple[int, int]  # (worker pid, slot id)


class _Slot:
    """One worker-side slot: shared buffers per dtype and a shared flag."""

    def __init__(self, slot_id: int) -> None:
        self.id = slot_id
        self.generation = 0
        self.flag = torch.zeros(1, dtype=torch.int32).share_memory_()
        self.storages: Dict[torch.dtype, torch.Tensor] = {}
        self.sent = False

    def free(self) -> bool:
        return int(self.flag[0]) == 0

    def fits(self, sizes: Sizes) -> bool:
        return all(dt in self.storages and self.storages[dt].numel() >= n
                   for dt, n in sizes.items())

    def grow(self, sizes: Sizes, headroom: float) -> None:
        for dt, n in sizes.items():
            if dt not in self.storages or self.storages[dt].numel() < n:
                self.storages[dt] = torch.empty(
                    int(n * headroom) + 64, dtype=dt).share_memory_()
        self.generation += 1
        self.sent = False


class RingTicket:
    """What a ring-backed batch carries across the queue.

    Worker side it holds the slot; ``payload()`` is what gets pickled: the
    storages and flag the first time a slot generation is sent, only its key
    afterwards.
    """

    __slots__ = ('slot', 'pid', 'sizes')

    def __init__(self, slot: _Slot, sizes: Sizes) -> None:
        self.slot = slot
        self.pid = os.getpid()
        self.sizes = dict(sizes)

    def payload(self) -> tuple:
        slot = self.slot
        first = not slot.sent
        slot.sent = True
        return (self.pid, slot.id, slot.generation, self.sizes,
                dict(slot.storages) if first else None,
                slot.flag if first else None)


class SharedRing:
    """Per-worker shared slots; ``allocate`` is ``pack``'s allocator.

    Args:
        slots_per_worker (int): Slots each worker keeps. Defaults to 4.
        headroom (float): A slot that grows gets this factor of room.
            Defaults to 1.25.
    """

    def __init__(self,
                 slots_per_worker: int = 4,
                 headroom: float = 1.25) -> None:
        self.slots_per_worker = slots_per_worker
        self.headroom = headroom
        self._pid: Optional[int] = None
        self._slots: List[_Slot] = []
        self.last: Optional[RingTicket] = None

    def __getstate__(self) -> dict:
        # Workers started with 'spawn' get their own, empty ring.
        return dict(
            slots_per_worker=self.slots_per_worker, headroom=self.headroom)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def allocate(self,
                 sizes: Sizes) -> Optional[Dict[torch.dtype, torch.Tensor]]:
        """Buffers in a free slot, or None (pack then uses fresh ones).

        Only inside a DataLoader worker; ``self.last`` gets the ticket.

        Args:
            sizes (dict): Elements needed per dtype.

        Returns:
            dict or None: 1-D views of the slot's shared storages.
        """
        self.last = None
        if get_worker_info() is None:
            return None
        if self._pid != os.getpid():  # a forked copy: start empty
            self._pid, self._slots = os.getpid(), []
        free = [s for s in self._slots if s.free()]
        slot = next((s for s in free if s.fits(sizes)), None)
        if slot is None and len(self._slots) < self.slots_per_worker:
            slot = _Slot(len(self._slots))
            self._slots.append(slot)
        if slot is None and free:
            slot = free[0]
        if slot is None:
            return None
        if not slot.fits(sizes):
            slot.grow(sizes, self.headroom)
        slot.flag[0] = 1
        self.last = RingTicket(slot, sizes)
        return {dt: slot.storages[dt][:n] for dt, n in sizes.items()}


# --------------------------------------------------------------------------
# Main-process side
# --------------------------------------------------------------------------
#: Main process: the slot storages received so far, by (worker pid, slot):
#: (generation, flag, storages).
_RECEIVED_SLOTS: Dict[_Key, tuple] = {}
#: Main-process counts: batches whose slot storages arrived (first use of a
#: slot generation) and batches that arrived as a key into the received
#: slots.
RECEIVED_COUNTS = {'storages': 0, 'reused': 0}


class _Lease:
    """Clears a slot's flag when the last of its buffers is gone."""

    def __init__(self, flag: torch.Tensor, count: int) -> None:
        self.flag = flag
        self.count = count

    def release_one(self) -> None:
        self.count -= 1
        if self.count == 0:
            self.flag[0] = 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def receive(payload: tuple) -> Dict[torch.dtype, torch.Tensor]:
    """Main process: the buffers of a ring-backed batch, leased.

    Args:
        payload (tuple): From ``RingTicket.payload``.

    Returns:
        dict: One fresh (non-view) tensor per dtype on the slot's storage;
        the slot is released when all of them, and every view of them, are
        gone.
    """
    pid, slot_id, generation, sizes, storages, flag = payload
    key = (pid, slot_id)
    if storages is not None:
        if not any(k[0] == pid for k in _RECEIVED_SLOTS):
            # a new worker: drop the slots of workers that are gone
            for dead in [k for k in _RECEIVED_SLOTS if not _alive(k[0])]:
                del _RECEIVED_SLOTS[dead]
        _RECEIVED_SLOTS[key] = (generation, flag, storages)
        RECEIVED_COUNTS['storages'] += 1
    else:
        RECEIVED_COUNTS['reused'] += 1
    cached = _RECEIVED_SLOTS.get(key)
    if cached is None or cached[0] != generation:
        raise RuntimeError(
            f'packed batch from worker {pid} refers to slot {slot_id} '
            f'generation {generation}, which this process never received')
    _, flag, storages = cached
    lease = _Lease(flag, len(sizes))
    buffers = {}
    for dt, n in sizes.items():
        buf = torch.empty(
            0, dtype=dt).set_(storages[dt].untyped_storage(), 0, (n, ))
        weakref.finalize(buf, lease.release_one)
        buffers[dt] = buf
    return buffers


#: The ring ``packed_collate`` and ``PackedCollate`` use by default.
DEFAULT_RING = SharedRing()
