"""Buckets of the fused optimizer step: which tensors share a functional call.

A bucket is keyed by everything that picks the functional's code path, so
every tensor takes the path it takes in stock; why that gives stock's bytes
is in ``docs/step.md``.
"""
import numbers
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch
from torch import Tensor

from fast_parallel.compat.optim import default_to_fused_or_foreach

__all__ = [
    'SGD_KEYS', 'ADAM_KEYS', 'Bucket', 'number_key', 'hyper_key',
    'fast_route_safe', 'slices', 'add_to_buckets', 'sgd_foreach',
    'adam_foreach'
]

#: Group keys ``torch.optim.sgd.sgd`` reads, besides tensors and path flags.
SGD_KEYS = ('lr', 'momentum', 'dampening', 'weight_decay', 'nesterov',
            'maximize')
#: Group keys ``torch.optim.adam.adam`` reads, besides tensors and path flags.
ADAM_KEYS = ('lr', 'betas', 'eps', 'weight_decay', 'amsgrad', 'maximize',
             'decoupled_weight_decay')


class Bucket:
    """The tensors of one functional call and the group it takes scalars from.

    Args:
        group (dict): The first param group in the bucket; every group in it
            has the same hyper-parameters.
        foreach (bool): The resolved ``foreach`` of the bucket's groups.
        num_lists (int): Number of tensor lists the functional takes.
    """

    def __init__(self, group: Dict[str, Any], foreach: bool,
                 num_lists: int) -> None:
        self.group = group
        self.foreach = foreach
        self.lists: List[list] = [[] for _ in range(num_lists)]
        self.has_sparse_grad = False
        self.has_complex = False

    def extend(self, lists: List[list]) -> None:
        """Appends one slice's tensors, list by list."""
        for mine, theirs in zip(self.lists, lists):
            mine.extend(theirs)


# --------------------------------------------------------------- keys ---


def number_key(value: Any) -> Optional[Hashable]:
    """An exact key for a hyper-parameter, or None if it is no plain number.

    Floats are keyed by their exact hex form (``-0.0`` and ``0.0`` differ),
    and every value by its type, so only values that reach the kernels
    identically share a bucket.

    Args:
        value: A hyper-parameter of a param group.

    Returns:
        Hashable, optional: The key, or None.
    """
    kind = type(value)
    if kind is float:  # the common case first: this runs per group per step
        return (kind, value.hex())
    if kind in (bool, int, str) or value is None:
        return (kind, value)
    if kind is tuple:
        keys = tuple(number_key(v) for v in value)
        return None if None in keys else (kind, keys)
    if isinstance(value, numbers.Integral):  # numpy integers
        return (kind, int(value))
    if isinstance(value, numbers.Real):  # numpy floats
        return (kind, float(value).hex())
    return None  # a Tensor lr/weight_decay, or anything unknown


def hyper_key(group: Dict[str, Any], keys: Tuple[str, ...]) -> Hashable:
    """The group's hyper-parameters as a key; a unique one if not numbers.

    Args:
        group (dict): A param group.
        keys (tuple[str]): :data:`SGD_KEYS` or :data:`ADAM_KEYS`.

    Returns:
        Hashable: The key.
    """
    parts = tuple(number_key(group[k]) for k in keys)
    if any(part is None for part in parts):
        return ('own group', id(group))
    return parts


def fast_route_safe(tensor_lists: List[list], index: int) -> bool:
    """Whether entry ``index`` can never knock a list off the fast route.

    CUDA's multi-tensor kernels run a list on the fast route only when every
    tensor is dense, non-overlapping, and shaped, strided and typed like its
    counterparts (``ATen/native/ForeachUtils.h``); otherwise the whole list
    takes the per-tensor path. Contiguous tensors of the parameter's shape,
    dtype and device always qualify, so they can share a call with others.

    Args:
        tensor_lists (list[list]): The lists the kernels take, params first.
        index (int): The entry to check, in every list.

    Returns:
        bool: True if the entry can share a call.
    """
    param = tensor_lists[0][index]
    if param.layout != torch.strided or param.numel() == 0:
        return False
    for tensors in tensor_lists:
        tensor = tensors[index] if tensors else None
        if tensor is None:
            continue
        if (tensor.layout != torch.strided or tensor.shape != param.shape
                or tensor.dtype != param.dtype or tensor.device != param.device
                or not tensor.is_contiguous()):
            return False
    return True


