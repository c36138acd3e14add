"""Which priors stock assigns in each image: ``anchor_inside_flags``.

Dense heads call ``prior_generator.valid_flags`` per image (priors beyond
the image's padded size are invalid) and ``anchor_inside_flags`` (with
``allowed_border >= 0``, priors must also lie within the image); stock then
assigns the valid, inside priors only and fills the rest in ("unmap").
:func:`inside_flags` gives the same flags for a batch, and none at all where
every prior is in (the common case, decided on the host).
"""
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from fast_parallel.step.targets.padding import to_device

__all__ = [
    'inside_flags', 'image_without_prior_on_host', 'valid_flags',
    'within_border'
]


def _all_valid(head: Any, featmap_sizes: Sequence, pad_shape: tuple) -> bool:
    """Whether ``valid_flags`` of this pad shape are all True (host only)."""
    for (feat_h, feat_w), (stride_w,
                           stride_h) in zip(featmap_sizes,
                                            head.prior_generator.strides):
        h, w = pad_shape[:2]
        if (min(int(np.ceil(h / stride_h)), feat_h) != feat_h
                or min(int(np.ceil(w / stride_w)), feat_w) != feat_w):
            return False
    return True


def image_without_prior_on_host(head: Any, featmap_sizes: Sequence,
                                metas: Sequence[dict]) -> Optional[bool]:
    """Whether an image of the batch has no prior to assign, if the host
    knows.

    Without a border check (``allowed_border < 0``) the flags stock assigns
    by are ``valid_flags`` of each ``pad_shape``, which the host computes:
    an image has none where no level has a valid row and column (as
    :func:`_valid_flags` finds them). With a border check the priors'
    coordinates decide, on the device: None.

    Args:
        head: A dense head (``prior_generator``, ``train_cfg``).
        featmap_sizes (Sequence): Feature map size per level.
        metas (Sequence[dict]): ``pad_shape`` per image.

    Returns:
        bool | None: True / False where known on the host, else None.
    """
    if head.train_cfg['allowed_border'] >= 0:
        return None
    generator = head.prior_generator

    def has_prior(pad_shape: tuple) -> bool:
        h, w = pad_shape[:2]
        return any(
            min(int(np.ceil(h / stride_h)), feat_h) > 0
            and min(int(np.ceil(w / stride_w)), feat_w) > 0 and base > 0
            for (feat_h, feat_w), (stride_w, stride_h), base in zip(
                featmap_sizes, generator.strides, generator.num_base_priors))

    return not all(
        has_prior(pad) for pad in {tuple(m['pad_shape'][:2])
                                   for m in metas})


def _valid_flags(head: Any, featmap_sizes: Sequence,
                 pad_shape: tuple) -> np.ndarray:
    """``cat(prior_generator.valid_flags(featmap_sizes, pad_shape))`` on the
    host: per level, the priors of the rows and columns the padded image
    covers, ``num_base_priors`` per location (row-major, as the priors)."""
    generator = head.prior_generator
    levels = []
    for (feat_h, feat_w), (stride_w,
                           stride_h), base in zip(featmap_sizes,
                                                  generator.strides,
                                                  generator.num_base_priors):
        h, w = pad_shape[:2]
        valid_h = min(int(np.ceil(h / stride_h)), feat_h)
        valid_w = min(int(np.ceil(w / stride_w)), feat_w)
        grid = (np.arange(feat_h) < valid_h)[:, None] & \
            (np.arange(feat_w) < valid_w)[None, :]
        levels.append(np.repeat(grid.reshape(-1), base))
    return np.concatenate(levels)


def valid_flags(head: Any, featmap_sizes: Sequence, metas: Sequence[dict],
                device: Any) -> Tensor:
    """``prior_generator.valid_flags`` of every image, ``(B, N)`` bool:
    made on the host per pad shape (booleans, exact) and sent in one copy.

    Args:
        head: A dense head (``prior_generator``).
        featmap_sizes (Sequence): Feature map size per level.
        metas (Sequence[dict]): ``pad_shape`` per image.
        device: Where the flags go.

    Returns:
        Tensor: Each image's flags of every level, levels one after another.
    """
    pads = [tuple(m['pad_shape'][:2]) for m in metas]
    rows = {pad: _valid_flags(head, featmap_sizes, pad) for pad in set(pads)}
    return to_device(np.stack([rows[pad] for pad in pads]), device)


def inside_flags(head: Any, priors: Tensor, featmap_sizes: Sequence,
                 metas: Sequence[dict]) -> Optional[Tensor]:
    """The priors stock assigns in each image: ``(B, N)``, or None for all.

    Without a border check (``allowed_border < 0``) and with pad shapes
    whose valid flags are all True (the images fill the padded batch, as
    RTMDet's ``Pad`` makes them), no tensor is needed. Else the valid flags
    of each image are made on the host (as ``valid_flags`` makes them:
    booleans, exact) and travel in one copy, and the border check is
    ``anchor_inside_flags``'s comparisons for all images at once.

    Args:
        head: A dense head (``prior_generator``, ``train_cfg``).
        priors (Tensor): ``(N, 4)`` flat priors of the batch.
        featmap_sizes (Sequence): Feature map size per level.
        metas (Sequence[dict]): ``pad_shape`` and ``img_shape`` per image.

    Returns:
        Optional[Tensor]: ``(B, N)`` bool, or None.
    """
    border = head.train_cfg['allowed_border']
    pads = [tuple(m['pad_shape'][:2]) for m in metas]
    if border < 0 and all(
            _all_valid(head, featmap_sizes, pad) for pad in set(pads)):
        return None
    return within_border(
        head, priors, valid_flags(head, featmap_sizes, metas, priors.device),
        metas)


def within_border(head: Any, priors: Tensor, valid: Tensor,
                  metas: Sequence[dict]) -> Tensor:
    """``anchor_inside_flags`` of every image from its valid flags:
    ``(B, N)`` bool.

    Without a border check (``allowed_border < 0``) the valid flags; else
    stock's comparisons, each bound summed in Python and then cast to the
    priors' dtype, as stock's Python numbers are (a float32 sum of the
    size and a fractional border could round otherwise).

    Args:
        head: A dense head (``train_cfg``).
        priors (Tensor): ``(N, 4)`` flat priors of the batch.
        valid (Tensor): ``(B, N)`` bool valid flags.
        metas (Sequence[dict]): ``img_shape`` per image.

    Returns:
        Tensor: ``(B, N)`` bool.
    """
    border = head.train_cfg['allowed_border']
    if border < 0:
        return valid
    bounds = to_device(
        torch.tensor([[m['img_shape'][0] + border, m['img_shape'][1] + border]
                      for m in metas],
                     dtype=priors.dtype), priors.device)
    return valid & (priors[:, 0] >= -border) & (priors[:, 1] >= -border) & (
        priors[:, 2] < bounds[:, 1:2]) & (
            priors[:, 3] < bounds[:, 0:1])
