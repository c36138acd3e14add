"""Helpers the sample COCO and KITTI makers share.

See ``docs/sample_data.md``.
"""
from pathlib import Path
from typing import Sequence

import numpy as np


def seeded_rng(seed: int, *keys: int) -> np.random.Generator:
    """A generator for one item, independent of how many others there are.

    Args:
        seed (int): The run's random seed.
        *keys (int): What names the item (part, split, index).

    Returns:
        np.random.Generator: Seeded with ``[seed, *keys]``.
    """
    return np.random.default_rng([seed, *keys])


def all_exist(root: Path, names: Sequence[str]) -> bool:
    """Whether all ``names`` exist under ``root``.

    Args:
        root (Path): The folder.
        names (Sequence[str]): Paths relative to ``root``.

    Returns:
        bool: True when every one exists.
    """
    return all((root / name).exists() for name in names)
