"""ATSS's IoU threshold per ground truth (mean + std), as stock sums it.

Stock computes ``candidate_overlaps.mean(0) + candidate_overlaps.std(0)``
on each image's contiguous ``(K, num_gt)`` matrix. ``std`` is a Welford
reduction in double, one column at a time in row order, whatever the
layout, so the batch's ``std(1)`` is stock's on the CPU. ``mean`` is a
``sum`` then a division on the CPU, and ATen's cascade sum adds a column's
``K`` values in an order that depends on where the column sits in its
matrix: columns in full blocks of ``4 * vector width`` (of 4, below the
vector width) go through ``multi_row_sum`` ("A"), the others through
``row_sum``'s four interleaved partial sums ("B"), and a single column
through the contiguous inner sum ("C"). :func:`thresholds` computes the
three orders for every column of the batch, each with a layout that makes
ATen take that order, and picks each column's by its image's count.
:func:`calibrate` checks that model against stock's own ``mean`` once per
process; where it fails, and on other devices, the threshold is computed
image by image on stock's own shapes. Reasoning: ``docs/targets_atss.md``.
"""
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.step.targets.padding import to_device

__all__ = ['calibrate', 'thresholds']

#: ATen's ``GRAIN_SIZE``: smaller reductions run on one thread.
_GRAIN = 32768
#: (K, dtype) -> the vector width the model holds with (None: it does not).
_CALIBRATED: Dict[Tuple[int, torch.dtype], Optional[int]] = {}

_A, _B, _C = 0, 1, 2


def _orders(counts: Sequence[int], width: int, vec: int) -> list:
    """Per image and column: which summation order stock's ``sum(0)`` of a
    ``(K, count)`` matrix uses for that column (padding: B)."""
    rows = []
    for count in counts:
        if count == 1:
            rows.append([_C] + [_B] * (width - 1))
            continue
        block = 4 if count < vec else 4 * vec
        full = count // block * block
        rows.append([_A if g < full else _B for g in range(width)])
    return rows


def _sum_a(cand: Tensor, vec: int) -> Tensor:
    """Every column summed in order A: laid out ``(K, M)`` contiguous with
    ``M`` whole blocks, in calls small enough for one thread."""
    b, k, g = cand.shape
    block = 4 * vec
    per_call = max(block, (_GRAIN - 1) // k // block * block)
    width = -(-b * g // block) * block
    flat = cand.new_zeros((k, width))
    flat[:, :b * g].view(k, b, g).copy_(cand.transpose(0, 1))
    sums = [
        flat[:, start:start + per_call].sum(0)
        for start in range(0, width, per_call)
    ]
    return (torch.cat(sums) if len(sums) > 1 else sums[0])[:b * g]


def _sum_b(cand: Tensor) -> Tensor:
    """Every column summed in order B: each column a strided row (stride
    two elements), which ATen sums with ``row_sum``."""
    b, k, g = cand.shape
    buf = cand.new_zeros((b, g, k, 2))
    buf[..., 0] = cand.transpose(1, 2)
    return buf[..., 0].sum(2).reshape(-1)


def _sum_c(cand: Tensor) -> Tensor:
    """Every column summed in order C: a contiguous row."""
    rows = cand.new_empty((cand.shape[0], cand.shape[2], cand.shape[1]))
    return rows.copy_(cand.transpose(1, 2)).sum(2).reshape(-1)


def _model_mean(cand: Tensor, counts: Sequence[int], vec: int) -> Tensor:
    b, k, g = cand.shape
    order = to_device(
        torch.tensor(_orders(counts, g, vec), dtype=torch.uint8),
        cand.device).reshape(-1)
    sums = torch.where(order == _A, _sum_a(cand, vec),
                       torch.where(order == _B, _sum_b(cand), _sum_c(cand)))
    return (sums / k).view(b, g)


def calibrate(k: int, dtype: torch.dtype = torch.float32) -> Optional[int]:
    """The vector width with which the model gives stock's ``mean(0)`` of
    ``(k, n)`` CPU matrices, or None. Checked once per ``k`` and dtype on
    random matrices of 1 to 150 columns, several per batch."""
    key = (k, dtype)
    if key not in _CALIBRATED:
        gen = torch.Generator().manual_seed(k)
        counts = [
            1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70,
            129, 150
        ]
        found = None
        for vec in (8, 16, 4, 32):
            ok = True
            for trial in range(3):
                mats = [
                    torch.rand((k, n), generator=gen).to(dtype)
                    for n in counts[trial::3]
                ]
                width = max(m.shape[1] for m in mats)
                cand = torch.zeros((len(mats), k, width), dtype=dtype)
                for i, m in enumerate(mats):
                    cand[i, :, :m.shape[1]] = m
                got = _model_mean(cand, [m.shape[1] for m in mats], vec)
                ok = ok and all(
                    torch.equal(got[i, :m.shape[1]], m.mean(0))
                    for i, m in enumerate(mats))
            if ok:
                found = vec
                break
        _CALIBRATED[key] = found
    return _CALIBRATED[key]


def _per_image(cand: Tensor, counts: Sequence[int]) -> Tensor:
    """Stock's own ``mean(0) + std(0)`` on each image's ``(K, n)``."""
    thr = cand.new_zeros(cand.shape[0], cand.shape[2])
    for i, count in enumerate(counts):
        if count:
            own = cand[i, :, :count].contiguous()
            thr[i, :count] = own.mean(0) + own.std(0)
    return thr


def thresholds(cand: Tensor, counts: Sequence[int]) -> Tensor:
    """Stock's ``mean(0) + std(0)`` of each image's candidate overlaps.

    Args:
        cand (Tensor): ``(B, K, G)`` candidate overlaps; image ``i``'s are
            its first ``counts[i]`` columns.
        counts (Sequence[int]): Ground truths per image.

    Returns:
        Tensor: ``(B, G)`` thresholds (padding columns: anything).
    """
    vec = None
    if cand.device.type == 'cpu' and cand.dtype == torch.float32:
        vec = calibrate(cand.shape[1], cand.dtype)
    if vec is None:
        return _per_image(cand, counts)
    return _model_mean(cand, counts, vec) + cand.std(1)
