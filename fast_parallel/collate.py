"""Collate functions that hand the DataLoader a ``PackedBatch``."""
from functools import partial
from typing import Any, Callable, Optional, Sequence, Tuple, Union

from mmengine.dataset import pseudo_collate
from mmengine.registry import FUNCTIONS
from torch.utils.data import get_worker_info

from .packing import PackedBatch, pack
from .resume import random_states
from .ring import DEFAULT_RING, SharedRing


def _pack_in_ring(tree, ring: Optional[SharedRing]) -> PackedBatch:
    """``pack`` into the worker's shared ring (fresh buffers elsewhere)."""
    if ring is None:
        return pack(tree)
    packed = pack(tree, allocate=ring.allocate)
    packed.ticket, ring.last = ring.last, None
    return packed


def worker_states() -> Optional[Tuple[int, dict]]:
    """``(worker id, random states)`` inside a DataLoader worker, else None.

    The states are :func:`fast_parallel.resume.random_states` with torch's
    state as a NumPy array: a tensor would cross the worker queue as a
    shared-memory segment of its own, the cost the ring avoids.
    """
    info = get_worker_info()
    if info is None:
        return None
    states = random_states()
    states['torch'] = states['torch'].numpy()
    return info.id, states


@FUNCTIONS.register_module()
def packed_collate(data_batch: Sequence) -> PackedBatch:
    """``pack(pseudo_collate(data_batch))``.

    Use it in any mmdet / mmdet3d config with
    ``collate_fn=dict(type='packed_collate')``. An empty batch packs to an
    empty list.

    Args:
        data_batch (Sequence): The samples of one batch.

    Returns:
        PackedBatch: The batch, one buffer per dtype.
    """
    return _pack_in_ring(
        pseudo_collate(data_batch) if len(data_batch) else [], DEFAULT_RING)


def build_collate(cfg: Union[Callable, dict, str]) -> Callable:
    """Builds a collate function the way mmengine's Runner does.

    Args:
        cfg (callable | dict | str): A function, a name in ``FUNCTIONS``, or
            a dict with ``type`` and keyword arguments bound with
            ``functools.partial``.

    Returns:
        callable: The collate function.
    """
    if isinstance(cfg, str):
        cfg = dict(type=cfg)
    if isinstance(cfg, dict):
        cfg = dict(cfg)
        fn = cfg.pop('type')
        if isinstance(fn, str):
            fn = FUNCTIONS.get(fn)
            if fn is None:
                raise KeyError(f'no collate function {cfg!r} in FUNCTIONS')
        return partial(fn, **cfg) if cfg else fn
    return cfg


class PackedCollate:
    """Packs the output of any other collate function.

    Args:
        inner (callable | dict | str): A collate function, or its config in
            mmengine's ``FUNCTIONS`` (e.g. ``dict(type='default_collate')``).
            Defaults to ``pseudo_collate``.
        ring (SharedRing, optional): Inside DataLoader workers, pack into
            this ring of reused shared-memory buffers
            (:mod:`fast_parallel.ring`); None packs into fresh buffers.
            Defaults to the shared default ring.
        worker_states (bool): Inside DataLoader workers, give each batch the
            worker's id and random states right after it was made
            (``PackedBatch.worker_states``, see :func:`worker_states`).
            ``FastParallelHook`` turns it on where ``ExactResumeHook`` needs
            them: the train loader of an epoch-based loop with persistent
            workers. Defaults to False.
    """

    def __init__(self,
                 inner: Union[Callable, dict, str] = pseudo_collate,
                 ring: Optional[SharedRing] = DEFAULT_RING,
                 worker_states: bool = False) -> None:
        inner = build_collate(inner)
        if isinstance(inner, PackedCollate):
            inner = inner.inner
        self.inner = inner
        self.ring = ring
        self.worker_states = worker_states

    def __call__(self, data_batch: Sequence) -> PackedBatch:
        tree = self.inner(data_batch) if len(data_batch) else []
        packed = _pack_in_ring(tree, self.ring)
        if self.worker_states:
            # After the whole batch: nothing the worker does before its
            # next batch draws a random number.
            packed.worker_states = worker_states()
        return packed

    def __repr__(self) -> str:
        name = getattr(self.inner, '__name__', repr(self.inner))
        return f'PackedCollate({name})'


def is_packed_collate(fn: Any) -> bool:
    """Whether ``fn`` already produces ``PackedBatch`` objects.

    Args:
        fn: A collate function.

    Returns:
        bool: True for ``packed_collate`` and ``PackedCollate`` instances.
    """
    return fn is packed_collate or isinstance(fn, PackedCollate)


def reporting_worker_states(fn: Callable) -> PackedCollate:
    """A packed collate function that reports its workers' random states.

    Args:
        fn: The DataLoader's collate function, packed or not.

    Returns:
        PackedCollate: ``fn`` itself when it reports them already; else a
        new one packing what ``fn`` collates (``fn`` is not changed).
    """
    if isinstance(fn, PackedCollate):
        if fn.worker_states:
            return fn
        return PackedCollate(fn.inner, fn.ring, worker_states=True)
    if fn is packed_collate:  # the same as PackedCollate()'s defaults
        return PackedCollate(worker_states=True)
    return PackedCollate(fn, worker_states=True)
