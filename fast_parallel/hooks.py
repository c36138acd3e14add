"""``FastParallelHook``: the one-line opt-in for any mmdet / mmdet3d config.
"""
from functools import partial
from typing import Optional, Sequence, Union

from mmengine.hooks import Hook
from mmengine.model import MMDistributedDataParallel, is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import BaseLoop
from torch import nn
from torch.utils.data import DataLoader

from fast_parallel.compat import (LOADER_CONFIGS, check_runner, loader_config,
                                  loop_as_is)
from fast_parallel.data.collate import is_packed_collate, packed_config_hint
from fast_parallel.data.loader import (accelerator_available, loader_figures,
                                       prepare_loader)
from fast_parallel.data.rebuild import (rebuild_started, sampler_names,
                                        started_iterators)
from fast_parallel.resume.hook import needs_worker_states
from fast_parallel.step.foreach_ema import fuse_ema
from fast_parallel.step.fused_optim import fuse_optim_wrapper
from fast_parallel.step.targets.switch import switch_targets
from fast_parallel.wrappers import (FastDataParallel,
                                    FastDistributedDataParallel)
from fast_parallel.wrappers.data_parallel import module_device

FAST_WRAPPERS = (FastDataParallel, FastDistributedDataParallel)


@HOOKS.register_module()
class FastParallelHook(Hook):
    """Turns on the fast data path for the train, val and test loops.

    Add to any mmdet / mmdet3d config::

        custom_imports = dict(imports=['fast_parallel'],
                              allow_failed_imports=False)
        custom_hooks = [dict(type='FastParallelHook')]

    Before each run it

    - makes the model run under a fast wrapper: ``FastDataParallel`` when
      the Runner left it unwrapped (launcher ``none``), and
      ``FastDistributedDataParallel`` in place of the Runner's
      ``MMDistributedDataParallel`` (launcher ``pytorch`` & co.);
    - wraps each built loop's DataLoader ``collate_fn`` in
      :class:`~fast_parallel.PackedCollate` and makes the DataLoader a
      :class:`~fast_parallel.data.loader.FastDataLoader` (no per-batch profiler
      scope while no profiler runs);
    - turns ``pin_memory`` on where the model is on a GPU;
    - in an ``EpochBasedTrainLoop`` with persistent workers, has the train
      batches carry their worker's random states, which ``ExactResumeHook``
      needs for an exact resume (:mod:`fast_parallel.resume.hook`).

    Before training it cuts the step's launch overhead, with the same bytes
    as stock:

    - the optimizer (``torch.optim.SGD``, ``Adam``, ``AdamW``) steps with
      one multi-tensor call per distinct set of hyper-parameters instead of
      one per param group (:mod:`fast_parallel.step.fused_optim`); groups,
      state and checkpoints stay stock's;
    - every ``EMAHook``'s averaged model (mmengine's EMA family, mmdet's
      ``ExpMomentumEMA``) updates with foreach ops instead of two ops per
      tensor (:mod:`fast_parallel.step.foreach_ema`);
    - the heads of :data:`~fast_parallel.step.targets.switch.COVERED`
      (``YOLOXHead`` with ``SimOTAAssigner``, ``Anchor3DHead`` with
      ``Max3DIoUAssigner``) compute the training targets of the whole batch
      at once instead of one image at a time, bit-identical to stock; the
      method is replaced on that head instance only. A sample the batched
      path cannot decide as stock does is computed stock's way and counted
      (:mod:`fast_parallel.step.targets.switch`).

    One log line says that the fast path is on and what it covers, e.g.
    ``FastParallelHook: on: wrapper FastDataParallel (cuda:0); loaders:
    train packed (2 workers, pinned), val packed (1 worker, pinned);
    optimizer: SGD 240 groups -> 2 fused steps; EMA (ExpMomentumEMA): 388
    tensors in 1 multi-tensor update; targets: YOLOXHead/SimOTAAssigner
    batched`` (a loader left stock reads ``train stock (<sampler>: <why>)``,
    an optimizer or a head left stock says why).

    The batches stay stock's, in stock's order: a DataLoader whose iterator
    has not started yet changes in place; one that has (``IterBasedTrainLoop``
    starts it, and its workers prefetch, before any hook runs) is built
    again from the loop's config around the same dataset, so that every
    sampler and batch sampler starts where stock's did
    (:mod:`fast_parallel.data.rebuild`). A sampler that draws from the main
    process's global random state while its iterator starts cannot be
    restarted exactly: that loop stays on the stock path, with a warning
    naming the sampler.

    A model under any other wrapper is left alone, with a warning, and so
    are its DataLoaders: the run stays on the stock path.

    The transfer figures of each training iteration go into the log line
    (``transfer_time``, ``transfer_copies``, ``transfer_mb``, right after
    ``data_time``); validation and test print their per-batch means at the
    end of each epoch.

    Args:
        device_ids (Sequence[int], optional): GPUs for ``FastDataParallel``
            in a run without launcher (one process, several GPUs). None
            keeps the device the Runner chose. Defaults to None.
        pin_memory (bool, optional): Force ``pin_memory`` on or off. None
            turns it on when the model is on a GPU. Defaults to None.
        fuse_optimizer (bool): Fuse the optimizer step across param groups.
            Defaults to True.
        foreach_ema (bool): Update EMA models with foreach ops. Defaults to
            True.
        fast_targets (bool): Compute the training targets of covered heads
            for the whole batch at once. Defaults to True.
        priority (int | str): Hook priority. Defaults to 'VERY_HIGH', so
            the wrapper is in place before other hooks look at the model.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 device_ids: Optional[Sequence[int]] = None,
                 pin_memory: Optional[bool] = None,
                 fuse_optimizer: bool = True,
                 foreach_ema: bool = True,
                 fast_targets: bool = True,
                 priority: Union[int, str] = 'VERY_HIGH') -> None:
        self.device_ids = list(device_ids) if device_ids else None
        self.pin_memory = pin_memory
        self.fuse_optimizer = fuse_optimizer
        self.foreach_ema = foreach_ema
        self.fast_targets = fast_targets
        #: The counters of the heads switched to batched targets.
        self.target_stats: list = []
        self.priority = priority
        self.enabled = False
        #: Per loop ('train', 'val', 'test'): what ``before_run`` did to its
        #: DataLoader, as the start-of-training line says it.
        self.loaders: dict = {}

    def before_run(self, runner) -> None:
        """Installs the wrapper and the packed collate function.

        Args:
            runner (Runner): The runner.
        """
        check_runner(runner)
        self.enabled = self._wrap_model(runner)
        if not self.enabled:
            return
        pin = self.pin_memory
        if pin is None:
            pin = module_device(runner.model.module).type == 'cuda'
        elif pin and not accelerator_available():
            runner.logger.info(
                'FastParallelHook: pin_memory=True skipped: no accelerator '
                'is present, and torch pins memory only for one.')
        for kind in LOADER_CONFIGS:
            loop = loop_as_is(runner, kind)
            loader = getattr(loop, 'dataloader', None) if isinstance(
                loop, BaseLoop) else None
            if isinstance(loader, DataLoader):
                self.loaders[kind] = self._install(runner, kind, loop,
                                                   loader_config(runner, kind),
                                                   pin)

    def before_train(self, runner) -> None:
        """Fuses the optimizer step and the EMA updates.

        Runs after every hook's ``before_run`` (``EMAHook`` builds its
        averaged model there) and after a resumed checkpoint was loaded;
        both are class swaps of the built instances, so what was loaded
        stays as it is.

        Args:
            runner (Runner): The runner.
        """
        if not self.enabled:
            return
        done = []
        if self.fuse_optimizer:
            done.append(fuse_optim_wrapper(runner.optim_wrapper))
        if self.foreach_ema:
            done += [
                fuse_ema(hook.ema_model) for hook in runner.hooks
                if isinstance(getattr(hook, 'ema_model', None), nn.Module)
            ]
        targets, self.target_stats = switch_targets(runner.model,
                                                    self.fast_targets)
        done.append(targets)
        runner.logger.info(self._summary(runner, done))

    def _summary(self, runner, done: Sequence[str]) -> str:
        """The start-of-training line: what is on, what was left stock.

        Args:
            runner (Runner): The runner.
            done (Sequence[str]): What ``before_train`` fused, as logged.

        Returns:
            str: E.g. ``FastParallelHook: on: wrapper FastDataParallel
            (cpu); loaders: train packed (2 workers, not pinned), ...;
            optimizer: SGD 240 groups -> 2 fused steps; EMA ...``.
        """
        model = runner.model
        device = str(module_device(model.module))
        if self.device_ids:
            device += f', device_ids {self.device_ids}'
        parts = [f'wrapper {type(model).__name__} ({device})']
        if self.loaders:
            parts.append('loaders: ' +
                         ', '.join(f'{kind} {outcome}'
                                   for kind, outcome in self.loaders.items()))
        parts += done
        if not self.fuse_optimizer:
            parts.append('optimizer: left stock (fuse_optimizer=False)')
        if not self.foreach_ema:
            parts.append('EMA: left stock (foreach_ema=False)')
        return 'FastParallelHook: on: ' + '; '.join(parts)

    @staticmethod
    def _install(runner, name: str, loop: BaseLoop, cfg, pin: bool) -> str:
        """The fast path for one loop, on exactly stock's batches.

        A loader no iterator has started yet (epoch loops, validation,
        test) changes in place. One already started (``IterBasedTrainLoop``
        starts it when built; its workers have prefetched) is built again
        from its config (:mod:`fast_parallel.data.rebuild`); where that cannot
        be
        exact the loop stays on the stock path, with a warning.

        The train loader of an epoch-based loop with persistent workers
        gets a collate function that reports its workers' random states
        (:func:`~fast_parallel.resume.needs_worker_states`).

        Returns:
            str: What was done, for the start-of-training line, e.g.
            ``packed (2 workers, pinned)``.
        """
        loader = loop.dataloader
        # Only an epoch loop with persistent workers needs the workers'
        # random states for an exact resume (see fast_parallel.resume.hook).
        states = name == 'train' and needs_worker_states(loop)
        started = started_iterators(loop, loader)
        if not started:
            prepare_loader(loader, pin, worker_states=states)
            return f'packed ({loader_figures(loader)})'
        if is_packed_collate(loader.collate_fn):
            # packed by its config from the start
            return f'packed by its config ({loader_figures(loader)})'
        why = rebuild_started(
            runner, loop, cfg,
            partial(prepare_loader, pin=pin, worker_states=states))
        if why is None:
            return f'packed, rebuilt ({loader_figures(loop.dataloader)})'
        runner.logger.warning(
            f'FastParallelHook: the {name} DataLoader '
            f'({sampler_names(loader)}) stays on the stock data path, '
            f'so that it trains on the same batches as stock: {why}. ' +
            packed_config_hint(name, cfg, pin and accelerator_available()))
        short = why.split(' (')[0].split(',')[0]
        return f'stock ({sampler_names(loader)}: {short})'

    def _wrap_model(self, runner) -> bool:
        model = runner.model
        if isinstance(model, FAST_WRAPPERS):
            return True
        if type(model) is MMDistributedDataParallel:
            # FastDistributedDataParallel adds no state: switching the class
            # of this one instance keeps DDP's reducer and its hooks as the
            # Runner built them (a second DDP would register them twice).
            model.__class__ = FastDistributedDataParallel
            return True
        if not is_model_wrapper(model):
            runner.model = FastDataParallel(model, device_ids=self.device_ids)
            return True
        runner.logger.warning(
            f'FastParallelHook: the model is wrapped by '
            f'{type(model).__name__}, which fast_parallel does not replace; '
            'the run stays on the stock data path.')
        return False

    def _report(self, runner, mode: str) -> None:
        model = runner.model
        if not self.enabled or not isinstance(model, FAST_WRAPPERS):
            return
        means = model.transfer_stats.pop_totals(mode)
        if means:
            runner.logger.info(
                f'fast_parallel {mode}: per batch transfer_time '
                f'{means["transfer_time"] * 1e3:.3f} ms, copies '
                f'{means["transfer_copies"]:.1f}, '
                f'{means["transfer_mb"]:.2f} MB')

    def after_train_epoch(self, runner) -> None:
        """Logs the epoch's mean transfer figures and target counts."""
        self._report(runner, 'train')
        for stats in self.target_stats:  # empty unless enabled
            line = stats.pop()
            if line:
                runner.logger.info(f'FastParallelHook: targets: {line}')

    def after_val_epoch(self, runner, metrics=None) -> None:
        """Logs the validation's mean transfer figures."""
        self._report(runner, 'val')

    def after_test_epoch(self, runner, metrics=None) -> None:
        """Logs the test's mean transfer figures."""
        self._report(runner, 'test')
