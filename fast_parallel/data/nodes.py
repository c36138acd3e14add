"""Skeleton nodes: the picklable structure of a packed batch.

``pack`` turns everything in a collated batch except its tensor leaves into
these nodes; each rebuilds its piece of the structure in ``unpack``, tensor
leaves as views into the moved buffers (see ``docs/packing.md``).
"""
from typing import Any, Dict, List, Optional, Tuple

import torch
from mmengine.structures import BaseDataElement

from fast_parallel.compat import ELEMENT_FIELD_SETS
from fast_parallel.data.adapters import find_adapter
from fast_parallel.data.errors import PackingError

__all__ = [
    'AdapterNode', 'Const', 'ElementNode', 'Leaf', 'MappingNode', 'Movable',
    'Node', 'SequenceNode', 'UnpackContext'
]


class UnpackContext:
    """What ``unpack`` needs: the leaf views and where the batch was moved.

    Args:
        views (list[Tensor]): One view per leaf slot.
        device (torch.device, optional): Where ``to`` moved the batch; None
            for a batch that was not moved.
        non_blocking (bool): Whether the move was non-blocking.
    """

    __slots__ = ('views', 'device', 'non_blocking')

    def __init__(self, views: List[torch.Tensor],
                 device: Optional[torch.device], non_blocking: bool) -> None:
        self.views = views
        self.device = device
        self.non_blocking = non_blocking


class Node:
    """A piece of the skeleton; ``unpack`` rebuilds it."""

    __slots__ = ()

    def unpack(self, ctx: UnpackContext) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class Const(Node):
    """A value that travels untouched (metadata, unknown objects)."""

    __slots__ = ('value', )

    def __init__(self, value: Any) -> None:
        self.value = value

    def unpack(self, ctx: UnpackContext) -> Any:
        return self.value


class Movable(Node):
    """An object the packer does not know but stock would call ``.to`` on."""

    __slots__ = ('value', )

    def __init__(self, value: Any) -> None:
        self.value = value

    def unpack(self, ctx: UnpackContext) -> Any:
        if ctx.device is None:
            return self.value
        return self.value.to(ctx.device, non_blocking=ctx.non_blocking)


class Leaf(Node):
    """A tensor leaf: the view in its ``slot`` of the buffers."""

    __slots__ = ('slot', )

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def unpack(self, ctx: UnpackContext) -> torch.Tensor:
        return ctx.views[self.slot]


class MappingNode(Node):
    """A ``Mapping``: its class and its ``(key, node)`` items."""

    __slots__ = ('cls', 'items')

    def __init__(self, cls: type, items: List[Tuple[Any, Node]]) -> None:
        self.cls = cls
        self.items = items

    def unpack(self, ctx: UnpackContext) -> Any:
        # Stock ``cast_data`` returns a plain dict for any Mapping.
        cls = dict if ctx.device is not None else self.cls
        return cls({k: node.unpack(ctx) for k, node in self.items})


class SequenceNode(Node):
    """A sequence (``named`` for a namedtuple): its class and children."""

    __slots__ = ('cls', 'children', 'named')

    def __init__(self, cls: type, children: List[Node], named: bool) -> None:
        self.cls = cls
        self.children = children
        self.named = named

    def unpack(self, ctx: UnpackContext) -> Any:
        values = [node.unpack(ctx) for node in self.children]
        if self.named:
            return self.cls(*values)
        if self.cls is list:
            return values
        return self.cls(values)


class ElementNode(Node):
    """A ``BaseDataElement``: its ``__dict__`` with the data fields packed."""

    __slots__ = ('cls', 'static', 'fields')

    def __init__(self, cls: type, static: Dict[str, Any],
                 fields: List[Tuple[str, Node]]) -> None:
        self.cls = cls
        self.static = static
        self.fields = fields

    def unpack(self, ctx: UnpackContext) -> BaseDataElement:
        obj = self.cls.__new__(self.cls)
        state = dict(self.static)
        # ``set_field`` adds to these sets in place: never share them.
        for key in ELEMENT_FIELD_SETS:
            state[key] = set(state[key])
        for key, node in self.fields:
            state[key] = node.unpack(ctx)
        obj.__dict__.update(state)
        return obj


class AdapterNode(Node):
    """An object opened by its adapter.

    The adapter is looked up again by class where the batch is unpacked:
    adapters hold functions, which need not pickle across worker processes.
    """

    __slots__ = ('cls', 'aux', 'fields')

    def __init__(self, cls: type, aux: Any, fields: List[Tuple[str,
                                                               Node]]) -> None:
        self.cls = cls
        self.aux = aux
        self.fields = fields

    def unpack(self, ctx: UnpackContext) -> Any:
        tensors = {key: node.unpack(ctx) for key, node in self.fields}
        adapter = find_adapter(self.cls)
        if adapter is None:
            raise PackingError(
                f'{self.cls.__qualname__} was packed with an adapter that is '
                'not registered in this process: register it at import time '
                'of the module that defines the type.')
        return adapter.unflatten(self.cls, tensors, self.aux)
