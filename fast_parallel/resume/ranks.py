"""Every rank's resume states in rank 0's checkpoint (distributed runs).

mmengine's ``Runner.save_checkpoint`` is ``master_only``: only rank 0 writes
the checkpoint, and only rank 0 runs ``before_save_checkpoint``. So that a
resumed distributed run gets each rank's own random states (main process and
persistent train workers) and its own buffers (DDP does not broadcast them
here: BatchNorm's running statistics differ per rank until a
``SyncNormHook`` averages them; an ``EMAHook``'s averaged model holds its
own per-rank copies), :func:`gather_if_saving` collects them from every
rank, with one ``all_gather_object``, right before ``CheckpointHook`` writes
a checkpoint (the same test as its ``after_train_epoch`` /
``after_train_iter``, mmengine 0.10.7); rank 0 puts the list in the
checkpoint, and on resume :func:`own_entry` gives each rank its own and
:func:`set_buffers` puts its buffers back.
Reasoning: ``docs/resume.md``.
"""
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from mmengine.hooks import CheckpointHook
from mmengine.model import is_model_wrapper

__all__ = [
    'buffers_of', 'checkpoint_due', 'gather_if_saving', 'own_entry',
    'set_buffers'
]


def checkpoint_due(runner: Any, by_epoch: bool) -> bool:
    """Whether a ``CheckpointHook`` of ``runner`` writes a checkpoint at
    the end of this epoch (``by_epoch``) or iteration, as it decides.

    Args:
        runner (Runner): The runner.
        by_epoch (bool): At the end of an epoch (True) or an iteration.

    Returns:
        bool: True when one will.
    """
    for hook in runner.hooks:
        if not isinstance(hook, CheckpointHook) or hook.by_epoch != by_epoch:
            continue
        if by_epoch:
            due = hook.every_n_epochs(runner, hook.interval, hook.save_begin)
            last = hook.is_last_train_epoch(runner)
        else:
            due = hook.every_n_train_iters(runner, hook.interval,
                                           hook.save_begin)
            last = hook.is_last_train_iter(runner)
        if due or (hook.save_last and last):
            return True
    return False


def gather_if_saving(runner: Any, by_epoch: bool,
                     own: Callable[[], dict]) -> Optional[List[dict]]:
    """Every rank's ``own()``, on every rank, when a checkpoint is about to
    be written in a distributed run; else None (nothing exchanged).

    Args:
        runner (Runner): The runner (every rank calls this at the same
            point: a collective).
        by_epoch (bool): At the end of an epoch or of an iteration.
        own (callable): This rank's states.

    Returns:
        list[dict] | None: By rank.
    """
    if runner.world_size < 2 or not dist.is_available() or \
            not dist.is_initialized() or not checkpoint_due(runner, by_epoch):
        return None
    found: List[Optional[dict]] = [None] * runner.world_size
    dist.all_gather_object(found, own())
    return found  # type: ignore[return-value]


def own_entry(saved: dict, rank: int, world_size: int) -> Optional[dict]:
    """This rank's states from a checkpoint's resume entry, or None when it
    holds no per-rank states for this many ranks.

    Args:
        saved (dict): The checkpoint's ``meta`` entry of
            :class:`~fast_parallel.resume.hook.ExactResumeHook`.
        rank (int): This process's global rank.
        world_size (int): The number of processes.

    Returns:
        dict | None: ``random`` and (where saved) ``workers``.
    """
    ranks = saved.get('ranks')
    if not isinstance(ranks, list) or len(ranks) != world_size:
        return None
    return ranks[rank]


def _modules(runner: Any) -> dict:
    """The model (unwrapped) and each ``EMAHook``'s averaged model, by a
    name that is the same on every rank and in the resumed run."""
    model = runner.model.module if is_model_wrapper(
        runner.model) else runner.model
    found = {'model': model}
    emas = [h for h in runner.hooks if hasattr(h, 'ema_model')]
    for i, hook in enumerate(emas):
        found[f'ema{i}'] = hook.ema_model
    return found


def buffers_of(runner: Any) -> dict:
    """This rank's buffers of the model and of every averaged model, as CPU
    copies: ``{module key: {buffer name: tensor}}``."""
    return {
        key: {
            name: buffer.detach().cpu().clone()
            for name, buffer in module.named_buffers()
        }
        for key, module in _modules(runner).items()
    }


def set_buffers(runner: Any, saved: dict) -> None:
    """Puts this rank's saved buffers back (after the checkpoint's weights
    were loaded).

    Args:
        runner (Runner): The runner.
        saved (dict): From :func:`buffers_of`.

    Raises:
        KeyError: A saved buffer the model does not have.
    """
    modules = _modules(runner)
    for key, buffers in saved.items():
        own = dict(modules[key].named_buffers())
        for name, value in buffers.items():
            if name not in own:
                raise KeyError(f'checkpoint has this rank\'s buffer {key}: '
                               f'{name!r}, which this run does not have')
            with torch.no_grad():
                own[name].copy_(value)
