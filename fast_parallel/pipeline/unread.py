"""Mosaic patches that ``RandomAffine`` never reads: not decoded.

YOLOX's ``RandomAffine`` follows ``Mosaic`` and warps only part of the
2x canvas (its translation is about the canvas's origin), so on average
1.5 of the four patches lie where no output pixel reads. A loaded image
whose shape this run saw decoded from the same file (size, mtime, ctime,
inode) is handed to the fast Mosaic as a :class:`DeferredImage`; the
Mosaic peeks the affine's draws (the numpy state put back) and decodes only
the patches the warp may read. Why the bytes are stock's:
``docs/pipeline.md``.
"""
import math
import mmap
import multiprocessing
import os
import zlib
from typing import Any, Optional, Tuple

import numpy as np

from fast_parallel.compat import affine_matrix
from fast_parallel.pipeline.cache import DTYPES
from fast_parallel.pipeline.rng_state import (restore_numpy_state,
                                              save_numpy_state)
from fast_parallel.pipeline.stats import count

__all__ = [
    'DeferredImage', 'ShapeMemo', 'affine_reads', 'decode_deferred',
    'install_shape_memos', 'loaded', 'mosaic_reads', 'pastes_cleanly', 'unread'
]

# one row per sample: state, ndim, shape (3), dtype number, path hash, then
# the file's size, mtime, ctime (ns) and inode (:func:`_file_key`)
_STATE, _NDIM, _SHAPE, _DTYPE, _HASH, _FILE = 0, 1, 2, 5, 6, 7
_ROW = 11
#: Margin (pixels) around the corners' preimage: bilinear reads the next
#: pixel, and OpenCV rounds the source point to 1/32 pixel.
_MARGIN = 3


def _path_hash(path: Any) -> Optional[int]:
    """A hash of a ``str`` or ``os.PathLike`` path (None for others)."""
    try:
        path = os.fsencode(path)
    except TypeError:
        return None
    return zlib.crc32(path) | (len(path) << 32)


def _file_key(stat: os.stat_result) -> tuple:
    """What must match for a file to count as unchanged: its size and
    mtime (the decoded cache's key) and, stricter, its ctime (any write,
    ``chmod`` or rename updates it) and inode."""
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns,
            stat.st_ino & (2**63 - 1))


class ShapeMemo:
    """The shape and dtype of each train image this run decoded, by sample
    index, with its path's hash and the file's :func:`_file_key`: in
    anonymous shared memory made before the workers fork, so every
    worker's decodes count.

    Args:
        length (int): The wrapped dataset's length.
    """

    def __init__(self, length: int) -> None:
        self.length = int(length)
        self._map = mmap.mmap(-1, max(self.length, 1) * _ROW * 8)
        self.table = np.frombuffer(self._map, np.int64).reshape(-1, _ROW)
        self.lock = multiprocessing.get_context('fork').Lock()

    def __deepcopy__(self, memo: dict) -> 'ShapeMemo':
        return self

    def __reduce__(self) -> Any:
        # a spawned worker cannot map it: it keeps its own
        return (ShapeMemo, (self.length, ))

    def _slot(self, results: dict) -> Optional[int]:
        index = results.get('sample_idx')
        if type(index) is not int or not 0 <= index < self.length:
            return None
        return index

    def record(self, results: dict, stat: Optional[os.stat_result]) -> None:
        """Keeps the shape of ``results['img']``, decoded from
        ``results['img_path']`` as it was at ``stat``."""
        slot, img = self._slot(results), results.get('img')
        path_hash = _path_hash(results.get('img_path'))
        if slot is None or stat is None or path_hash is None or \
                type(img) is not np.ndarray or img.ndim not in (2, 3) or \
                img.dtype not in DTYPES:
            return
        row = np.zeros(_ROW, np.int64)
        row[[_STATE, _NDIM, _DTYPE]] = (1, img.ndim, DTYPES.index(img.dtype))
        row[_SHAPE:_SHAPE + img.ndim] = img.shape
        row[_HASH] = path_hash
        row[_FILE:] = _file_key(stat)
        with self.lock:
            self.table[slot] = row

    def kept(self, results: dict) -> Optional[Tuple[tuple, np.dtype]]:
        """(shape, dtype) of the image of ``results`` while its file is as
        it was when decoded; None otherwise."""
        slot = self._slot(results)
        if slot is None:
            return None
        with self.lock:
            row = self.table[slot].copy()
        path = results.get('img_path')
        if row[_STATE] != 1 or row[_HASH] != _path_hash(path):
            return None
        try:
            stat = os.stat(path)
        except (OSError, TypeError, ValueError):
            return None
        if _file_key(stat) != tuple(row[_FILE:]):
            return None
        shape = tuple(int(v) for v in row[_SHAPE:_SHAPE + row[_NDIM]])
        return shape, DTYPES[int(row[_DTYPE])]

    def kept_colour(self, results: dict) -> Optional[Tuple[tuple, np.dtype]]:
        """:meth:`kept` for a 3-channel ``uint8`` image (the only kind a
        fast Mosaic leaves undecoded); None for any other."""
        kept = self.kept(results)
        if kept is None or len(kept[0]) != 3 or kept[0][2] != 3 or \
                kept[1] != np.uint8:
            return None
        return kept


