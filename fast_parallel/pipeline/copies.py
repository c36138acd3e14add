"""Copies the workers can leave out, and the checks that make it exact.

Stock ``MultiImageMixDataset`` deep-copies each sample it loads and the
results before every transform. :func:`as_deepcopied` gives a transform's
input what a deep copy would have been for it, copying only what a deep copy
would make differ (array layout, views); :func:`fresh_results_why` says when
a dataset's items are new objects nothing else holds, so that copying them
changes nothing. Why each step is exact: ``docs/pipeline.md``.
"""
import copy
import random as py_random
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.dataset import BaseDataset

__all__ = ['as_deepcopied', 'fresh_results_why', 'RandomStates']

#: Load transforms whose output is a new object, made from the file and the
#: info alone: no random draw, no state kept (by class name).
FRESH_LOADS = frozenset(
    {'LoadImageFromFile', 'LoadAnnotations', 'FastLoadImageFromFile'})

_PLAIN = (str, bytes, int, float, bool, complex, type(None), np.generic)
_SCALARS = frozenset((str, bytes, int, float, bool, complex, type(None)))


def _box_types() -> tuple:
    from mmdet.structures.bbox import BaseBoxes
    return (BaseBoxes, )


def as_deepcopied(value: Any,
                  boxes: Optional[tuple] = None,
                  plain: Optional[Dict[int, Any]] = None) -> Any:
    """``value`` as a transform sees ``copy.deepcopy(value)``, if no one else
    holds any part of it.

    A numpy array that owns its C-contiguous data is kept (its deep copy
    would be the same bytes in the same layout); any other array is copied
    with the deep copy's own ``order='K'``. Dicts, lists and tuples are
    walked. Tensors keep their storage: a deep copy would give each one a
    copy of its whole storage, with the same strides, shared as before.
    Boxes (small) and any other object are deep-copied, as stock does; a
    structure that holds itself is deep-copied whole.

    Args:
        value: The results dict (or a part of it) about to be handed to a
            transform that cannot return None.
        boxes (tuple, optional): Box classes (found once by the caller).
        plain (dict[int, Any], optional): Nested containers found to hold
            only plain values, by id, kept by the caller for one sample: the
            covered transforms only replace top-level keys, so such a
            container stays plain while the sample is made.

    Returns:
        The value to hand to the transform.
    """
    boxes = _box_types() if boxes is None else boxes
    plain = {} if plain is None else plain
    try:
        return _walk(value, boxes, plain, {}, top=True)[0]
    except RecursionError:  # a structure that holds itself: stock's copy
        return copy.deepcopy(value)


def _walk(value: Any,
          boxes: tuple,
          plain: Dict[int, Any],
          memo: Dict[int, Tuple[Any, bool]],
          top: bool = False) -> Tuple[Any, bool]:
    """(what to hand over, whether ``value`` holds only plain values).

    ``memo``, as a deep copy's, hands over one object for an object met
    twice in one call.
    """
    found = memo.get(id(value))
    if found is None:
        found = memo[id(value)] = _walk_new(value, boxes, plain, memo, top)
    return found


def _walk_new(value: Any, boxes: tuple, plain: Dict[int, Any],
              memo: Dict[int, Tuple[Any,
                                    bool]], top: bool) -> Tuple[Any, bool]:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return copy.deepcopy(value), False
        if value.base is None and value.flags.c_contiguous and \
                value.flags.writeable:
            return value, False
        return value.copy(order='K'), False
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:
        if id(value) in plain:
            return value, True
        items = value.values() if kind is dict else value
        if _SCALARS.issuperset(map(type, items)):
            walked, all_plain = value, True
        else:
            pairs = [(v, True) if type(v) in _SCALARS else _walk(
                v, boxes, plain, memo) for v in items]
            all_plain = all(p for _, p in pairs)
            new = [v for v, _ in pairs]
            walked = value
            if any(a is not b for a, b in zip(new, items)):
                walked = dict(zip(value, new)) if kind is dict else kind(new)
        if all_plain and not top:
            plain[id(walked)] = walked  # held, so that no id is reused
        return walked, all_plain
    if isinstance(value, _PLAIN):
        return value, True
    if isinstance(value, boxes):
        # small; their deep copy clones the tensor (storage no longer shared)
        return copy.deepcopy(value), False
    if isinstance(value, torch.Tensor):
        return value, False
    return copy.deepcopy(value), False


def fresh_results_why(dataset: Any) -> Optional[str]:
    """Why ``dataset[i]`` may not be a new object made without randomness
    from the file and its info; None when it is.

    Args:
        dataset: The dataset a ``MultiImageMixDataset`` wraps.

    Returns:
        str | None: The reason, or None.
    """
    if not isinstance(dataset, BaseDataset):
        return f'{type(dataset).__name__} is not an mmengine BaseDataset'
    cls = type(dataset)
    for name in ('__getitem__', 'prepare_data', 'get_data_info'):
        if getattr(cls, name) is not getattr(BaseDataset, name):
            return f'{cls.__name__} overrides {name}'
    transforms: Sequence = getattr(dataset.pipeline, 'transforms', None)
    if transforms is None:
        return f'{cls.__name__}.pipeline is not a Compose'
    others = [
        type(t).__name__ for t in transforms
        if type(t).__name__ not in FRESH_LOADS
    ]
    if others:
        return f'its pipeline has {", ".join(others)}'
    return None


class RandomStates:
    """The three random states a transform may draw from, to tell whether a
    call drew from any of them."""

    __slots__ = ('numpy', 'python', 'torch')

    def __init__(self) -> None:
        self.numpy = np.random.get_state(legacy=False)
        self.python = py_random.getstate()
        self.torch = torch.random.get_rng_state()

    def same_as(self, other: 'RandomStates') -> bool:
        """Whether both hold the same states."""
        a, b = self.numpy, other.numpy
        return (a['state']['key'] == b['state']['key']).all() and \
            a['state']['pos'] == b['state']['pos'] and \
            a['has_gauss'] == b['has_gauss'] and \
            a['gauss'] == b['gauss'] and self.python == other.python and \
            torch.equal(self.torch, other.torch)
