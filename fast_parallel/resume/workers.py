"""Persistent train workers across a resume: random states, restarts, caches.

Why each step is exact, and what is not: ``docs/resume.md``.
"""
import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
from mmengine.runner import EpochBasedTrainLoop
from torch.utils.data import DataLoader

from fast_parallel.compat import (iterator_base_seed, override_start,
                                  persistent_iterator, set_persistent_iterator,
                                  start_iterator, switched_hooks)
from fast_parallel.data.handout import packed_batch_of
from fast_parallel.data.loader import FastDataLoader
from fast_parallel.data.loader_state import loader_state
from fast_parallel.random_states import set_random_states


def needs_worker_states(loop) -> bool:
    """Whether an exact resume of this train loop needs its workers' random
    states: an ``EpochBasedTrainLoop`` whose DataLoader has workers and
    ``persistent_workers=True``.

    Args:
        loop: The train loop.

    Returns:
        bool: True only in that case.
    """
    loader = getattr(loop, 'dataloader', None)
    return (isinstance(loop, EpochBasedTrainLoop)
            and isinstance(loader, DataLoader) and loader.num_workers > 0
            and bool(loader.persistent_workers))


class RestoreWorkerStates:
    """``worker_init_fn``: the DataLoader's own, then the saved states.

    A class, not a closure, so that workers started with ``spawn`` or
    ``forkserver`` get it pickled.

    Args:
        init_fn (callable, optional): The original ``worker_init_fn``.
        states (dict): ``{worker id: random states}``; a worker without an
            entry keeps what ``init_fn`` gave it.
    """

    def __init__(self, init_fn: Optional[Callable[[int], None]],
                 states: Dict[int, dict]) -> None:
        self.init_fn = init_fn
        self.states = states

    def __call__(self, worker_id: int) -> None:
        if self.init_fn is not None:
            self.init_fn(worker_id)
        states = self.states.get(worker_id)
        if states is not None:
            set_random_states(states)


class WorkerRecord:
    """What this run's persistent train workers did, for its checkpoints.

    ``states``: each worker's latest random states (from the batches);
    ``restarts``: each time the workers were started again after the first
    start, ``dict(epoch=..., hooks=[switch-once hooks that switched])``.
    """

    def __init__(self) -> None:
        self.states: Dict[int, dict] = {}
        self.restarts: List[dict] = []
        self._last_iterator: Optional[weakref.ref] = None
        self._switched: Set[str] = set()

    def see(self, runner, loader: DataLoader, data_batch: Any) -> None:
        """Notes a training batch: a restart, the worker's states.

        Args:
            runner (Runner): The runner.
            loader (DataLoader): The train DataLoader.
            data_batch: The batch (a packed one may carry states).
        """
        it = persistent_iterator(loader)
        last = None if self._last_iterator is None else self._last_iterator()
        if it is not last:
            switched = switched_hooks(runner.hooks)
            if self._last_iterator is not None:
                # New workers: the old ones' states are of no use any more.
                self.restarts.append(
                    dict(
                        epoch=runner.epoch,
                        hooks=sorted(switched - self._switched)))
                self.states.clear()
            self._switched = switched
            self._last_iterator = None if it is None else weakref.ref(it)
        packed = packed_batch_of(data_batch)
        if packed is not None and packed.worker_states is not None:
            worker_id, states = packed.worker_states
            self.states[worker_id] = states

    def entry(self, loader: DataLoader) -> dict:
        """The checkpoint's ``workers`` entry."""
        it = persistent_iterator(loader)
        return dict(
            states=dict(self.states),
            num_workers=loader.num_workers,
            base_seed=iterator_base_seed(it),
            restarts=[dict(r) for r in self.restarts],
            # switch-once hooks that had switched when these workers
            # started (one that switched before the first start restarted
            # nothing, so no restart names it)
            switched=sorted(self._switched))


class _Unstarted:
    """Stands as a loader's persistent iterator until the first resumed
    epoch starts it. A hook that restarts the workers drops it (sets None);
    otherwise ``DataLoader.__iter__`` calls :meth:`_reset`, which puts the
    real iterator in its place (``__iter__`` returns ``loader._iterator``).
    """

    def __init__(self, start: Callable[[bool], Any]) -> None:
        self._start = start

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        set_persistent_iterator(loader, self._start(False))


def _start_workers_from(loader: DataLoader, saved: dict) -> Callable[[], None]:
    """Makes the loader's next iterator start its workers from ``saved``;
    returns how to put the loader back once the iterator has started."""
    init_fn, generator = loader.worker_init_fn, loader.generator
    state = loader_state(loader)
    base_seed = state.base_seed
    loader.worker_init_fn = RestoreWorkerStates(init_fn, saved['states'])
    # The uninterrupted run drew the persistent iterator's base seed from
    # torch's global generator when its workers started, not again here.
    loader.generator = torch.Generator()
    if saved.get('base_seed') is not None and isinstance(
            loader, FastDataLoader):
        state.base_seed = saved['base_seed']

    def undo() -> None:
        loader.worker_init_fn, loader.generator = init_fn, generator
        state.base_seed = base_seed

    return undo


