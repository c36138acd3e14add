"""Shared test helpers: exact structural equality of collated batches."""
from typing import Any

import numpy as np
import torch
from mmengine.structures import BaseDataElement


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1).contiguous().cpu()
    return flat.view(torch.uint8) if flat.numel() else flat


def assert_same_tree(a: Any, b: Any, path: str = '<batch>') -> None:
    """Asserts two collated structures are the same, bit for bit.

    Same container and element types, metainfo, dtypes, shapes, devices,
    ``requires_grad`` and values (compared as raw bytes, so NaN payloads and
    signed zeros count).
    """
    assert type(a) is type(b), f'{path}: {type(a)} != {type(b)}'
    if a is b:
        return
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f'{path}: dtype {a.dtype} != {b.dtype}'
        assert a.shape == b.shape, f'{path}: shape {a.shape} != {b.shape}'
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
