"""Putting the fast data path into a loop without changing its batches.

A loader whose iterator has not started changes in place
(:func:`~fast_parallel.data.loader.prepare_loader`); one whose iterator has
(``IterBasedTrainLoop`` starts it, and its workers prefetch, before any
hook runs) is **rebuilt** from its config by the Runner's own
``build_dataloader`` (:func:`rebuild_started`), where that can be exact;
else it stays stock and :func:`install_fast_path` says why
(``docs/design.md``, "Started loaders").
"""
import random
from functools import partial
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from fast_parallel.compat import (iterator_base_seed, point_holder_at,
                                  randomness_config, set_persistent_iterator,
                                  shutdown_workers, started_iterators)
from fast_parallel.data.collate import is_packed_collate
from fast_parallel.data.loader import loader_figures, prepare_loader
from fast_parallel.data.loader_state import loader_state
from fast_parallel.outcome import Outcome


class _SharedRef:
    """Survives ``copy.deepcopy`` as the object it holds.

    ``Runner.build_dataloader`` deep-copies its config; a built dataset put
    in it would be copied whole. Deep-copying this returns the dataset
    itself, so the rebuilt loader uses the very object stock's uses.
    """

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __deepcopy__(self, memo: dict) -> Any:
        return self.obj


# --------------------------------------------------------------------------
# The main process's random states.
# --------------------------------------------------------------------------
def _rng_snapshot() -> tuple:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _rng_restore(state: tuple) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


def _after_one_seed_draw(torch_state: torch.Tensor) -> torch.Tensor:
    """torch's CPU state after a DataLoader iterator drew its base seed."""
    gen = torch.Generator()
    gen.set_state(torch_state)
    torch.empty((), dtype=torch.int64).random_(generator=gen)
    return gen.get_state()


def _same_numpy_state(a: tuple, b: tuple) -> bool:
    return (a[0] == b[0] and np.array_equal(a[1], b[1])
            and tuple(a[2:]) == tuple(b[2:]))


def _foreign_draws(before: tuple, after: tuple, seed_draws: int) -> List[str]:
    """Global generators that moved, beyond the iterators' base-seed draws.

    Args:
        before (tuple): :func:`_rng_snapshot` before the loader was built.
        after (tuple): The snapshot after its iterator started.
        seed_draws (int): Iterators started (each draws its base seed from
            torch's generator).

    Returns:
        list[str]: Names of the generators drawn from; empty when none.
    """
    moved = []
    if before[0] != after[0]:
        moved.append('Python random')
    if not _same_numpy_state(before[1], after[1]):
        moved.append('NumPy')
    expected = before[2]
    for _ in range(seed_draws):
        expected = _after_one_seed_draw(expected)
    if not torch.equal(expected, after[2]):
        moved.append('torch')
    return moved


# --------------------------------------------------------------------------
# Started iterators.
# --------------------------------------------------------------------------
def _build_like(runner: Any, cfg: Any, old: DataLoader,
                seed: Optional[int]) -> Tuple[Optional[DataLoader], str, str]:
    """A DataLoader built as the Runner built ``old``, on ``old``'s dataset.

    Returns:
        tuple: The loader, or None, why it could not be built alike in a
        few words, and the rest of the sentence.
    """
    if not isinstance(cfg, dict):
        return (None, 'the Runner was given a built DataLoader',
                ', not a config to build it again from')
    cfg = dict(cfg)
    # The dataset is built already (and sliced, with num_batch_per_epoch).
    cfg.pop('num_batch_per_epoch', None)
    cfg['dataset'] = _SharedRef(old.dataset)
    diff_rank_seed = randomness_config(runner).get('diff_rank_seed', False)
    new = runner.build_dataloader(
        cfg, seed=seed, diff_rank_seed=diff_rank_seed)
    for what in ('dataset', 'sampler', 'batch_sampler'):
        a, b = getattr(old, what, None), getattr(new, what, None)
        same = a is b if what == 'dataset' else type(a) is type(b)
        if not same:
            return (None, 'the loader built again from its config has '
                    f'another {what}',
                    f' ({type(b).__name__} vs {type(a).__name__})')
    for what in ('batch_size', 'num_workers', 'drop_last'):
        if getattr(old, what) != getattr(new, what):
            return (None, 'the loader built again from its config has '
                    f'another {what}', '')
    return new, '', ''


def sampler_names(loader: DataLoader) -> str:
    """``Sampler`` or ``Sampler + BatchSampler`` of a loader, for messages.
    """
    names = [type(loader.sampler).__name__]
    batch_sampler = getattr(loader, 'batch_sampler', None)
    if batch_sampler is not None:
        names.append(type(batch_sampler).__name__)
    return ' + '.join(names)


