"""Fast forms of mmdet's ``Pad`` and ``PackDetInputs``: the image's memory
layout changed by OpenCV, stock's bytes.

``RandomFlip`` hands on a view with a negative stride (mmcv's ``imflip`` is
``np.flip``); OpenCV's binding copies such an array an element group at a
time before ``copyMakeBorder`` (~1 ms for 640 x 640 x 3). ``FastPad`` hands
stock's ``_pad_img`` the same pixels, C-ordered, copied by ``cv2.flip``
(:func:`~fast_parallel.pipeline.copies.flipped_copy`): OpenCV's result does
not depend on the input's strides. ``PackDetInputs`` turns the HWC image
into a CHW tensor with torch's ``permute().contiguous()`` (~0.5 ms for
640 x 640 x 3); ``FastPackDetInputs`` writes the same planes into the same
kind of memory with ``cv2.split``.
"""
from typing import Optional

import cv2
import numpy as np
import torch
from mmdet.datasets.transforms import PackDetInputs, Pad

from fast_parallel.pipeline.copies import flipped_copy

__all__ = ['FastPackDetInputs', 'FastPad', 'chw_planes']

_TORCH = frozenset(np.dtype(t) for t in (np.uint8, np.float32))


def chw_planes(img: np.ndarray) -> Optional[torch.Tensor]:
    """Stock ``PackDetInputs``'s ``inputs`` tensor of a 2..4-channel
    ``uint8`` / ``float32`` image, made by ``cv2.split``.

    Stock gives a C-contiguous image ``torch.from_numpy(img).permute(2, 0,
    1).contiguous()`` (memory torch allocates, resizable) and any other
    ``torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))``
    (memory numpy allocates, not resizable): the same kinds here, the first
    a clone of the planes (a tensor that ever lent numpy its memory is no
    longer resizable, so ``torch.empty(...).numpy()`` would not do).

    Args:
        img (np.ndarray): ``results['img']``.

    Returns:
        torch.Tensor | None: The tensor, or None for an image of another
        kind (a read-only C-contiguous one: torch warns), a single pixel,
        or a layout OpenCV would copy or refuse (then stock).
    """
    if type(img) is not np.ndarray or img.ndim != 3 or \
            img.dtype not in _TORCH or not 2 <= img.shape[2] <= 4 or \
            img.shape[0] * img.shape[1] < 2:
        return None
    height, width, channels = img.shape
    source = img
    if img.flags.c_contiguous and (min(img.strides) < 0
                                   or not img.flags.writeable):
        return None  # torch.from_numpy's error or warning, as on stock
    if not img.flags.c_contiguous:
        source = flipped_copy(img)
        if source is None:
            row, col, chan = img.strides
            if row <= 0 or row % img.itemsize or \
                    col != chan * channels or chan != img.itemsize:
                return None
            source = img  # rows apart (a crop): OpenCV reads it as it is
    planes = np.empty((channels, height, width), img.dtype)
    cv2.split(source, list(planes))
    out = torch.from_numpy(planes)
    # torch's own memory for a contiguous image, as stock's (a tensor
    # that ever lent numpy its memory can no longer be resized)
    return out.clone() if img.flags.c_contiguous else out


class FastPad(Pad):
    """``Pad`` that copies a flipped image with ``cv2.flip`` first."""

    def _pad_img(self, results: dict) -> None:
        img = results.get('img')
        flipped = flipped_copy(img)
        if flipped is not None:
            results['img'] = flipped
        try:
            super()._pad_img(results)
        except BaseException:
            results['img'] = img  # as stock leaves it
            raise


class FastPackDetInputs(PackDetInputs):
    """``PackDetInputs`` that makes the image tensor with ``cv2.split``."""

    def transform(self, results: dict) -> dict:
        keys = self.meta_keys
        inputs = None if not isinstance(keys, (tuple, list)) or \
            'img' in keys else chw_planes(results.get('img'))
        if inputs is None:
            return super().transform(results)
        rest = dict(results)
        del rest['img']
        packed = dict(inputs=inputs)
        packed.update(super().transform(rest))
        return packed
