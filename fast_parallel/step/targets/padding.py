"""Ground truths of a batch padded to one ``(B, G)`` grid, and a mask.

One ``cat`` and one gather whatever the batch: the gather index is built on
the host from the box counts (shapes, so no device sync) and travels in one
copy, non-blocking from pinned memory on a GPU. Padding slots hold a dummy
row (zeros, label -1) that every family masks out. Also the checks and the
per-level split the 2D families share, and the one way they move host
values to the device (:func:`to_device`).
"""
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    'Padded', 'gt_layout_reason', 'images_to_levels', 'pad_gts', 'pad_rows',
    'to_device'
]


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


def to_device(host: Any, device: torch.device) -> Tensor:
    """A host array or tensor on ``device``: one copy, non-blocking from
    pinned memory on a GPU (on the CPU, the tensor itself)."""
    tensor = torch.as_tensor(host)
    if device.type == 'cpu':
        return tensor
    pinned = device.type == 'cuda'
    if pinned:
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=pinned)


def _gather_index(counts: Sequence[int], width: int,
                  device: torch.device) -> Tensor:
    """``(B, width)`` indices into the rows of all samples, then a dummy."""
    total = sum(counts)
    index: List[int] = []
    start = 0
    for count in counts:
        index.extend(range(start, start + count))
        index.extend([total] * (width - count))  # the dummy row
        start += count
    return to_device(torch.tensor(index, dtype=torch.long),
                     device).view(len(counts), width)


def pad_rows(rows: Sequence[Tensor],
             device: torch.device,
             min_width: int = 0,
             fill: float = 0) -> Tuple[Tensor, Tensor]:
    """Pads each sample's ``(n_i, ...)`` rows to ``(B, G, ...)``.

    Args:
        rows (Sequence[Tensor]): Rows per sample, one dtype.
        device (torch.device): Where the batch lives.
        min_width (int): At least this many columns. Defaults to 0.
        fill (float): The padding value. Defaults to 0.

    Returns:
        tuple[Tensor, Tensor]: The padded rows and the ``(B, G)`` mask of
        the real ones.
    """
    counts = [int(r.shape[0]) for r in rows]
    width = max(max(counts, default=0), min_width)
    index = _gather_index(counts, width, device)
    dummy = rows[0].new_full((1, *rows[0].shape[1:]), fill)
    return torch.cat([*rows, dummy])[index], index < sum(counts)


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
    width = max(max(counts, default=0), min_width)
    index = _gather_index(counts, width, device)
    dim = boxes[0].shape[-1]
    all_boxes = torch.cat([*boxes, boxes[0].new_zeros((1, dim))])
    all_labels = torch.cat([*labels, labels[0].new_full((1, ), -1)])
    return Padded(all_boxes[index], all_labels[index], index < sum(counts),
                  counts)


def images_to_levels(target: Tensor, sizes: Sequence[int]) -> List[Tensor]:
    """mmdet's ``images_to_levels`` of a stacked ``(B, N, ...)`` target:
    its slices per level (views, as stock's slices of its stack).

    Args:
        target (Tensor): ``(B, N, ...)``.
        sizes (Sequence[int]): Priors per level (summing to ``N``).

    Returns:
        list[Tensor]: ``(B, n_level, ...)`` per level.
    """
    out, start = [], 0
    for size in sizes:
        out.append(target[:, start:start + size])
        start += size
    return out


def gt_layout_reason(gts: Sequence[Any],
                     device: torch.device) -> Optional[str]:
    """Why 2D ground truths are not laid out as the batched targets read
    them, or None: ``(n, 4)`` boxes, one integer label per box, on
    ``device``.

    Args:
        gts (Sequence[InstanceData]): ``bboxes`` and ``labels`` per image.
        device (torch.device): The predictions' device.

    Returns:
        Optional[str]: ``'ground truth layout'``, or None.
    """
    for gt in gts:
        labels = gt.labels
        if (gt.bboxes.dim() != 2 or gt.bboxes.shape[1] != 4
                or type(labels) is not Tensor or labels.device != device
                or labels.shape != gt.bboxes.shape[:1]
                or labels.dtype.is_floating_point
                or labels.dtype == torch.bool):
            return 'ground truth layout'
    return None
