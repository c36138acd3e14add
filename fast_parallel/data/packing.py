"""Pack a collated batch into one flat buffer per dtype.

``pack(tree)`` walks a collated structure the way mmengine's
``BaseDataPreprocessor.cast_data`` does, copies every tensor that stock
``cast_data`` would move into one 1-D buffer per dtype and keeps a small
picklable skeleton for everything else. ``PackedBatch.to(device)`` then
moves the whole batch with one copy per buffer, and ``unpack()`` rebuilds the
structure with tensor leaves as views into the buffers.

Where stock would *not* move a tensor (a list of tensors inside a data sample,
a tensor in ``metainfo``), the packer leaves it untouched in the skeleton, so
that the unpacked result equals stock ``cast_data`` leaf by leaf, devices
included.

Strides are stock's too. Stock keeps each tensor as the pipeline made it
(``pseudo_collate`` and the DataLoader's shared-memory queue keep strides);
``cast_data``'s ``tensor.to(device)`` returns the tensor itself on its own
device, and on another device copies it with ``torch.preserve_format``: a
non-overlapping-and-dense tensor (contiguous, channels-last, any permutation)
keeps its strides, any other one (expanded, gapped slice, overlapping view)
gets fresh dense strides. So each leaf's buffer holds the span of storage its
view touches (gaps of a sliced tensor included, only the underlying elements
of an expanded one), and ``unpack`` gives

- where the batch was packed (no ``to``, or ``to`` its own device): a view
  with the original shape and strides, expansion and overlap included;
- after ``to`` another device: the same view for a non-overlapping-and-dense
  leaf, and for any other leaf what stock's ``to`` gives, a dense copy with
  the strides ``Tensor.to`` picks (worked out once, at pack time).

Preserved: shape, strides, dtype, values, the expansion/overlap structure of
each view, ``requires_grad``, one object for a tensor that occurs twice, and
a 64-byte aligned start for each leaf's span. Not preserved, because all
leaves share one buffer: the ``storage_offset`` value and storage sharing
between *different* leaves (two views of one tensor become two spans).
"""
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from mmengine.structures import BaseDataElement