def slices(params: List[Tensor]) -> List[List[int]]:
    """Indices of ``params`` by (device, dtype), in first-seen order.

    Args:
        params (list[Tensor]): A group's parameters with gradients.

    Returns:
        list[list[int]]: One list of indices per (device, dtype).
    """
    if len(params) == 1:
        return [[0]]
    found: Dict[Tuple[torch.device, torch.dtype], List[int]] = OrderedDict()
    for i, param in enumerate(params):
        found.setdefault((param.device, param.dtype), []).append(i)
    return list(found.values())


def add_to_buckets(buckets: Dict[Hashable, Bucket], group: Dict[str, Any],
                   base_key: Hashable, foreach: bool, tensor_lists: List[list],
                   path_flag: Callable[[List[int]], Hashable],
                   checked: int) -> List[Bucket]:
    """Distributes one group's gathered tensors over the buckets.

    Args:
        buckets (dict): Buckets by key, filled in place.
        group (dict): The param group the tensors come from.
        base_key (Hashable): The group's hyper-parameter key.
        foreach (bool): The group's resolved ``foreach``.
        tensor_lists (list[list]): The lists the functional takes, params
            first, as torch's ``_init_group`` gathered them; empty lists
            (``max_exp_avg_sqs`` without amsgrad) stay empty.
        path_flag (Callable): Gives, for a slice's indices, whatever else
            picks the functional's code path for that slice.
        checked (int): How many leading lists the multi-tensor kernels take
            on the parameters' device (Adam's CPU ``state_steps`` are not).

    Returns:
        list[Bucket]: The buckets this group's tensors went to.
    """
    touched = []
    for index, indices in enumerate(slices(tensor_lists[0])):
        key: Hashable = (base_key, foreach, path_flag(indices))
        if foreach and not all(
                fast_route_safe(tensor_lists[:checked], i) for i in indices):
            key = ('own slice', id(group), index)
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = Bucket(group, foreach, len(tensor_lists))
        bucket.extend([[tensors[i] for i in indices] if tensors else []
                       for tensors in tensor_lists])
        touched.append(bucket)
    return touched


# ------------------------------------------------------------ foreach ---


def sgd_foreach(group: Dict[str, Any], params: List[Tensor]) -> bool:
    """``foreach`` as ``torch.optim.sgd.sgd`` resolves it for this group.

    Args:
        group (dict): An ``SGD`` param group.
        params (list[Tensor]): Its parameters.

    Returns:
        bool: The resolved ``foreach``.
    """
    foreach, fused = group['foreach'], group['fused']
    if foreach is None and fused is None:
        _, foreach = default_to_fused_or_foreach(
            params, differentiable=False, use_fused=False)
    return bool(foreach)


def adam_foreach(group: Dict[str, Any], params: List[Tensor]) -> bool:
    """``foreach`` as ``torch.optim.adam.adam`` resolves it for this group.

    Args:
        group (dict): An ``Adam`` / ``AdamW`` param group.
        params (list[Tensor]): Its parameters.

    Returns:
        bool: The resolved ``foreach``.
    """
    foreach, fused = group['foreach'], group['fused']
    if fused is None and foreach is None:
        _, foreach = default_to_fused_or_foreach(
            params, group['differentiable'], use_fused=False)
        if (foreach and isinstance(group['lr'], Tensor)
                and not group['capturable']):
            foreach = False
    return bool(foreach)
