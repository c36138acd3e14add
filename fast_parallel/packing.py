"""Pack a collated batch into one flat buffer per dtype.

``pack(tree)`` walks a collated structure the way mmengine's
``BaseDataPreprocessor.cast_data`` does, copies every tensor that stock
``cast_data`` would move into one contiguous 1-D buffer per dtype and keeps a
small picklable skeleton for everything else. ``PackedBatch.to(device)`` then
moves the whole batch with one copy per buffer, and ``unpack()`` rebuilds the
structure with tensor leaves as views into the buffers.

Where stock would *not* move a tensor (a list of tensors inside a data sample,
a tensor in ``metainfo``), the packer leaves it untouched in the skeleton, so
that the unpacked result equals stock ``cast_data`` leaf by leaf, devices
included.
"""
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from mmengine.structures import BaseDataElement

from .adapters import find_adapter

#: Every leaf starts at an offset that is a multiple of this many bytes.
ALIGN_BYTES = 64

_Path = Tuple[Union[str, int], ...]
DeviceLike = Union[str, int, torch.device]


class PackingError(ValueError):
    """A batch that cannot be packed; the message names the field path."""


def format_path(path: _Path) -> str:
    """Formats a field path such as ``data_samples[3].gt_instances.bboxes``.

    Args:
        path (tuple): Keys (``str``) and indices (``int``) from the root.

    Returns:
        str: The readable path, ``<batch>`` for the root.
    """
    out = ''
    for part in path:
        if isinstance(part, int):
            out += f'[{part}]'
        elif part.startswith('.'):
            out += part
        else:
            out += f'[{part!r}]' if out else part
    return out or '<batch>'


# --------------------------------------------------------------------------
# Skeleton nodes. Each rebuilds its piece of the structure in ``unpack``.
# --------------------------------------------------------------------------
class _Ctx:
    """What ``unpack`` needs: the leaf views and where the batch was moved."""

    __slots__ = ('views', 'device', 'non_blocking')

    def __init__(self, views: List[torch.Tensor],
                 device: Optional[torch.device], non_blocking: bool) -> None:
        self.views = views
        self.device = device
        self.non_blocking = non_blocking


class _Node:
    __slots__ = ()

    def unpack(self, ctx: _Ctx) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class _Const(_Node):
    """A value that travels untouched (metadata, unknown objects)."""

    __slots__ = ('value', )

    def __init__(self, value: Any) -> None:
        self.value = value

    def unpack(self, ctx: _Ctx) -> Any:
        return self.value


class _Movable(_Node):
    """An object the packer does not know but stock would call ``.to`` on."""

    __slots__ = ('value', )

    def __init__(self, value: Any) -> None:
        self.value = value

    def unpack(self, ctx: _Ctx) -> Any:
        if ctx.device is None:
            return self.value
        return self.value.to(ctx.device, non_blocking=ctx.non_blocking)


class _Leaf(_Node):
    __slots__ = ('slot', )

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def unpack(self, ctx: _Ctx) -> torch.Tensor:
        return ctx.views[self.slot]


class _MappingNode(_Node):
    __slots__ = ('cls', 'items')

    def __init__(self, cls: type, items: List[Tuple[Any, _Node]]) -> None:
        self.cls = cls
        self.items = items

    def unpack(self, ctx: _Ctx) -> Any:
        # Stock ``cast_data`` returns a plain dict for any Mapping.
        cls = dict if ctx.device is not None else self.cls
        return cls({k: node.unpack(ctx) for k, node in self.items})


class _SequenceNode(_Node):
    __slots__ = ('cls', 'children', 'named')

    def __init__(self, cls: type, children: List[_Node], named: bool) -> None:
        self.cls = cls
        self.children = children
        self.named = named

    def unpack(self, ctx: _Ctx) -> Any:
        values = [node.unpack(ctx) for node in self.children]
        if self.named:
            return self.cls(*values)
        if self.cls is list:
            return values
        return self.cls(values)


