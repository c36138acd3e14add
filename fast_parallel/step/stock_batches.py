"""A batch a data preprocessor's batched step leaves to stock's code.

Logged the first time, counted on the preprocessor every time, so that
``data_preprocessor.<counter>`` says how many batches went stock's way.
"""
from typing import Any

from mmengine.logging import MMLogger

__all__ = ['count_stock_batch']


def count_stock_batch(owner: Any, counter: str, words: str, why: str) -> None:
    """Counts one batch that takes stock's way; logs the first.

    Args:
        owner: The data preprocessor (it holds the ``counter`` int).
        counter (str): The count's attribute, e.g. ``'fast_images_stock'``.
        words (str): What happened, e.g. ``'images: a batch made'``.
        why (str): Why, for the log.
    """
    done = getattr(owner, counter)
    if not done:
        MMLogger.get_current_instance().info(
            f'FastParallelHook: {words} the stock way ({why}); the numbers '
            f'stay stock\'s. Counted in data_preprocessor.{counter}.')
    setattr(owner, counter, done + 1)
