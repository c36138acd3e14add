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
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
from mmengine.dataset import BaseDataset

from fast_parallel.pipeline.cache import lent
from fast_parallel.pipeline.unread import DeferredImage

__all__ = [
    'as_deepcopied', 'flipped_copy', 'fresh_results_why', 'holds_only_plain',
    'RandomStates', 'sample_is_plain'
]

#: Load transforms whose output is a new object, made from the file and the
#: info alone: no random draw, no state kept (by class name).
FRESH_LOADS = frozenset(
    {'LoadImageFromFile', 'LoadAnnotations', 'FastLoadImageFromFile'})

_PLAIN = (str, bytes, int, float, bool, complex, type(None), np.generic)
_SCALARS = frozenset((str, bytes, int, float, bool, complex, type(None)))

#: The dtypes OpenCV's binding takes and returns as they are.
CV_NATIVE = frozenset(
    np.dtype(t)
    for t in (np.uint8, np.int8, np.uint16, np.int16, np.float32, np.float64))


def flipped_copy(img: np.ndarray) -> Optional[np.ndarray]:
    """``img.copy(order='K')`` of a flipped image view, made by OpenCV.

    ``np.flip`` (mmcv's ``imflip``) gives a view with a negative stride;
    numpy copies it an element group at a time, and OpenCV's binding copies
    it the same way before any call. Flipping the positive view back with
    ``cv2.flip`` gives the same bytes, C-ordered, in row-sized copies.

    Args:
        img (np.ndarray): An image.

    Returns:
        np.ndarray | None: The copy (C-contiguous, owning its memory), or
        None where ``img`` is not a flipped 2-D or 2..4-channel image (a
        plain ``np.ndarray``) of an OpenCV dtype whose rows lie in stride
        order, a whole number of elements apart (then copy it as before).
    """
    if type(img) is not np.ndarray or img.dtype not in CV_NATIVE or \
            img.ndim not in (2, 3) or img.size == 0 or \
            (img.ndim == 3 and not 2 <= img.shape[2] <= 4):
        return None
    row, col = img.strides[:2]
    if (row >= 0 and col >= 0) or abs(row) % img.itemsize or \
            abs(col) != img.itemsize * (
            1 if img.ndim == 2 else img.shape[2]) or \
            abs(row) < abs(col) * img.shape[1] or \
            (img.ndim == 3 and img.strides[2] != img.itemsize):
        return None
    code = 1 if row > 0 else (0 if col > 0 else -1)
    positive = img[::1 if row > 0 else -1, ::1 if col > 0 else -1]
    return cv2.flip(positive, code)


def holds_only_plain(value: Any, known: frozenset = frozenset()) -> bool:
    """Whether ``value`` is made of dicts, lists and tuples of Python
    scalars, strings, numpy scalars, numpy arrays of plain dtypes and
    objects of the ``known`` classes only: a deep copy of it draws nothing
    and cannot fail, so leaving one out changes nothing but its copies.

    Args:
        value: Any object.
        known (frozenset): Classes (exact) whose deep copy draws nothing
            and cannot fail, e.g. mmdet's boxes. Defaults to none.

    Returns:
        bool: True when plain (a structure holding itself is not).
    """
    try:
        return _plain(value, known)
    except RecursionError:
        return False


def sample_is_plain(results: Any) -> bool:
    """Whether a results dict (and its ``mix_results``) holds only plain
    data (:func:`holds_only_plain`) and mmdet's boxes and masks: the deep
    copies a stock transform makes of it draw nothing and cannot fail, so
    a fast form that leaves them out gives the same draws and errors.

    Args:
        results: A results dict (a cache entry, a mix result).

    Returns:
        bool: True when the copies can be left out.
    """
    if type(results) is not dict:
        return False
    known = _known_structures()
    for key, value in results.items():
        if key == 'mix_results' and type(value) is list:
            if not all(map(sample_is_plain, value)):
                return False
        elif not holds_only_plain(value, known):
            return False
    return True


def _known_structures() -> frozenset:
    """mmdet's boxes and masks, whose deep copies draw nothing, and the
    images a fast Mosaic decodes when it reads them."""
    from mmdet.structures.bbox import HorizontalBoxes
    from mmdet.structures.mask import BitmapMasks, PolygonMasks
    return frozenset(
        (HorizontalBoxes, BitmapMasks, PolygonMasks, DeferredImage))


def _plain(value: Any, known: frozenset) -> bool:
    kind = type(value)
    if kind in _SCALARS or kind in known:
        return True
    if kind is dict or kind is list or kind is tuple:
        items = value.values() if kind is dict else value
        if kind is dict and not _SCALARS.issuperset(map(type, value)):
            return False
        return _SCALARS.issuperset(map(type, items)) or all(
            _plain(item, known) for item in items)
    if kind is np.ndarray:
        return not value.dtype.hasobject
    return isinstance(value, np.generic) and not isinstance(value, np.object_)


