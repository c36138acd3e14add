"""Ground truths of a batch padded to one ``(B, G)`` grid, and a mask.

One ``cat`` and one gather whatever the batch: the gather index is built on
the host from the box counts (shapes, so no device sync) and travels in one
copy, non-blocking from pinned memory on a GPU. Padding slots hold a dummy
row (zeros, label -1) that every family masks out.
"""
from typing import List, NamedTuple, Sequence

import torch
from torch import Tensor

__all__ = ['Padded', 'pad_gts']


class Padded(NamedTuple):
    """Padded ground truths."""
    #: ``(B, G, D)`` boxes.
    boxes: Tensor
    #: ``(B, G)`` labels (-1 in padding).
    labels: Tensor
    #: ``(B, G)`` bool: a real ground truth.
    mask: Tensor
    #: Ground truths per sample.
    counts: List[int]


def pad_gts(boxes: Sequence[Tensor],
            labels: Sequence[Tensor],
            device: torch.device,
            min_width: int = 0) -> Padded:
    """Pads each sample's ``(n_i, D)`` boxes and ``(n_i,)`` labels.

    Args:
        boxes (Sequence[Tensor]): Boxes per sample, one dtype.
        labels (Sequence[Tensor]): Labels per sample.
        device (torch.device): Where the batch lives.
        min_width (int): At least this many columns (one all-padding column
            keeps a batch without ground truths in shape). Defaults to 0.

    Returns:
        Padded: Boxes, labels, mask and counts.
    """
    counts = [int(b.shape[0]) for b in boxes]
    total = sum(counts)
    width = max(max(counts, default=0), min_width)
    index: List[int] = []
    start = 0
    for count in counts:
        index.extend(range(start, start + count))
        index.extend([total] * (width - count))  # the dummy row
        start += count
    pinned = device.type == 'cuda'
    index_t = torch.tensor(
        index, dtype=torch.long, pin_memory=pinned).to(
            device, non_blocking=pinned).view(len(counts), width)
    dim = boxes[0].shape[-1]
    all_boxes = torch.cat([*boxes, boxes[0].new_zeros((1, dim))])
    all_labels = torch.cat([*labels, labels[0].new_full((1, ), -1)])
    return Padded(all_boxes[index_t], all_labels[index_t], index_t < total,
                  counts)
