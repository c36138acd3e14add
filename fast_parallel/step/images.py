"""The batch's images flipped, normalised and padded for the whole batch.

mmengine's ``ImgDataPreprocessor.forward``, under mmdet's
``DetDataPreprocessor``, makes the batch image by image: channel flip,
``float()``, ``(x - mean) / std`` and ``F.pad`` for each, then a stack (13 +
5 B operations). :func:`switch_images` makes one preprocessor instance a
:class:`~fast_parallel.step.det_preprocessor.FastDetDataPreprocessor`,
whose image step does the same for the whole batch in at most B + 7
operations, with stock's bits: every element goes through the same
correctly rounded IEEE operations (the same conversion, one subtraction,
one division) and the padded cells get ``pad_value`` after them, as stock
pads after normalising. Why, and what stays stock: ``docs/step.md``,
"Images".
"""
import math
from typing import Any, List, Optional, Union

import numpy as np
import torch
from mmengine.model import ImgDataPreprocessor, is_model_wrapper
from torch import Tensor, nn

from fast_parallel.compat.mmengine import image_steps
from fast_parallel.compat.targets import replaced_reason, upstream
from fast_parallel.outcome import Outcome
from fast_parallel.step.stock_batches import count_stock_batch

__all__ = ['BatchedImages', 'batch_images', 'switch_images']

#: Sizes below this are exact in stock's float32 size arithmetic.
_EXACT_SIZE = 1 << 24


def _plan(pre: Any, inputs: Any) -> Union[str, tuple]:
    """The padded ``(height, width)`` of this batch's images, or why they
    take stock's way (a str)."""
    if not isinstance(inputs, list) or not inputs or \
            any(type(x) is not Tensor for x in inputs):
        return 'inputs not a list of tensors'
    first = inputs[0]
    if any(x.dim() != 3 or x.dtype != first.dtype or x.device != first.device
           or x.shape[0] != first.shape[0] or x.requires_grad for x in inputs):
        return 'images not (C, H, W) of one dtype and device'
    divisor, pad_value = pre.pad_size_divisor, pre.pad_value
    if type(divisor) is not int or divisor < 1 or \
            type(pad_value) not in (int, float):
        return 'pad_size_divisor or pad_value not a plain number'
    if max(max(x.shape) for x in inputs) + divisor >= _EXACT_SIZE:
        return 'an image side near 2**24'
    conversion, normalize = image_steps(pre)
    if conversion and first.shape[0] < 3:
        return 'a channel flip of fewer than 3 channels'
    if normalize and pre.mean.shape[0] == 3 and \
            (3 if conversion else first.shape[0]) != 3:
        return 'mean of 3 values, images not of 3 channels'
    # stock: ceil(max size / divisor) * divisor in float32, exact below
    # 2**24 (a quotient that is not whole is over 1 / divisor from one)
    height = math.ceil(max(x.shape[1] for x in inputs) / divisor) * divisor
    width = math.ceil(max(x.shape[2] for x in inputs) / divisor) * divisor
    padded = any(x.shape[1:] != (height, width) for x in inputs)
    return height, width, padded


def _pad_mask(inputs: List[Tensor], height: int, width: int,
              device: torch.device) -> Tensor:
    """(B, 1, height, width): True on each image's padded cells; made from
    (B, height + width) host flags, one copy to ``device``."""
    rows = np.arange(height) >= np.array([x.shape[1] for x in inputs])[:, None]
    cols = np.arange(width) >= np.array([x.shape[2] for x in inputs])[:, None]
    flags = torch.from_numpy(np.concatenate([rows, cols], axis=1)).to(
        device, non_blocking=True)
    return flags[:, None, :height, None] | flags[:, None, None, height:]