def _scalar_tree(value: Any, depth: int) -> bool:
    """Whether ``value`` is dicts (of scalar keys), lists and tuples of
    Python scalars, at most ``depth`` containers deep (a dataset info's
    ``instances``, their boxes and polygons): plain, checked without the
    walk's bookkeeping."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth <= 0 or not (kind is list or kind is tuple or kind is dict):
        return False
    if kind is dict:
        if not _SCALARS.issuperset(map(type, value)):
            return False
        value = value.values()
    return _SCALARS.issuperset(map(type, value)) or all(
        _scalar_tree(item, depth - 1) for item in value)


def _box_types() -> tuple:
    from mmdet.structures.bbox import BaseBoxes
    return (BaseBoxes, )


def as_deepcopied(value: Any,
                  boxes: Optional[tuple] = None,
                  plain: Optional[Dict[int, Any]] = None,
                  keep_lent: bool = False) -> Any:
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
        keep_lent (bool): Keep the cache's read-only views
            (:func:`~fast_parallel.pipeline.cache.lent`) as they are, for a
            transform that only reads them (a fast Mosaic or MixUp); they
            are copied otherwise. Defaults to False.

    Returns:
        The value to hand to the transform.
    """
    boxes = _box_types() if boxes is None else boxes
    plain = {} if plain is None else plain
    # (deeper than a quarter of the recursion limit, where a deep copy may
    # run out of stack: stock's copy, which then fails or not as stock's)
    levels = sys.getrecursionlimit() // 4
    try:
        return _walk(value, boxes, plain, {}, keep_lent, levels, top=True)[0]
    except RecursionError:  # a structure that holds itself: stock's copy
        return copy.deepcopy(value)


def _walk(value: Any,
          boxes: tuple,
          plain: Dict[int, Any],
          memo: Dict[int, Tuple[Any, bool]],
          keep_lent: bool,
          levels: int,
          top: bool = False) -> Tuple[Any, bool]:
    """(what to hand over, whether ``value`` holds only plain values).

    ``memo``, as a deep copy's, hands over one object for an object met
    twice in one call.
    """
    found = memo.get(id(value))
    if found is None:
        found = memo[id(value)] = _walk_new(value, boxes, plain, memo,
                                            keep_lent, levels, top)
    return found


def _walk_new(value: Any, boxes: tuple, plain: Dict[int, Any],
              memo: Dict[int, Tuple[Any, bool]], keep_lent: bool, levels: int,
              top: bool) -> Tuple[Any, bool]:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return copy.deepcopy(value), False
        if value.base is None and value.flags.c_contiguous and \
                value.flags.writeable:
            return value, False
        if keep_lent and lent(value):  # for a fast Mosaic / MixUp to read
            return value, False
        flipped = flipped_copy(value)
        return (value.copy(order='K') if flipped is None else flipped), False
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:
        if id(value) in plain:
            return value, True
        if levels <= 0:
            raise RecursionError('deeper than the walk goes')
        items = value.values() if kind is dict else value
        walked, all_plain = value, True
        if not _SCALARS.issuperset(map(type, items)):
            new, changed = [], False
            for v in items:
                item = type(v)
                if item in _SCALARS:
                    new.append(v)
                    continue
                if item is tuple or item is list or item is dict:
                    if id(v) in plain:
                        new.append(v)
                        continue
                    if _scalar_tree(v, 4):
                        plain[id(v)] = v  # (held: no id is reused)
                        new.append(v)  # (plain: handed over as it is, as
                        continue  # walked; an info's instances, say)
                if item is np.ndarray and v.base is None and \
                        v.flags.c_contiguous and v.flags.writeable and \
                        not v.dtype.hasobject:
                    handed, v_plain = v, False  # (as walked: kept)
                else:
                    handed, v_plain = _walk(v, boxes, plain, memo, keep_lent,
                                            levels - 1)
                all_plain = all_plain and v_plain
                changed = changed or handed is not v
                new.append(handed)
            if changed:
                walked = dict(zip(value, new)) if kind is dict else kind(new)
        if all_plain and not top:
            plain[id(walked)] = walked  # held, so that no id is reused
        return walked, all_plain
    if isinstance(value, _PLAIN):
        return value, True
    if isinstance(value, boxes):
        # small; their deep copy clones the tensor (storage no longer shared)
        return copy.deepcopy(value), False
    if isinstance(value, torch.Tensor) or type(value) is DeferredImage:
        return value, False  # (a deferred image's deep copy is itself)
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