class DeferredImage:
    """A loaded image not decoded yet: its shape and dtype, and how to
    decode it (the load transform, on the sample's path)."""

    __slots__ = ('load', 'path', 'shape', 'dtype')

    def __init__(self, load: Any, path: str, shape: tuple,
                 dtype: np.dtype) -> None:
        self.load, self.path, self.shape, self.dtype = load, path, shape, dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __deepcopy__(self, memo: dict) -> 'DeferredImage':
        return self

    def decoded(self, lend: bool = False) -> np.ndarray:
        """The image, decoded now as the load decodes it.

        Args:
            lend (bool): For a reader that never writes it (the fast
                Mosaic): a cache hit may be a read-only view. Defaults to
                False.

        Raises:
            RuntimeError: Where the decode no longer gives the shape and
                dtype this run saw from the same file (its stat unchanged).
        """
        lending, self.load._fp_lend = self.load._fp_lend, lend
        try:
            out = self.load.decode_now({'img_path': self.path})
        finally:
            self.load._fp_lend = lending
        img = None if out is None else out.get('img')
        if not isinstance(img, np.ndarray) or img.shape != self.shape or \
                img.dtype != self.dtype:
            raise RuntimeError(
                f'{self.path}: decoded as {getattr(img, "shape", None)} '
                f'{getattr(img, "dtype", None)}, where this run decoded '
                f'{self.shape} {self.dtype} from the same file, its stat '
                'unchanged (set FastParallelHook(fast_pipeline=False))')
        count('deferred decodes: decoded')
        return img


def loaded(img: Any, lend: bool = False) -> Any:
    """``img``, decoded if it is a :class:`DeferredImage` (``lend``: see
    :meth:`DeferredImage.decoded`)."""
    return img.decoded(lend) if type(img) is DeferredImage else img


def decode_deferred(results: Any) -> None:
    """Decodes every deferred image of a results dict and its
    ``mix_results``, for a transform that reads them all (stock's way)."""
    if type(results) is not dict:
        return
    for key, value in results.items():
        if type(value) is DeferredImage:
            results[key] = value.decoded()
        elif key == 'mix_results' and type(value) is list:
            for mix in value:
                decode_deferred(mix)


def affine_reads(affine: Any, canvas_shape: tuple) -> Optional[tuple]:
    """The canvas box ``(x0, y0, x1, y1)`` (ends excluded) holding every
    pixel ``affine``'s ``warpPerspective`` of a ``canvas_shape`` image can
    read, from the matrix its next call will draw; None where unknown.

    The numpy state is put back: the call draws the same numbers after.
    """
    try:  # (a border stock cannot use raises in the warp, stock's way)
        height = canvas_shape[0] + affine.border[1] * 2
        width = canvas_shape[1] + affine.border[0] * 2
    except Exception:
        return None
    if not (isinstance(height, int) and isinstance(width, int)) or \
            height <= 0 or width <= 0:
        return None
    state = save_numpy_state()
    try:
        matrix = np.asarray(affine_matrix(affine)(height, width), np.float64)
    except Exception:  # the warp's own call raises it, stock's way
        return None
    finally:
        restore_numpy_state(state)
    if matrix.shape != (3, 3):
        return None
    (a, b, c), (d, e, f), last = matrix.tolist()
    det = a * e - b * d
    finite = all(math.isfinite(v) for v in (a, b, c, d, e, f, det))
    if last != [0.0, 0.0, 1.0] or not finite or det == 0:
        return None
    # each output corner's source point: the affine part inverted by hand,
    # with OpenCV's own determinant a * e - b * d (numpy's inv of a 3 x 3
    # cost ~0.15 ms a sample with its code out of the caches); a rounding
    # of ~1e-16 of the point is far inside the margin. Beyond 1e6 pixels a
    # warp that rounded its matrix to float32 could stray past the margin:
    # no box then (every patch is decoded)
    corners = ((0, 0), (width - 1, 0), (0, height - 1), (width - 1,
                                                         height - 1))
    xs = [(e * (x - c) - b * (y - f)) / det for x, y in corners]
    ys = [(a * (y - f) - d * (x - c)) / det for x, y in corners]
    if not all(math.isfinite(v) and abs(v) <= 1e6 for v in xs + ys):
        return None
    return (math.floor(min(xs)) - _MARGIN, math.floor(min(ys)) - _MARGIN,
            math.floor(max(xs)) + _MARGIN + 1,
            math.floor(max(ys)) + _MARGIN + 1)


