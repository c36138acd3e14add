"""What user code sees of a packed batch: stock's structure, moved in one go.

The fast DataLoader iterators hand out :func:`hand_out` of each
``PackedBatch``: the structure the config's collate function made (for mmdet
a plain ``dict``), tensor leaves as CPU views into the packed buffers. Hooks,
evaluators and scripts get exactly that. The wrappers recognise a batch
handed out here (:func:`take`) and move it with :func:`move_handed`: one copy
per buffer, then the model's own ``cast_data`` rebuilds the device batch
from the structure as it is now, each ``Tensor.to`` of a leaf still as it
was handed out answered by its view in the moved buffers. A leaf that user
code replaced, reshaped or re-pointed is moved by stock's own
``Tensor.to``, and counted. Why it is exact: ``docs/packing.md``, "What user
code sees".
"""
from collections import OrderedDict
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from fast_parallel.data.batch import PackedBatch

__all__ = ['Handed', 'hand_out', 'move_handed', 'packed_batch_of', 'take']

#: Batches handed out and not yet taken by a wrapper, newest last. A batch
#: iterated by hand and never stepped drops out after this many more; a
#: wrapper then moves it as stock does.
KEEP = 4


class Handed:
    """A batch handed out: the structure, its batch and its leaves.

    The leaves are kept so that no ``id`` in the structure can be reused by
    another tensor while the record lives.
    """

    __slots__ = ('tree', 'batch', 'leaves')

    def __init__(self, tree: Any, batch: PackedBatch,
                 leaves: List[torch.Tensor]) -> None:
        self.tree = tree
        self.batch = batch
        self.leaves = leaves


_HANDED: 'OrderedDict[int, Handed]' = OrderedDict()


def hand_out(batch: Any) -> Any:
    """What a fast DataLoader iterator yields for a collated batch.

    Args:
        batch: The batch from the collate function (after the pin thread).

    Returns:
        The unpacked structure for a ``PackedBatch`` (CPU views into its
        buffers, remembered for :func:`take`); anything else as it is.
    """
    if not isinstance(batch, PackedBatch):
        return batch
    leaves = batch.leaves()
    tree = batch.rebuild(leaves)
    _HANDED[id(tree)] = Handed(tree, batch, leaves)
    while len(_HANDED) > KEEP:
        _HANDED.popitem(last=False)
    return tree


def _find(data: Any) -> Optional[Handed]:
    record = _HANDED.get(id(data))
    return record if record is not None and record.tree is data else None


def packed_batch_of(data: Any) -> Optional[PackedBatch]:
    """The ``PackedBatch`` behind a batch, without taking it.

    Args:
        data: What a loop handed its hooks.

    Returns:
        PackedBatch | None: ``data`` itself, or the batch it was unpacked
        from by :func:`hand_out` while not yet taken; None otherwise.
    """
    if isinstance(data, PackedBatch):
        return data
    record = _find(data)
    return None if record is None else record.batch


def take(data: Any) -> Optional[Handed]:
    """The record of a batch :func:`hand_out` gave, forgotten from now on.

    Args:
        data: A batch a wrapper was given.

    Returns:
        Handed | None: None for anything not handed out (or dropped).
    """
    record = _find(data)
    if record is not None:
        del _HANDED[id(data)]
    return record


def move_handed(record: Handed, device: torch.device, non_blocking: bool,
                cast: Callable[[Any], Any]) -> Tuple[Any, int, int, int]:
    """Moves a handed-out batch: one copy per buffer, stock's structure.

    Args:
        record (Handed): From :func:`take`.
        device (torch.device): The model's device.
        non_blocking (bool): For the buffers' copies (pinned buffers).
        cast (callable): The model's ``data_preprocessor.cast_data``.

    Returns:
        tuple: ``(batch, copies, bytes, stock_copies)``: on the buffers' own
        device the structure as it is (stock's ``Tensor.to`` returns such
        leaves themselves); else ``cast`` of it with the moved leaves, the
        copies and bytes made, and how many of those copies were leaves
        that user code had replaced, moved the stock way.
    """
    batch = record.batch
    moved = batch.to(device, non_blocking=non_blocking)
    if not moved.buffers or moved.buffer_device == batch.buffer_device:
        return record.tree, 0, 0, 0
    twins = DeviceTwins(record, moved)
    with twins:
        data = cast(record.tree)
    return (data, moved.num_copies + twins.stock_copies,
            moved.nbytes + twins.stock_bytes, twins.stock_copies)


class DeviceTwins(TorchFunctionMode):
    """Answers ``Tensor.to(device)`` of a handed-out leaf with its moved view.

    A leaf answers only while it is the object handed out, with the dtype,
    shape, strides, ``requires_grad`` and memory it had then, and only for a
    plain move to the buffers' device (``.to(device[, non_blocking])``);
    every other call is torch's own, and a copy it makes is counted.

    Args:
        record (Handed): The batch handed out.
        moved (PackedBatch): Its buffers on the device.
    """

    def __init__(self, record: Handed, moved: PackedBatch) -> None:
        super().__init__()
        self.slots = {id(leaf): i for i, leaf in enumerate(record.leaves)}
        self.record = record
        self.moved = moved
        self.device = moved.buffer_device
        self.stock_copies = 0
        self.stock_bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and args:
            tensor = args[0]
            slot = self.slots.get(id(tensor))
            if (slot is not None and self.record.leaves[slot] is tensor
                    and self._plain_move(args[1:], kwargs)
                    and self._as_handed_out(slot, tensor)):
                return self.moved.leaf(slot)
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and out is not tensor \
                    and out.device != tensor.device:
                self.stock_copies += 1
                self.stock_bytes += out.numel() * out.element_size()
            return out
        return func(*args, **kwargs)

    def _plain_move(self, args: tuple, kwargs: dict) -> bool:
        if len(args) > 2 or (len(args) == 2 and 'non_blocking' in kwargs):
            return False
        if set(kwargs) - {'device', 'non_blocking'} or (args and 'device'
                                                        in kwargs):
            return False
        target = args[0] if args else kwargs.get('device')
        if len(args) == 2 and not isinstance(args[1], bool):
            return False
        return _same_device(target, self.device)

    def _as_handed_out(self, slot: int, tensor: torch.Tensor) -> bool:
        entry = self.record.batch.layout[slot]
        buffer = self.record.batch.buffers[entry.dtype]
        return (tensor.dtype == entry.dtype
                and tensor.requires_grad == entry.requires_grad
                and tuple(tensor.shape) == tuple(entry.shape)
                and tensor.stride() == tuple(entry.stride)
                and tensor.data_ptr()
                == buffer.data_ptr() + entry.offset * buffer.element_size())


def _same_device(target: Any, device: torch.device) -> bool:
    """Whether ``Tensor.to(target)`` goes to the concrete ``device``."""
    if isinstance(target, int) and not isinstance(target, bool):
        target = torch.device('cuda', target)
    elif isinstance(target, str):
        target = torch.device(target)
    if not isinstance(target, torch.device) or target.type != device.type:
        return False
    if target.index is None and device.type == 'cuda':
        return torch.cuda.current_device() == device.index
    return target.index is None or target.index == device.index
