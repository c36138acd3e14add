"""Shared test helpers: exact structural equality of collated batches."""
from typing import Any, List, Tuple

import numpy as np
import torch
from mmengine.structures import BaseDataElement


def _bits(t: torch.Tensor) -> torch.Tensor:
    # A fresh contiguous copy: a view of a size-1 dimension can be
    # "contiguous" with any stride, and viewing it as bytes needs stride 1.
    flat = t.detach().cpu().clone(
        memory_format=torch.contiguous_format).reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else flat


def assert_same_tree(a: Any, b: Any, path: str = '<batch>') -> None:
    """Asserts two collated structures are the same, bit for bit.

    Same container and element types, metainfo, dtypes, shapes, strides,
    devices, ``requires_grad`` and values (compared as raw bytes, so NaN
    payloads and signed zeros count).
    """
    assert type(a) is type(b), f'{path}: {type(a)} != {type(b)}'
    if a is b:
        return
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f'{path}: dtype {a.dtype} != {b.dtype}'
        assert a.shape == b.shape, f'{path}: shape {a.shape} != {b.shape}'
        if a.layout == torch.strided:  # a Conv2d's result depends on them
            assert a.stride() == b.stride(), \
                f'{path}: stride {a.stride()} != {b.stride()}'
        assert a.device == b.device, f'{path}: {a.device} != {b.device}'
        assert a.requires_grad == b.requires_grad, f'{path}: requires_grad'
        assert torch.equal(_bits(a), _bits(b)), f'{path}: values differ'
    elif isinstance(a, BaseDataElement):
        assert set(a.metainfo_keys()) == set(b.metainfo_keys()), path
        for k in a.metainfo_keys():
            assert_same_tree(a.metainfo[k], b.metainfo[k], f'{path}.{k}')
        assert set(a.keys()) == set(b.keys()), f'{path}: data fields'
        for k in a.keys():
            assert_same_tree(getattr(a, k), getattr(b, k), f'{path}.{k}')
    elif isinstance(a, dict):
        assert list(a) == list(b), f'{path}: keys {list(a)} != {list(b)}'
        for k in a:
            assert_same_tree(a[k], b[k], f'{path}[{k!r}]')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f'{path}: len {len(a)} != {len(b)}'
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f'{path}[{i}]')
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), f'{path}: values differ'
    elif hasattr(a, '__dict__') and not isinstance(a, type):
        assert_same_tree(vars(a), vars(b), f'{path}.__dict__')
    else:
        assert a == b or (a != a and b != b), f'{path}: {a!r} != {b!r}'


def tensor_layouts(tree: Any, path: str = '<batch>') -> List[Tuple]:
    """Every tensor of a collated structure, with its layout.

    For batches whose values cannot be read (tensors on the ``meta``
    device), where ``assert_same_tree`` cannot compare them.

    Args:
        tree: A collated structure.
        path (str): The name of ``tree`` in the paths. Defaults to
            ``'<batch>'``.

    Returns:
        list[tuple]: ``(path, shape, stride, dtype, device)`` per tensor, in
        a fixed order (data-element fields sorted by name).
    """
    if isinstance(tree, torch.Tensor):
        return [(path, tuple(tree.shape), tree.stride(), tree.dtype,
                 tree.device)]
    if isinstance(tree, BaseDataElement):
        items = [(f'{path}.{k}', getattr(tree, k))
                 for k in sorted(tree.keys())]
    elif isinstance(tree, dict):
        items = [(f'{path}[{k!r}]', v) for k, v in tree.items()]
    elif isinstance(tree, (list, tuple)):
        items = [(f'{path}[{i}]', v) for i, v in enumerate(tree)]
    elif hasattr(tree, '__dict__') and not isinstance(tree, type):
        items = [(f'{path}.{k}', v) for k, v in vars(tree).items()]
    else:
        return []
    return [entry for p, v in items for entry in tensor_layouts(v, p)]
