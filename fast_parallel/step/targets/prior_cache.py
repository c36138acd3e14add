"""Each switched head's priors made once per feature map sizes.

A dense head calls ``prior_generator.grid_priors(featmap_sizes, ...)`` in
every ``loss_by_feat`` (and ``predict_by_feat``): per level an ``arange``
or two, a meshgrid, stacks and products, ~11 operations a level (FCOS's
five levels: 55 a step). The priors are a function of the sizes, dtype,
device and flags alone, so :class:`KeptPriors` computes them once for each
such key and hands out clones (new tensors with the same values: no caller
can change what is kept), one copy a level. Only mmdet's own
``MlvlPointGenerator`` and ``AnchorGenerator`` (exact classes) are wrapped,
per instance.
"""
import inspect
import operator
import threading
from collections import OrderedDict
from typing import Any, List

import torch
from torch import Tensor

__all__ = ['KeptPriors', 'keep_priors']

#: Keys (feature map sizes) kept per generator, and their bytes at most:
#: multi-scale training and keep-ratio batches (padded to a multiple of 32)
#: cycle through some dozens of sizes; a RetinaNet key at 800 x 1333 is
#: ~3 MB of anchors.
KEEP = 64
KEEP_BYTES = 64 * 2**20


class KeptPriors:
    """``grid_priors`` of one generator, kept per call's arguments.

    Args:
        generator: An mmdet prior generator.
    """

    def __init__(self, generator: Any) -> None:
        self.method = type(generator).grid_priors.__get__(generator)
        self.signature = inspect.signature(self.method)
        self.kept: 'OrderedDict[tuple, List[Tensor]]' = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> List[Tensor]:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:  # stock's own error, as stock raises it
            return self.method(*args, **kwargs)
        bound.apply_defaults()
        key = _key(bound.arguments)
        if key is None:
            return self.method(*args, **kwargs)
        with self.lock:  # DataParallel's replicas share this object
            priors = self.kept.get(key)
            if priors is None:
                priors = self.method(*args, **kwargs)
                if not _plain_list(priors):
                    return priors
                self.kept[key] = priors
                self.bytes += _nbytes(priors)
                while len(self.kept) > KEEP or (self.bytes > KEEP_BYTES
                                                and len(self.kept) > 1):
                    self.bytes -= _nbytes(self.kept.popitem(last=False)[1])
            else:
                self.kept.move_to_end(key)
            return [p.clone() for p in priors]

    def __deepcopy__(self, memo: dict) -> 'KeptPriors':
        # a copied generator (an EMA model's) gets its own, empty
        generator = self.method.__self__
        return KeptPriors(memo.get(id(generator), generator))

    def __reduce__(self) -> Any:
        return (KeptPriors, (self.method.__self__, ))


def _key(arguments: dict) -> Any:
    """A hashable key of ``grid_priors``' arguments, or None where one is
    not plain (then nothing is kept): sizes that are not integers (stock's
    ``arange`` of 2.5 has 3 steps), a device without an index (``'cuda'``
    is whichever is current)."""
    key = []
    for name, value in arguments.items():
        if name == 'featmap_sizes':
            try:
                value = tuple(tuple(_size(v) for v in s) for s in value)
            except (TypeError, ValueError):
                return None
        elif name == 'device':
            try:
                value = torch.device(value)
            except (TypeError, RuntimeError):
                return None
            if value.type != 'cpu' and value.index is None:
                return None
        elif not isinstance(value, (bool, int, float, str, torch.dtype)):
            return None
        key.append((name, value))
    return tuple(key)


def _size(value: Any) -> int:
    """An integer size as it is (``operator.index``); TypeError else."""
    if type(value) is bool:
        raise TypeError('bool')
    return operator.index(value)


def _nbytes(priors: List[Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in priors)


def _plain_list(priors: Any) -> bool:
    return isinstance(priors, list) and all(
        type(p) is Tensor and not p.requires_grad for p in priors)


def keep_priors(head: Any) -> bool:
    """Wraps ``head.prior_generator.grid_priors`` (this instance only) in
    :class:`KeptPriors`, for mmdet's point and anchor generators.

    Args:
        head: A dense head.

    Returns:
        bool: Whether its priors are kept.
    """
    from mmdet.models.task_modules.prior_generators import (AnchorGenerator,
                                                            MlvlPointGenerator)
    generator = getattr(head, 'prior_generator', None)
    if type(generator) not in (AnchorGenerator, MlvlPointGenerator):
        return False
    if not isinstance(vars(generator).get('grid_priors'), KeptPriors):
        generator.grid_priors = KeptPriors(generator)
    return True