def batch_images(pre: Any, inputs: List[Tensor], height: int, width: int,
                 padded: bool) -> Tensor:
    """Stock's list branch of ``ImgDataPreprocessor.forward`` (the images
    cast) for the whole batch.

    Args:
        pre: The preprocessor (its flip, ``mean``, ``std``, ``pad_value``).
        inputs (list[Tensor]): (C, H, W) images of one dtype and device.
        height (int): The batch's padded height (:func:`_plan`).
        width (int): Its padded width.
        padded (bool): Whether an image is smaller than that.

    Returns:
        Tensor: ``stack_batch`` of stock's images, bit for bit.
    """
    conversion, normalize = image_steps(pre)
    pad_value = float(pre.pad_value)  # as F.pad takes it
    if padded:
        # (normalised, the padded cells are set after; F.pad checks the
        # value against the normalised dtype)
        first = inputs[0]
        batch = first.new_full((len(inputs), first.shape[0], height, width),
                               0.0 if normalize else pad_value,
                               dtype=torch.float32)
        for image, x in zip(batch, inputs):
            image[:, :x.shape[1], :x.shape[2]].copy_(x)  # as x.float()
    else:
        batch = torch.stack(inputs)  # stock stacks the images too
    if conversion:
        batch = batch[:, [2, 1, 0], ...]
    batch = batch.float()  # the same tensor where float32 already
    if normalize:
        batch = (batch - pre.mean) / pre.std
        if padded:  # stock pads after normalising
            batch.masked_fill_(
                _pad_mask(inputs, height, width, batch.device), pad_value)
    return batch


class BatchedImages(ImgDataPreprocessor):
    """``ImgDataPreprocessor.forward`` with :func:`batch_images` for a list
    of images. ``DetDataPreprocessor.forward``'s ``super().forward`` comes
    here in the method order of ``FastDetDataPreprocessor``
    (:mod:`fast_parallel.step.det_preprocessor`)."""

    #: Batches made the stock way (set by :func:`switch_images`).
    fast_images_stock: int = 0

    def forward(self, data: dict, training: bool = False) -> Any:
        plan = _plan(self, data.get('inputs')) if isinstance(
            data, dict) else 'data not a dict'
        if isinstance(plan, str):
            count_stock_batch(self, 'fast_images_stock',
                              'images: a batch made', plan)
            return ImgDataPreprocessor.forward(self, data, training)
        data = self.cast_data(data)
        data['inputs'] = batch_images(self, data['inputs'], *plan)
        data.setdefault('data_samples', None)
        return data


def switch_images(model: nn.Module, enabled: bool = True) -> Optional[Outcome]:
    """Makes ``model``'s ``DetDataPreprocessor`` a
    :class:`~fast_parallel.step.det_preprocessor.FastDetDataPreprocessor`.

    Args:
        model (nn.Module): The model (a wrapper's module is looked into).
        enabled (bool): False leaves it stock. Defaults to True.

    Returns:
        Outcome | None: ``images: DetDataPreprocessor batched`` or why it
        stays stock, for the start line; None where the model's
        preprocessor is no mmdet 2D one (mmdet3d's, a classifier's).
    """
    if is_model_wrapper(model):
        model = model.module
    pre = getattr(model, 'data_preprocessor', None)
    names = {c.__name__ for c in type(pre).__mro__}
    if 'DetDataPreprocessor' not in names or \
            'Det3DDataPreprocessor' in names:
        return None  # (mmdet3d's makes its images its own way)
    # (mmdet imported only here, for a model that has mmdet's preprocessor)
    from fast_parallel.step.det_preprocessor import FastDetDataPreprocessor
    det = upstream('DetDataPreprocessor')
    if not isinstance(pre, det):
        return None
    name = type(pre).__name__
    if not enabled:
        return Outcome('images', False, 'fast_images=False')
    if type(pre) is det:
        why = replaced_reason((pre, 'DetDataPreprocessor'))
    else:
        why = None if type(pre) is FastDetDataPreprocessor else \
            f'{name} is not DetDataPreprocessor'
    if why is not None:
        return Outcome(
            'images', False, why, text=f'images: {name} stock '
            f'({why})')
    pre.__class__ = FastDetDataPreprocessor
    return Outcome('images', True, text='images: DetDataPreprocessor batched')
