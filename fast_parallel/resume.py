"""``ExactResumeHook``: a resumed run continues exactly where it stopped.

mmengine's checkpoint carries the weights, optimizer, schedulers, message
hub and (with ``EMAHook``) the averaged weights, and ``IterBasedTrainLoop``
skips the batches already trained by drawing them again, so its workers
replay the same augmentations. What it does not carry:

- the random states of the main process: Python's ``random`` (mmdet's
  ``BatchSyncRandomResize`` draws its next size from it), NumPy's global
  state, torch's CPU and CUDA generators (dropout, samplers, the base seed
  every new DataLoader iterator draws). A resumed process starts from the
  seed instead;
- Python attributes of modules that are not in the ``state_dict``:
  ``BatchSyncRandomResize._input_size``, the size the next batches are
  resized to, starts again as "no resize";
- the validation that ran right after the checkpoint was written: it drew
  from torch's generator (its DataLoader iterator's base seed) before
  training went on.

This hook writes the first two into the checkpoint's own ``meta`` (key
``fast_parallel_resume``) and, when the Runner resumes from such a
checkpoint, puts them back right before the first resumed iteration, after
running again the validation the original run did after that checkpoint.
A run that is not resumed is not changed in any way (its batches may carry
their workers' states, below: the numbers stay the same).

Two more things a resumed run would get wrong, which the hook puts right:

- without a fixed seed (``randomness=dict(seed=None)``, mmdet's default) the
  Runner draws a new seed per process and builds the DataLoaders with it
  (sampler order, mmengine's ``worker_init_fn``) before ``Runner.resume``
  restores the checkpoint's seed: the resumed run would train on another
  order with other augmentations. The hook builds the train DataLoader again
  with the checkpoint's seed (:mod:`fast_parallel.restart`) before the first
  resumed batch is drawn;
- in an epoch-based loop the first batch is built before
  ``before_train_iter``: there the states go back in ``before_train_epoch``.

Epoch-based loops with persistent workers (``persistent_workers=True``,
mmdet's default): in the uninterrupted run the workers' random states
(Python, NumPy, torch) run on from epoch to epoch, where a resumed run
starts new workers, which mmengine's ``worker_init_fn`` seeds from the seed
and the worker id. On the fast path the hook carries the states over:

- ``FastParallelHook`` has the train collate function of such a loop report
  its worker's id and random states with each batch, taken right after the
  batch was made (``PackedCollate(worker_states=True)``,
  ``PackedBatch.worker_states``); no other loader pays for it;
- the hook sees every training batch in ``before_train_iter`` and keeps the
  latest states of each worker; a checkpoint gets them in its ``meta``.
  At an epoch-end checkpoint they are exactly what the uninterrupted run's
  workers go on from. In torch's ``_MultiProcessingDataLoaderIter`` (torch
  2.13) a worker gets indices only while the epoch's sampler has some
  (``_try_put_index``); it makes its batches one after the other and puts
  them on one queue, so the loop receives each worker's batches in the
  order they were made, and all of them before the epoch ends: each
  worker's latest batch is its last one. Until the next epoch's ``iter()``
  sends ``_ResumeIteration`` the workers wait on their index queues; on it
  a map-style dataset's worker only makes its fetcher again, which draws
  nothing, and in the main process ``_reset`` draws nothing either (its
  shared seed is for ``IterDataPipe`` datasets only). A worker that has
  made no batch yet holds what mmengine's ``worker_init_fn`` seeded, which
  a new worker gets too;
- on resume, the train DataLoader (the one that will run: after the rebuild
  with the checkpoint's seed) gets a one-shot ``worker_init_fn``,
  :class:`RestoreWorkerStates`: the original one, then the worker's saved
  states. The first iterator draws its base seed from a generator of its
  own, not torch's global one: the uninterrupted run drew it once, when its
  persistent iterator started in the first epoch, and not again. On a
  ``FastDataLoader`` the base seed (``get_worker_info().seed``) is the
  checkpoint's, the uninterrupted run's (elsewhere a new one: nothing in
  mmengine, mmdet or mmdet3d reads it). Once that iterator has started
  (the first ``before_train_iter``) the loader is as it was, so a later
  worker restart (mmdet's ``YOLOXModeSwitchHook``) seeds its workers as
  stock does.

What it cannot make exact, and warns about when resuming:

- an epoch-based checkpoint written in the middle of an epoch: mmengine
  trains that whole epoch again;
- an epoch-based loop with persistent workers resumed from a checkpoint
  without its workers' states (written on the stock data path, or by a
  fast_parallel from before they were saved) or with the states of another
  number of workers: the workers start from their seed;
- a distributed run (the warning names it). mmengine's
  ``Runner.save_checkpoint`` is decorated ``@master_only``: on every rank
  but global rank 0 it returns without doing anything, so
  ``before_save_checkpoint`` -- and this hook -- runs on rank 0 only, and
  the checkpoint holds rank 0's main-process random states and rank 0's
  worker states. On resume every rank loads that one file
  (``Runner.resume`` on each rank), so ranks other than 0 get rank 0's
  main-process states, which equal their own only where every rank drew
  alike (the same seed, no ``diff_rank_seed``, no draws on rank 0 alone
  such as ``BatchSyncRandomResize``'s next size); their persistent
  workers start from their seed (mmengine seeds each rank's workers
  apart), only rank 0's get the saved states.

Not detected: a hook that restarts the persistent workers in the very epoch
the run resumes at (``YOLOXModeSwitchHook`` resumed from the checkpoint
right before its switch): the uninterrupted run's workers started afresh
there, the resumed run's get the saved states.
"""
import random
from functools import partial
from typing import Callable, Dict, List, Optional, Tuple, Type, Union

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
from torch.utils.data import DataLoader

