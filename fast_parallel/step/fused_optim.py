"""One multi-tensor optimizer call per distinct set of hyper-parameters.

:func:`fuse_optimizer` swaps an ``SGD``/``Adam``/``AdamW`` *instance* to a
subclass that overrides only ``step``: torch's own ``_init_group`` and
functional, once per bucket of groups (:mod:`.optim_buckets`) instead of
once per group, with stock's bytes. Why and what stays stock:
``docs/step.md``.
"""
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Optional

import torch
from torch import Tensor
from torch.optim import SGD, Adam, AdamW, Optimizer
from torch.optim import adam as _adam_module
from torch.optim import sgd as _sgd_module

from fast_parallel.compat import CHECKED_ON
from fast_parallel.compat.optim import (MISSING_INTERNALS,
                                        graph_capture_health_check, init_group,
                                        patch_step_function, unhooked_step,
                                        use_grad_for_differentiable)
from fast_parallel.outcome import Outcome
from fast_parallel.step.adam_foreach import (multi_tensor_adam,
                                             read_once_reason, static_reason)
from fast_parallel.step.optim_buckets import (ADAM_KEYS, SGD_KEYS, Bucket,
                                              adam_foreach, add_to_buckets,
                                              hyper_key, sgd_foreach)

__all__ = [
    'MISSING_INTERNALS', 'FusedSGD', 'FusedAdam', 'FusedAdamW',
    'fuse_optimizer', 'unfuse_optimizer', 'fuse_optim_wrapper'
]

# ------------------------------------------------------ stock fallback ---


def _stock_reason(optimizer: Optimizer) -> Optional[str]:
    """Why this step must run stock's code, or None if it can be fused."""
    for group in optimizer.param_groups:
        for flag in ('fused', 'capturable', 'differentiable'):
            if group.get(flag):
                return f'{flag}=True'
    if (getattr(optimizer, 'grad_scale', None) is not None
            or getattr(optimizer, 'found_inf', None) is not None):
        return 'a grad scaler hands grad_scale/found_inf to the optimizer'
    if torch.compiler.is_compiling():
        return 'torch.compile is tracing the step'
    return None


# -------------------------------------------------------- fused step ---