class _ElementNode(_Node):
    """A ``BaseDataElement``: its ``__dict__`` with the data fields packed."""

    __slots__ = ('cls', 'static', 'fields')

    def __init__(self, cls: type, static: Dict[str, Any],
                 fields: List[Tuple[str, _Node]]) -> None:
        self.cls = cls
        self.static = static
        self.fields = fields

    def unpack(self, ctx: _Ctx) -> BaseDataElement:
        obj = self.cls.__new__(self.cls)
        state = dict(self.static)
        # ``set_field`` adds to these sets in place: never share them.
        state['_metainfo_fields'] = set(state['_metainfo_fields'])
        state['_data_fields'] = set(state['_data_fields'])
        for key, node in self.fields:
            state[key] = node.unpack(ctx)
        obj.__dict__.update(state)
        return obj


class _AdapterNode(_Node):
    """An object opened by its adapter.

    The adapter is looked up again by class where the batch is unpacked:
    adapters hold functions, which need not pickle across worker processes.
    """

    __slots__ = ('cls', 'aux', 'fields')

    def __init__(self, cls: type, aux: Any,
                 fields: List[Tuple[str, _Node]]) -> None:
        self.cls = cls
        self.aux = aux
        self.fields = fields

    def unpack(self, ctx: _Ctx) -> Any:
        tensors = {key: node.unpack(ctx) for key, node in self.fields}
        adapter = find_adapter(self.cls)
        if adapter is None:
            raise PackingError(
                f'{self.cls.__qualname__} was packed with an adapter that is '
                'not registered in this process: register it at import time '
                'of the module that defines the type.')
        return adapter.unflatten(self.cls, tensors, self.aux)


# --------------------------------------------------------------------------
# The packer: walks the tree, collects tensor leaves.
# --------------------------------------------------------------------------
class _Packer:

    def __init__(self) -> None:
        self.leaves: List[torch.Tensor] = []
        self.paths: List[_Path] = []
        self._slot_of: Dict[int, int] = {}
        # What stock ``cast_data`` would copy: one per occurrence.
        self.stock_copies = 0
        self.stock_bytes = 0
        self._in_worker = torch.utils.data.get_worker_info() is not None

    def leaf(self, tensor: torch.Tensor, path: _Path) -> _Leaf:
        self.stock_copies += 1
        self.stock_bytes += tensor.numel() * tensor.element_size()
        slot = self._slot_of.get(id(tensor))
        if slot is None:
            if self._in_worker and tensor.device.type != 'cpu':
                raise PackingError(
                    f'{_describe(path)} is a tensor on {tensor.device} inside '
                    'a DataLoader worker: workers must produce CPU tensors.')
            if self.leaves and tensor.device != self.leaves[0].device:
                raise PackingError(
                    f'{_describe(path)} is on {tensor.device} but '
                    f'{_describe(self.paths[0])} is on '
                    f'{self.leaves[0].device}: a packed batch must have all '
                    'its tensors on one device.')
            slot = len(self.leaves)
            self._slot_of[id(tensor)] = slot
            self.leaves.append(tensor)
            self.paths.append(path)
        return _Leaf(slot)

    def cast(self, data: Any, path: _Path) -> _Node:
        """Mirrors ``BaseDataPreprocessor.cast_data``."""
        if isinstance(data, torch.Tensor):
            return self.leaf(data, path)
        if isinstance(data, BaseDataElement):
            return self.element(data, path)
        if isinstance(data, Mapping):
            return _MappingNode(
                type(data),
                [(k, self.cast(data[k], path + (k, ))) for k in data])
        if isinstance(data, (str, bytes)) or data is None:
            return _Const(data)
        if isinstance(data, tuple) and hasattr(data, '_fields'):
            return _SequenceNode(
                type(data),
                [self.cast(v, path + (i, )) for i, v in enumerate(data)],
                named=True)
        if isinstance(data, Sequence):
            return _SequenceNode(
                type(data),
                [self.cast(v, path + (i, )) for i, v in enumerate(data)],
                named=False)
        return _Const(data)

    def field(self, value: Any, path: _Path) -> _Node:
        """Mirrors ``BaseDataElement.to``: one level, ``.to`` where it exists.
        """
        if isinstance(value, torch.Tensor):
            return self.leaf(value, path)
        if isinstance(value, BaseDataElement):
            return self.element(value, path)
        if not hasattr(value, 'to'):
            return _Const(value)
        adapter = find_adapter(type(value))
        if adapter is None:
            return _Movable(value)
        try:
            tensors, aux = adapter.flatten(value)
        except Exception as exc:
            raise PackingError(
                f'{_describe(path)}: the adapter for '
                f'{type(value).__qualname__} failed: {exc!r}') from exc
        fields = [(key, self.field(t, path + ('.' + key, )))
                  for key, t in tensors.items()]
        return _AdapterNode(type(value), aux, fields)

    def element(self, elem: BaseDataElement, path: _Path) -> _ElementNode:
        state = elem.__dict__
        static = dict(state)
        fields = []
        seen = set()
        for name in sorted(elem._data_fields):
            # DetDataSample & co. keep property-backed fields as `_name`, and
            # `_data_fields` may hold both spellings: one entry per value.
            key = name if name in state else '_' + name
            if key not in seen:
                seen.add(key)
                static[key] = None  # keeps the key's place in __dict__
                fields.append(
                    (key, self.field(state[key],
                                     path + ('.' + name.lstrip('_'), ))))
        return _ElementNode(type(elem), static, fields)