from fast_parallel.data.adapters import find_adapter

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
            stride, requires_grad, moved_stride)``: the leaf's view starts
            at ``offset`` (elements of its dtype's buffer) with its original
            ``shape`` and ``stride``; ``moved_stride`` is None when the leaf
            is non-overlapping and dense, else the strides stock's
            ``Tensor.to`` gives it on another device.
        skeleton: The structure, as skeleton nodes.
        device (torch.device, optional): Where ``to`` moved the batch;
            None for a batch fresh from the collate function.
            Defaults to None.
        non_blocking (bool): Whether the move was non-blocking.
            Defaults to False.
        ticket (RingTicket, optional): Worker side, the shared ring slot the
            buffers live in. Defaults to None.
        moved (bool): Whether ``to`` has copied the buffers to another
            device than the one the leaves were packed on. Defaults to
            False.
        worker_states (tuple, optional): ``(worker id, random states)`` of
            the DataLoader worker that made the batch, right after making
            it, where the collate function was asked to report them
            (:class:`~fast_parallel.PackedCollate`'s ``worker_states``;
            ``ExactResumeHook`` keeps them for epoch-based resumes).
            Defaults to None.
        pinned (bool): Whether the buffers are known to be page-locked:
            True only where this batch's maker pinned them (``pack(...,
            pin_memory=True)`` on the CPU, :meth:`pin_memory`). Readers
            (``move_batch``) trust it instead of asking the driver
            (``Tensor.is_pinned`` is a CUDA driver query, ~1 ms on a busy
            GPU). False never gives wrong numbers, only a blocking copy or
            one more pinning copy. Defaults to False.
    """

    __slots__ = ('buffers', 'layout', 'skeleton', 'device', 'non_blocking',
                 'ticket', 'moved', 'worker_states', 'pinned')

    def __init__(self,
                 buffers: Dict[torch.dtype, torch.Tensor],
                 layout: List[tuple],
                 skeleton: _Node,
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
        return PackedBatch(buffers, self.layout, self.skeleton, device,
                           non_blocking, moved=moved,
                           worker_states=self.worker_states, pinned=pinned)

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
        return self._replace(pinned, self.device, self.non_blocking,
                             self.moved, pinned=True)

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
        moved = {dt: b.to(device, non_blocking=copy_non_blocking)
                 for dt, b in self.buffers.items()}
        # Stock's ``tensor.to(device)`` returns the tensor itself when it is
        # on ``device`` already (``Tensor.to`` resolves ``'cuda'`` to the
        # current index, as it does for the buffers here) and copies it
        # otherwise. The buffers were copied iff their device changed.
        crossed = source is not None and _device_of(moved) != source
        # Uncrossed, the buffers are the same tensors: pinned as before.
        return self._replace(moved, device, non_blocking,
                             self.moved or crossed,
                             pinned=self.pinned and not crossed)

    def _has_undense_leaves(self) -> bool:
        return any(entry[5] is not None for entry in self.layout)

    def unpack(self) -> Any:
        """Rebuilds the collated structure.

        Returns:
            The structure ``pack`` was given (or, after ``to``, what stock
            ``cast_data`` would return); tensor leaves are views into the
            buffers with the original strides, except leaves that were not
            non-overlapping-and-dense after a move to another device:
            those are dense copies, as stock's ``Tensor.to`` makes them.
        """
        buffers = self.buffers
        moved = self.moved
        views = []
        for dtype, offset, shape, stride, requires_grad, moved_stride in \
                self.layout:
            view = buffers[dtype].as_strided(shape, stride, offset)
            if moved and moved_stride is not None:
                view = _dense_copy(view, moved_stride)
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


def _device_of(buffers: Dict[torch.dtype, torch.Tensor]
               ) -> Optional[torch.device]:
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


def _dense_copy(view: torch.Tensor, stride: Tuple[int, ...]) -> torch.Tensor:
    """What stock's ``Tensor.to`` makes of a leaf that is not dense.

    Stock copies such a tensor (expanded, gapped or overlapping) into fresh
    memory with dense strides when it moves it to another device. This is
    that same copy, made on the device from the moved buffer. It is not a
    transfer copy: the batch crossed to the device in the one copy per
    buffer, and stock makes this copy too.

    Args:
        view (Tensor): The leaf's view into its moved buffer.
        stride (tuple[int]): The strides stock's ``to`` picks.

    Returns:
        Tensor: A dense tensor with those strides holding the view's values.
    """
    out = torch.empty_strided(view.shape, stride, dtype=view.dtype,
                              device=view.device)
    return out.copy_(view)


def _span(shape: Tuple[int, ...], stride: Tuple[int, ...]) -> int:
    """Elements of storage a view touches, from its first to its last.

    Args:
        shape (tuple[int]): The view's sizes.
        stride (tuple[int]): The view's strides (never negative in torch).

    Returns:
        int: 0 for an empty view, else ``1 + sum((size - 1) * stride)``.
    """
    if 0 in shape:
        return 0
    return 1 + sum((size - 1) * st for size, st in zip(shape, stride))


def _moved_stride(tensor: torch.Tensor) -> Optional[Tuple[int, ...]]:
    """The strides stock's ``tensor.to(other_device)`` gives a leaf.

    ``Tensor.to`` keeps the strides of a non-overlapping-and-dense tensor
    and picks dense ones for any other. The rules live in C++
    (``_to_copy``); a move to the ``meta`` device runs that very code and
    allocates nothing, so it answers exactly.

    Args:
        tensor (Tensor): A leaf that is not contiguous.

    Returns:
        tuple[int] or None: None when ``to`` keeps the strides, else the
        strides it picks.
    """
    stride = tensor.detach().to('meta').stride()
    return None if stride == tensor.stride() else stride


def _plan(leaves: List[torch.Tensor]
          ) -> Tuple[Dict[torch.dtype, int], List[tuple], List[Optional[int]]]:
    """Places each leaf's span in its dtype's buffer.

    Args:
        leaves (list[Tensor]): The distinct tensor leaves, in slot order.

    Returns:
        tuple: ``sizes`` (elements per dtype buffer), ``layout`` (see
        :class:`PackedBatch`) and ``runs``: per leaf None when it is
        contiguous (its span is its elements), else its span.
    """
    sizes: Dict[torch.dtype, int] = {}
    layout = []
    runs: List[Optional[int]] = []
    for t in leaves:
        itemsize = t.element_size()
        start = sizes.get(t.dtype, 0)
        shape = tuple(t.shape)
        stride = t.stride()
        if t.is_contiguous():
            # The common case, kept as cheap as before: the span is the
            # elements, and ``to`` keeps contiguous strides.
            run, span, moved_stride = None, t.numel(), None
        else:
            span = run = _span(shape, stride)
            moved_stride = _moved_stride(t)
        layout.append((t.dtype, start, shape, stride, t.requires_grad,
                       moved_stride))
        runs.append(run)
        sizes[t.dtype] = start + _aligned(span * itemsize) // itemsize
    return sizes, layout, runs


@torch.no_grad()  # the buffers never join a graph; no detach() per leaf
def _fill(buffers: Dict[torch.dtype, torch.Tensor],
          leaves: List[torch.Tensor], layout: List[tuple],
          runs: List[Optional[int]]) -> None:
    """Copies each leaf's span into its place (see :func:`_plan`).

    Args:
        buffers (dict[torch.dtype, Tensor]): The 1-D buffers.
        leaves (list[Tensor]): The leaves, in slot order.
        layout (list[tuple]): From :func:`_plan`.
        runs (list[int | None]): From :func:`_plan`.
    """
    for t, run, (dt, offset, shape, stride, *_) in zip(leaves, runs, layout):
        if run is None:
            if t.numel():
                buffers[dt].as_strided(shape, stride, offset).copy_(t)
        elif run:
            # The storage the view touches as one 1-D run (gaps included,
            # an expanded view's elements once); ``unpack`` lays the
            # original strides over it from ``offset``.
            source = t.as_strided((run, ), (1, ), t.storage_offset())
            buffers[dt].narrow(0, offset, run).copy_(source)


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
            (the shared ring of :mod:`fast_parallel.data.ring`). Defaults to
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

    sizes, layout, runs = _plan(leaves)
    device = leaves[0].device
    buffers = None
    if allocate is not None and device.type == 'cpu':
        buffers = allocate(sizes)
    pin = False  # shared ring buffers are pageable
    if buffers is None:
        pin = pin_memory and device.type == 'cpu'
        buffers = {
            dt: torch.empty(n, dtype=dt, device=device, pin_memory=pin)
            for dt, n in sizes.items()
        }
    _fill(buffers, leaves, layout, runs)
    return PackedBatch(buffers, layout, skeleton, pinned=pin)
