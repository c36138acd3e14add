"""``PackingError`` and the field paths its messages name.

A field path is the keys (``str``) and indices (``int``) from the collated
batch's root to a value, e.g. ``data_samples[3].gt_instances.bboxes``.
"""
from typing import Tuple, Union

__all__ = ['FieldPath', 'PackingError', 'describe_path', 'format_path']

#: Keys (``str``; ``'.name'`` for an attribute) and indices (``int``).
FieldPath = Tuple[Union[str, int], ...]


class PackingError(ValueError):
    """A batch that cannot be packed; the message names the field path."""


def format_path(path: FieldPath) -> str:
    """Formats a field path such as ``data_samples[3].gt_instances.bboxes``.

    Args:
        path (tuple): Keys (``str``) and indices (``int``) from the root.

    Returns:
        str: The readable path, ``<batch>`` for the root.
    """
    out = ''
    for part in path:
        if isinstance(part, int):
            out += f'[{part}]'
        elif part.startswith('.'):
            out += part
        else:
            out += f'[{part!r}]' if out else part
    return out or '<batch>'


def describe_path(path: FieldPath) -> str:
    """Names the sample (first index on the path) and the field path.

    Args:
        path (tuple): Keys (``str``) and indices (``int``) from the root.

    Returns:
        str: ``sample <i>, field <path>``, or just the path when it holds
        no index.
    """
    sample = next((p for p in path if isinstance(p, int)), None)
    where = format_path(path)
    return f'sample {sample}, field {where}' if sample is not None else where