def _describe(path: _Path) -> str:
    """Names the sample (first index on the path) and the field path."""
    sample = next((p for p in path if isinstance(p, int)), None)
    where = format_path(path)
    return f'sample {sample}, field {where}' if sample is not None else where


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


# --------------------------------------------------------------------------
# PackedBatch
# --------------------------------------------------------------------------
class PackedBatch:
    """A collated batch as one flat buffer per dtype plus a skeleton.

    Args:
        buffers (dict[torch.dtype, Tensor]): One 1-D buffer per dtype.
        layout (list[tuple]): Per leaf slot: ``(dtype, offset, shape,
            stride, requires_grad)``, offsets in elements of the buffer.
        skeleton: The structure, as skeleton nodes.
        device (torch.device, optional): Where ``to`` moved the batch;
            None for a batch fresh from the collate function.
            Defaults to None.
        non_blocking (bool): Whether the move was non-blocking.
            Defaults to False.
    """

    __slots__ = ('buffers', 'layout', 'skeleton', 'device', 'non_blocking',
                 'ticket')

    def __init__(self,
                 buffers: Dict[torch.dtype, torch.Tensor],
                 layout: List[tuple],
                 skeleton: _Node,
                 device: Optional[torch.device] = None,
                 non_blocking: bool = False,
                 ticket: Optional[Any] = None) -> None:
        self.buffers = buffers
        self.layout = layout
        self.skeleton = skeleton
        self.device = device
        self.non_blocking = non_blocking
        # A worker-side RingTicket when the buffers live in a shared slot.
        self.ticket = ticket

    def __getstate__(self) -> tuple:
        if self.ticket is not None:  # the slot's storages, or just its key
            return (None, self.layout, self.skeleton, self.device,
                    self.non_blocking, self.ticket.payload())
        return (self.buffers, self.layout, self.skeleton, self.device,
                self.non_blocking, None)

    def __setstate__(self, state: tuple) -> None:
        (self.buffers, self.layout, self.skeleton, self.device,
         self.non_blocking, ring) = state
        self.ticket = None
        if ring is not None:
            from .ring import receive
            self.buffers = receive(ring)

    @property
    def nbytes(self) -> int:
        """int: Bytes in all buffers, alignment padding included."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    @property
    def num_leaves(self) -> int:
        """int: Distinct tensor leaves carried in the buffers."""
        return len(self.layout)

    @property
    def num_copies(self) -> int:
        """int: Copies ``to`` makes: one per buffer."""
        return len(self.buffers)

    def _replace(self, buffers: Dict[torch.dtype, torch.Tensor],
                 device: Optional[torch.device],
                 non_blocking: bool) -> 'PackedBatch':
        return PackedBatch(buffers, self.layout, self.skeleton, device,
                           non_blocking)

    def pin_memory(self, device: Optional[DeviceLike] = None) -> 'PackedBatch':
        """Pins the buffers (the DataLoader's pin-memory thread calls this).

        Args:
            device: Ignored; accepted for ``torch.utils.data`` compatibility.

        Returns:
            PackedBatch: The same batch with page-locked buffers.
        """
        pinned = {dt: b if b.is_pinned() else b.pin_memory()
                  for dt, b in self.buffers.items()}
        return self._replace(pinned, self.device, self.non_blocking)

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
        moved = {dt: b.to(device, non_blocking=non_blocking)
                 for dt, b in self.buffers.items()}
        return self._replace(moved, device, non_blocking)

    def unpack(self) -> Any:
        """Rebuilds the collated structure.

        Returns:
            The structure ``pack`` was given (or, after ``to``, what stock
            ``cast_data`` would return); tensor leaves are views into the
            buffers.
        """
        buffers = self.buffers
        views = []
        for dtype, offset, shape, stride, requires_grad in self.layout:
            view = buffers[dtype].as_strided(shape, stride, offset)
            if requires_grad:
                view.requires_grad_()
            views.append(view)
        return self.skeleton.unpack(
            _Ctx(views, self.device, self.non_blocking))

    def __repr__(self) -> str:
        dtypes = ', '.join(str(dt).replace('torch.', '')
                           for dt in self.buffers)
        return (f'PackedBatch(leaves={self.num_leaves}, copies='
                f'{self.num_copies}, nbytes={self.nbytes}, dtypes=[{dtypes}],'
                f' device={self.device})')


def _contiguous_stride(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(stride))


def stock_transfers(tree: Any) -> Tuple[int, int]:
    """What stock ``cast_data`` copies for ``tree``.

    Args:
        tree: A collated structure (e.g. ``pseudo_collate`` output).

    Returns:
        tuple[int, int]: The number of tensor copies and the bytes copied.
    """
    packer = _Packer()
    packer.cast(tree, ())
    return packer.stock_copies, packer.stock_bytes


def pack(tree: Any, pin_memory: bool = False,
         allocate: Optional[Callable[[Dict[torch.dtype, int]],
                                     Dict[torch.dtype, torch.Tensor]]] = None
         ) -> PackedBatch:
    """Packs a collated structure into one flat buffer per dtype.

    Args:
        tree: Any collated structure: dicts, lists, tuples, namedtuples,
            tensors, ``BaseDataElement`` (and subclasses), plus any type
            with an adapter (mmdet/mmdet3d boxes and points built in).
        pin_memory (bool): Allocate the buffers page-locked. Defaults to
            False.
        allocate (callable, optional): ``{dtype: numel} -> {dtype: 1-D
            tensor}`` providing CPU buffers of at least that many elements
            (the shared ring of :mod:`fast_parallel.ring`). Defaults to
            None: fresh buffers.

    Returns:
        PackedBatch: The packed batch.

    Raises:
        PackingError: A tensor that cannot be placed (mixed devices, a GPU
            tensor inside a DataLoader worker, a failing adapter); the
            message names the sample and the field path.
    """
    packer = _Packer()
    skeleton = packer.cast(tree, ())
    leaves = packer.leaves
    if not leaves:
        return PackedBatch({}, [], skeleton)

    sizes: Dict[torch.dtype, int] = {}
    layout = []
    for t in leaves:
        itemsize = t.element_size()
        start = sizes.get(t.dtype, 0)
        shape = tuple(t.shape)
        layout.append((t.dtype, start, shape, _contiguous_stride(shape),
                       t.requires_grad))
        sizes[t.dtype] = start + _aligned(t.numel() * itemsize) // itemsize

    device = leaves[0].device
    buffers = None
    if allocate is not None and device.type == 'cpu':
        buffers = allocate(sizes)
    if buffers is None:
        pin = pin_memory and device.type == 'cpu'
        buffers = {
            dt: torch.empty(n, dtype=dt, device=device, pin_memory=pin)
            for dt, n in sizes.items()
        }
    for t, (dt, offset, shape, stride, _) in zip(leaves, layout):
        if t.numel():
            buffers[dt].as_strided(shape, stride, offset).copy_(t.detach())
    return PackedBatch(buffers, layout, skeleton)