from .compat import loader_config, loop_progress, private
from .loader import FastDataLoader, make_fast
from .packing import PackedBatch
from .restart import rebuild_started, started_iterators

META_KEY = 'fast_parallel_resume'

#: Module classes whose plain attributes a resumed run needs, by
#: ``(module path, class name)``; filled lazily (mmdet may be absent).
_STATEFUL: Dict[Tuple[str, str], Tuple[str, ...]] = {
    ('mmdet.models.data_preprocessors.data_preprocessor',
     'BatchSyncRandomResize'): ('_input_size', ),
}


def register_stateful_module(cls: Type, attrs: Tuple[str, ...]) -> None:
    """Adds module attributes that ``ExactResumeHook`` saves and restores.

    Args:
        cls (type): An ``nn.Module`` class.
        attrs (tuple[str]): Attribute names; values must be plain Python
            data (numbers, strings, tuples, lists, dicts, None).
    """
    _STATEFUL[cls.__module__, cls.__qualname__] = tuple(attrs)


def _attrs_of(module: torch.nn.Module) -> Tuple[str, ...]:
    for cls in type(module).__mro__:
        attrs = _STATEFUL.get((cls.__module__, cls.__qualname__))
        if attrs is not None:
            return attrs
    return ()


def module_states(model: torch.nn.Module) -> Dict[str, dict]:
    """Registered plain attributes of every submodule, by module name.

    Args:
        model (nn.Module): The (possibly wrapped) model.

    Returns:
        dict: ``{module name: {attribute: value}}``.
    """
    out = {}
    for name, module in model.named_modules():
        attrs = _attrs_of(module)
        if attrs:
            out[name] = {a: getattr(module, a) for a in attrs}
    return out


def random_states() -> dict:
    """The main process's random states: Python, NumPy, torch, CUDA."""
    states = dict(python=random.getstate(), numpy=np.random.get_state(),
                  torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states['cuda'] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict) -> None:
    """Puts back what :func:`random_states` returned."""
    random.setstate(states['python'])
    np.random.set_state(states['numpy'])
    # A worker's torch state travels as a NumPy array (fast_parallel.collate).
    torch.set_rng_state(torch.as_tensor(states['torch']))
    if 'cuda' in states and torch.cuda.is_available():
        cuda = states['cuda']
        if len(cuda) != torch.cuda.device_count():
            raise RuntimeError(
                f'the checkpoint holds the random states of {len(cuda)} '
                f'GPUs, this process sees {torch.cuda.device_count()}')
        torch.cuda.set_rng_state_all(cuda)


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


_UNSET = object()


def _start_workers_from(loader: DataLoader,
                        saved: dict) -> Callable[[], None]:
    """Makes the loader's next iterator start its workers from ``saved``.

    Args:
        loader (DataLoader): A DataLoader whose iterator has not started.
        saved (dict): The checkpoint's worker entry: ``states``,
            ``num_workers``, ``base_seed``.

    Returns:
        callable: Puts the loader back as it was; call it once the iterator
        has started.
    """
    init_fn, generator = loader.worker_init_fn, loader.generator
    base_seed = loader.__dict__.get('_fast_parallel_base_seed', _UNSET)
    loader.worker_init_fn = RestoreWorkerStates(init_fn, saved['states'])
    # The uninterrupted run drew the persistent iterator's base seed from
    # torch's global generator once, in the first epoch: not again here.
    loader.generator = torch.Generator()
    if saved.get('base_seed') is not None and isinstance(
            loader, FastDataLoader):
        loader._fast_parallel_base_seed = saved['base_seed']

    def undo() -> None:
        loader.worker_init_fn, loader.generator = init_fn, generator
        if base_seed is _UNSET:
            loader.__dict__.pop('_fast_parallel_base_seed', None)
        else:
            loader._fast_parallel_base_seed = base_seed

    return undo


