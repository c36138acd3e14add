"""Walks a collated batch as stock ``cast_data`` does, collecting leaves.

:class:`Packer` mirrors ``BaseDataPreprocessor.cast_data`` (and
``BaseDataElement.to`` one level down): every tensor stock would move
becomes a :class:`~fast_parallel.data.nodes.Leaf`, the rest skeleton nodes.
"""
from collections.abc import Mapping, Sequence
from typing import Any, Dict, List

import torch
from mmengine.structures import BaseDataElement

from fast_parallel.compat import data_element_fields
from fast_parallel.data.adapters import find_adapter
from fast_parallel.data.errors import FieldPath, PackingError, describe_path
from fast_parallel.data.nodes import (AdapterNode, Const, ElementNode, Leaf,
                                      MappingNode, Movable, Node, SequenceNode)

__all__ = ['Packer']


class Packer:
    """Walks a tree once; collects its distinct tensor leaves in slot order.

    Attributes:
        leaves (list[Tensor]): The distinct tensor leaves, in slot order.
        paths (list[tuple]): The field path where each leaf was first met.
        stock_copies (int): Tensor copies stock ``cast_data`` would make
            (one per occurrence).
        stock_bytes (int): Bytes those copies move.
    """

    def __init__(self) -> None:
        self.leaves: List[torch.Tensor] = []
        self.paths: List[FieldPath] = []
        self._slot_of: Dict[int, int] = {}
        # What stock ``cast_data`` would copy: one per occurrence.
        self.stock_copies = 0
        self.stock_bytes = 0
        self._in_worker = torch.utils.data.get_worker_info() is not None

    def leaf(self, tensor: torch.Tensor, path: FieldPath) -> Leaf:
        """Gives ``tensor`` a slot (its first one if it occurred before).

        Args:
            tensor (Tensor): A tensor stock would move.
            path (tuple): Where it is in the tree.

        Returns:
            Leaf: The node that unpacks to its view.

        Raises:
            PackingError: A non-CPU tensor inside a DataLoader worker, or a
                tensor on another device than the first leaf.
        """
        self.stock_copies += 1
        self.stock_bytes += tensor.numel() * tensor.element_size()
        slot = self._slot_of.get(id(tensor))
        if slot is None:
            if self._in_worker and tensor.device.type != 'cpu':
                raise PackingError(
                    f'{describe_path(path)} is a tensor on {tensor.device} '
                    'inside a DataLoader worker: workers must produce CPU '
                    'tensors.')
            if self.leaves and tensor.device != self.leaves[0].device:
                raise PackingError(
                    f'{describe_path(path)} is on {tensor.device} but '
                    f'{describe_path(self.paths[0])} is on '
                    f'{self.leaves[0].device}: a packed batch must have all '
                    'its tensors on one device.')
            slot = len(self.leaves)
            self._slot_of[id(tensor)] = slot
            self.leaves.append(tensor)
            self.paths.append(path)
        return Leaf(slot)

    def cast(self, data: Any, path: FieldPath) -> Node:
        """Mirrors ``BaseDataPreprocessor.cast_data``."""
        if isinstance(data, torch.Tensor):
            return self.leaf(data, path)
        if isinstance(data, BaseDataElement):
            return self.element(data, path)
        if isinstance(data, Mapping):
            return MappingNode(
                type(data),
                [(k, self.cast(data[k], path + (k, ))) for k in data])
        if isinstance(data, (str, bytes)) or data is None:
            return Const(data)
        if isinstance(data, tuple) and hasattr(data, '_fields'):
            return SequenceNode(
                type(data),
                [self.cast(v, path + (i, )) for i, v in enumerate(data)],
                named=True)
        if isinstance(data, Sequence):
            return SequenceNode(
                type(data),
                [self.cast(v, path + (i, )) for i, v in enumerate(data)],
                named=False)
        return Const(data)

    def field(self, value: Any, path: FieldPath) -> Node:
        """Mirrors ``BaseDataElement.to``: one level, ``.to`` where it exists.
        """
        if isinstance(value, torch.Tensor):
            return self.leaf(value, path)
        if isinstance(value, BaseDataElement):
            return self.element(value, path)
        if not hasattr(value, 'to'):
            return Const(value)
        adapter = find_adapter(type(value))
        if adapter is None:
            return Movable(value)
        try:
            tensors, aux = adapter.flatten(value)
        except Exception as exc:
            raise PackingError(
                f'{describe_path(path)}: the adapter for '
                f'{type(value).__qualname__} failed: {exc!r}') from exc
        fields = [(key, self.field(t, path + ('.' + key, )))
                  for key, t in tensors.items()]
        return AdapterNode(type(value), aux, fields)

    def element(self, elem: BaseDataElement, path: FieldPath) -> ElementNode:
        """A ``BaseDataElement``: its data fields walked, the rest kept."""
        state = elem.__dict__
        static = dict(state)
        fields = []
        seen = set()
        for name in sorted(data_element_fields(elem)[1]):
            # DetDataSample & co. keep property-backed fields as `_name`, and
            # `_data_fields` may hold both spellings: one entry per value.
            key = name if name in state else '_' + name
            if key not in seen:
                seen.add(key)
                static[key] = None  # keeps the key's place in __dict__
                fields.append((key,
                               self.field(state[key],
                                          path + ('.' + name.lstrip('_'), ))))
        return ElementNode(type(elem), static, fields)
