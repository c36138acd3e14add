"""The decoded-input cache: each train image decoded (and each gt-database
file read) once per run, one copy shared by all DataLoader workers.

:class:`DecodedCache` lives in anonymous shared memory made in the main
process before the workers fork (so it ends with the last process that maps
it); :class:`FastLoadImageFromFile` hands out a copy of a cached image
(stock's bytes: decoding is deterministic) when the file's size and mtime
are still those it was decoded from, and decodes stock's way otherwise. A
failed decode is never cached. How it is sized and installed:
:mod:`~fast_parallel.pipeline.cache_plan` and ``docs/pipeline.md``.
"""
import mmap
import multiprocessing
import os
import weakref
from types import SimpleNamespace
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from mmcv.transforms import LoadImageFromFile

from fast_parallel.pipeline.stats import count

__all__ = ['DTYPES', 'DecodedCache', 'FastLoadImageFromFile', 'lent']

# one row per image: state, offset, nbytes, dtype number, ndim, shape (3),
# file size, file mtime (ns)
_STATE, _OFFSET, _NBYTES, _DTYPE, _NDIM, _SHAPE, _SIZE, _MTIME = (0, 1, 2, 3,
                                                                  4, 5, 8, 9)
_ROW = 10
_READY = 1
_WRITING = 2  # space taken by one writer: the others leave it
#: The dtypes a decode gives (mmcv's backends); others are not cached.
DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32),
          np.dtype(np.int16), np.dtype(np.float64), np.dtype(np.int32))

#: Every cache's memory, to tell the arrays it lends (:func:`lent`).
_MAPS: 'weakref.WeakValueDictionary[int, Any]' = weakref.WeakValueDictionary()


def lent(array: np.ndarray) -> bool:
    """Whether ``array`` is a read-only view of a cache's memory
    (:meth:`DecodedCache.view`), lent to a reader that never writes it."""
    if array.flags.writeable:
        return False
    root = _root(array)
    return root is not None and _MAPS.get(id(root)) is root


def _root(array: np.ndarray) -> Any:
    """What holds the memory of ``array`` (the end of its ``base`` chain).
    """
    root = array
    while isinstance(root, np.ndarray):
        root = root.base
    return root


class DecodedCache:
    """Decoded images by path, in shared memory, filled as they are decoded.

    Args:
        paths (Sequence[str]): Every image path the dataset may load.
        capacity (int): Bytes for the decoded images; an image that no
            longer fits is not cached (and counted).
    """

    def __init__(self, paths: Sequence[str], capacity: int) -> None:
        self.slots: Dict[str, int] = {p: i for i, p in enumerate(paths)}
        self.capacity = int(capacity)
        self._data_map = mmap.mmap(-1, max(self.capacity, 1))
        self._table_map = mmap.mmap(-1, max(len(paths), 1) * _ROW * 8 + 8)
        self.data = np.frombuffer(self._data_map, np.uint8)
        memory = _root(self.data)  # (numpy's buffer over the map)
        _MAPS[id(memory)] = memory
        table = np.frombuffer(self._table_map, np.int64)
        self.top = table[:1]  # the next free byte
        self.table = table[1:].reshape(-1, _ROW)
        self.lock = multiprocessing.get_context('fork').Lock()
        #: Caches made from this one's entries (the fit caches, by scale),
        #: which end with it.
        self.derived: Dict[Any, Any] = {}

    def __deepcopy__(self, memo: dict) -> 'DecodedCache':
        return self  # one cache per run, whatever copies the dataset

    def __reduce__(self) -> Any:
        # a spawned worker cannot map it: it decodes, as stock does
        return (type(None), ())

    @property
    def used(self) -> int:
        """Bytes of decoded images held."""
        return int(self.top[0])

    def located(self, path: str) -> Optional[np.ndarray]:
        """The table row of ``path`` where its entry is kept and the file
        is unchanged since (its size and mtime); None otherwise."""
        slot = self.slots.get(path)
        if slot is None:
            return None
        with self.lock:  # the writer's data is visible after its release
            row = self.table[slot].copy()
        if row[_STATE] != _READY:
            return None
        try:
            stat = os.stat(path)
        except OSError:
            return None
        if (stat.st_size, stat.st_mtime_ns) != (row[_SIZE], row[_MTIME]):
            count('cache: file changed since it was cached')
            return None
        return row

    def get(self, path: str) -> Optional[np.ndarray]:
        """A copy of the cached array of ``path`` while the file is
        unchanged; None otherwise."""
        row = self.located(path)
        if row is None:
            return None
        shape = tuple(int(v) for v in row[_SHAPE:_SHAPE + row[_NDIM]])
        start = int(row[_OFFSET])
        flat = self.data[start:start + int(row[_NBYTES])]
        out = np.empty(shape, dtype=DTYPES[int(row[_DTYPE])])
        out.reshape(-1).view(np.uint8)[:] = flat
        return out

    def kept(self, path: str) -> Optional[Tuple[tuple, np.dtype, Any]]:
        """(shape, dtype, the file's stat when it was read) of the entry of
        ``path`` while the file is unchanged; None otherwise. The stat has
        ``st_size`` and ``st_mtime_ns``, as :meth:`put` takes it."""
        row = self.located(path)
        if row is None:
            return None
        shape = tuple(int(v) for v in row[_SHAPE:_SHAPE + row[_NDIM]])
        stat = SimpleNamespace(
            st_size=int(row[_SIZE]), st_mtime_ns=int(row[_MTIME]))
        return shape, DTYPES[int(row[_DTYPE])], stat

    def view(self,
             path: str,
             shape: Optional[tuple] = None,
             dtype: Optional[np.dtype] = None) -> Optional[np.ndarray]:
        """A read-only view of the cached array of ``path`` (no copy),
        when the file is unchanged (and the array has ``shape`` and
        ``dtype``, where given); None otherwise. For readers that never
        write to what they get (:func:`lent`)."""
        row = self.located(path)
        if row is None:
            return None
        kept = tuple(int(v) for v in row[_SHAPE:_SHAPE + row[_NDIM]])
        if shape is None:
            shape, dtype = kept, DTYPES[int(row[_DTYPE])]
        if kept != tuple(shape) or DTYPES[int(row[_DTYPE])] != dtype:
            return None
        start = int(row[_OFFSET])
        out = self.data[start:start + int(row[_NBYTES])].view(dtype)
        out = out.reshape(shape)
        out.flags.writeable = False
        return out

    def lends(self, path: str, img: Any) -> bool:
        """Whether ``img`` is this cache's own read-only view of the entry
        of ``path`` (:meth:`view`), so its bytes are that entry's.

        Args:
            path (str): The file.
            img: An image.

        Returns:
            bool: True when it is.
        """
        slot = self.slots.get(path)
        if slot is None or type(img) is not np.ndarray or not lent(img):
            return False
        with self.lock:
            row = self.table[slot].copy()
        if row[_STATE] != _READY:
            return False
        shape = tuple(int(v) for v in row[_SHAPE:_SHAPE + row[_NDIM]])
        start = self.data.__array_interface__['data'][0] + int(row[_OFFSET])
        return img.shape == shape and img.dtype == DTYPES[int(
            row[_DTYPE])] and img.__array_interface__['data'][0] == start

    def get_bytes(self, path: str) -> Optional[bytes]:
        """The cached bytes of ``path`` (kept by :meth:`put` as a ``uint8``
        array), as a new ``bytes`` object, while the file is unchanged;
        None otherwise."""
        row = self.located(path)
        if row is None:
            return None
        start = int(row[_OFFSET])
        return self._data_map[start:start + int(row[_NBYTES])]

    def put(self, path: str, img: np.ndarray, stat: os.stat_result) -> None:
        """Keeps ``img``, read from ``path`` as it was at ``stat``.

        Args:
            path (str): The file.
            img (np.ndarray): Its decoded image (or its bytes, ``uint8``).
            stat (os.stat_result): The file's, taken before the read.
        """
        slot = self.slots.get(path)
        if slot is None or img.ndim > 3 or not img.flags.c_contiguous or \
                img.dtype not in DTYPES:
            return
        with self.lock:
            if self.table[slot, _STATE] != 0:  # kept, or being kept
                return
            start = int(self.top[0])
            if start + img.nbytes > self.capacity:
                count('cache: full')
                return
            self.top[0] = start + img.nbytes
            self.table[slot, _STATE] = _WRITING
        self.data[start:start + img.nbytes] = img.reshape(-1).view(np.uint8)
        row = np.zeros(_ROW, np.int64)
        row[[_OFFSET, _NBYTES, _DTYPE,
             _NDIM]] = (start, img.nbytes, DTYPES.index(img.dtype), img.ndim)
        row[_SHAPE:_SHAPE + img.ndim] = img.shape
        row[[_SIZE, _MTIME]] = (stat.st_size, stat.st_mtime_ns)
        row[_STATE] = _READY
        with self.lock:
            self.table[slot] = row


