"""Splitting a collated batch by samples, and gathering the results.

``FastDataParallel`` uses these on more than one GPU; they are plain
functions so that the splitting and weighting rules are tested on CPU.
"""
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Sequence

import torch


def chunk_sizes(batch_size: int, num_chunks: int) -> List[int]:
    """Sizes of contiguous chunks that differ by at most one.

    Args:
        batch_size (int): Samples in the batch.
        num_chunks (int): Devices to spread them over.

    Returns:
        list[int]: ``min(batch_size, num_chunks)`` positive sizes summing to
        ``batch_size`` (the first ``batch_size % num_chunks`` one larger).
    """
    if num_chunks < 1:
        raise ValueError(f'num_chunks must be >= 1, got {num_chunks}')
    n = min(batch_size, num_chunks)
    if n == 0:
        return []
    base, extra = divmod(batch_size, n)
    return [base + (i < extra) for i in range(n)]


def batch_size_of(data: Any) -> Optional[int]:
    """The number of samples of a collated batch.

    Args:
        data: ``pseudo_collate`` output (per-sample lists) or
            ``default_collate`` output (stacked tensors).

    Returns:
        int or None: The length of the first per-sample list or stacked
        tensor found, None if there is none.
    """
    if isinstance(data, Mapping):
        for value in data.values():
            size = batch_size_of(value)
            if size is not None:
                return size
        return None
    if isinstance(data, tuple) and hasattr(data, '_fields'):
        for value in data:
            size = batch_size_of(value)
            if size is not None:
                return size
        return None
    if isinstance(data, (list, tuple)):
        return len(data)
    if isinstance(data, torch.Tensor) and data.dim() > 0:
        return data.shape[0]
    return None


def split_batch(data: Any, sizes: Sequence[int]) -> List[Any]:
    """Splits a collated batch into contiguous chunks of samples.

    Per-sample lists (and stacked tensors whose first dimension is the
    batch) are sliced; everything else is shared by all chunks.

    Args:
        data: A collated batch.
        sizes (Sequence[int]): Chunk sizes, from :func:`chunk_sizes`.

    Returns:
        list: One batch of the same structure per chunk.
    """
    total = sum(sizes)
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]

    def split(value: Any, path: str) -> List[Any]:
        if isinstance(value, Mapping):
            parts = {k: split(v, f'{path}[{k!r}]') for k, v in value.items()}
            return [
                type(value)({
                    k: parts[k][i]
                    for k in value
                }) for i in range(len(sizes))
            ]
        if isinstance(value, tuple) and hasattr(value, '_fields'):
            parts = [
                split(v, f'{path}.{f}') for f, v in zip(value._fields, value)
            ]
            return [
                type(value)(*(p[i] for p in parts)) for i in range(len(sizes))
            ]
        if isinstance(value, (list, tuple)):
            if len(value) != total:
                raise ValueError(
                    f'{path} has {len(value)} entries but the batch has '
                    f'{total} samples: cannot split it by samples')
            return [
                type(value)(value[bounds[i]:bounds[i + 1]])
                for i in range(len(sizes))
            ]
        if isinstance(value, torch.Tensor) and value.dim() > 0 \
                and value.shape[0] == total:
            return [value[bounds[i]:bounds[i + 1]] for i in range(len(sizes))]
        return [value] * len(sizes)

    return split(data, 'batch')


def gather_log_vars(per_chunk: Sequence[Dict[str, torch.Tensor]],
                    sizes: Sequence[int],
                    device: torch.device) -> Dict[str, torch.Tensor]:
    """Averages per-chunk losses, weighted by chunk size, on one device.

    With chunk sizes ``n_i`` and batch size ``B = sum(n_i)``, each entry is
    ``sum_i n_i / B * value_i``: the mean over the batch that one device
    would have computed when each chunk's loss is a per-sample mean.

    Args:
        per_chunk (Sequence[dict]): ``parse_losses`` log vars of each chunk
            (including ``'loss'``).
        sizes (Sequence[int]): Chunk sizes.
        device (torch.device): Where the result lives (the output device).

    Returns:
        dict: The gathered log vars; ``'loss'`` keeps its autograd graph.
    """
    total = float(sum(sizes))
    out: Dict[str, torch.Tensor] = type(per_chunk[0])()
    for key in per_chunk[0]:
        out[key] = sum(chunk[key].to(device) * (n / total)
                       for chunk, n in zip(per_chunk, sizes))
    return out