def decide_start(restarted: bool, saved: dict, switched_now: Set[str],
                 epoch: int) -> Tuple[bool, str, bool]:
    """How the resumed run's first workers start: as the interrupted run's
    went on, or afresh as it restarted them at this epoch.

    Args:
        restarted (bool): A hook restarted the workers before this epoch's
            first batch (it dropped the persistent iterator).
        saved (dict): The checkpoint's ``workers`` entry.
        switched_now (set[str]): Switch-once hooks that have switched.
        epoch (int): The first resumed epoch (0-based).

    Returns:
        tuple: ``(fresh, message, exact)``: start afresh; what to log; False
        where the hook cannot tell what the interrupted run did.
    """
    if not restarted:
        return False, ('the persistent train DataLoader workers start from '
                       'the random states the checkpoint holds, as the '
                       'interrupted run\'s went on'), True
    restarts = saved.get('restarts')
    if restarts is None:
        return False, ('a hook restarted the train DataLoader workers in the '
                       f'first resumed epoch ({epoch}), and the checkpoint '
                       'does not say when the interrupted run restarted '
                       'its workers (written by an older fast_parallel): '
                       'they start from its states'), False
    recorded = {h for r in restarts for h in r['hooks']}
    recorded |= set(saved.get('switched', ()))
    new = switched_now - recorded
    if new:
        return True, (f'{", ".join(sorted(new))} restarted the train '
                      f'DataLoader workers at epoch {epoch}, as in the '
                      'interrupted run: they start afresh'), True
    if switched_now and all(r['hooks'] for r in restarts):
        when = ', '.join(str(r['epoch']) for r in restarts) or \
            '0, before its workers first started,'
        return False, (f'{", ".join(sorted(switched_now))} switched again '
                       '(its state is not in checkpoints); the interrupted '
                       f'run switched at epoch {when} and kept its workers '
                       'since: they start from the checkpoint\'s states'), True
    if not restarts:
        return True, ('a hook restarted the train DataLoader workers at '
                      f'epoch {epoch}, for the first time, as in the '
                      'interrupted run: they start afresh'), True
    return True, ('a hook restarted the train DataLoader workers in the '
                  f'first resumed epoch ({epoch}), and the interrupted run '
                  'restarted them before for reasons the hook does not know '
                  f'(epochs {[r["epoch"] for r in restarts]}): it cannot tell '
                  'whether they restarted at this epoch too; they start '
                  'afresh'), False


def arm_first_start(runner, loader: DataLoader, saved: dict,
                    done: Callable[[bool, str, bool], None]) -> None:
    """Makes the resumed run's first train iterator start as the
    interrupted run's workers were at that point.

    Args:
        runner (Runner): The runner.
        loader (DataLoader): The train DataLoader (not started).
        saved (dict): The checkpoint's ``workers`` entry.
        done (callable): Called with :func:`decide_start`'s answer once the
            iterator has started.
    """

    def start(restarted: bool) -> Any:
        override_start(loader, None)  # one shot
        fresh, message, exact = decide_start(restarted, saved,
                                             switched_hooks(runner.hooks),
                                             runner.epoch)
        if fresh:
            it = start_iterator(loader)
        else:
            undo = _start_workers_from(loader, saved)
            try:
                it = start_iterator(loader)
            finally:
                undo()
        done(fresh, message, exact)
        return it

    # DataLoader.__iter__ calls this when a hook dropped the placeholder.
    override_start(loader, lambda: start(True))
    set_persistent_iterator(loader, _Unstarted(start))


# --------------------------------------------------------------------------
# Transforms that keep state across samples (no checkpoint carries it).
# --------------------------------------------------------------------------
_CHILDREN = ('pipeline', 'transforms', 'dataset', 'datasets')
_CODE = (types.MethodType, types.FunctionType, types.BuiltinFunctionType)


def stateful_transforms(dataset: Any) -> List[str]:
    """Transforms in a dataset's pipelines that keep state across samples.

    mmdet's ``Cached*`` family and anything with a ``results_cache``,
    found through dataset wrappers (``dataset``/``datasets``), pipelines
    and nested transforms (``transforms``).

    Args:
        dataset: A dataset.

    Returns:
        list[str]: Class names, in pipeline order, each once.
    """
    found: List[str] = []
    seen: Set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if obj is None or id(obj) in seen or depth > 12 or isinstance(
                obj, (str, bytes, int, float, dict, torch.Tensor)):
            return
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item, depth + 1)
            return
        name = type(obj).__name__
        if (hasattr(obj, 'results_cache') or name.startswith('Cached')) \
                and name not in found:
            found.append(name)
        for attr in _CHILDREN:
            child = getattr(obj, attr, None)
            if not isinstance(child, _CODE):
                visit(child, depth + 1)

    visit(dataset, 0)
    return found
