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

Exact resume needs an iteration-based loop: an epoch-based one restarts its
DataLoader workers at the resumed epoch, with fresh random states in the
workers.
"""
import random
from typing import Dict, Optional, Tuple, Type

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import IterBasedTrainLoop

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

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        """First resumed iteration: validation as the original run, states.
        """
        saved, self._pending = self._pending, None
        if saved is None:
            return
        set_random_states(saved['random'])
        loop = runner.train_loop
        if isinstance(loop, IterBasedTrainLoop) and _validated_after(loop):
            # The original run validated right after writing this
            # checkpoint; that drew from the random states too.
            runner.val_loop.run()
            runner.model.train()


def _validated_after(loop: IterBasedTrainLoop) -> bool:
    """Whether the loop validated after its last finished iteration.

    The same test as ``IterBasedTrainLoop.run``, at the same ``_iter``.
    """
    it = loop._iter
    loop._decide_current_val_interval()
    return (it > 0 and loop.runner.val_loop is not None
            and it >= loop.val_begin
            and (it % loop.val_interval == 0 or it == loop.max_iters))
