"""Which transforms have fast forms (:data:`SWAPS`), and the switch.

:func:`switch_pipeline` walks the train dataset (through mmengine's and
mmdet's dataset wrappers), gives each transform instance of a covered class
its fast class and a ``MultiImageMixDataset`` whose wrapped items are fresh
the fast wrapper, on those instances only. Everything else stays stock, and
the start line names it with the reason.
"""
import importlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

from mmcv.transforms import LoadImageFromFile
from mmengine.dataset import BaseDataset

from fast_parallel.outcome import Outcome
from fast_parallel.pipeline.cache import FastLoadImageFromFile
from fast_parallel.pipeline.cache_plan import budget_left, install_cache
from fast_parallel.pipeline.cached_mixes import (FastCachedMixUp,
                                                 FastCachedMosaic)
from fast_parallel.pipeline.colour import FastYOLOXHSVRandomAug
from fast_parallel.pipeline.copies import fresh_results_why
from fast_parallel.pipeline.fit_cache import install_fit_caches
from fast_parallel.pipeline.layout import FastPackDetInputs, FastPad
from fast_parallel.pipeline.mix_dataset import FastMultiImageMixDataset
from fast_parallel.pipeline.mixes import FastMixUp
from fast_parallel.pipeline.mosaic import FastMosaic
from fast_parallel.pipeline.unread import install_shape_memos

__all__ = [
    'LAZY_SWAPS', 'NEVER_NONE', 'RETRIES_ALIKE', 'STAYS_STOCK', 'SWAPS',
    'switch_pipeline'
]

#: Stock transform class (exact, by name) -> its fast form.
SWAPS: Dict[str, type] = {
    'Mosaic': FastMosaic,
    'MixUp': FastMixUp,
    'YOLOXHSVRandomAug': FastYOLOXHSVRandomAug,
    'CachedMosaic': FastCachedMosaic,
    'CachedMixUp': FastCachedMixUp,
    'Pad': FastPad,
    'PackDetInputs': FastPackDetInputs,
}

#: Stock transform class (exact, by name) -> ``'module:class'`` of its fast
#: form, imported only when a dataset holds one: the 3D forms import mmdet3d.
LAZY_SWAPS: Dict[str, str] = {
    'ObjectSample': 'fast_parallel.pipeline.object_sample:FastObjectSample',
    'LoadPointsFromMultiSweeps':
    'fast_parallel.pipeline.sweeps:FastLoadPointsFromMultiSweeps',
    'PointsRangeFilter':
    'fast_parallel.pipeline.point_filters:FastPointsRangeFilter',
    'PointShuffle': 'fast_parallel.pipeline.point_filters:FastPointShuffle',
    'GlobalRotScaleTrans':
    'fast_parallel.pipeline.rigid3d:FastGlobalRotScaleTrans',
    'ObjectRangeFilter':
    'fast_parallel.pipeline.rigid3d:FastObjectRangeFilter',
}

#: Transforms left stock on purpose, and why (the start line says it).
STAYS_STOCK: Dict[str, str] = {
    'RandomAffine': 'no exact faster form',
}

#: Transform classes whose ``transform`` returns its results in every case
#: (read in mmdet 3.3.0 / mmcv 2.1.0), and their fast forms: the mixing
#: wrapper hands them its results without stock's retry copy.
NEVER_NONE = frozenset({
    'Mosaic', 'MixUp', 'RandomAffine', 'YOLOXHSVRandomAug', 'RandomFlip',
    'Resize', 'Pad', 'PackDetInputs', 'FastMosaic', 'FastMixUp',
    'FastYOLOXHSVRandomAug', 'FastPad', 'FastPackDetInputs'
})

#: Transform classes that return None only before touching their input and
#: without a random draw (read in mmdet 3.3.0): stock's retries of one
#: would all give None, so the wrapper raises stock's error at once.
RETRIES_ALIKE = frozenset({'FilterAnnotations'})


def _fast_form(cls: type) -> Optional[Tuple[str, type]]:
    """(stock name, fast class) where ``cls`` is a covered stock class or
    its fast form, else None; a lazy form is imported on its stock name."""
    base = cls.__base__
    for name in (cls.__name__, ) + (() if base is None else (base.__name__, )):
        fast = SWAPS.get(name)
        if fast is None and name in LAZY_SWAPS:
            module, attr = LAZY_SWAPS[name].split(':')
            fast = getattr(importlib.import_module(module), attr)
        if fast is not None and (fast is cls or fast.__base__ is cls):
            return name, fast
    return None


def _pipelines(dataset: Any) -> Iterator[Tuple[Any, List[Any]]]:
    """(dataset, its transform list) for ``dataset`` and what it wraps."""
    from mmdet.datasets import MultiImageMixDataset
    if isinstance(dataset, MultiImageMixDataset):
        yield dataset, dataset.pipeline
    else:
        transforms = getattr(
            getattr(dataset, 'pipeline', None), 'transforms', None)
        if isinstance(transforms, list):
            yield dataset, transforms
    inner = getattr(dataset, 'datasets', None)
    for child in inner if isinstance(inner, (list, tuple)) else ():
        yield from _pipelines(child)
    child = getattr(dataset, 'dataset', None)
    if child is not None and child is not dataset:
        yield from _pipelines(child)


