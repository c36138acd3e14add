"""``FastMultiImageMixDataset``: stock's mixing wrapper without the copies
that change nothing.

The class is put on the built dataset instance by
:func:`~fast_parallel.pipeline.switch.switch_pipeline`; an instance whose
wrapped dataset's items are not provably fresh keeps stock's
``__getitem__``. Per sample it does what stock does, in the same order, with
the same random draws: it only leaves out the deep copies of new objects and
of the results handed to a transform that cannot return None, and it hands
``MixUp`` the sample its ``get_indexes`` already loaded when loading it drew
nothing. Why each is exact: ``docs/pipeline.md``.
"""
import collections.abc
import contextlib
import copy
import inspect
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
from mmdet.datasets import MultiImageMixDataset

from fast_parallel.compat import mix_skip_type_keys, own_random_matrix
from fast_parallel.pipeline.cache import FastLoadImageFromFile, lent
from fast_parallel.pipeline.copies import (RandomStates, _box_types,
                                           as_deepcopied, fresh_results_why,
                                           sample_is_plain)
from fast_parallel.pipeline.stats import count
from fast_parallel.pipeline.unread import DeferredImage

__all__ = ['FastMultiImageMixDataset', 'never_none', 'retries_alike']


def never_none(transform: Any) -> bool:
    """Whether ``transform`` is of a class whose ``transform`` always
    returns its results (read in mmdet 3.3.0 / mmcv 2.1.0), so that stock's
    retry copy is never used."""
    from fast_parallel.pipeline.switch import NEVER_NONE
    return type(transform).__name__ in NEVER_NONE and \
        type(transform).__module__.startswith(('mmdet.', 'mmcv.',
                                               'fast_parallel.'))


def retries_alike(transform: Any) -> bool:
    """Whether ``transform`` returns None only without a random draw and
    without touching its input, so that every one of stock's retries would
    give None again (``FilterAnnotations``, read in mmdet 3.3.0)."""
    from fast_parallel.pipeline.switch import RETRIES_ALIKE
    return type(transform).__name__ in RETRIES_ALIKE and \
        type(transform).__module__.startswith('mmdet.')


def _draws_nothing(dataset: Any) -> bool:
    """Whether ``dataset`` is a ``BaseDataset`` with stock's loading
    methods and mmengine's ``Compose``, and every transform of its pipeline
    is of a load class read to draw no random number (mmcv's and the fast
    image load, mmdet's ``LoadAnnotations``; exact classes) reading local
    files (no ``backend_args`` / ``file_client_args``: a user's file
    backend may draw)."""
    from mmcv.transforms import LoadImageFromFile
    from mmdet.datasets.transforms import LoadAnnotations
    from mmengine.dataset import Compose
    return fresh_results_why(dataset) is None and \
        type(dataset.pipeline) is Compose and all(
            type(t) in (FastLoadImageFromFile, LoadImageFromFile,
                        LoadAnnotations)
            and getattr(t, 'backend_args', None) is None
            and getattr(t, 'file_client_args', None) is None
            for t in dataset.pipeline.transforms)


