"""The adapter table: how the packer carries structure types it must open.

An adapter splits an object into its tensors (which travel in the packed
buffers) and a small picklable rest, and rebuilds it from the two. The packer
uses an adapter where stock mmengine would call the object's ``.to()`` (a
data field of a ``BaseDataElement``); without an adapter such an object still
travels, untouched, and gets its own ``.to()`` after the batch is moved.

Teaching the packer a new type takes a few lines::

    from fast_parallel import register_adapter

    class Polygons:                      # holds `.coords` and `.closed`
        ...

    register_adapter(
        Polygons,
        flatten=lambda p: ({'coords': p.coords}, p.closed),
        unflatten=lambda cls, t, closed: cls(t['coords'], closed))

or, for a class whose state is its ``__dict__`` with one tensor attribute,
``register_tensor_holder(Polygons, attr='coords')``.

The adapters for mmdet (``BaseBoxes``) and mmdet3d (``BaseInstance3DBoxes``,
``BasePoints``) register themselves the first time the packer meets an object
from those packages, so importing fast_parallel never imports them.
"""
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import torch

Flatten = Callable[[Any], Tuple[Dict[str, Any], Any]]
Unflatten = Callable[[type, Dict[str, Any], Any], Any]


class Adapter(NamedTuple):
    """How to open and rebuild one structure type.

    Attributes:
        flatten (callable): ``obj -> (tensors, aux)``; ``tensors`` maps
            names to tensors (or other packable values), ``aux`` is
            anything picklable.
        unflatten (callable): ``(cls, tensors, aux) -> obj``.
    """
    flatten: Flatten
    unflatten: Unflatten


_ADAPTERS: Dict[type, Adapter] = {}
_RESOLVED: Dict[type, Optional[Adapter]] = {}


def register_adapter(cls: type, flatten: Flatten,
                     unflatten: Unflatten) -> None:
    """Teaches the packer a structure type (and its subclasses).

    Args:
        cls (type): The type.
        flatten (callable): ``obj -> (dict of tensors, picklable aux)``.
        unflatten (callable): ``(cls, dict of tensors, aux) -> obj``; ``cls``
            is the object's own (sub)class.
    """
    _ADAPTERS[cls] = Adapter(flatten, unflatten)
    _RESOLVED.clear()


def register_tensor_holder(cls: type, attr: str = 'tensor') -> None:
    """Registers a type whose state is its ``__dict__`` with one tensor.

    The rebuilt object gets the same ``__dict__`` (``box_dim``,
    ``with_yaw``, ``points_dim``, ``attribute_dims``, ...) with the tensor
    replaced, without calling ``__init__`` again.

    Args:
        cls (type): The type.
        attr (str): The attribute holding the tensor. Defaults to 'tensor'.
    """

    def flatten(obj: Any) -> Tuple[Dict[str, Any], Any]:
        state = dict(obj.__dict__)
        tensor = state[attr]
        state[attr] = None  # keeps the attribute's place in __dict__
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f'.{attr} is {type(tensor).__qualname__}, '
                            'not a tensor')
        return {attr: tensor}, state

    def unflatten(klass: type, tensors: Dict[str, Any], state: Any) -> Any:
        obj = klass.__new__(klass)
        obj.__dict__.update(state)
        obj.__dict__[attr] = tensors[attr]
        return obj

    register_adapter(cls, flatten, unflatten)


def _register_mmdet() -> None:
    from mmdet.structures.bbox import BaseBoxes
    register_tensor_holder(BaseBoxes)


def _register_mmdet3d() -> None:
    from mmdet3d.structures import BaseInstance3DBoxes, BasePoints
    register_tensor_holder(BaseInstance3DBoxes)
    register_tensor_holder(BasePoints)


# Top-level package -> registrar, run once, when an object of it shows up.
_LAZY: Dict[str, Callable[[], None]] = {
    'mmdet': _register_mmdet,
    'mmdet3d': _register_mmdet3d,
}


def find_adapter(cls: type) -> Optional[Adapter]:
    """Returns the adapter for ``cls`` (or a base class), or None.

    Args:
        cls (type): The type of an object met by the packer.

    Returns:
        Adapter or None: The adapter, None when the type has none.
    """
    try:
        return _RESOLVED[cls]
    except KeyError:
        pass
    registrar = _LAZY.pop(cls.__module__.split('.')[0], None)
    if registrar is not None:
        registrar()
    adapter = next((_ADAPTERS[k] for k in cls.__mro__ if k in _ADAPTERS), None)
    _RESOLVED[cls] = adapter
    return adapter
