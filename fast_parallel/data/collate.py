"""Collate functions that hand the DataLoader a ``PackedBatch``."""
from functools import partial
from typing import Any, Callable, Optional, Sequence, Tuple, Union

from mmengine.dataset import pseudo_collate
from mmengine.registry import FUNCTIONS
from torch.utils.data import get_worker_info

from fast_parallel.data.batch import PackedBatch
from fast_parallel.data.loader_state import LoaderState
from fast_parallel.data.packing import pack
from fast_parallel.data.ring import DEFAULT_RING, SharedRing, fresh_shared
from fast_parallel.random_states import random_states


def _pack_in_ring(tree, ring: Optional[SharedRing]) -> PackedBatch:
    """``pack`` into the worker's shared ring (fresh buffers elsewhere)."""
    if ring is None:
        return pack(tree, allocate=fresh_shared)
    packed = pack(tree, allocate=ring.allocate)
    packed.ticket, ring.last = ring.last, None
    return packed


def current_worker_states() -> Optional[Tuple[int, dict]]:
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
def packed_collate(
        data_batch: Sequence,
        inner: Union[Callable, dict, str, None] = None) -> PackedBatch:
    """``pack(pseudo_collate(data_batch))``, or ``pack(inner(data_batch))``.

    Use it in any mmdet / mmdet3d config with
    ``collate_fn=dict(type='packed_collate')``; a config whose loader
    collates with something else names it as ``inner``, e.g.
    ``collate_fn=dict(type='packed_collate',
    inner=dict(type='default_collate'))``. An empty batch packs to an empty
    list.

    Args:
        data_batch (Sequence): The samples of one batch.
        inner (callable | dict | str, optional): The collate function to
            pack the output of (see :func:`build_collate`). Defaults to
            None: ``pseudo_collate``.

    Returns:
        PackedBatch: The batch, one buffer per dtype.
    """
    collate = pseudo_collate if inner is None else build_collate(inner)
    return _pack_in_ring(
        collate(data_batch) if len(data_batch) else [], DEFAULT_RING)


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
            (:mod:`fast_parallel.data.ring`); None packs into fresh buffers.
            Defaults to the shared default ring.
        state (LoaderState, optional): The state of the DataLoader it
            collates for (:mod:`fast_parallel.data.loader_state`). Where it
            says so (``carries_worker_states``), each batch made in a worker
            gets the worker's id and random states right after it was made
            (``PackedBatch.worker_states``, see
            :func:`current_worker_states`). Defaults to None: none.
    """

    def __init__(self,
                 inner: Union[Callable, dict, str] = pseudo_collate,
                 ring: Optional[SharedRing] = DEFAULT_RING,
                 state: Optional[LoaderState] = None) -> None:
        inner = build_collate(inner)
        self.inner = packed_inner(inner) or inner
        self.ring = ring
        self.state = state

    def __call__(self, data_batch: Sequence) -> PackedBatch:
        tree = self.inner(data_batch) if len(data_batch) else []
        packed = _pack_in_ring(tree, self.ring)
        if self.state is not None and self.state.carries_worker_states:
            # After the whole batch: nothing the worker does before its
            # next batch draws a random number.
            packed.worker_states = current_worker_states()
        return packed

    def __repr__(self) -> str:
        name = getattr(self.inner, '__name__', repr(self.inner))
        return f'PackedCollate({name})'


def packed_inner(fn: Any) -> Optional[Callable]:
    """What a packed collate function packs the output of.

    Args:
        fn: A collate function.

    Returns:
        callable | None: ``pseudo_collate`` for ``packed_collate`` (also as
        the ``functools.partial`` mmengine's Runner builds from
        ``collate_fn=dict(type='packed_collate', ...)``, with its ``inner``),
        a ``PackedCollate``'s ``inner``; None for any other function.
    """
    if isinstance(fn, PackedCollate):
        return fn.inner
    if isinstance(fn, partial) and fn.func is packed_collate and not fn.args:
        inner = (fn.keywords or {}).get('inner')
        return pseudo_collate if inner is None else build_collate(inner)
    return pseudo_collate if fn is packed_collate else None


def is_packed_collate(fn: Any) -> bool:
    """Whether ``fn`` already produces ``PackedBatch`` objects.

    Args:
        fn: A collate function.

    Returns:
        bool: True for ``packed_collate`` (also as the Runner's
        ``functools.partial`` of it) and ``PackedCollate`` instances.
    """
    return packed_inner(fn) is not None


def packed_config_hint(name: str, cfg: Any, pin: bool) -> str:
    """How a config packs a loop's batches from the start (for warnings).

    A loader built with a packed collate function is packed in its workers
    from its first batch, so it needs no restart: the data path's gain,
    with stock's sampler and batches.

    Args:
        name (str): 'train', 'val' or 'test'.
        cfg: The loop's DataLoader config (a dict), or the built DataLoader
            the Runner was given.
        pin (bool): Also advise ``pin_memory=True`` (a GPU run).

    Returns:
        str: A sentence with the config line.
    """
    if not isinstance(cfg, dict):
        return ('To pack its batches anyway, build it with '
                '`collate_fn=fast_parallel.PackedCollate(<its collate_fn>)`.')
    inner = cfg.get('collate_fn', None) or dict(type='pseudo_collate')
    line = f'{name}_dataloader.collate_fn=dict(type=\'packed_collate\''
    if not (isinstance(inner, dict)
            and dict(inner) == dict(type='pseudo_collate')):
        line += f', inner={_config_text(inner)}'
    lines = [line + ')']
    if pin:
        lines.append(f'{name}_dataloader.pin_memory=True')
    return ('To pack its batches all the same (stock\'s batches, from '
            'stock\'s sampler), set the packed collate in its config from '
            'the start: `' + '` and `'.join(lines) + '`.')


def _config_text(value: Any) -> str:
    """``dict(type='x', k=1)`` for a config dict; ``repr`` otherwise."""
    if isinstance(value, dict):
        return 'dict(' + ', '.join(f'{k}={_config_text(v)}'
                                   for k, v in value.items()) + ')'
    return getattr(value, '__name__', None) or repr(value)


def packed_for(fn: Callable, state: LoaderState) -> PackedCollate:
    """A DataLoader's packed collate function, reading its state.

    Args:
        fn: The DataLoader's collate function, packed or not.
        state (LoaderState): The DataLoader's state.

    Returns:
        PackedCollate: ``fn`` itself when it is one reading ``state``
        already; else a new one packing what ``fn`` collates (in ``fn``'s
        ring, for a ``PackedCollate``), and ``fn`` is not changed.
    """
    if isinstance(fn, PackedCollate):
        if fn.state is state:
            return fn
        return PackedCollate(fn.inner, fn.ring, state)
    # packed_collate (or the Runner's partial of it) is PackedCollate(inner)
    # with the defaults.
    return PackedCollate(packed_inner(fn) or fn, state=state)