class _LoadProbe:
    """The wrapped dataset as ``MixUp.get_indexes`` sees it, remembering the
    last sample it loaded if loading it drew no random number.

    With loads that draw nothing (:func:`_draws_nothing`), only
    ``BaseDataset``'s refetch of a broken sample draws (it picks another
    index at random, and the item then holds that index), unless the data
    info holds an object of its own (its unpickling or deep copy runs its
    code): an item of plain data (:func:`~fast_parallel.pipeline.copies.
    sample_is_plain`) that holds the index asked for was loaded without a
    draw. Otherwise the random states before and after the load are
    compared.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.last: Optional[tuple] = None
        self.checks = not _draws_nothing(dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        before = RandomStates() if self.checks else None
        item = self.dataset[index]
        if before is not None:
            clean = before.same_as(RandomStates())
        else:
            clean = type(item) is dict and \
                item.get('sample_idx') == index and sample_is_plain(item)
        self.last = (index, item) if clean else None
        return item

    def take(self, index: int) -> Any:
        """The sample at ``index``: the one already loaded, or a new load."""
        last, self.last = self.last, None
        if last is not None and last[0] == index:
            count('mix loads reused')
            return last[1]
        return self.dataset[index]


def _reads(transform: Any) -> bool:
    """Whether ``transform`` only reads the loaded images it is handed (a
    fast Mosaic or MixUp: they may be lent the cache's views)."""
    from fast_parallel.pipeline.mixes import FastMixUp
    from fast_parallel.pipeline.mosaic import FastMosaic
    return type(transform) in (FastMosaic, FastMixUp)


def _return_lent(results: Any) -> None:
    """Copies any lent view a transform handed back (a Mosaic or MixUp that
    returned its input: ``prob``, a mix sample without boxes), so that the
    next transforms and the user get what stock's deep copy gives; decodes
    any image still undecoded."""
    if type(results) is dict:
        for key, value in results.items():
            if type(value) is np.ndarray and lent(value):
                results[key] = value.copy()
            elif type(value) is DeferredImage:
                results[key] = value.decoded()


def _is_fast_mosaic(transform: Any) -> bool:
    from fast_parallel.pipeline.mosaic import FastMosaic
    return type(transform) is FastMosaic


def _defers_to(active: list) -> Any:
    """The exact ``RandomAffine`` right after a fast Mosaic that is first
    among the ``active`` transforms: the Mosaic then decodes only the
    patches that affine reads. None otherwise."""
    from mmdet.datasets.transforms import RandomAffine

    from fast_parallel.pipeline.mosaic import FastMosaic
    if len(active) < 2 or type(active[0]) is not FastMosaic or \
            type(active[1]) is not RandomAffine or \
            not own_random_matrix(active[1]):
        return None
    return active[1]


def _probes(transform: Any) -> bool:
    from mmdet.datasets.transforms import MixUp
    return inspect.getattr_static(type(transform), 'get_indexes',
                                  None) is MixUp.__dict__['get_indexes']


#: Transform class -> (its copy can be left out, it never returns None,
#: it only reads loaded images): read off the class's identity, name and
#: module alone.
_KINDS: Dict[type, Tuple[bool, bool, bool]] = {}


def _kind(transform: Any) -> Tuple[bool, bool, bool]:
    """``(never_none or retries_alike, never_none, _reads)`` of
    ``transform``'s class, worked out once per class."""
    kind = _KINDS.get(type(transform))
    if kind is None:
        kind = _KINDS[type(transform)] = (never_none(transform)
                                          or retries_alike(transform),
                                          never_none(transform),
                                          _reads(transform))
    return kind


class FastMultiImageMixDataset(MultiImageMixDataset):
    """``MultiImageMixDataset`` with stock's samples and draws, fewer copies.

    ``_fp_fresh`` (set by the switch) is True when the wrapped dataset's
    items are new objects made without random draws; otherwise every item
    takes stock's ``__getitem__``.
    """

    _fp_fresh = False

    def __getitem__(self, idx: int) -> Any:
        if not self._fp_fresh or self.max_refetch <= 0:
            return super().__getitem__(idx)  # (stock raises without tries)
        boxes = _box_types()
        plain: dict = {}  # containers found plain, for this sample
        skip = mix_skip_type_keys(self)
        active = [
            t for t, kind in zip(self.pipeline, self.pipeline_types)
            if skip is None or kind not in skip
        ]
        first = active[0] if active else None
        defer = _defers_to(active)
        if _is_fast_mosaic(first):
            first._fp_then = defer
        try:
            return self._made(idx, first, defer, boxes, plain, skip)
        finally:  # (the affine is known only for this sample's Mosaic)
            if _is_fast_mosaic(first):
                first._fp_then = None

    def _made(self, idx: int, first: Any, defer: Any, boxes: tuple,
              plain: dict, skip: Any) -> Any:
        """The sample ``idx``, made with ``first`` (the first active
        transform) told the affine it feeds (``defer``)."""
        with self._lending(first, defer is not None) as lending:
            results = as_deepcopied(self.dataset[idx], boxes, plain, lending)
        for transform, transform_type in zip(self.pipeline,
                                             self.pipeline_types):
            if skip is not None and transform_type in skip:
                continue
            if hasattr(transform, 'get_indexes'):
                results['mix_results'] = self._mix_results(
                    transform, boxes, plain, defer is not None
                    and transform is first)
            uncopied, nonnull, reads = _kind(transform)
            if uncopied:
                updated = transform(
                    as_deepcopied(results, boxes, plain, reads))
                if updated is None and nonnull:
                    raise RuntimeError(
                        f'{type(transform).__name__} returned None, which '
                        'mmdet 3.3.0 never does: fast_parallel cannot '
                        'retry it as stock would (set '
                        'FastParallelHook(fast_pipeline=False)).')
                if updated is None:  # each of stock's retries gives None
                    raise RuntimeError(
                        'The training pipeline of the dataset wrapper'
                        ' always return None.Please check the correctness '
                        'of the dataset and its pipeline.')
                results = updated
            else:
                count(f'stock copy: {transform_type}')
                results = self._stock_retry(transform, results)
            if 'mix_results' in results:
                results.pop('mix_results')
            _return_lent(results)
            if transform is first and _is_fast_mosaic(first):
                # (the affine is told for this call only: the same Mosaic
                # again later in the pipeline feeds something else)
                first._fp_then = None
            first = None  # (the first call is made)
        count('samples')
        return results

    def _mix_results(self,
                     transform: Any,
                     boxes: tuple,
                     plain: dict,
                     defer: bool = False) -> list:
        for _ in range(self.max_refetch):
            probe = _LoadProbe(self.dataset) if _probes(transform) else None
            with self._lending(transform, defer) as lending:
                indexes = transform.get_indexes(probe or self.dataset)
                if not isinstance(indexes, collections.abc.Sequence):
                    indexes = [indexes]
                mix_results = [
                    as_deepcopied(
                        probe.take(index) if probe else self.dataset[index],
                        boxes, plain, lending) for index in indexes
                ]
            if None not in mix_results:
                return mix_results
        raise RuntimeError('The loading pipeline of the original dataset'
                           ' always return None. Please check the correctness '
                           'of the dataset and its pipeline.')

    @contextlib.contextmanager
    def _lending(self, reader: Any, defer: bool = False) -> Iterator[bool]:
        """While loading samples that go to ``reader`` first: where that is
        a fast Mosaic or MixUp (they only read a loaded image), the cached
        loads lend read-only views instead of copies, and with ``defer``
        (a fast Mosaic before a ``RandomAffine``) hand over known images
        undecoded (:mod:`~fast_parallel.pipeline.unread`). Yields whether
        they lend."""
        loads = [
            t for t in self.dataset.pipeline.transforms
            if type(t) is FastLoadImageFromFile
        ] if reader is not None and _kind(reader)[2] else []
        for load in loads:
            load._fp_lend = True
            load._fp_defer = defer
        try:
            yield bool(loads)
        finally:
            for load in loads:
                load._fp_lend = False
                load._fp_defer = False

    def _stock_retry(self, transform: Any, results: dict) -> dict:
        for _ in range(self.max_refetch):
            updated_results = transform(copy.deepcopy(results))
            if updated_results is not None:
                return updated_results
        raise RuntimeError('The training pipeline of the dataset wrapper'
                           ' always return None.Please check the correctness '
                           'of the dataset and its pipeline.')
