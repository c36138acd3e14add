"""``FastDetDataPreprocessor``: mmdet's ``DetDataPreprocessor`` with the
batched image step of :mod:`fast_parallel.step.images`.

A module of its own because importing it imports mmdet, which the rest of
the package never does on import (an mmengine-only or mmdet3d user's model
has no use for it); :func:`~fast_parallel.step.images.switch_images`
imports it for a model that has mmdet's preprocessor.
"""
from mmdet.models.data_preprocessors import DetDataPreprocessor

from fast_parallel.step.images import BatchedImages

__all__ = ['FastDetDataPreprocessor']


class FastDetDataPreprocessor(DetDataPreprocessor, BatchedImages):
    """mmdet's ``DetDataPreprocessor`` whose image step is
    :func:`~fast_parallel.step.images.batch_images`: in this method order,
    ``DetDataPreprocessor.forward``'s ``super().forward`` reaches
    :class:`~fast_parallel.step.images.BatchedImages`. Its arguments and
    state dict are stock's. Made by
    :func:`~fast_parallel.step.images.switch_images` on a built instance.
    """
