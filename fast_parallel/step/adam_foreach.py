"""torch's multi-tensor Adam step, with the step counts read in one go.

torch 2.13's ``_multi_tensor_adam`` (``foreach=True``, ``capturable=False``)
keeps each parameter's step count in a CPU scalar tensor and reads every one
with ``.item()`` twice per step: two host reads per parameter (PointPillars'
66 parameters: 132 ``.item()`` calls per iteration). :func:`multi_tensor_adam`
runs the same foreach calls in the same order on the same tensors, and reads
the counts once for the whole list (``stack`` + ``tolist``: the same floats),
so its bytes are stock's. It is used only where :func:`read_once_reason` says
so; anywhere else the fused step calls torch's own ``adam``. Why it is exact:
``docs/step.md``.
"""
from typing import Any, Dict, List, Optional

import torch
from torch import Tensor

from fast_parallel.compat import CHECKED_ON
from fast_parallel.compat.optim import adam_foreach_ops

#: The ops, or None on a torch without one of them.
_OPS = adam_foreach_ops()


def _torch_version() -> str:
    return torch.__version__.split('+')[0]


def static_reason(group: Dict[str, Any]) -> Optional[str]:
    """Why a param group's settings keep torch's own Adam step, or None.

    Args:
        group (dict): An ``Adam`` / ``AdamW`` param group.

    Returns:
        Optional[str]: None where :func:`multi_tensor_adam` may run.
    """
    if _OPS is None:
        return 'a foreach op is missing'
    if _torch_version() != CHECKED_ON['torch']:
        return (f'torch {_torch_version()} (the step is copied from torch '
                f'{CHECKED_ON["torch"]})')
    if group.get('maximize'):
        return 'maximize=True'
    for name in ('lr', 'weight_decay', 'eps'):
        if isinstance(group[name], Tensor):
            return f'{name} is a tensor'
    if any(isinstance(b, Tensor) for b in group['betas']):
        return 'betas are tensors'
    return None


def read_once_reason(group: Dict[str, Any], foreach: bool, has_complex: bool,
                     lists: List[list]) -> Optional[str]:
    """Why this call keeps torch's own Adam step, or None.

    Args:
        group (dict): The bucket's param group (its hyper-parameters).
        foreach (bool): The resolved ``foreach``.
        has_complex (bool): Whether a parameter is complex.
        lists (list[list]): params, grads, exp_avgs, exp_avg_sqs,
            max_exp_avg_sqs, state_steps.

    Returns:
        Optional[str]: None where :func:`multi_tensor_adam` gives stock's
        bytes.
    """
    why = static_reason(group)
    if why is not None:
        return why
    if not foreach or has_complex:
        return 'not the multi-tensor path on real tensors'
    params, steps = lists[0], lists[5]
    first = params[0]
    if any(p.device != first.device or p.dtype != first.dtype for p in params):
        return 'parameters on several devices or of several dtypes'
    if not all(
            type(s) is Tensor and s.is_cpu and s.dtype == torch.float32
            and s.dim() == 0 for s in steps):
        return 'step counts not float32 CPU scalars'
    return None


@torch.no_grad()
def multi_tensor_adam(params: List[Tensor], grads: List[Tensor],
                      exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                      max_exp_avg_sqs: List[Tensor], state_steps: List[Tensor],
                      *, amsgrad: bool, beta1: float, beta2: float, lr: float,
                      weight_decay: float, eps: float,
                      decoupled_weight_decay: bool) -> None:
    """``_multi_tensor_adam`` for one (device, dtype) group, not capturable.

    The arguments are ``torch.optim.adam.adam``'s, for a call that
    :func:`read_once_reason` accepted.
    """
    if not params:
        return
    ops = _OPS
    ops['add_'](state_steps, torch.tensor(1.0, device='cpu'), alpha=1.0)
    if weight_decay != 0:
        if decoupled_weight_decay:
            ops['mul_'](params, 1 - lr * weight_decay)
        else:
            grads = ops['add'](grads, params, alpha=weight_decay)
    ops['lerp_'](exp_avgs, grads, 1 - beta1)
    ops['mul_'](exp_avg_sqs, beta2)
    ops['addcmul_'](exp_avg_sqs, grads, grads, 1 - beta2)
    del grads
    # stock: _get_value(step) (one .item()) per count, twice
    steps = torch.stack(state_steps).tolist()
    bias_correction1 = [1 - beta1**step for step in steps]
    bias_correction2 = [1 - beta2**step for step in steps]
    step_size = [(lr / bc) * -1 for bc in bias_correction1]
    bias_correction2_sqrt = [bc**0.5 for bc in bias_correction2]
    if amsgrad:
        ops['maximum_'](max_exp_avg_sqs, exp_avg_sqs)
        exp_avg_sq_sqrt = ops['sqrt'](max_exp_avg_sqs)
    else:
        exp_avg_sq_sqrt = ops['sqrt'](exp_avg_sqs)
    ops['div_'](exp_avg_sq_sqrt, bias_correction2_sqrt)
    ops['add_'](exp_avg_sq_sqrt, eps)
    ops['addcdiv_'](params, exp_avgs, exp_avg_sq_sqrt, step_size)