class _FusedStep:
    """The fused ``step`` shared by every optimizer here.

    ``step`` runs the stock class's own ``step`` where fusing is out of scope
    (:func:`_stock_reason`); else it runs the closure as torch's ``step``
    does, gathers every group into buckets (the subclass's ``_gather``) and
    runs each bucket once (its ``_run``).
    """

    #: The torch class whose ``step`` runs where fusing is out of scope.
    _stock_step_of: type = Optimizer

    def _before_fused_step(self) -> None:
        """What stock's ``step`` checks first (nothing by default)."""

    @use_grad_for_differentiable
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Performs one optimisation step, fused across param groups.

        Args:
            closure (Callable, optional): Re-evaluates the model and returns
                the loss. Defaults to None.

        Returns:
            The closure's loss, or None.
        """
        if _stock_reason(self) is not None:
            # torch wraps each class's step once to run the step hooks; the
            # fused step is wrapped too, so call stock's inner function
            return unhooked_step(self._stock_step_of)(self, closure)
        self._before_fused_step()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buckets: Dict[Hashable, Bucket] = OrderedDict()
        for group in self.param_groups:
            self._gather(group, buckets)
        for bucket in buckets.values():
            self._run(bucket)
        self._fused_calls = len(buckets)
        return loss


# ----------------------------------------------------------------- SGD ---


class FusedSGD(_FusedStep, SGD):
    """``torch.optim.SGD`` stepping with one call per hyper-parameter set.

    Made by :func:`fuse_optimizer` from an existing ``SGD``; only ``step``
    differs, and its results are the bytes stock ``SGD.step`` gives.
    """

    _stock_step_of = SGD

    def _gather(self, group: Dict[str, Any], buckets: Dict[Hashable,
                                                           Bucket]) -> None:
        """Gathers one group as stock does and files it into buckets."""
        params: List[Tensor] = []
        grads: List[Tensor] = []
        bufs: List[Optional[Tensor]] = []
        has_sparse_grad = init_group(self, group, params, grads, bufs)
        if not params:
            return
        base_key = hyper_key(group, SGD_KEYS)
        if has_sparse_grad:
            base_key = ('own group', id(group))

        def all_bufs(indices: List[int]) -> bool:
            # multi-tensor SGD takes its foreach branch only when every
            # buffer of a (device, dtype) slice exists
            return bool(bufs) and all(bufs[i] is not None for i in indices)

        touched = add_to_buckets(
            buckets,
            group,
            base_key,
            sgd_foreach(group, params), [params, grads, bufs],
            all_bufs,
            checked=3)
        for bucket in touched:
            bucket.has_sparse_grad |= has_sparse_grad

    def _run(self, bucket: Bucket) -> None:
        """One ``torch.optim.sgd.sgd`` call over a bucket, then its state."""
        params, grads, bufs = bucket.lists
        group = bucket.group
        _sgd_module.sgd(
            params,
            grads,
            bufs,
            weight_decay=group['weight_decay'],
            momentum=group['momentum'],
            lr=group['lr'],
            dampening=group['dampening'],
            nesterov=group['nesterov'],
            maximize=group['maximize'],
            has_sparse_grad=bucket.has_sparse_grad,
            foreach=bucket.foreach,
            fused=False)
        if group['momentum'] != 0:
            for param, buf in zip(params, bufs):
                self.state[param]['momentum_buffer'] = buf


# ---------------------------------------------------------- Adam(W) ---


class _FusedAdamStep(_FusedStep):
    """The fused ``step`` of :class:`FusedAdam` and :class:`FusedAdamW`.

    Stock ``AdamW`` has no ``step`` of its own: it runs ``Adam.step`` with
    ``decoupled_weight_decay=True`` in every group, and so does this one.
    """

    _stock_step_of = Adam

    def _before_fused_step(self) -> None:
        """``Adam.step``'s first check."""
        graph_capture_health_check(self)

    def _gather(self, group: Dict[str, Any], buckets: Dict[Hashable,
                                                           Bucket]) -> None:
        """Gathers one group as stock does (lazy state included), bucketed."""
        lists: List[list] = [[] for _ in range(6)]
        has_complex = init_group(self, group, *lists)
        if not lists[0]:
            return
        # state_steps (last) are CPU scalars unless capturable/fused
        touched = add_to_buckets(
            buckets,
            group,
            hyper_key(group, ADAM_KEYS),
            adam_foreach(group, lists[0]),
            lists,
            lambda indices: None,
            checked=5)
        for bucket in touched:
            bucket.has_complex |= has_complex

    def _run(self, bucket: Bucket) -> None:
        """One Adam call over a bucket: the step counts read in one go
        (:mod:`fast_parallel.step.adam_foreach`) where that is exact, else
        ``torch.optim.adam.adam``."""
        group = bucket.group
        beta1, beta2 = group['betas']
        if read_once_reason(group, bucket.foreach, bucket.has_complex,
                            bucket.lists) is None:
            multi_tensor_adam(
                *bucket.lists,
                amsgrad=group['amsgrad'],
                beta1=beta1,
                beta2=beta2,
                lr=group['lr'],
                weight_decay=group['weight_decay'],
                eps=group['eps'],
                decoupled_weight_decay=group['decoupled_weight_decay'])
            return
        _adam_module.adam(
            *bucket.lists,
            amsgrad=group['amsgrad'],
            has_complex=bucket.has_complex,
            beta1=beta1,
            beta2=beta2,
            lr=group['lr'],
            weight_decay=group['weight_decay'],
            eps=group['eps'],
            maximize=group['maximize'],
            foreach=bucket.foreach,
            capturable=False,
            differentiable=False,
            fused=False,
            decoupled_weight_decay=group['decoupled_weight_decay'])


class FusedAdam(_FusedAdamStep, Adam):
    """``torch.optim.Adam`` stepping with one call per hyper-parameter set.

    Made by :func:`fuse_optimizer` from an existing ``Adam``.
    """


class FusedAdamW(_FusedAdamStep, AdamW):
    """``torch.optim.AdamW`` stepping with one call per hyper-parameter set.

    Made by :func:`fuse_optimizer` from an existing ``AdamW``.
    """


# ------------------------------------------------------------ public ---

_FUSED = {SGD: FusedSGD, Adam: FusedAdam, AdamW: FusedAdamW}
_STOCK = {fused: stock for stock, fused in _FUSED.items()}


def _planned_steps(optimizer: Optimizer, stock: type) -> int:
    """Calls per step if every parameter has a gradient (for the summary)."""
    keys, resolve = ((SGD_KEYS, sgd_foreach) if stock is SGD else
                     (ADAM_KEYS, adam_foreach))
    return len({(hyper_key(group, keys), resolve(group, group['params']))
                for group in optimizer.param_groups})


def _left_stock(subject: str, why: str) -> Outcome:
    """An optimizer left stock: ``optimizer: SGD left stock (<why>)``."""
    return Outcome(
        'optimizer',
        False,
        why,
        text=f'optimizer: {subject} left stock ({why})')


