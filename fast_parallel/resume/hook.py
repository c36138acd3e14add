"""``ExactResumeHook``: a resumed run continues exactly where it stopped.

It saves what mmengine's checkpoint leaves out (the main process's random
states, module attributes outside the ``state_dict``, the persistent train
workers' random states and restarts) and puts it back on resume; where a
resume cannot be exact, it says so in the log. Why each step is exact, and
the list of what is not: ``docs/resume.md``.
"""
from functools import partial
from typing import Dict, List, Optional, Tuple, Type, Union

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
from torch.utils.data import DataLoader

from fast_parallel.compat import (STATEFUL_MODULE_ATTRS, decide_val_interval,
                                  is_resuming, loader_config, loop_progress,
                                  runner_loop, switched_hooks)
from fast_parallel.data.loader import prepare_like
from fast_parallel.data.loader_state import carry_worker_states
from fast_parallel.data.rebuild import rebuild_started, started_iterators
from fast_parallel.random_states import random_states, set_random_states
from fast_parallel.resume.ranks import (buffers_of, gather_at_saves, own_entry,
                                        set_buffers)
from fast_parallel.resume.workers import (WorkerRecord, arm_first_start,
                                          needs_worker_states,
                                          stateful_transforms)

__all__ = [
    'ExactResumeHook', 'META_KEY', 'register_stateful_module', 'module_states',
    'random_states', 'set_random_states', 'needs_worker_states'
]

META_KEY = 'fast_parallel_resume'

