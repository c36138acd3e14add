"""``PackedBatch``: a collated batch as one flat buffer per dtype.

``pin_memory`` and ``to`` move the few buffers (one copy per buffer);
``unpack`` rebuilds the structure from the skeleton, tensor leaves as views
into the buffers (see ``docs/packing.md``).
"""
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from fast_parallel.data.layout import LayoutEntry, dense_copy
from fast_parallel.data.nodes import Node, UnpackContext

__all__ = ['DeviceLike', 'PackedBatch']

DeviceLike = Union[str, int, torch.device]


class PackedBatch:
    """A collated batch as one flat buffer per dtype plus a skeleton.

    What each field holds and why: ``docs/packing.md``, "The fields of a
    PackedBatch".

    Args:
        buffers (dict[torch.dtype, Tensor]): One 1-D buffer per dtype.
        layout (list[LayoutEntry]): Per leaf slot, where its view lies in
            its dtype's buffer
            (:class:`~fast_parallel.data.layout.LayoutEntry`).
        skeleton (Node): The structure, as skeleton nodes.
        device (torch.device, optional): Where ``to`` moved the batch; None
            for a batch fresh from the collate function. Defaults to None.
        non_blocking (bool): Whether the move was non-blocking.
            Defaults to False.
        ticket (RingTicket, optional): Worker side, the shared ring slot the
            buffers live in. Defaults to None.
        moved (bool): Whether ``to`` has copied the buffers to another
            device than the one the leaves were packed on. Defaults to False.
        worker_states (tuple, optional): ``(worker id, random states)`` of
            the DataLoader worker that made the batch, where its loader's
            batches carry them. Defaults to None.
        pinned (bool): Whether the buffers are known to be page-locked (set
            by whoever pinned them; never asked of the driver). Defaults to
            False.
    """

    __slots__ = ('buffers', 'layout', 'skeleton', 'device', 'non_blocking',
                 'ticket', 'moved', 'worker_states', 'pinned')

    def __init__(self,
                 buffers: Dict[torch.dtype, torch.Tensor],
                 layout: List[LayoutEntry],
                 skeleton: Node,
                 device: Optional[torch.device] = None,
                 non_blocking: bool = False,
                 ticket: Optional[Any] = None,
                 moved: bool = False,
                 worker_states: Optional[Tuple[int, dict]] = None,
                 pinned: bool = False) -> None:
        self.buffers = buffers
        self.layout = layout
        self.skeleton = skeleton
        self.device = device
        self.non_blocking = non_blocking
        # A worker-side RingTicket when the buffers live in a shared slot.
        self.ticket = ticket
        self.moved = moved
        self.worker_states = worker_states
        self.pinned = pinned

    def __getstate__(self) -> tuple:
        if self.ticket is not None:  # the slot's storages, or just its key
            return (None, self.layout, self.skeleton, self.device,
                    self.non_blocking, self.moved, self.worker_states,
                    self.ticket.payload())
        return (self.buffers, self.layout, self.skeleton, self.device,
                self.non_blocking, self.moved, self.worker_states, None)

    def __setstate__(self, state: tuple) -> None:
        (self.buffers, self.layout, self.skeleton, self.device,
         self.non_blocking, self.moved, self.worker_states, ring) = state
        self.ticket = None
        # Unpickled buffers are never page-locked: torch rebuilds a pickled
        # tensor in fresh memory, and its multiprocessing reduction moves
        # it to shared memory (as the ring's storages are). So the flag is
        # not part of the state; a later ``pin_memory`` pins again.
        self.pinned = False
        if ring is not None:
            from fast_parallel.data.ring import receive
            self.buffers = receive(ring)

    @property
    def nbytes(self) -> int:
        """int: Bytes in all buffers, alignment padding included."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    @property
    def buffer_device(self) -> Optional[torch.device]:
        """torch.device | None: Where the buffers are (None: no buffers)."""
        return _device_of(self.buffers)

    @property
    def num_leaves(self) -> int:
        """int: Distinct tensor leaves carried in the buffers."""
        return len(self.layout)

    @property
    def num_copies(self) -> int:
        """int: Copies ``to`` makes: one per buffer."""
        return len(self.buffers)

    def _replace(self, buffers: Dict[torch.dtype, torch.Tensor],
                 device: Optional[torch.device], non_blocking: bool,
                 moved: bool, pinned: bool) -> 'PackedBatch':
        return PackedBatch(
            buffers,
            self.layout,
            self.skeleton,
            device,
            non_blocking,
            moved=moved,
            worker_states=self.worker_states,
            pinned=pinned)

    def pin_memory(self, device: Optional[DeviceLike] = None) -> 'PackedBatch':
        """Pins the buffers (the DataLoader's pin-memory thread calls this).

        Whether the buffers are pinned already comes from :attr:`pinned`,
        not from the driver: a batch packed with ``pin_memory=True`` (or
        pinned before) is returned as it is, any other one (fresh or
        shared-memory ring buffers from a worker) gets its buffers copied
        into page-locked memory, and the result says so in
        :attr:`pinned`. ``Tensor.pin_memory`` would ask the driver first.

        Args:
            device: Ignored; accepted for ``torch.utils.data`` compatibility.

        Returns:
            PackedBatch: The batch with page-locked buffers (``self`` when
            they are already).

        Raises:
            RuntimeError: A buffer is not on the CPU, or no pinned-memory
                allocator exists (a CPU-only build of torch).
        """
        if self.pinned:
            return self
        pinned = {dt: _pinned_copy(b) for dt, b in self.buffers.items()}
        return self._replace(
            pinned, self.device, self.non_blocking, self.moved, pinned=True)

    def to(self,
           device: DeviceLike,
           non_blocking: bool = False) -> 'PackedBatch':
        """Moves the batch with one copy per buffer.

        Args:
            device (str | int | torch.device): The target device.
            non_blocking (bool): Passed to ``Tensor.to``; overlaps the copy
                with host work when the buffers are pinned.
                Defaults to False.

        Returns:
            PackedBatch: A new batch whose buffers live on ``device``.
        """
        device = torch.device(device)
        source = _device_of(self.buffers)
        copy_non_blocking = non_blocking
        if (non_blocking and device.type == 'cpu' and source is not None
                and source.type != 'cpu' and self._has_undense_leaves()):
            # ``unpack`` reads these buffers on the host for the dense
            # copies: a non-blocking device-to-host copy may not have landed.
            copy_non_blocking = False
        moved = {
            dt: b.to(device, non_blocking=copy_non_blocking)
            for dt, b in self.buffers.items()
        }
        # Stock's ``tensor.to(device)`` returns the tensor itself when it is
        # on ``device`` already (``Tensor.to`` resolves ``'cuda'`` to the
        # current index, as it does for the buffers here) and copies it
        # otherwise. The buffers were copied iff their device changed.
        crossed = source is not None and _device_of(moved) != source
        # Uncrossed, the buffers are the same tensors: pinned as before.
        return self._replace(
            moved,
            device,
            non_blocking,
            self.moved or crossed,
            pinned=self.pinned and not crossed)

    def _has_undense_leaves(self) -> bool:
        return any(entry.moved_stride is not None for entry in self.layout)

    def leaf(self, slot: int) -> torch.Tensor:
        """The tensor leaf of one layout slot, as :meth:`unpack` gives it.

        Args:
            slot (int): Index into :attr:`layout`.

        Returns:
            Tensor: A view into its buffer with the original strides, or,
            after a move to another device, what stock's ``Tensor.to``
            gives for a leaf that was not non-overlapping-and-dense.
        """
        entry = self.layout[slot]
        view = self.buffers[entry.dtype].as_strided(entry.shape, entry.stride,
                                                    entry.offset)
        if self.moved and entry.moved_stride is not None:
            view = dense_copy(view, entry.moved_stride)
        if entry.requires_grad:
            view.requires_grad_()
        return view

    def leaves(self) -> List[torch.Tensor]:
        """list[Tensor]: Every layout slot's leaf (:meth:`leaf`), in order.
        """
        return [self.leaf(slot) for slot in range(len(self.layout))]

    def unpack(self) -> Any:
        """Rebuilds the collated structure.

        Returns:
            The structure ``pack`` was given (or, after ``to``, what stock
            ``cast_data`` would return); tensor leaves are views into the
            buffers with the original strides, except leaves that were not
            non-overlapping-and-dense after a move to another device:
            those are dense copies, as stock's ``Tensor.to`` makes them.
        """
        return self.rebuild(self.leaves())

    def rebuild(self, leaves: List[torch.Tensor]) -> Any:
        """The collated structure around given leaves (see :meth:`unpack`).

        Args:
            leaves (list[Tensor]): One tensor per layout slot, e.g.
                :meth:`leaves`.

        Returns:
            The structure, a new one per call.
        """
        return self.skeleton.unpack(
            UnpackContext(leaves, self.device, self.non_blocking))

    def __repr__(self) -> str:
        dtypes = ', '.join(
            str(dt).replace('torch.', '') for dt in self.buffers)
        return (f'PackedBatch(leaves={self.num_leaves}, copies='
                f'{self.num_copies}, nbytes={self.nbytes}, dtypes=[{dtypes}],'
                f' device={self.device})')


def _device_of(
        buffers: Dict[torch.dtype, torch.Tensor]) -> Optional[torch.device]:
    """The device of the buffers (all on one), None when there are none."""
    for buf in buffers.values():
        return buf.device
    return None


def _pinned_copy(buffer: torch.Tensor) -> torch.Tensor:
    """A page-locked copy of a CPU buffer, without asking the driver.

    What ``Tensor.pin_memory`` does after its ``is_pinned`` query: a tensor
    from the pinned-memory allocator, then a host copy (same bytes).

    Args:
        buffer (Tensor): A 1-D CPU buffer.

    Returns:
        Tensor: Its page-locked copy.

    Raises:
        RuntimeError: The buffer is not on the CPU.
    """
    if buffer.device.type != 'cpu':
        raise RuntimeError(
            f'cannot pin a buffer on {buffer.device}: only CPU buffers can '
            'be pinned')
    out = torch.empty(buffer.shape, dtype=buffer.dtype, pin_memory=True)
    return out.copy_(buffer)