def _switch_mixer(dataset: Any, stock: Dict[str, str]) -> bool:
    from mmdet.datasets import MultiImageMixDataset
    if type(dataset) is FastMultiImageMixDataset:
        return True
    if type(dataset) is not MultiImageMixDataset:
        return False
    why = fresh_results_why(dataset.dataset)
    if why is not None:
        stock['MultiImageMixDataset'] = f'copies kept: {why}'
        return False
    dataset.__class__ = FastMultiImageMixDataset
    dataset._fp_fresh = True
    return True


def _switch_3d_dataset(dataset: Any) -> Optional[str]:
    """Gives an mmdet3d dataset its class without the info's second copy
    (:mod:`~fast_parallel.pipeline.datasets3d`); its stock name, or None.
    mmdet3d is imported only for a dataset of its own."""
    module = type(dataset).__module__
    ours = 'fast_parallel.pipeline.datasets3d'
    if not (module.startswith('mmdet3d.') or module == ours):
        return None
    from fast_parallel.pipeline.datasets3d import fast_dataset_class
    fast = fast_dataset_class(type(dataset))
    if fast is None:
        return None
    dataset.__class__ = fast
    return fast.__name__[len('Fast'):]


def fast_transforms(dataset: Any) -> frozenset:
    """The ids of the transforms of ``dataset`` that have a fast class."""
    return frozenset(
        id(t) for _, transforms in _pipelines(dataset) for t in transforms
        if type(t) is FastLoadImageFromFile or _is_fast(type(t)))


def _is_fast(cls: type) -> bool:
    form = _fast_form(cls)
    return form is not None and form[1] is cls


def switch_pipeline(dataset: Any,
                    enabled: bool = True,
                    cache_inputs: Optional[str] = None,
                    forked: bool = True) -> Outcome:
    """Gives the covered transforms of ``dataset`` their fast forms, and
    its image loads the decoded-input cache.

    Args:
        dataset: The train DataLoader's dataset, before its workers start.
        enabled (bool): ``FastParallelHook(fast_pipeline=...)``.
        cache_inputs (str, optional): ``FastParallelHook(cache_inputs=...)``
            (:func:`~fast_parallel.pipeline.cache_plan.install_cache`).
            Defaults to None (off).
        forked (bool): Whether its DataLoader workers fork from this
            process. Defaults to True.

    Returns:
        Outcome: ``pipeline``; its text e.g. ``pipeline: Mosaic, MixUp,
        YOLOXHSVRandomAug, MultiImageMixDataset fast; RandomAffine stock (no
        exact faster form); inputs cached in shared memory (up to 1.2 GB;
        60.1 GB available)``.
    """
    if not enabled:
        return Outcome('pipeline', False, 'fast_pipeline=False')
    fast: List[str] = []
    stock: Dict[str, str] = {}
    loads, databases = [], []
    for holder, transforms in _pipelines(dataset):
        if _switch_mixer(holder, stock):
            fast.append('MultiImageMixDataset')
        name = _switch_3d_dataset(holder)
        if name is not None:
            fast.append(name)
        for transform in transforms:
            cls = type(transform)
            if cls in (LoadImageFromFile, FastLoadImageFromFile) and \
                    isinstance(holder, BaseDataset):
                loads.append((holder, transform))
            form = _fast_form(cls)
            if form is not None:
                transform.__class__ = form[1]
                fast.append(form[0])
                if hasattr(transform, 'switch_parts'):
                    stock.update(transform.switch_parts())
                if form[0] == 'ObjectSample':
                    databases.append((holder, transform.db_sampler))
            elif cls.__name__ in STAYS_STOCK:
                stock[cls.__name__] = STAYS_STOCK[cls.__name__]
    cache = install_cache(loads, cache_inputs, forked, databases)
    if cache.startswith('inputs cached in shared memory'):
        mixers = [
            holder for holder, _ in _pipelines(dataset)
            if type(holder) is FastMultiImageMixDataset
        ]
        fits = install_fit_caches(mixers, budget_left(loads, databases))
        cache += f'; {fits}' if fits else ''
    unread = install_shape_memos([
        holder for holder, _ in _pipelines(dataset)
        if type(holder) is FastMultiImageMixDataset
    ])
    cache += f'; {unread}' if unread else ''
    names = list(dict.fromkeys(fast))
    left = ''.join(f'; {name} stock ({why})' for name, why in stock.items())
    if not names:
        return Outcome(
            'pipeline',
            cache.startswith('inputs cached'),
            'no transform with a fast form',
            text=f'pipeline: stock (no transform with a fast form{left}); '
            f'{cache}')
    return Outcome(
        'pipeline',
        True,
        text=f'pipeline: {", ".join(names)} fast{left}; {cache}')