#: Module classes whose plain attributes a resumed run needs, by
#: ``(module path, class name)``: mmdet's (the seam's defaults) and those
#: registered here.
_STATEFUL: Dict[Tuple[str, str], Tuple[str, ...]] = dict(STATEFUL_MODULE_ATTRS)


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
        # What the persistent train workers did (states, restarts).
        self._record = WorkerRecord()
        # On resume: the checkpoint's worker entry, until before_train
        # arms the loader's first start with it.
        self._worker_restore: Optional[dict] = None
        # On resume of an epoch loop: look for stateful transforms once the
        # first resumed workers have started (a hook may switch pipelines).
        self._check_caches = False
        self._fresh_workers = False
        # Distributed runs: every rank's states, for the next checkpoint.
        self._ranks: Optional[list] = None
        self._buffers: Optional[dict] = None

    def before_run(self, runner) -> None:
        """Remembers the seed the Runner built the DataLoaders with; asks for
        the train workers' random states where an exact resume needs them
        (:func:`~fast_parallel.resume.workers.needs_worker_states`)."""
        self._built_seed = runner.seed
        # distributed runs: every rank's states right before each checkpoint
        gather_at_saves(runner, partial(self._rank_states, runner),
                        self._keep_ranks)
        loop = runner_loop(runner, 'train')
        if needs_worker_states(loop):
            # Batches carry them where FastParallelHook packs them.
            carry_worker_states(loop.dataloader)

    def _own_states(self, runner) -> dict:
        """This process's random states, and its train DataLoader workers'
        where the batches carried them."""
        own = dict(random=random_states())
        loader = getattr(runner_loop(runner, 'train'), 'dataloader', None)
        if self._record.states and isinstance(loader, DataLoader):
            own['workers'] = self._record.entry(loader)
        return own

    def _rank_states(self, runner) -> dict:
        return dict(self._own_states(runner), buffers=buffers_of(runner))

    def _keep_ranks(self, states: list) -> None:
        self._ranks = states

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Writes random and module states into ``checkpoint['meta']``, and
        the train DataLoader workers' where the batches carried them; in a
        distributed run, every rank's (gathered just before)."""
        saved = dict(
            self._own_states(runner),
            modules={
                _strip(k): v
                for k, v in module_states(runner.model).items()
            })
        if self._ranks is not None:
            saved['ranks'] = [dict(r) for r in self._ranks]
            saved['ranks'][runner.rank].update(self._own_states(runner))
            self._ranks = None
        checkpoint.setdefault('meta', {})[META_KEY] = saved

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """On resume, restores module states and keeps the random ones."""
        saved = checkpoint.get('meta', {}).get(META_KEY)
        if saved is None or not is_resuming(runner):
            return
        modules = {_strip(name): m for name, m in runner.model.named_modules()}
        for name, attrs in saved['modules'].items():
            if name not in modules:
                raise KeyError(
                    f'checkpoint has resume state for module {name!r}, '
                    'which this model does not have')
            for attr, value in attrs.items():
                setattr(modules[name], attr, value)
        own = own_entry(saved, runner.rank, runner.world_size)
        if own is not None:  # this rank's own states (distributed run)
            saved = dict(
                {
                    k: v
                    for k, v in saved.items() if k not in ('random', 'workers')
                }, **own)
            # its buffers go back once the weights are loaded (before_train)
            self._buffers = own.get('buffers')
        self._pending = saved
        self._check_caches = isinstance(runner.train_loop, EpochBasedTrainLoop)
        self._worker_restore, reasons = _resume_plan(runner.train_loop,
                                                     checkpoint, saved,
                                                     runner.rank,
                                                     runner.world_size)
        for why in reasons:
            _inexact(runner, why)

    def before_train(self, runner) -> None:
        """After a resume: the train DataLoader with the checkpoint's seed,
        its persistent workers to start as the interrupted run's were."""
        if self._buffers is not None:
            set_buffers(runner, self._buffers)
            self._buffers = None
        self._reseed_train_loader(runner)
        saved, self._worker_restore = self._worker_restore, None
        if saved is None:
            return
        loop = runner.train_loop
        loader = loop.dataloader  # the one that runs, rebuilt or not
        if started_iterators(loop, loader):
            _inexact(
                runner, 'the train DataLoader\'s workers started before '
                'the hook could give them the checkpoint\'s random '
                'states')
            return
        # Workers that make no batch before the next checkpoint go on with
        # these states in the uninterrupted run too.
        self._record.states = dict(saved['states'])
        self._record.restarts = [dict(r) for r in saved.get('restarts', [])]
        arm_first_start(runner, loader, saved,
                        partial(self._workers_started, runner))

    def _workers_started(self, runner, fresh: bool, message: str,
                         exact: bool) -> None:
        """The first resumed workers started: afresh or from the states."""
        self._fresh_workers = fresh
        if fresh:
            # As the interrupted run's at this epoch: seeded, no states yet.
            recorded = {h for r in self._record.restarts for h in r['hooks']}
            self._record.restarts.append(
                dict(
                    epoch=runner.epoch,
                    hooks=sorted(switched_hooks(runner.hooks) - recorded)))
            self._record.states = {}
        if exact:
            runner.logger.info(f'ExactResumeHook: {message}.')
        else:
            _inexact(runner, message)

    def _reseed_train_loader(self, runner) -> None:
        """The train DataLoader built again with the checkpoint's seed."""
        seed = runner.seed
        if self._pending is None or seed == self._built_seed:
            return
        loop = runner.train_loop
        rebuilt = rebuild_started(
            runner,
            loop,
            loader_config(runner, 'train'),
            partial(prepare_like, loop.dataloader),
            seed=seed)
        if rebuilt.done:
            runner.logger.info(
                f'ExactResumeHook: the train DataLoader was built again with '
                f'the checkpoint\'s seed {seed} (it was built with '
                f'{self._built_seed}), as the interrupted run had it.')
        else:
            runner.logger.warning(
                f'ExactResumeHook: the train DataLoader keeps the seed '
                f'{self._built_seed}, not the checkpoint\'s {seed}, so this '
                f'resumed run draws another order and other augmentations: '
                f'{rebuilt.why}. Set randomness=dict(seed=...) for an exact '
                'resume.')
        self._built_seed = seed

    def before_train_epoch(self, runner) -> None:
        """Epoch loops: the states go back before the epoch's first batch.
        """
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            self._restore(runner)

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch=None) -> None:
        """Notes the batch's worker states and restarts; iteration loops:
        the states go back at the first resumed iteration (after mmengine
        skipped the batches already trained)."""
        loop = runner.train_loop
        if needs_worker_states(loop):
            self._record.see(runner, loop.dataloader, data_batch)
        if self._check_caches:
            self._check_caches = False
            self._warn_stateful_transforms(runner, loop.dataloader)
        self._restore(runner)

    def _warn_stateful_transforms(self, runner, loader: DataLoader) -> None:
        """Epoch loops: transforms whose state the interrupted run's
        pipeline carried into this epoch and no checkpoint holds."""
        if loader.num_workers > 0 and (not loader.persistent_workers
                                       or self._fresh_workers):
            return  # new workers each epoch, or afresh here: empty caches
        names = stateful_transforms(loader.dataset)
        if names:
            where = ('the main process'
                     if loader.num_workers == 0 else 'the persistent workers')
            _inexact(
                runner,
                (f'the train pipeline keeps state across samples in '
                 f'{", ".join(names)} (e.g. a results_cache), which lives in '
                 f'{where} and is in no checkpoint: the interrupted run went '
                 'into this epoch with it filled, this run starts it empty'))

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


def _inexact(runner, why: str) -> None:
    runner.logger.warning(
        'ExactResumeHook: this resumed run will not be identical to an '
        f'uninterrupted one: {why}.')


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
    if world_size > 1 and own_entry(saved, rank, world_size) is None:
        reasons.append(
            f'the checkpoint holds no random states per rank for '
            f'{world_size} ranks (written by another number of processes, '
            'without a CheckpointHook schedule the hook could see, or by '
            'an older fast_parallel): only rank 0 writes it (mmengine\'s '
            'Runner.save_checkpoint is master_only), so the other ranks go '
            'on with rank 0\'s main-process states, and in an epoch-based '
            'loop their persistent DataLoader workers from their seed')
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
    distributed_exact = world_size == 1 or own_entry(saved, rank,
                                                     world_size) is not None
    return (workers if rank == 0 or distributed_exact else None), reasons


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
    decide_val_interval(loop)
    return (done > 0 and loop.runner.val_loop is not None
            and done >= loop.val_begin
            and (done % loop.val_interval == 0 or done == last))
