"""Pack a collated batch into one flat buffer per dtype.

``pack(tree)`` walks a collated structure the way mmengine's
``BaseDataPreprocessor.cast_data`` does, copies every tensor stock would move
into one 1-D buffer per dtype and keeps a small picklable skeleton for the
rest; ``PackedBatch.to(device)`` then moves the batch with one copy per
buffer. What is preserved, and why strides match stock: ``docs/packing.md``.

The parts: :mod:`~fast_parallel.data.walker` (the walk),
:mod:`~fast_parallel.data.nodes` (the skeleton),
:mod:`~fast_parallel.data.layout` (the buffers' layout) and
:mod:`~fast_parallel.data.batch` (:class:`PackedBatch`).
"""
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from fast_parallel.data.batch import PackedBatch
from fast_parallel.data.layout import fill_buffers, plan_layout
from fast_parallel.data.walker import Packer

__all__ = ['pack', 'stock_transfers']


def stock_transfers(tree: Any) -> Tuple[int, int]:
    """What stock ``cast_data`` copies for ``tree``.

    Args:
        tree: A collated structure (e.g. ``pseudo_collate`` output).

    Returns:
        tuple[int, int]: The number of tensor copies and the bytes copied.
    """
    packer = Packer()
    packer.cast(tree, ())
    return packer.stock_copies, packer.stock_bytes


def pack(
    tree: Any,
    pin_memory: bool = False,
    allocate: Optional[Callable[[Dict[torch.dtype, int]],
                                Dict[torch.dtype, torch.Tensor]]] = None
) -> PackedBatch:
    """Packs a collated structure into one flat buffer per dtype.

    Args:
        tree: Any collated structure: dicts, lists, tuples, namedtuples,
            tensors, ``BaseDataElement`` (and subclasses), plus any type
            with an adapter (mmdet/mmdet3d boxes and points built in).
        pin_memory (bool): Allocate the buffers page-locked. Defaults to
            False.
        allocate (callable, optional): ``{dtype: numel} -> {dtype: 1-D
            tensor}`` providing CPU buffers of at least that many elements
            (the shared ring of :mod:`fast_parallel.data.ring`). Defaults to
            None: fresh buffers.

    Returns:
        PackedBatch: The packed batch.

    Raises:
        PackingError: A tensor that cannot be placed (mixed devices, a GPU
            tensor inside a DataLoader worker, a failing adapter); the
            message names the sample and the field path.
    """
    packer = Packer()
    skeleton = packer.cast(tree, ())
    leaves = packer.leaves
    if not leaves:
        return PackedBatch({}, [], skeleton)

    sizes, layout, runs = plan_layout(leaves)
    device = leaves[0].device
    buffers = None
    if allocate is not None and device.type == 'cpu':
        buffers = allocate(sizes)
    pin = False  # shared ring buffers are pageable
    if buffers is None:
        pin = pin_memory and device.type == 'cpu'
        buffers = {
            dt: torch.empty(n, dtype=dt, device=device, pin_memory=pin)
            for dt, n in sizes.items()
        }
    fill_buffers(buffers, leaves, layout, runs)
    return PackedBatch(buffers, layout, skeleton, pinned=pin)
