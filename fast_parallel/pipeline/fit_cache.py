"""Mosaic's and MixUp's keep-ratio resizes of cached images, kept too.

``Mosaic`` and ``MixUp`` first resize each loaded image to fit their scale
(``min(scale_h / h, scale_w / w)``): no random draw, a function of the
decoded bytes and the scale alone, ~0.5 ms a patch and five patches a
YOLOX sample. Where a ``MultiImageMixDataset``'s items are fresh loads
from a shared-memory :class:`~fast_parallel.pipeline.cache.DecodedCache`,
:class:`FitCache` keeps each image's resize at one scale in shared memory
as well, keyed by the path: a hit is a read-only view (the mixes only read
it), a miss resizes as stock does. Only an image that is the decoded
cache's own read-only view of its entry (lent by the load) is looked up or
kept: its bytes are then that entry's. Why: ``docs/pipeline.md``.
"""
from typing import Any, Dict, List, Optional, Tuple

import mmcv
import mmcv.image.geometric as mmcv_geometric
import numpy as np

from fast_parallel.pipeline.cache import DecodedCache, FastLoadImageFromFile
from fast_parallel.pipeline.mixes import FastMixUp
from fast_parallel.pipeline.mosaic import FastMosaic
from fast_parallel.pipeline.stats import count

__all__ = ['FitCache', 'fit_size', 'install_fit_caches']


def fit_size(shape: tuple, scale: tuple) -> Tuple[int, int]:
    """Stock's keep-ratio size, ``(width, height)``, of an image of
    ``shape`` at ``scale`` (width, height), as Mosaic and MixUp compute it.
    """
    h, w = shape[:2]
    ratio = min(scale[1] / h, scale[0] / w)
    return int(w * ratio), int(h * ratio)


class FitCache:
    """The keep-ratio resizes at ``scale`` of the images of ``decoded``.

    Args:
        decoded (DecodedCache): The decoded images the dataset's load keeps.
        scale (tuple): (width, height), a Mosaic's ``img_scale`` or a
            MixUp's ``dynamic_scale``.
        capacity (int): Bytes for the resized images.
    """

    def __init__(self, decoded: DecodedCache, scale: tuple,
                 capacity: int) -> None:
        self.decoded = decoded
        self.scale = tuple(scale)
        self.fits = DecodedCache(list(decoded.slots), capacity)

    def __deepcopy__(self, memo: dict) -> 'FitCache':
        return self

    def __reduce__(self) -> Any:
        return (type(None), ())  # a spawned worker resizes, as stock does

    def resized(self, patch: dict, img: np.ndarray,
                size: Tuple[int, int]) -> np.ndarray:
        """``mmcv.imresize(img, size)`` for the loaded image ``img`` of
        ``patch``: where ``img`` is the decoded cache's own view of the
        entry of its path (lent by the load, so its bytes are that entry's)
        and OpenCV resizes, the kept resize of that entry (a read-only
        view), made and kept on a miss; stock's resize otherwise.

        Args:
            patch (dict): The loaded sample (its ``img_path``).
            img (np.ndarray): Its image.
            size (tuple): (width, height).

        Returns:
            np.ndarray: The resized image (read-only where kept).
        """
        path = patch.get('img_path')
        if type(path) is not str or tuple(size) == img.shape[1::-1] or \
                mmcv_geometric.imread_backend != 'cv2' or \
                not self.decoded.lends(path, img):
            return mmcv.imresize(img, size)
        shape = (size[1], size[0]) + img.shape[2:]
        hit = self.fits.view(path, shape, img.dtype)
        if hit is not None:
            count('cache: resizes kept')
            return hit
        out = mmcv.imresize(img, size)
        kept = self.decoded.kept(path)  # (with the file's stat)
        if kept is not None:
            self.fits.put(path, np.ascontiguousarray(out), kept[2])
        return out


def _scale_of(transform: Any) -> Optional[tuple]:
    if type(transform) is FastMosaic:
        return tuple(transform.img_scale)
    if type(transform) is FastMixUp:
        return tuple(transform.dynamic_scale)
    return None


def _decoded_of(mixer: Any) -> Optional[DecodedCache]:
    """The shared-memory cache of the one image load (colour) of
    ``mixer``'s fresh dataset: loads only, so its items' images are the
    decodes of their paths. None where there is none."""
    if not getattr(mixer, '_fp_fresh', False):
        return None
    loads = [
        t for t in mixer.dataset.pipeline.transforms
        if type(t).__name__ in ('LoadImageFromFile', 'FastLoadImageFromFile')
    ]
    if len(loads) != 1 or type(loads[0]) is not FastLoadImageFromFile or \
            type(loads[0]._fp_cache) is not DecodedCache or \
            loads[0].color_type != 'color':
        return None
    return loads[0]._fp_cache


def _need(dataset: Any, scale: tuple) -> int:
    """Bytes of the resizes of ``dataset``'s colour images at ``scale``
    (from the data infos; an image already of its fit size needs none)."""
    total = 0
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        shape = (int(info['height']), int(info['width']))
        w, h = fit_size(shape, scale)
        if (h, w) != shape:
            total += w * h * 3
    return total


def install_fit_caches(mixers: List[Any], budget: float) -> str:
    """Gives the fast Mosaic and MixUp of each fresh, cached
    ``FastMultiImageMixDataset`` the :class:`FitCache` of their scale,
    where all of those still to make fit ``budget`` bytes.

    Args:
        mixers (list): The run's ``FastMultiImageMixDataset`` instances.
        budget (float): Bytes of shared memory still allowed.

    Returns:
        str: The start line's words ('' where no mix can have one).
    """
    plans = []
    for mixer in mixers:  # (a switch again may find no cache, or no room)
        for t in mixer.pipeline:
            if type(t) in (FastMosaic, FastMixUp):
                t._fp_fit = None
    for mixer in mixers:
        decoded = _decoded_of(mixer)
        for t in mixer.pipeline if decoded is not None else ():
            scale = _scale_of(t)
            if scale is not None:
                plans.append((t, mixer.dataset, decoded, scale))
    if not plans:
        return ''
    to_make: Dict[tuple, tuple] = {}
    for _, dataset, decoded, scale in plans:
        key = (id(decoded), scale)
        if scale not in decoded.derived and key not in to_make:
            to_make[key] = (decoded, scale, _need(dataset, scale))
    need = sum(size for _, _, size in to_make.values())
    held = sum(f.fits.capacity for decoded in {id(p[2]): p[2]
                                               for p in plans}.values()
               for f in decoded.derived.values())
    if need > budget - held:
        return (f'Mosaic/MixUp resizes not cached (they need '
                f'{need / 1e9:.1f} GB more)')
    for decoded, scale, size in to_make.values():
        decoded.derived[scale] = FitCache(decoded, scale, size)
    given = {}
    for t, _, decoded, scale in plans:
        t._fp_fit = given[(id(decoded), scale)] = decoded.derived[scale]
    total = sum(f.fits.capacity for f in given.values())
    return f'Mosaic/MixUp resizes cached too (up to {total / 1e9:.1f} GB)'
