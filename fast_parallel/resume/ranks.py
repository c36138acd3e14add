"""Every rank's resume states in rank 0's checkpoint (distributed runs).

mmengine's ``Runner.save_checkpoint`` is ``master_only``: only rank 0 writes
the checkpoint, and only rank 0 runs ``before_save_checkpoint``. So that a
resumed distributed run gets each rank's own random states (main process and
persistent train workers) and its own buffers (DDP does not broadcast them
here: BatchNorm's running statistics differ per rank until a
``SyncNormHook`` averages them; an ``EMAHook``'s averaged model holds its
own per-rank copies), :func:`gather_at_saves` wraps, on the instance, each
``CheckpointHook``'s method that writes a checkpoint (periodic and best; every
rank runs it, with the same step): first one ``all_gather_object`` of every
rank's states, taken right then (after every hook that ran before the save,
EMA updates included), then the save. Rank 0 puts the list in the
checkpoint; on resume :func:`own_entry` gives each rank its own and
:func:`set_buffers` puts its buffers back. Reasoning: ``docs/resume.md``.
"""
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from mmengine.hooks import CheckpointHook
from mmengine.model import is_model_wrapper

from fast_parallel.compat import CHECKPOINT_SAVE_METHOD, checkpoint_save_method

__all__ = ['buffers_of', 'gather_at_saves', 'own_entry', 'set_buffers']


def gather_at_saves(runner: Any, own: Callable[[], dict],
                    keep: Callable[[List[dict]], None]) -> int:
    """Makes every ``CheckpointHook`` of a distributed ``runner`` gather
    each rank's ``own()`` right before it writes a checkpoint and hand the
    list to ``keep`` (on every rank) first.

    Args:
        runner (Runner): The runner (``world_size`` > 1, group started).
        own (callable): This rank's states.
        keep (callable): Gets the list, by rank.

    Returns:
        int: The hooks wrapped (0 in a single process).
    """
    if runner.world_size < 2 or not dist.is_available() or \
            not dist.is_initialized():
        return 0
    wrapped = 0
    for hook in runner.hooks:
        if not isinstance(hook, CheckpointHook) or \
                CHECKPOINT_SAVE_METHOD in vars(hook):
            continue
        save = checkpoint_save_method(hook)

        def gathering(runner_: Any,
                      step: Any,
                      meta: Any,
                      _save: Callable = save) -> Any:
            found: List[Optional[dict]] = [None] * runner_.world_size
            dist.all_gather_object(found, own())
            keep(found)  # type: ignore[arg-type]
            return _save(runner_, step, meta)

        setattr(hook, CHECKPOINT_SAVE_METHOD, gathering)
        wrapped += 1
    return wrapped


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