def _strip(name: str) -> str:
    # The same module under FastDataParallel / DDP ('module.' prefix) or not.
    return name[len('module.'):] if name.startswith('module.') else name


@HOOKS.register_module()
class ExactResumeHook(Hook):
    """Saves what a resumed run needs to go on bit for bit; puts it back.

    Add it to a config (``fast_parallel.enable`` does) next to
    ``FastParallelHook``::

        custom_hooks = [dict(type='FastParallelHook'),
                        dict(type='ExactResumeHook')]

    Args:
        priority (int | str): Hook priority. Defaults to 'VERY_HIGH': the
            states go back before any other hook's ``before_train_iter``.
    """

    priority = 'VERY_HIGH'

    def __init__(self, priority='VERY_HIGH') -> None:
        self.priority = priority
        self._pending: Optional[dict] = None
        self._built_seed: Optional[int] = None
        # The latest random states of each train DataLoader worker.
        self._workers: Dict[int, dict] = {}
        # On resume: the checkpoint's worker states, until before_train
        # hands them to the loader; then how to put the loader back.
        self._worker_restore: Optional[dict] = None
        self._undo_workers: Optional[Callable[[], None]] = None

    def before_run(self, runner) -> None:
        """Remembers the seed the Runner built the DataLoaders with."""
        self._built_seed = runner.seed

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Writes random and module states into ``checkpoint['meta']``, and
        the train DataLoader workers' where the batches carried them."""
        saved = dict(
            random=random_states(),
            modules={_strip(k): v
                     for k, v in module_states(runner.model).items()})
        loader = getattr(getattr(runner, '_train_loop', None), 'dataloader',
                         None)
        if self._workers and isinstance(loader, DataLoader):
            saved['workers'] = dict(
                states=dict(self._workers), num_workers=loader.num_workers,
                base_seed=getattr(getattr(loader, '_iterator', None),
                                  '_base_seed', None))
        checkpoint.setdefault('meta', {})[META_KEY] = saved

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """On resume, restores module states and keeps the random ones."""
        saved = checkpoint.get('meta', {}).get(META_KEY)
        if saved is None or not getattr(runner, '_resume', False):
            return
        modules = {_strip(name): m for name, m in runner.model.named_modules()}
        for name, attrs in saved['modules'].items():
            if name not in modules:
                raise KeyError(
                    f'checkpoint has resume state for module {name!r}, '
                    'which this model does not have')
            for attr, value in attrs.items():
                setattr(modules[name], attr, value)
        self._pending = saved
        self._worker_restore, reasons = _resume_plan(
            runner.train_loop, checkpoint, saved, runner.rank,
            runner.world_size)
        for why in reasons:
            runner.logger.warning(
                f'ExactResumeHook: this resumed run will not be identical '
                f'to an uninterrupted one: {why}.')

    def before_train(self, runner) -> None:
        """After a resume: the train DataLoader with the checkpoint's seed,
        its persistent workers to start from the checkpoint's states."""
        self._reseed_train_loader(runner)
        saved, self._worker_restore = self._worker_restore, None
        if saved is None:
            return
        loop = runner.train_loop
        loader = loop.dataloader  # the one that runs, rebuilt or not
        if started_iterators(loop, loader):
            runner.logger.warning(
                'ExactResumeHook: this resumed run will not be identical to '
                'an uninterrupted one: the train DataLoader\'s workers '
                'started before the hook could give them the checkpoint\'s '
                'random states.')
            return
        self._undo_workers = _start_workers_from(loader, saved)
        # Workers that make no batch before the next checkpoint go on with
        # these states in the uninterrupted run too.
        self._workers = dict(saved['states'])
        runner.logger.info(
            f'ExactResumeHook: the {loader.num_workers} persistent train '
            'DataLoader workers start from the random states the '
            'checkpoint holds, as the interrupted run\'s went on.')

    def _reseed_train_loader(self, runner) -> None:
        """The train DataLoader built again with the checkpoint's seed."""
        seed = runner.seed
        if self._pending is None or seed == self._built_seed:
            return
        loop = runner.train_loop
        why = rebuild_started(runner, loop,
                              loader_config(runner, '_train_loop'),
                              partial(_same_as, loop.dataloader), seed=seed)
        if why is None:
            runner.logger.info(
                f'ExactResumeHook: the train DataLoader was built again with '
                f'the checkpoint\'s seed {seed} (it was built with '
                f'{self._built_seed}), as the interrupted run had it.')
        else:
            runner.logger.warning(
                f'ExactResumeHook: the train DataLoader keeps the seed '
                f'{self._built_seed}, not the checkpoint\'s {seed}, so this '
                f'resumed run draws another order and other augmentations: '
                f'{why}. Set randomness=dict(seed=...) for an exact resume.')
        self._built_seed = seed

    def before_train_epoch(self, runner) -> None:
        """Epoch loops: the states go back before the epoch's first batch.
        """
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            self._restore(runner)

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        """Keeps the batch's worker states, if it carries them; iteration
        loops: the states go back at the first resumed iteration (after
        mmengine skipped the batches already trained)."""
        if isinstance(data_batch, PackedBatch) and \
                data_batch.worker_states is not None:
            worker_id, states = data_batch.worker_states
            self._workers[worker_id] = states
        if self._undo_workers is not None:
            # The iterator has started its workers: later restarts (e.g.
            # YOLOXModeSwitchHook) seed them as stock.
            self._undo_workers()
            self._undo_workers = None
        self._restore(runner)

    def _restore(self, runner) -> None:
        """Validation as the original run did, then the random states."""
        saved, self._pending = self._pending, None
        if saved is None:
            return
        set_random_states(saved['random'])
        if _validated_after(runner.train_loop):
            # The original run validated right after writing this
            # checkpoint; that drew from the random states too.
            runner.val_loop.run()
            runner.model.train()