def mosaic_reads(t: Any, canvas_shape: tuple,
                 patches: list) -> Optional[tuple]:
    """:func:`affine_reads` of the ``RandomAffine`` after the Mosaic ``t``
    (its ``_fp_then``) where a patch is undecoded or the run keeps no
    resizes (the Mosaic then resizes only the part read); None
    otherwise."""
    affine = getattr(t, '_fp_then', None)
    if affine is None or (getattr(t, '_fp_fit', None) is not None and not any(
            type(p.get('img')) is DeferredImage for p in patches)):
        return None
    return affine_reads(affine, canvas_shape)


def unread(reads: Optional[tuple], paste: tuple, crop: tuple, size: tuple,
           canvas: np.ndarray, img: Any) -> bool:
    """Whether the undecoded ``img``, resized to ``size`` and pasted at
    ``paste`` (x1, y1, x2, y2) from its ``crop``, lies wholly outside the
    box ``reads`` (:func:`affine_reads`; None: all is read), and stock's
    resize and paste of it cannot raise: a 3-channel ``uint8`` image of a
    positive size into a 3-channel ``uint8`` canvas, at integer
    coordinates inside the canvas and the resized image, the paste and the
    crop of one size. Then it need not be decoded."""
    if reads is None or type(img) is not DeferredImage or \
            not pastes_cleanly(paste, crop, size, canvas, img):
        return False
    x1, y1, x2, y2 = paste
    return x2 <= reads[0] or x1 >= reads[2] or y2 <= reads[1] or \
        y1 >= reads[3]


def pastes_cleanly(paste: tuple, crop: tuple, size: tuple, canvas: np.ndarray,
                   img: Any) -> bool:
    """Whether stock's resize of the 3-channel ``uint8`` ``img`` to
    ``size`` and its paste at ``paste`` from ``crop`` cannot raise: a
    positive size, a 3-channel ``uint8`` canvas, integer coordinates
    inside the canvas and the resized image, the paste and the crop of one
    size."""
    return _colour(img) and _colour(canvas) and min(size) > 0 and \
        _inside(paste, canvas.shape[1], canvas.shape[0]) and \
        _inside(crop, size[0], size[1]) and \
        paste[2] - paste[0] == crop[2] - crop[0] and \
        paste[3] - paste[1] == crop[3] - crop[1]


def _inside(box: tuple, width: int, height: int) -> bool:
    """Whether ``box`` is four ``int`` with 0 <= x1 <= x2 <= width and
    0 <= y1 <= y2 <= height (slices numpy takes as they are)."""
    return len(box) == 4 and all(type(v) is int for v in box) and \
        0 <= box[0] <= box[2] <= width and 0 <= box[1] <= box[3] <= height


def _colour(img: Any) -> bool:
    return len(img.shape) == 3 and img.shape[2] == 3 and \
        img.dtype == np.uint8


def install_shape_memos(mixers: list) -> str:
    """Gives the image loads of each fast mixing wrapper whose pipeline has
    a fast Mosaic right before an exact ``RandomAffine`` a shared
    :class:`ShapeMemo` (local files only).

    Args:
        mixers (list): The run's ``FastMultiImageMixDataset`` instances.

    Returns:
        str: The start line's words, or '' where none was given one.
    """
    from mmcv.transforms import LoadImageFromFile
    from mmdet.datasets.transforms import RandomAffine

    from fast_parallel.pipeline.cache import FastLoadImageFromFile
    from fast_parallel.pipeline.mosaic import FastMosaic
    given = 0
    for mixer in mixers:
        steps = list(mixer.pipeline)
        if not any(
                type(a) is FastMosaic and type(b) is RandomAffine
                for a, b in zip(steps, steps[1:])):
            continue
        for load in getattr(mixer.dataset.pipeline, 'transforms', ()):
            if type(load) not in (LoadImageFromFile, FastLoadImageFromFile) \
                    or load.backend_args is not None or \
                    load.file_client_args is not None:
                continue
            load.__class__ = FastLoadImageFromFile
            if load._fp_shapes is None:
                load._fp_shapes = ShapeMemo(len(mixer.dataset))
            given += 1
    return ('Mosaic decodes only the patches RandomAffine reads'
            if given else '')
