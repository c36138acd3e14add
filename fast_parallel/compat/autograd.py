"""torch's autograd internals the shared-weight gradient sums need.

Checked on torch 2.13.0 (:data:`fast_parallel.compat.CHECKED_ON`);
:mod:`fast_parallel.step.level_grads` uses them, and a missing one fails at
the switch with :class:`~fast_parallel.compat.CompatError`.

- ``Module._parameters``: where a module keeps its parameters (the
  per-level aliases are put there for one level's forward);
- ``Tensor._backward_hooks`` / ``Tensor._post_accumulate_grad_hooks``: a
  parameter with either keeps stock's accumulation;
- ``torch._C._current_graph_task_id`` (-1 outside a backward pass) and
  ``torch._C._autograd._top_saved_tensors_default_hooks`` (a checkpoint's
  or an offload's hooks): a forward in either keeps stock's sums;
- ``Tensor._use_count``: whether an autograd graph still holds an alias
  (its gradient accumulator and saved tensors hold the tensor);
- ``Variable._execution_engine.queue_callback``: runs the sums when the
  backward pass ends (as ``DistributedDataParallel`` finalises there).
"""
from typing import Any, Callable, Dict

import torch
from torch import Tensor, nn

from fast_parallel.compat.core import private

__all__ = [
    'module_parameters', 'has_grad_hooks', 'run_tensor_hooks',
    'run_post_accumulate_hooks', 'graph_task', 'in_backward_pass',
    'saved_tensors_hooked', 'graph_holds', 'queue_callback',
    'check_autograd_internals'
]

_USE = 'the shared head weights\' gradient sums (step.level_grads)'
_PARAMETERS = '_parameters'
_HOOKS = ('_backward_hooks', '_post_accumulate_grad_hooks')


def module_parameters(module: nn.Module) -> Dict[str, Any]:
    """The module's own ``name -> Parameter`` dict (``_parameters``), the
    one ``module.weight`` reads."""
    return private(module, _PARAMETERS, 'torch', _USE)


def has_grad_hooks(param: Tensor) -> bool:
    """Whether ``param`` has a tensor hook or a post-accumulate-grad hook."""
    return any(private(param, name, 'torch', _USE) for name in _HOOKS)


def run_tensor_hooks(param: Tensor, grad: Tensor) -> Tensor:
    """``param``'s tensor hooks on ``grad``, in order, as autograd runs a
    leaf's before it accumulates: a hook may return a new gradient of the
    same size, dtype and device (else stock's error)."""
    for hook in list((private(param, _HOOKS[0], 'torch', _USE)
                      or {}).values()):
        result = hook(grad)
        if result is None:
            continue
        name = getattr(hook, '__name__', type(hook).__name__)
        for what, was, got in (('size', grad.shape, result.shape),
                               ('type', grad.dtype, result.dtype),
                               ('device', grad.device, result.device)):
            if was != got:
                raise RuntimeError(f"hook '{name}' has changed the {what} "
                                   f'of value (was {was} got {got})')
        grad = result
    return grad


def run_post_accumulate_hooks(param: Tensor) -> None:
    """``param``'s post-accumulate-grad hooks, as autograd runs them after
    it accumulated."""
    for hook in list((private(param, _HOOKS[1], 'torch', _USE)
                      or {}).values()):
        hook(param)


def graph_task() -> int:
    """The running backward pass's id on this thread (-1: none)."""
    return private(torch._C, '_current_graph_task_id', 'torch', _USE)()


def in_backward_pass() -> bool:
    """Whether a backward pass is running on this thread."""
    return graph_task() != -1


def saved_tensors_hooked() -> bool:
    """Whether saved-tensor hooks (a checkpoint's, ``save_on_cpu``...) are
    on."""
    top = private(torch._C._autograd, '_top_saved_tensors_default_hooks',
                  'torch', _USE)
    return top(False) is not None


def graph_holds(leaf: Tensor) -> bool:
    """Whether anything but its Python object holds ``leaf`` (a leaf only
    fast_parallel refers to: then a live autograd graph does)."""
    return private(leaf, '_use_count', 'torch', _USE)() > 1


def queue_callback(callback: Callable[[], None]) -> None:
    """Runs ``callback`` when the running backward pass ends (call it from
    inside that pass, e.g. a hook)."""
    engine = private(torch.autograd.Variable, '_execution_engine', 'torch',
                     _USE)
    engine.queue_callback(callback)


def check_autograd_internals() -> None:
    """Fails with ``CompatError`` now if this torch lacks one of them."""
    private(nn.Module(), _PARAMETERS, 'torch', _USE)
    probe = torch.zeros(1)
    for name in (*_HOOKS, '_use_count'):
        private(probe, name, 'torch', _USE)
    engine = private(torch.autograd.Variable, '_execution_engine', 'torch',
                     _USE)
    private(engine, 'queue_callback', 'torch', _USE)
    private(torch._C, '_current_graph_task_id', 'torch', _USE)
    private(torch._C._autograd, '_top_saved_tensors_default_hooks', 'torch',
            _USE)
