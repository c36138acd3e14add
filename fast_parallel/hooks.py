"""``FastParallelHook``: the one-line opt-in for any mmdet / mmdet3d config.
"""
from typing import List, Optional, Sequence, Union

from mmengine.hooks import Hook
from mmengine.model import MMDistributedDataParallel, is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import BaseLoop
from torch import nn
from torch.utils.data import DataLoader

from fast_parallel.compat import (LOADER_CONFIGS, check_runner, loader_config,
                                  runner_loop, started_iterators)
from fast_parallel.data.collate import packed_config_hint
from fast_parallel.data.loader import accelerator_available, forks_workers
from fast_parallel.data.rebuild import install_fast_path, sampler_names
from fast_parallel.outcome import Outcome
from fast_parallel.pipeline.data_bound import DataBoundMonitor
from fast_parallel.pipeline.stats import share_counts, shared_totals
from fast_parallel.step.foreach_ema import fuse_ema
from fast_parallel.step.fused_optim import fuse_optim_wrapper
from fast_parallel.step.images import switch_images
from fast_parallel.step.level_switch import switch_level_grads
from fast_parallel.step.targets.switch import switch_targets
from fast_parallel.step.voxelize import switch_voxelize
from fast_parallel.wrappers import (FastDataParallel,
                                    FastDistributedDataParallel)
from fast_parallel.wrappers.data_parallel import module_device

FAST_WRAPPERS = (FastDataParallel, FastDistributedDataParallel)
#: Iterations after which the first data-bound line is logged.
DATA_BOUND_AFTER = 50