def fuse_optimizer(optimizer: Optimizer) -> Outcome:
    """Makes ``optimizer.step`` one call per distinct hyper-parameter set.

    The instance's class becomes :class:`FusedSGD`, :class:`FusedAdam` or
    :class:`FusedAdamW`; nothing else about it changes, and nothing global
    is patched. Calling it again is harmless.

    Args:
        optimizer (Optimizer): A ``torch.optim.SGD``, ``Adam`` or ``AdamW``
            (exactly those types). Anything else is left as it is.

    Returns:
        Outcome: ``str()`` is one line for the log, e.g. ``"optimizer: SGD
        240 groups -> 2 fused steps"``, or says why the optimizer was left
        stock (``why``).
    """
    name = type(optimizer).__name__
    stock = _STOCK.get(type(optimizer), type(optimizer))
    if MISSING_INTERNALS:
        return _left_stock(
            name, f'torch {torch.__version__} lacks '
            f'{", ".join(MISSING_INTERNALS)}, which the fused step uses; '
            f'checked on torch {CHECKED_ON["torch"]}')
    if stock not in _FUSED:
        return _left_stock(
            name, 'only torch.optim.SGD, Adam and AdamW themselves have a '
            'fused step')
    for group in optimizer.param_groups:
        for flag in ('fused', 'capturable', 'differentiable'):
            if group.get(flag):
                return _left_stock(name, f'{flag}=True is out of scope')
    groups = len(optimizer.param_groups)
    plural = 's' if groups != 1 else ''
    steps = _planned_steps(optimizer, stock)
    read_once = stock is not SGD and all(
        static_reason(group) is None and adam_foreach(group, group['params'])
        for group in optimizer.param_groups)
    if steps >= groups and not read_once:
        unfuse_optimizer(optimizer)
        why = 'nothing to fuse: no two groups share their hyper-parameters'
        return Outcome(
            'optimizer',
            False,
            why,
            text=f'optimizer: {stock.__name__} {groups} group{plural}, left '
            f'stock ({why})')
    if type(optimizer) is stock:
        optimizer.__class__ = _FUSED[stock]
        # Wraps the new class's step with torch's step hooks (once per
        # class), as Optimizer.__init__ does for every optimizer class.
        patch_step_function(optimizer)
    line = (f'optimizer: {stock.__name__} {groups} group{plural} -> {steps} '
            f'fused step{"s" if steps != 1 else ""}')
    return Outcome(
        'optimizer',
        True,
        text=line + (', step counts read in one go' if read_once else ''))


def unfuse_optimizer(optimizer: Optimizer) -> None:
    """Gives a fused optimizer its stock class (and ``step``) back.

    Args:
        optimizer (Optimizer): An optimizer, fused or not.
    """
    stock = _STOCK.get(type(optimizer))
    if stock is not None:
        optimizer.__class__ = stock
        patch_step_function(optimizer)


def fuse_optim_wrapper(optim_wrapper: Any) -> Outcome:
    """Applies :func:`fuse_optimizer` to the optimizers of an mmengine wrapper.

    ``OptimWrapper`` and ``AmpOptimWrapper`` hold one optimizer;
    ``OptimWrapperDict`` one wrapper per name. Grad clipping is unchanged
    (it runs on the gradients before ``step``). ``AmpOptimWrapper`` works as
    it is: its ``GradScaler`` unscales the gradients and checks them for
    inf/NaN before it calls ``optimizer.step()``, and skips the call if it
    found any; only fused optimizers (left stock here) get the scale handed
    into ``step``.

    Args:
        optim_wrapper: An ``OptimWrapper``, ``AmpOptimWrapper``,
            ``OptimWrapperDict`` or a bare ``torch.optim.Optimizer``.

    Returns:
        Outcome: The optimizer's; for a dict, one made of each wrapper's
        (``parts``), whose line is theirs ``'; '``-joined, each prefixed by
        its name.
    """
    from mmengine.optim import OptimWrapper, OptimWrapperDict
    if isinstance(optim_wrapper, OptimWrapperDict):
        named = [(name, fuse_optim_wrapper(wrapper))
                 for name, wrapper in optim_wrapper.items()]
        done = any(outcome.done for _, outcome in named)
        return Outcome(
            'optimizer',
            done,
            None if done else '; '.join(f'{name}: {outcome.why}'
                                        for name, outcome in named),
            text='; '.join(f'{name}: {outcome}' for name, outcome in named),
            parts=tuple(outcome for _, outcome in named))
    if isinstance(optim_wrapper, OptimWrapper):
        return fuse_optimizer(optim_wrapper.optimizer)
    if isinstance(optim_wrapper, Optimizer):
        return fuse_optimizer(optim_wrapper)
    return _left_stock(
        type(optim_wrapper).__name__,
        'not an optimizer or mmengine optimizer wrapper')
