"""torch internals: the optimizer's (fused step) and the foreach ops (EMA).

Checked on torch 2.13.0 (:data:`fast_parallel.compat.CHECKED_ON`). Both
parts are optional: on a torch without an internal named here, the
optimizer / averaged model stays stock and the log says why
(``docs/step.md``).
"""
from typing import Any, Callable, List, Optional

import torch
from torch.optim import SGD, Adam, AdamW, Optimizer
from torch.optim import adam as adam_module
from torch.optim import optimizer as optimizer_module
from torch.optim import sgd as sgd_module

from fast_parallel.compat.core import (CompatError, missing_internal_error,
                                       private)

__all__ = [
    'OPTIM_INTERNALS', 'MISSING_INTERNALS', 'AVERAGED_MODELS', 'FOREACH_OPS',
    'check_optim_internals', 'missing_foreach_ops',
    'default_to_fused_or_foreach', 'use_grad_for_differentiable', 'init_group',
    'patch_step_function', 'unhooked_step', 'graph_capture_health_check',
    'foreach_lerp_', 'foreach_mul_', 'foreach_add_', 'foreach_sub',
    'foreach_copy_'
]

_OPTIM_USE = 'the fused optimizer step (fast_parallel.step.fused_optim)'


def _optional(owner: Any, name: str) -> Any:
    """``owner.name`` looked up with :func:`private`; None where missing.

    Args:
        owner: The module or class holding the internal (None if the owner
            itself is missing).
        name (str): The attribute.

    Returns:
        The attribute, or None.
    """
    try:
        return private(owner, name, 'torch', _OPTIM_USE)
    except CompatError:
        return None


# -------------------------------------------- the fused optimizer step ---
#: The torch internals the fused step calls, by the name a "left stock" log
#: line gives them, and what this torch has for each (None: missing).
OPTIM_INTERNALS = {
    'torch.optim.optimizer._default_to_fused_or_foreach':
    _optional(optimizer_module, '_default_to_fused_or_foreach'),
    'torch.optim.optimizer._use_grad_for_differentiable':
    _optional(optimizer_module, '_use_grad_for_differentiable'),
    'torch.optim.sgd.sgd':
    _optional(sgd_module, 'sgd'),
    'torch.optim.adam.adam':
    _optional(adam_module, 'adam'),
    'Optimizer._patch_step_function':
    _optional(Optimizer, '_patch_step_function'),
    'SGD._init_group':
    _optional(SGD, '_init_group'),
    'Adam._init_group':
    _optional(Adam, '_init_group'),
    'Optimizer._accelerator_graph_capture_health_check':
    _optional(Optimizer, '_accelerator_graph_capture_health_check'),
    'torch.compiler.is_compiling':
    _optional(getattr(torch, 'compiler', None), 'is_compiling'),
    # AdamW as Adam(decoupled_weight_decay=True), torch >= 2.7 or so
    'AdamW as a subclass of Adam':
    True if issubclass(AdamW, Adam) else None,
}
#: The internals this torch lacks (empty on the versions checked).
MISSING_INTERNALS: List[str] = [
    name for name, obj in OPTIM_INTERNALS.items() if obj is None
]

#: ``torch.optim.optimizer._default_to_fused_or_foreach`` (or None).
default_to_fused_or_foreach: Optional[Callable] = OPTIM_INTERNALS[
    'torch.optim.optimizer._default_to_fused_or_foreach']
#: ``torch.optim.optimizer._use_grad_for_differentiable``, or a no-op
#: decorator on a torch without it (the fused step is then never used).
use_grad_for_differentiable: Callable = OPTIM_INTERNALS[
    'torch.optim.optimizer._use_grad_for_differentiable'] or (lambda f: f)


def check_optim_internals() -> None:
    """Fails if this torch lacks an internal of the fused optimizer step.

    Raises:
        CompatError: Naming the first internal that is missing.
    """
    if MISSING_INTERNALS:
        raise missing_internal_error('torch', MISSING_INTERNALS[0], _OPTIM_USE)


def init_group(optimizer: Optimizer, group: dict, *lists: list) -> Any:
    """The optimizer class's own ``_init_group(group, *lists)``.

    Args:
        optimizer (Optimizer): A ``torch.optim.SGD`` or ``Adam`` (subclasses
            included).
        group (dict): One of its param groups.
        *lists (list): The lists ``_init_group`` fills, in its order.

    Returns:
        What ``_init_group`` returns (``has_sparse_grad`` for SGD,
        ``has_complex`` for Adam).
    """
    return optimizer._init_group(group, *lists)


