"""A ring of shared-memory buffers that DataLoader workers reuse.

Packing cuts a batch to one buffer per dtype, but a fresh shared-memory
buffer per batch still costs the main process a file-descriptor hand-over,
an ``mmap`` and, later, an ``munmap`` of every page. Here each worker keeps a
few slots of shared buffers (``slots_per_worker``, default 4: the
DataLoader's default prefetch of 2, one batch in use, one spare) and writes
each batch into a free one. A slot's storages cross the queue once; after
that a batch carries only ``(worker pid, slot, generation)`` and the sizes,
and the main process maps nothing.

A slot is free again when nothing in the main process can reach its memory
any more: no tensor, view, ``.detach()``, ``.data``, storage object or NumPy
array (each keeps a reference to the storage) of any batch it carried. The
main process knows this from the storages' reference counts
(:func:`~fast_parallel.compat.storage_use_count`), which it checks for the
slots it holds each time a batch arrives, and only then clears the slot's
shared flag. With ``pin_memory`` that is right after the pin thread's copy;
on the CPU it is when the step and anything that kept a handle (an
evaluator holding ground truth, a hook's ``x.detach().numpy()``) let go.
A worker that finds no free slot never waits: it packs into fresh buffers,
exactly as without the ring. So a slot is never written while anything can
still read it, and the numbers the model sees are the same bytes either
way. All of a worker's buffers are nameless shared memory (a ``memfd``), so
a worker killed with its trainer leaves nothing in ``/dev/shm``.
"""
import functools
import os
from typing import Dict, List, Optional, Tuple

import torch
from torch.utils.data import get_worker_info

from fast_parallel.compat import nameless_shared_empty, storage_use_count

Sizes = Dict[torch.dtype, int]
_Key = Tuple[int, int]  # (worker pid, slot id)


class _Slot:
    """One worker-side slot: shared buffers per dtype and a shared flag."""

    def __init__(self, slot_id: int) -> None:
        self.id = slot_id
        self.generation = 0
        self.flag = nameless_shared_empty(1, torch.int32)
        self.flag[0] = 0
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
                self.storages[dt] = nameless_shared_empty(
                    int(n * headroom) + 64, dt)
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


def fresh_shared(sizes: Sizes) -> Optional[Dict[torch.dtype, torch.Tensor]]:
    """Inside a DataLoader worker, fresh buffers in nameless shared memory.

    A buffer the worker's queue pickles unshared gets a named
    ``/dev/shm`` segment first, which a worker killed at that moment (its
    trainer died) would leave behind; these cross by their descriptor
    (:func:`~fast_parallel.compat.nameless_shared_empty`).

    Args:
        sizes (dict): Elements needed per dtype.

    Returns:
        dict or None: One buffer per dtype; None outside a worker (``pack``
        then allocates as it would, pinned where asked).
    """
    if get_worker_info() is None:
        return None
    return {dt: nameless_shared_empty(n, dt) for dt, n in sizes.items()}


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
            dict or None: 1-D views of the slot's shared storages; where no
            slot is free, fresh nameless shared buffers (:func:`fresh_shared`).
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
            return fresh_shared(sizes)
        if not slot.fits(sizes):
            slot.grow(sizes, self.headroom)
        slot.flag[0] = 1
        self.last = RingTicket(slot, sizes)
        return {dt: slot.storages[dt][:n] for dt, n in sizes.items()}


# --------------------------------------------------------------------------
# Main-process side
# --------------------------------------------------------------------------
#: Main process: the slot storages received so far, by (worker pid, slot).
_RECEIVED_SLOTS: Dict[_Key, '_Received'] = {}
#: Main-process counts: batches whose slot storages arrived (first use of a
#: slot generation), batches that arrived as a key into the received
#: slots, and slots handed back to their worker.
RECEIVED_COUNTS = {'storages': 0, 'reused': 0, 'freed': 0}


class _Received:
    """A slot generation's storages in the main process, and its lease.

    While ``leased``, the slot's batch is out; the slot is handed back (its
    shared flag cleared) once each storage's reference count is what one
    tensor alone gives (:func:`_held_by_one`): the record's own.
    """

    __slots__ = ('generation', 'flag', 'storages', 'leased')

    def __init__(self, generation: int, flag: torch.Tensor,
                 storages: Dict[torch.dtype, torch.Tensor]) -> None:
        self.generation = generation
        self.flag = flag
        self.storages = storages
        self.leased = False

    def release_if_unreachable(self) -> None:
        if self.leased and all(
                storage_use_count(t) == _held_by_one()
                for t in self.storages.values()):
            self.leased = False
            self.flag[0] = 0
            RECEIVED_COUNTS['freed'] += 1


@functools.lru_cache(maxsize=None)
def _held_by_one() -> int:
    """The reference count of a storage that one tensor alone holds.

    Measured on a tensor of its own rather than on a slot as it arrives:
    while a batch is being unpickled, the unpickler still holds the slot's
    storage objects, which would make that count too high.
    """
    return storage_use_count(torch.empty(1))


def release_unreachable_slots() -> None:
    """Hands back every leased slot nothing in this process can reach.

    Called as each ring-backed batch arrives; tests call it to see a slot
    freed at once.
    """
    for record in list(_RECEIVED_SLOTS.values()):
        record.release_if_unreachable()


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
        the slot goes back to its worker at a later arrival, once nothing
        shares its storages (:func:`release_unreachable_slots`).
    """
    pid, slot_id, generation, sizes, storages, flag = payload
    key = (pid, slot_id)
    if storages is not None:
        if not any(k[0] == pid for k in _RECEIVED_SLOTS):
            # a new worker: drop the slots of workers that are gone
            for dead in [k for k in _RECEIVED_SLOTS if not _alive(k[0])]:
                del _RECEIVED_SLOTS[dead]
        _RECEIVED_SLOTS[key] = _Received(generation, flag, storages)
        RECEIVED_COUNTS['storages'] += 1
    else:
        RECEIVED_COUNTS['reused'] += 1
    release_unreachable_slots()
    record = _RECEIVED_SLOTS.get(key)
    if record is None or record.generation != generation:
        raise RuntimeError(
            f'packed batch from worker {pid} refers to slot {slot_id} '
            f'generation {generation}, which this process never received')
    record.leased = True
    return {
        dt:
        torch.empty(0, dtype=dt).set_(record.storages[dt].untyped_storage(), 0,
                                      (n, ))
        for dt, n in sizes.items()
    }


#: The ring ``packed_collate`` and ``PackedCollate`` use by default.
DEFAULT_RING = SharedRing()
