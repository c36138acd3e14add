"""Buffer layout: where each tensor leaf's span lives in its dtype's buffer.

:func:`plan_layout` places the leaves, :func:`fill_buffers` copies them in,
and :func:`dense_copy` makes what stock's ``Tensor.to`` makes of a leaf that
is not dense. Why strides come out as stock's: ``docs/packing.md``.
"""
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

__all__ = [
    'ALIGN_BYTES', 'LayoutEntry', 'dense_copy', 'fill_buffers', 'plan_layout'
]

#: Every leaf starts at an offset that is a multiple of this many bytes.
ALIGN_BYTES = 64


class LayoutEntry(NamedTuple):
    """Where one leaf slot's view lies in its dtype's buffer.

    A ``NamedTuple``: it pickles as cheaply as a tuple through the
    DataLoader's worker queues, and unpacks like one.

    Attributes:
        dtype (torch.dtype): The leaf's dtype, i.e. its buffer.
        offset (int): Where the view starts, in elements of that buffer.
        shape (tuple[int]): The leaf's original shape.
        stride (tuple[int]): The leaf's original strides.
        requires_grad (bool): The leaf's ``requires_grad``.
        moved_stride (tuple[int], optional): None when the leaf is
            non-overlapping and dense, else the strides stock's
            ``Tensor.to`` gives it on another device.
    """

    dtype: torch.dtype
    offset: int
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    requires_grad: bool
    moved_stride: Optional[Tuple[int, ...]]


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


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


def plan_layout(
    leaves: List[torch.Tensor]
) -> Tuple[Dict[torch.dtype, int], List[LayoutEntry], List[Optional[int]]]:
    """Places each leaf's span in its dtype's buffer.

    Args:
        leaves (list[Tensor]): The distinct tensor leaves, in slot order.

    Returns:
        tuple: ``sizes`` (elements per dtype buffer), ``layout`` (one
        :class:`LayoutEntry` per leaf) and ``runs``: per leaf None when it
        is contiguous (its span is its elements), else its span.
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
        layout.append(
            LayoutEntry(t.dtype, start, shape, stride, t.requires_grad,
                        moved_stride))
        runs.append(run)
        sizes[t.dtype] = start + _aligned(span * itemsize) // itemsize
    return sizes, layout, runs


@torch.no_grad()  # the buffers never join a graph; no detach() per leaf
def fill_buffers(buffers: Dict[torch.dtype,
                               torch.Tensor], leaves: List[torch.Tensor],
                 layout: List[LayoutEntry], runs: List[Optional[int]]) -> None:
    """Copies each leaf's span into its place (see :func:`plan_layout`).

    Args:
        buffers (dict[torch.dtype, Tensor]): The 1-D buffers.
        leaves (list[Tensor]): The leaves, in slot order.
        layout (list[LayoutEntry]): From :func:`plan_layout`.
        runs (list[int | None]): From :func:`plan_layout`.
    """
    for t, run, entry in zip(leaves, runs, layout):
        if run is None:
            if t.numel():
                buffers[entry.dtype].as_strided(entry.shape, entry.stride,
                                                entry.offset).copy_(t)
        elif run:
            # The storage the view touches as one 1-D run (gaps included,
            # an expanded view's elements once); ``unpack`` lays the
            # original strides over it from ``offset``.
            source = t.as_strided((run, ), (1, ), t.storage_offset())
            buffers[entry.dtype].narrow(0, entry.offset, run).copy_(source)


def dense_copy(view: torch.Tensor, stride: Tuple[int, ...]) -> torch.Tensor:
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
    out = torch.empty_strided(
        view.shape, stride, dtype=view.dtype, device=view.device)
    return out.copy_(view)