@HOOKS.register_module()
class FastParallelHook(Hook):
    """Turns on the fast data path and the cheaper training step.

    Add to any mmdet / mmdet3d config::

        custom_imports = dict(imports=['fast_parallel'],
                              allow_failed_imports=False)
        custom_hooks = [dict(type='FastParallelHook')]

    Before each run it puts the model under a fast wrapper
    (``FastDataParallel``, or ``FastDistributedDataParallel`` in place of
    the Runner's ``MMDistributedDataParallel``) and gives each loop's
    DataLoader packed batches on stock's sampling
    (:func:`~fast_parallel.data.rebuild.install_fast_path`); before training
    it fuses the optimizer step, the ``EMAHook`` updates and the training
    targets of covered heads, with stock's bytes. One log line says what is
    on and why any part was left stock. A model under another wrapper keeps
    the stock path, with a warning. What each part does: ``docs/design.md``.

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
        fast_images (bool): Flip, normalise and pad the batch's images for
            the whole batch in mmdet's ``DetDataPreprocessor``
            (:mod:`fast_parallel.step.images`). Defaults to True.
        fast_shared_grads (bool): Sum the level gradients of a dense head's
            shared weights with one foreach op per level, in a run in one
            process on one device (:mod:`fast_parallel.step.level_grads`).
            Defaults to True.
        fast_voxelize (bool): Hard-voxelise the whole batch in one pass in
            mmdet3d's data preprocessor. Defaults to True.
        fast_pipeline (bool): Give the train dataset's covered transforms
            (and ``MultiImageMixDataset``) their fast forms, with stock's
            bytes and random draws, before its workers start
            (:mod:`fast_parallel.pipeline`). Defaults to True.
        cache_inputs (str, optional): ``'auto'``: keep each decoded train
            image and gt-database file in shared memory, one copy for all
            workers, when they fit 40% of the available memory together
            (else the start line says what they need); ``'disk:DIR'``:
            keep each decoded image as a ``.npy`` file in ``DIR``, for
            this run and later ones; None: off. Only with
            ``fast_pipeline``. Defaults to 'auto'.
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
                 fast_images: bool = True,
                 fast_shared_grads: bool = True,
                 fast_voxelize: bool = True,
                 fast_pipeline: bool = True,
                 cache_inputs: Optional[str] = 'auto',
                 priority: Union[int, str] = 'VERY_HIGH') -> None:
        self.device_ids = list(device_ids) if device_ids else None
        self.pin_memory = pin_memory
        self.fuse_optimizer = fuse_optimizer
        self.foreach_ema = foreach_ema
        self.fast_targets = fast_targets
        self.fast_images = fast_images
        self.fast_shared_grads = fast_shared_grads
        self.fast_voxelize = fast_voxelize
        self.fast_pipeline = fast_pipeline
        from fast_parallel.pipeline.cache_plan import disk_folder
        disk_folder(cache_inputs)  # a bad value fails here, named
        self.cache_inputs = cache_inputs
        #: Reads data waits and workers' CPU for the data-bound line.
        self.data_bound = DataBoundMonitor()
        self._iters_seen = 0
        self._pipeline_seen: dict = {}
        #: What the pipeline switch did (an Outcome), once ``before_run``
        #: ran.
        self.pipeline = None
        #: The counters of the heads switched to batched targets.
        self.target_stats: list = []
        self.priority = priority
        self.enabled = False
        #: Per loop ('train', 'val', 'test'): what ``before_run`` did to its
        #: DataLoader.
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
            loop = runner_loop(runner, kind)
            loader = getattr(loop, 'dataloader', None) if isinstance(
                loop, BaseLoop) else None
            if isinstance(loader, DataLoader):
                if kind == 'train':
                    from fast_parallel.pipeline.refresh import \
                        PipelineRefresher
                    from fast_parallel.pipeline.switch import switch_pipeline

                    # before the loader may be rebuilt and its workers
                    # started again on the same dataset object
                    started = bool(started_iterators(loop, loader))
                    self.pipeline = switch_pipeline(loader.dataset,
                                                    self.fast_pipeline,
                                                    self.cache_inputs,
                                                    forks_workers(loader))
                    if self.pipeline.done:
                        share_counts()  # before the workers fork
                        # (totals of earlier runs in this process left out)
                        self._pipeline_seen = shared_totals() or {}
                    if self.pipeline.done and not any(
                            isinstance(h, PipelineRefresher)
                            for h in runner.hooks):
                        # after any hook that rebuilds the pipeline
                        runner.register_hook(
                            PipelineRefresher(self.cache_inputs))
                self.loaders[kind] = self._install(runner, kind, loop, pin)
                if kind == 'train' and started and \
                        loop.dataloader is loader and self.pipeline.done:
                    self.pipeline = Outcome(
                        'pipeline',
                        True,
                        text=f'{self.pipeline} (from the next start of the '
                        'workers, which started before this hook)')

    def before_train(self, runner) -> None:
        """Fuses the optimizer step and the EMA updates, switches covered
        heads to batched targets and to summed level gradients of their
        shared weights, and the image step and the voxelisation of the data
        preprocessor to the whole batch.

        Runs after every hook's ``before_run`` (``EMAHook`` builds its
        averaged model there) and after a resumed checkpoint was loaded;
        each is a change of the built instances (their class, or methods
        on them), so what was loaded stays as it is.

        Args:
            runner (Runner): The runner.
        """
        if not self.enabled:
            return
        outcomes: List[Outcome] = []
        if self.fuse_optimizer:
            outcomes.append(fuse_optim_wrapper(runner.optim_wrapper))
        if self.foreach_ema:
            outcomes += [
                fuse_ema(hook.ema_model) for hook in runner.hooks
                if isinstance(getattr(hook, 'ema_model', None), nn.Module)
            ]
        model = runner.model
        for part in (switch_images(model, self.fast_images),
                     switch_voxelize(model, self.fast_voxelize),
                     switch_level_grads(
                         model.module, self.fast_shared_grads,
                         isinstance(model, FastDataParallel)
                         and len(model.device_ids) == 1)):
            if part is not None:
                outcomes.append(part)
        targets, self.target_stats = switch_targets(runner.model,
                                                    self.fast_targets)
        outcomes.append(targets)
        if self.pipeline is not None:
            outcomes.append(self.pipeline)
        if not self.fuse_optimizer:
            outcomes.append(
                Outcome('optimizer', False, 'fuse_optimizer=False'))
        if not self.foreach_ema:
            outcomes.append(Outcome('EMA', False, 'foreach_ema=False'))
        runner.logger.info(self._summary(runner, outcomes))

    def _summary(self, runner, outcomes: Sequence[Outcome]) -> str:
        """The start-of-training line: what is on, what was left stock.

        Args:
            runner (Runner): The runner.
            outcomes (Sequence[Outcome]): What ``before_train`` did.

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
                         ', '.join(map(str, self.loaders.values())))
        parts += map(str, outcomes)
        return 'FastParallelHook: on: ' + '; '.join(parts)

    @staticmethod
    def _install(runner, kind: str, loop: BaseLoop, pin: bool) -> Outcome:
        """The fast path for one loop, on exactly stock's batches
        (:func:`~fast_parallel.data.rebuild.install_fast_path`); a warning
        where the loop stays stock.

        Returns:
            Outcome: What was done, e.g. ``train packed (2 workers,
            pinned)`` in the start-of-training line.
        """
        cfg = loader_config(runner, kind)
        outcome = install_fast_path(runner, kind, loop, cfg, pin)
        if not outcome.done:
            runner.logger.warning(
                f'FastParallelHook: the {kind} DataLoader '
                f'({sampler_names(loop.dataloader)}) stays on the stock data '
                'path, so that it trains on the same batches as stock: '
                f'{outcome.why}. ' +
                packed_config_hint(kind, cfg, pin and accelerator_available()))
        return outcome

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
            stock = means['stock_leaves']
            runner.logger.info(
                f'fast_parallel {mode}: per batch transfer_time '
                f'{means["transfer_time"] * 1e3:.3f} ms, copies '
                f'{means["transfer_copies"]:.1f}, '
                f'{means["transfer_mb"]:.2f} MB' +
                (f'; {stock} tensors that hooks put into batches were '
                 'moved stock\'s way, one copy each' if stock else ''))

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        """After this run's first :data:`DATA_BOUND_AFTER` iterations, logs
        whether they waited on data."""
        self._iters_seen += 1
        if self.enabled:
            self.data_bound.tick(runner.train_loop)
        if self._iters_seen == DATA_BOUND_AFTER:
            self._log_data_bound(runner, f'iterations 1-{DATA_BOUND_AFTER}')

    def _log_data_bound(self, runner, span: str) -> None:
        if not self.enabled:
            return
        line = self.data_bound.report(runner, runner.train_loop, span)
        if line:
            runner.logger.info(f'FastParallelHook: {line}')

    def after_train_epoch(self, runner) -> None:
        """Logs the epoch's mean transfer figures, target counts, what the
        fast pipeline did and whether the epoch waited on data."""
        self._report(runner, 'train')
        totals = shared_totals() if self.enabled else None
        if totals is not None:
            done = {
                k: v - self._pipeline_seen.get(k, 0)
                for k, v in totals.items()
            }
            self._pipeline_seen = totals
            runner.logger.info(
                'FastParallelHook: pipeline this epoch (all workers): ' +
                ', '.join(f'{k} {v}' for k, v in done.items()))
        self._log_data_bound(runner, f'epoch {runner.epoch + 1}')
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
