"""Which dense heads get their level gradients summed, and the switch.

:func:`switch_level_grads` gives each covered head instance
(:data:`COVERED_HEADS`) the ``forward`` / ``forward_single`` of
:mod:`fast_parallel.step.level_grads` and a
:class:`~fast_parallel.step.level_grads.LevelGrads`; a weight whose every
use is not known to be one per level (a module outside :data:`ONE_USE`,
tied inside the head or with a module outside it) is left to autograd.
"""
from collections import Counter
from typing import List, Optional, Tuple

from torch import Tensor, nn

from fast_parallel.compat.autograd import (check_autograd_internals,
                                           module_parameters)
from fast_parallel.compat.targets import is_upstream
from fast_parallel.outcome import Outcome
from fast_parallel.step.level_grads import LevelGrads, forward, forward_single

__all__ = ['COVERED_HEADS', 'ONE_USE', 'switch_level_grads']

#: Heads whose ``forward`` is ``multi_apply(self.forward_single, x, ...)``
#: over the levels and whose ``forward_single`` calls each of its modules
#: once (mmdet 3.3.0 read), by exact class.
COVERED_HEADS = ('FCOSHead', 'NASFCOSHead', 'ATSSHead', 'GFLHead',
                 'RetinaHead', 'RPNHead')
#: Modules whose forward reads each of their weights once, by exact class
#: (``module.class``); mmcv's ``ConvWS2d`` reads its weight three times.
ONE_USE = ('torch.nn.modules.conv.Conv2d', 'torch.nn.modules.normalization.'
           'GroupNorm', 'torch.nn.modules.batchnorm.BatchNorm2d',
           'mmcv.cnn.bricks.wrappers.Conv2d', 'mmcv.cnn.bricks.scale.Scale',
           'mmcv.ops.modulated_deform_conv.ModulatedDeformConv2dPack',
           'mmcv.ops.deform_conv.DeformConv2dPack')
_METHODS = (('forward', forward), ('forward_single', forward_single))


def _reason(head: nn.Module) -> Optional[str]:
    """Why ``head`` keeps stock's sums, or None."""
    name = type(head).__name__
    if name not in COVERED_HEADS or not is_upstream(head, name):
        return 'not covered'
    replaced = [
        m for m, fn in _METHODS if m in vars(head)
        and getattr(vars(head)[m], '__func__', None) is not fn
    ]
    if replaced and not isinstance(
            getattr(head, 'fast_level_grads', None), LevelGrads):
        return f'{", ".join(replaced)} replaced on the instance'
    return None


def _one_use(module: nn.Module) -> bool:
    cls = type(module)
    return f'{cls.__module__}.{cls.__qualname__}' in ONE_USE


def _shared(head: nn.Module,
            model: nn.Module) -> Tuple[List[Tensor], List[str]]:
    """The head's trainable weights read once per level (each held by one
    module of :data:`ONE_USE`, inside the head only), and the names of the
    modules whose weights are left to autograd."""
    everywhere = Counter(
        id(p) for _, p in model.named_parameters(remove_duplicate=False))
    inside = Counter(
        id(p) for _, p in head.named_parameters(remove_duplicate=False))
    holders = {
        id(p): module
        for module in head.modules()
        for p in module_parameters(module).values() if p is not None
    }
    kept, left = [], []
    for p in head.parameters():
        if not p.requires_grad:
            continue
        module = holders[id(p)]
        if inside[id(p)] == everywhere[id(p)] == 1 and _one_use(module):
            kept.append(p)
        else:
            left.append(type(module).__name__)
    return kept, left


def _install(head: nn.Module, model: nn.Module) -> LevelGrads:
    state = getattr(head, 'fast_level_grads', None)
    if not isinstance(state, LevelGrads):
        params, left = _shared(head, model)
        state = LevelGrads(head, params, left)
        head.fast_level_grads = state
    for name, fn in _METHODS:  # again after a pickle (the class's came)
        setattr(head, name, fn.__get__(head))
    return state


def _text(label: str, state: LevelGrads) -> str:
    text = f'{label} {len(state.params)} weights summed per level by foreach'
    left = state.left
    if left:
        text += (f' ({len(left)} left to autograd: '
                 f'{", ".join(sorted(set(left)))})')
    return text


def switch_level_grads(model: nn.Module, enabled: bool,
                       single_device: bool) -> Optional[Outcome]:
    """Gives each covered dense head of ``model`` the summed level
    gradients.

    Args:
        model (nn.Module): The model (not a wrapper).
        enabled (bool): ``FastParallelHook(fast_shared_grads=...)``.
        single_device (bool): Whether the model trains in this one process
            on one device (no ``DistributedDataParallel``, no replicas).

    Returns:
        Outcome, optional: The ``shared head weights`` part of the start
        line; None for a model without a dense head of the table's kind.
    """
    heads = [
        m for m in model.modules() if any(
            c.__name__ in COVERED_HEADS for c in type(m).__mro__)
    ]
    if not heads:
        return None
    if not enabled:
        return Outcome('shared head weights', False, 'fast_shared_grads=False')
    if not single_device:
        return Outcome(
            'shared head weights', False,
            'DistributedDataParallel / replicas reduce each weight\'s '
            'gradient as autograd accumulates it')
    check_autograd_internals()
    parts = []
    for head in heads:
        label = type(head).__name__
        why = _reason(head)
        if why is None:
            parts.append(
                Outcome(label, True, text=_text(label, _install(head, model))))
        else:
            parts.append(
                Outcome(label, False, why, text=f'{label} stock ({why})'))
    done = any(p.done for p in parts)
    return Outcome(
        'shared head weights',
        done,
        None if done else '; '.join(f'{p.name}: {p.why}' for p in parts),
        text='shared head weights: ' + ', '.join(map(str, parts)),
        parts=tuple(parts))
