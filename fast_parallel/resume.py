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
A run that is not resumed is not changed in any way.

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

What it cannot make exact, and warns about when resuming:

- an epoch-based loop with ``persistent_workers=True`` and workers: in the
  uninterrupted run the workers' random states run on from epoch to epoch;
  a resumed run starts new workers from their seed (stock mmengine does the
  same). Random augmentations then differ after the resume.
  ``persistent_workers=False`` (workers seeded alike every epoch) or an
  iteration-based loop resume exactly;
- an epoch-based checkpoint written in the middle of an epoch: mmengine
  trains that whole epoch again.
"""
import random
from functools import partial
from typing import Dict, Optional, Tuple, Type, Union

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
from torch.utils.data import DataLoader

from .loader import FastDataLoader, make_fast
from .restart import rebuild_started

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
    torch.set_rng_state(states['torch'])
    if 'cuda' in states and torch.cuda.is_available():
        cuda = states['cuda']
        if len(cuda) != torch.cuda.device_count():
            raise RuntimeError(
                f'the checkpoint holds the random states of {len(cuda)} '
                f'GPUs, this process sees {torch.cuda.device_count()}')
        torch.cuda.set_rng_state_all(cuda)


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

    def before_run(self, runner) -> None:
        """Remembers the seed the Runner built the DataLoaders with."""
        self._built_seed = runner.seed

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Writes random and module states into ``checkpoint['meta']``."""
        checkpoint.setdefault('meta', {})[META_KEY] = dict(
            random=random_states(),
            modules={_strip(k): v
                     for k, v in module_states(runner.model).items()})

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
        why = _inexact_epoch_resume(runner.train_loop, checkpoint)
        if why:
            runner.logger.warning(
                f'ExactResumeHook: this resumed run will not be identical '
                f'to an uninterrupted one: {why}.')

    def before_train(self, runner) -> None:
        """After a resume: the train DataLoader with the checkpoint's seed.
        """
        seed = runner.seed
        if self._pending is None or seed == self._built_seed:
            return
        loop = runner.train_loop
        why = rebuild_started(runner, loop, runner._train_dataloader,
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
        """Iteration loops: the states go back at the first resumed
        iteration (after mmengine skipped the batches already trained)."""
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


def _inexact_epoch_resume(loop, checkpoint: dict) -> Optional[str]:
    """Why resuming an epoch-based run cannot be exact, or None."""
    if not isinstance(loop, EpochBasedTrainLoop):
        return None
    loader = loop.dataloader
    if loader.num_workers > 0 and loader.persistent_workers:
        return ('an epoch-based loop with persistent_workers=True restarts '
                'its workers from their seed, where the uninterrupted run\'s '
                'workers went on with their random states; set '
                'persistent_workers=False or use an iteration-based loop')
    meta = checkpoint.get('meta', {})
    if meta.get('iter', 0) != meta.get('epoch', 0) * len(loader):
        return ('the checkpoint was written in the middle of an epoch, '
                'which mmengine trains again from its start')
    return None


def _validated_after(
        loop: Union[IterBasedTrainLoop, EpochBasedTrainLoop]) -> bool:
    """Whether the loop validated after its last finished iteration/epoch.

    The same test as ``IterBasedTrainLoop.run`` / ``EpochBasedTrainLoop.run``
    make, at the same ``_iter`` / ``_epoch``.
    """
    if isinstance(loop, IterBasedTrainLoop):
        done, last = loop._iter, loop.max_iters
    elif isinstance(loop, EpochBasedTrainLoop):
        done, last = loop._epoch, loop.max_epochs
    else:
        return False
    loop._decide_current_val_interval()
    return (done > 0 and loop.runner.val_loop is not None
            and done >= loop.val_begin
            and (done % loop.val_interval == 0 or done == last))
