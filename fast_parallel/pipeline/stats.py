"""What the fast pipeline did in this process: samples, reuses, stock ways.

Each DataLoader worker counts in its own copy; the pipeline benchmark reads
them in its one process.
"""
from collections import Counter

__all__ = ['COUNTS']

#: Per process: ``'samples'`` made by a fast wrapper, ``'mix loads
#: reused'``, ``'stock: <transform>: <why>'`` for a sample a fast transform
#: handed to stock's, ``'stock copy: <type>'`` for a transform run with
#: stock's retry copy.
COUNTS: Counter = Counter()
