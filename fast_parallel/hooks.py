"""``FastParallelHook``: the one-line opt-in for any mmdet / mmdet3d config.
"""
from typing import Optional, Sequence, Union

import torch
from mmengine.dataset import InfiniteSampler
from mmengine.hooks import Hook
from mmengine.model import MMDistributedDataParallel, is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import BaseLoop

from .collate import PackedCollate, is_packed_collate
from .loader import make_fast
from .wrappers import FastDataParallel, FastDistributedDataParallel
from .wrappers.data_parallel import module_device

FAST_WRAPPERS = (FastDataParallel, FastDistributedDataParallel)


def _rewind_samplers(loader) -> None:
    """Starts mmengine ``InfiniteSampler`` streams again from their seed.

    An ``InfiniteSampler`` hands every iterator the same generator
    (``self.indices``): the dropped iterator has already drawn indices from
    it (its workers prefetch), and closing it would close the generator for
    good, so the next iterator would start late and stop after one pass.
    A fresh generator draws the order stock's first iterator draws.
    """
    for sampler in (getattr(loader, 'sampler', None),
                    getattr(getattr(loader, 'batch_sampler', None),
                            'sampler', None)):
        if isinstance(sampler, InfiniteSampler):
            sampler.indices = sampler._indices_of_rank()


def _restart_iterators(loop: BaseLoop, loader) -> None:
    """Drops iterators that were started before the collate_fn changed.

    Workers receive the collate function when they start. A persistent
    DataLoader keeps its workers in ``loader._iterator``, and
    ``IterBasedTrainLoop`` starts its iterator when the loop is built,
    before any hook runs: both would keep collating the old way. The new
    iterator draws the same sampler order and seeds its workers the same
    way (mmengine's worker_init_fn), so the batches are the ones the old
    one would have produced.
    """
    old = getattr(loader, '_iterator', None)
    if old is not None:
        old._shutdown_workers()
        loader._iterator = None
    _rewind_samplers(loader)
    infinite = getattr(loop, 'dataloader_iterator', None)
    if infinite is not None and getattr(infinite, '_iterator', None) \
            is not None:
        stale = infinite._iterator
        if stale is not old and hasattr(stale, '_shutdown_workers'):
            stale._shutdown_workers()
        # Starting an iterator draws its base seed from torch's global
        # generator; the model's weights are initialised from it after
        # before_run, so the draw must not show.
        rng = torch.get_rng_state()
        infinite._iterator = iter(loader)
        torch.set_rng_state(rng)


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
      :class:`~fast_parallel.loader.FastDataLoader` (no per-batch profiler
      scope while no profiler runs);
    - turns ``pin_memory`` on where the model is on a GPU.

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
        priority (int | str): Hook priority. Defaults to 'VERY_HIGH', so
            the wrapper is in place before other hooks look at the model.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 device_ids: Optional[Sequence[int]] = None,
                 pin_memory: Optional[bool] = None,
                 priority: Union[int, str] = 'VERY_HIGH') -> None:
        self.device_ids = list(device_ids) if device_ids else None
        self.pin_memory = pin_memory
        self.priority = priority
        self.enabled = False

    def before_run(self, runner) -> None:
        """Installs the wrapper and the packed collate function.

        Args:
            runner (Runner): The runner.
        """
        self.enabled = self._wrap_model(runner)
        if not self.enabled:
            return
        pin = self.pin_memory
        if pin is None:
            pin = module_device(runner.model.module).type == 'cuda'
        for name in ('_train_loop', '_val_loop', '_test_loop'):
            loop = getattr(runner, name, None)
            loader = getattr(loop, 'dataloader', None) if isinstance(
                loop, BaseLoop) else None
            if loader is None:
                continue
            changed = not is_packed_collate(loader.collate_fn)
            if changed:
                loader.collate_fn = PackedCollate(loader.collate_fn)
            changed = make_fast(loader) or changed
            if pin and torch.cuda.is_available() and not loader.pin_memory:
                loader.pin_memory = changed = True
            if changed:
                _restart_iterators(loop, loader)

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
        """Logs the epoch's mean transfer figures."""
        self._report(runner, 'train')

    def after_val_epoch(self, runner, metrics=None) -> None:
        """Logs the validation's mean transfer figures."""
        self._report(runner, 'val')

    def after_test_epoch(self, runner, metrics=None) -> None:
        """Logs the test's mean transfer figures."""
        self._report(runner, 'test')