class FastLoadImageFromFile(LoadImageFromFile):
    """``LoadImageFromFile`` that takes a decoded image from the run's
    cache (``_fp_cache``, set by the switch: a :class:`DecodedCache` or a
    :class:`~fast_parallel.pipeline.disk_cache.DiskCache`), when it has it;
    stock's decode otherwise. With a shape memo (``_fp_shapes``, a
    :class:`~fast_parallel.pipeline.unread.ShapeMemo`) it records each
    image's shape, and while ``_fp_defer`` is set it hands a known image
    over undecoded (:mod:`~fast_parallel.pipeline.unread`)."""

    _fp_cache: Any = None
    _fp_shapes: Any = None
    #: Set while the loaded image goes only to readers (a fast Mosaic or
    #: MixUp): a hit is then a read-only view, not a copy.
    _fp_lend = False
    #: Set while the loaded image goes to a fast Mosaic that decodes only
    #: the patches the next ``RandomAffine`` reads.
    _fp_defer = False

    def transform(self, results: dict) -> Optional[dict]:
        shapes = self._fp_shapes
        if shapes is None:
            return self.decode_now(results)
        if self._fp_defer:
            kept = shapes.kept_colour(results)
            if kept is not None:
                from fast_parallel.pipeline.unread import DeferredImage
                count('deferred decodes')
                results['img'] = DeferredImage(self, results['img_path'],
                                               *kept)
                results['img_shape'] = kept[0][:2]
                results['ori_shape'] = kept[0][:2]
                return results
        try:
            stat = os.stat(results['img_path'])
        except (OSError, KeyError, TypeError, ValueError):
            stat = None
        out = self.decode_now(results)
        if out is not None:
            shapes.record(out, stat)
        return out

    def decode_now(self, results: dict) -> Optional[dict]:
        """The cache's image, or stock's decode (kept in the cache)."""
        cache = self._fp_cache
        if cache is None:
            return super().transform(results)
        filename = results['img_path']
        if self._fp_lend and type(cache) is DecodedCache:
            img = cache.view(filename)
        else:
            img = cache.get(filename)
        if img is not None:
            count('cache: hits')
            results['img'] = img
            results['img_shape'] = img.shape[:2]
            results['ori_shape'] = img.shape[:2]
            return results
        try:
            stat = os.stat(filename)
        except OSError:
            stat = None
        out = super().transform(results)
        if out is not None and stat is not None:
            count('cache: decoded')
            cache.put(filename, out['img'], stat)
        return out