def _same_as(old: DataLoader, new: DataLoader) -> None:
    """Gives a DataLoader built again what the running one has on top of
    its config: collate function, class, pinning."""
    new.collate_fn = old.collate_fn
    if isinstance(old, FastDataLoader):
        make_fast(new)
    new.pin_memory = old.pin_memory


def _resume_plan(loop, checkpoint: dict, saved: dict, rank: int,
                 world_size: int) -> Tuple[Optional[dict], List[str]]:
    """The worker states to put back, and why a resume cannot be exact.

    Args:
        loop: The train loop.
        checkpoint (dict): The checkpoint resumed from.
        saved (dict): Its ``meta[META_KEY]``.
        rank (int): This process's global rank.
        world_size (int): The number of processes.

    Returns:
        tuple: The checkpoint's worker entry (``states``, ``num_workers``,
        ``base_seed``) for this process's train DataLoader, or None; the
        reasons, empty for an exact resume.
    """
    reasons = []
    if world_size > 1:
        reasons.append(
            'in a distributed run only rank 0 writes the checkpoint '
            '(mmengine\'s Runner.save_checkpoint is master_only), so it '
            'holds rank 0\'s random states: the other ranks go on with '
            'rank 0\'s main-process states, and in an epoch-based loop '
            'their persistent DataLoader workers from their seed')
    if not isinstance(loop, EpochBasedTrainLoop):
        return None, reasons
    loader = loop.dataloader
    meta = checkpoint.get('meta', {})
    if meta.get('iter', 0) != meta.get('epoch', 0) * len(loader):
        reasons.append('the checkpoint was written in the middle of an '
                       'epoch, which mmengine trains again from its start')
        return None, reasons
    if not needs_worker_states(loop):
        return None, reasons
    workers = saved.get('workers')
    why = None
    if workers is None:
        why = ('the checkpoint holds no random states of the workers (it '
               'was written on the stock data path, or by a fast_parallel '
               'that did not save them); resume from a checkpoint of a run '
               'on the fast path, or set persistent_workers=False')
    elif workers['num_workers'] != loader.num_workers:
        why = (f'the checkpoint holds the random states of '
               f'{workers["num_workers"]} workers, this run has '
               f'{loader.num_workers}')
    if why is not None:
        reasons.append(
            'an epoch-based loop with persistent_workers=True restarts its '
            'workers from their seed, where the uninterrupted run\'s '
            f'workers went on with their random states: {why}')
        return None, reasons
    return (workers if rank == 0 else None), reasons


def _validated_after(
        loop: Union[IterBasedTrainLoop, EpochBasedTrainLoop]) -> bool:
    """Whether the loop validated after its last finished iteration/epoch.

    The same test as ``IterBasedTrainLoop.run`` / ``EpochBasedTrainLoop.run``
    make, at the same ``_iter`` / ``_epoch``.
    """
    if isinstance(loop, IterBasedTrainLoop):
        done, last = loop_progress(loop), loop.max_iters
    elif isinstance(loop, EpochBasedTrainLoop):
        done, last = loop_progress(loop), loop.max_epochs
    else:
        return False
    private(loop, '_decide_current_val_interval', 'mmengine',
            'exact resume (the validation interval)')()
    return (done > 0 and loop.runner.val_loop is not None
            and done >= loop.val_begin
            and (done % loop.val_interval == 0 or done == last))