def _not_rebuilt(samplers: str, short: str, rest: str) -> Outcome:
    """The outcome of a loop left as it was: ``<samplers>: <short>``."""
    return Outcome(
        samplers,
        False,
        short + rest,
        text=f'{samplers}: {short}',
        short=short)


def rebuild_started(runner: Any,
                    loop: Any,
                    cfg: Any,
                    prepare: Callable[[DataLoader], None],
                    seed: Optional[int] = None) -> Outcome:
    """Replaces a loop's started DataLoader by one built again from config.

    The new loader is built by ``runner.build_dataloader`` from ``cfg``
    around the running loader's dataset, given the running one's
    :class:`~fast_parallel.data.loader_state.LoaderState` settings and its
    iterator's base seed, given to ``prepare`` (which sets its collate
    function, class and pinning), and started; every holder of the old
    iterator gets the new one and the old workers are shut down. The main
    process's random states are the same afterwards as before.

    Args:
        runner (Runner): The runner.
        loop: The loop whose ``dataloader`` is replaced.
        cfg (dict | DataLoader): The config the Runner built the loop's
            DataLoader from (``runner._train_dataloader`` & co.).
        prepare (callable): Changes the new DataLoader before it starts.
        seed (int, optional): The seed to build with. Defaults to None:
            ``runner.seed``, the one stock built with.

    Returns:
        Outcome: Named by the loader's samplers (:func:`sampler_names`);
        ``done`` when the loop has the new loader, else ``why`` (and
        ``short``) the loop was left exactly as it was.
    """
    old = loop.dataloader
    samplers = sampler_names(old)
    holders = started_iterators(loop, old)
    seed = runner.seed if seed is None else seed
    before = _rng_snapshot()
    try:
        new, short, rest = _build_like(runner, cfg, old, seed)
        if new is None:
            return _not_rebuilt(samplers, short, rest)
        state = loader_state(new)
        state.carries_worker_states = \
            loader_state(old).carries_worker_states
        prepare(new)
        old_iters = []
        for holder, attr in holders:
            it = getattr(holder, attr)
            if all(it is not o for o in old_iters):
                old_iters.append(it)
        if old_iters:
            # The abandoned iterator's base seed (torch's own worker seeds).
            state.base_seed = iterator_base_seed(old_iters[0])
        new_iter = iter(new) if holders else None
        moved = _foreign_draws(before, _rng_snapshot(), int(bool(holders)))
        if moved:
            shutdown_workers(new_iter)
            return _not_rebuilt(
                samplers, 'its sampling draws from the main process\'s '
                'global random state', f' ({", ".join(moved)}) when it is '
                'built or started, which a restart cannot replay')
    finally:
        _rng_restore(before)
    for it in old_iters:
        shutdown_workers(it)
    set_persistent_iterator(old, None)
    for holder, attr in holders:
        point_holder_at(holder, attr, old, new, new_iter)
    loop.dataloader = new
    return Outcome(samplers, True, text=f'{samplers}: rebuilt')


def install_fast_path(runner: Any, kind: str, loop: Any, cfg: Any,
                      pin: bool) -> Outcome:
    """The fast data path for one loop's DataLoader, on stock's batches.

    A loader no iterator has started yet (epoch loops, validation, test)
    changes in place (:func:`~fast_parallel.data.loader.prepare_loader`).
    One already started is left alone when its config packs its batches
    already, else built again from its config (:func:`rebuild_started`);
    where that cannot be exact, the loop stays on the stock path.

    Args:
        runner (Runner): The runner.
        kind (str): 'train', 'val' or 'test'.
        loop: The loop (its ``dataloader`` may be replaced).
        cfg (dict | DataLoader): The config the Runner built the loop's
            DataLoader from.
        pin (bool): Turn ``pin_memory`` on (see ``prepare_loader``).

    Returns:
        Outcome: Named ``kind``; its line e.g. ``train packed (2 workers,
        pinned)``, ``train packed by its config (...)``, ``train packed,
        rebuilt (...)`` or ``train stock (<samplers>: <short why>)``.
    """
    loader = loop.dataloader
    if not started_iterators(loop, loader):
        prepare_loader(loader, pin)
        how = 'packed'
    elif is_packed_collate(loader.collate_fn):
        how = 'packed by its config'  # packed in its workers from the start
    else:
        rebuilt = rebuild_started(runner, loop, cfg,
                                  partial(prepare_loader, pin=pin))
        if not rebuilt.done:
            return Outcome(
                kind,
                False,
                rebuilt.why,
                text=f'{kind} stock ({rebuilt})',
                short=rebuilt.short)
        how = 'packed, rebuilt'
    return Outcome(
        kind, True, text=f'{kind} {how} ({loader_figures(loop.dataloader)})')
