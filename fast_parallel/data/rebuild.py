"""Putting a new collate function in place without changing the batches.

A DataLoader's workers receive the collate function when its iterator
starts. mmengine's ``IterBasedTrainLoop`` starts its iterator when the loop
is built, before any hook runs, and that iterator's workers prefetch
(``num_workers * prefetch_factor`` batches): the sampler and batch sampler
have already handed out indices, and stateful ones (mmdet's
``AspectRatioBatchSampler`` buckets, ``MultiSourceSampler`` generators,
mmengine's ``InfiniteSampler`` stream) remember that. Dropping the iterator
and starting another on the same sampler objects trains on other batches.

So a loader whose iterator has started is not restarted but **rebuilt**:
the Runner's own ``build_dataloader`` makes a new DataLoader from the very
config the loop was built from, with the same seed, around the dataset
object already built (it is not loaded again). Its sampler and batch
sampler are therefore in the state stock's were in when stock's iterator
started, whatever their class, without knowing any sampler's private
state. The new iterator copies the abandoned one's base seed, and the
main process's random states are put back, so nothing downstream can tell.

What cannot be rebuilt that way is detected rather than guessed:

- a sampler (or its construction) that draws from the main process's
  global random states (Python ``random``, NumPy, torch), e.g. mmdet's
  ``GroupMultiSourceSampler`` with workers, or any sampler built with
  ``diff_rank_seed=True``: the draws the abandoned iterator made cannot be
  undone, so the rebuilt one would see other numbers;
- a loop whose DataLoader was handed to the Runner built (no config), or a
  rebuilt loader that does not match the running one (another sampler
  class, dataset or batch size).

Then :func:`rebuild_started` leaves the loop exactly as it was and returns
the reason; the caller keeps it on the stock data path and says so.
"""
import random
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from fast_parallel.compat import (iterator_base_seed, randomness_config,
                                  rehold, set_persistent_iterator,
                                  shutdown_workers, started_iterators)


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
                seed: Optional[int]) -> Tuple[Optional[DataLoader], str]:
    """A DataLoader built as the Runner built ``old``, on ``old``'s dataset.

    Returns:
        tuple: The loader, or None and why it could not be built alike.
    """
    if not isinstance(cfg, dict):
        return None, ('the Runner was given a built DataLoader, not a '
                      'config to build it again from')
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
            return None, (f'the loader built again from its config has '
                          f'another {what} ({type(b).__name__} vs '
                          f'{type(a).__name__})')
    for what in ('batch_size', 'num_workers', 'drop_last'):
        if getattr(old, what) != getattr(new, what):
            return None, (f'the loader built again from its config has '
                          f'another {what}')
    return new, ''


def sampler_names(loader: DataLoader) -> str:
    """``Sampler`` or ``Sampler + BatchSampler`` of a loader, for messages.
    """
    names = [type(loader.sampler).__name__]
    batch_sampler = getattr(loader, 'batch_sampler', None)
    if batch_sampler is not None:
        names.append(type(batch_sampler).__name__)
    return ' + '.join(names)


def rebuild_started(runner: Any,
                    loop: Any,
                    cfg: Any,
                    prepare: Callable[[DataLoader], None],
                    seed: Optional[int] = None) -> Optional[str]:
    """Replaces a loop's started DataLoader by one built again from config.

    The new loader is built by ``runner.build_dataloader`` from ``cfg``
    around the running loader's dataset, given to ``prepare`` (which sets
    its collate function, class and pinning), and started; every holder of
    the old iterator gets the new one and the old workers are shut down.
    The main process's random states are the same afterwards as before.

    Args:
        runner (Runner): The runner.
        loop: The loop whose ``dataloader`` is replaced.
        cfg (dict | DataLoader): The config the Runner built the loop's
            DataLoader from (``runner._train_dataloader`` & co.).
        prepare (callable): Changes the new DataLoader before it starts.
        seed (int, optional): The seed to build with. Defaults to None:
            ``runner.seed``, the one stock built with.

    Returns:
        str | None: None on success; else why the loop was left as it was.
    """
    old = loop.dataloader
    holders = started_iterators(loop, old)
    seed = runner.seed if seed is None else seed
    before = _rng_snapshot()
    try:
        new, why = _build_like(runner, cfg, old, seed)
        if new is None:
            return why
        prepare(new)
        old_iters = []
        for holder, attr in holders:
            it = getattr(holder, attr)
            if all(it is not o for o in old_iters):
                old_iters.append(it)
        if old_iters:
            # The abandoned iterator's base seed (torch's own worker seeds).
            new._fast_parallel_base_seed = iterator_base_seed(old_iters[0])
        new_iter = iter(new) if holders else None
        moved = _foreign_draws(before, _rng_snapshot(), int(bool(holders)))
        if moved:
            shutdown_workers(new_iter)
            return ('its sampling draws from the main process\'s global '
                    f'random state ({", ".join(moved)}) when it is built or '
                    'started, which a restart cannot replay')
    finally:
        _rng_restore(before)
    for it in old_iters:
        shutdown_workers(it)
    set_persistent_iterator(old, None)
    for holder, attr in holders:
        rehold(holder, attr, old, new, new_iter)
    loop.dataloader = new
    return None