def patch_step_function(optimizer: Optimizer) -> None:
    """``optimizer._patch_step_function()``: wraps its class's ``step`` with
    torch's step hooks, once per class, as ``Optimizer.__init__`` does.

    Args:
        optimizer (Optimizer): The optimizer, after its class changed.
    """
    optimizer._patch_step_function()


def unhooked_step(cls: type) -> Callable:
    """A class's ``step`` without the wrapper ``_patch_step_function`` put
    around it (the wrapper runs the step hooks).

    Args:
        cls (type): An optimizer class.

    Returns:
        Callable: The inner ``step`` function.
    """
    step = cls.step
    return step.__wrapped__ if getattr(step, 'hooked', False) else step


def graph_capture_health_check(optimizer: Optimizer) -> None:
    """``Adam.step``'s first check,
    ``optimizer._accelerator_graph_capture_health_check()``.

    Args:
        optimizer (Optimizer): The optimizer about to step.

    Raises:
        CompatError: When this torch lacks the check (listed in
            :data:`MISSING_INTERNALS`, so no optimizer is fused then).
    """
    private(optimizer, '_accelerator_graph_capture_health_check', 'torch',
            _OPTIM_USE)()


# ---------------------------------------------------- the foreach EMA ---
_AVERAGED = 'mmengine.model.averaged_model'
#: The stock averaged-model classes whose updates the foreach EMA does as
#: they do, by class name: their ``module.qualname`` (mmengine 0.10.7,
#: mmdet 3.3.0). A subclass, or a class moved elsewhere, stays stock.
AVERAGED_MODELS = {
    'ExponentialMovingAverage': f'{_AVERAGED}.ExponentialMovingAverage',
    'MomentumAnnealingEMA': f'{_AVERAGED}.MomentumAnnealingEMA',
    'StochasticWeightAverage': f'{_AVERAGED}.StochasticWeightAverage',
    'ExpMomentumEMA': 'mmdet.models.layers.ema.ExpMomentumEMA',
}
#: The multi-tensor ops the foreach EMA updates call.
FOREACH_OPS = ('_foreach_lerp_', '_foreach_mul_', '_foreach_add_',
               '_foreach_sub', '_foreach_copy_')


def missing_foreach_ops() -> List[str]:
    """The ops of :data:`FOREACH_OPS` this torch lacks, in table order.

    Returns:
        list[str]: Empty on the versions checked.
    """
    return [op for op in FOREACH_OPS if not hasattr(torch, op)]


def foreach_lerp_(*args: Any, **kwargs: Any) -> Any:
    """``torch._foreach_lerp_``."""
    return torch._foreach_lerp_(*args, **kwargs)


def foreach_mul_(*args: Any, **kwargs: Any) -> Any:
    """``torch._foreach_mul_``."""
    return torch._foreach_mul_(*args, **kwargs)


def foreach_add_(*args: Any, **kwargs: Any) -> Any:
    """``torch._foreach_add_``."""
    return torch._foreach_add_(*args, **kwargs)


def foreach_sub(*args: Any, **kwargs: Any) -> Any:
    """``torch._foreach_sub``."""
    return torch._foreach_sub(*args, **kwargs)


def foreach_copy_(*args: Any, **kwargs: Any) -> Any:
    """``torch._foreach_copy_``."""
    return torch._foreach_copy_(*args, **kwargs)


# ------------------------------------------ Adam's multi-tensor step ---
#: The multi-tensor ops torch's ``_multi_tensor_adam`` calls, which
#: :mod:`fast_parallel.step.adam_foreach` calls in the same order.
ADAM_FOREACH_OPS = ('_foreach_add_', '_foreach_mul_', '_foreach_add',
                    '_foreach_lerp_', '_foreach_addcmul_', '_foreach_maximum_',
                    '_foreach_sqrt', '_foreach_div_', '_foreach_addcdiv_')


def adam_foreach_ops() -> Optional[dict]:
    """The ops of :data:`ADAM_FOREACH_OPS`, by their name without
    ``_foreach_`` (``'add_'``, ``'sqrt'``...); None if one is missing.
    """
    ops = {
        name[len('_foreach_'):]: getattr(torch, name, None)
        for name in ADAM_FOREACH_OPS
    }
    return None if None in ops.values() else ops
