"""One multi-tensor optimizer call per distinct set of hyper-parameters.

mmengine's ``DefaultOptimWrapperConstructor`` with a ``paramwise_cfg`` (YOLOX:
``norm_decay_mult=0, bias_decay_mult=0``) gives one param group per
parameter: 240 groups for YOLOX with only two distinct sets of
hyper-parameters. torch's ``SGD``/``Adam``/``AdamW`` ``step`` calls its
functional implementation once per group, so with ``foreach`` (torch's
default on CUDA) every multi-tensor kernel is launched 240 times a step.

:func:`fuse_optimizer` swaps an optimizer *instance* to a subclass
(:class:`FusedSGD`, :class:`FusedAdam`, :class:`FusedAdamW`) that overrides
only ``step``. ``param_groups``, ``state``, ``state_dict``/
``load_state_dict``, ``zero_grad`` and the step hooks stay torch's, so
param schedulers, checkpoints, ``OptimWrapper`` and ``ExactResumeHook`` see
the stock layout. ``step`` gathers each group exactly as stock does (torch's
own ``_init_group``, which also creates lazy state in stock's order), puts
the gathered tensors in buckets and calls torch's own functional
(``torch.optim.sgd.sgd`` / ``torch.optim.adam.adam``) once per bucket.

Why the numbers are the same bytes as stock: every update these functionals
make is elementwise per parameter, with the same Python scalars, so it does
not matter which other tensors share a call, as long as each tensor takes the
same code path as in stock. A bucket is therefore keyed by everything that
picks a path, besides the hyper-parameters the functional reads:

- ``foreach`` resolved per group as the functional would resolve it for that
  group alone (``foreach=None`` depends on the group's devices);
- the unit of bucketing is a (group, device, dtype) slice, the unit torch's
  functionals split each call into (``_group_tensors_by_device_and_dtype``);
- SGD: whether every momentum buffer of the slice exists (the multi-tensor
  SGD uses ``_foreach_mul_``/``_foreach_add_`` only then, else per-tensor
  ``mul_``/``add_``);
- foreach: a slice whose tensors might miss the CUDA multi-tensor fast route
  (not contiguous, empty, state of another dtype/shape) gets a call of its
  own, since one such tensor sends a whole list to the per-tensor slow path;
- sparse gradients, or hyper-parameters that are not plain numbers (tensor
  ``lr``), keep their group in a call of its own, as in stock.

Left stock (the optimizer's own ``step`` runs): other optimizer types,
``fused=True`` (already one kernel per device and dtype),
``capturable=True``, ``differentiable=True``, a grad scaler that hands
``grad_scale``/``found_inf`` to the optimizer (only done for fused
optimizers), and ``torch.compile`` tracing.
"""
import numbers
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch
from torch import Tensor
from torch.optim import SGD, Adam, AdamW, Optimizer
from torch.optim import adam as _adam_module
from torch.optim import optimizer as _optimizer_module
from torch.optim import sgd as _sgd_module

from fast_parallel.compat import CHECKED_ON

# torch internals the fused step calls. They are optional: on a torch
# without one, fuse_optimizer leaves the optimizer stock and says why.
_INTERNALS = {
    'torch.optim.optimizer._default_to_fused_or_foreach':
    getattr(_optimizer_module, '_default_to_fused_or_foreach', None),
    'torch.optim.optimizer._use_grad_for_differentiable':
    getattr(_optimizer_module, '_use_grad_for_differentiable', None),
    'torch.optim.sgd.sgd': getattr(_sgd_module, 'sgd', None),
    'torch.optim.adam.adam': getattr(_adam_module, 'adam', None),
    'Optimizer._patch_step_function':
    getattr(Optimizer, '_patch_step_function', None),
    'SGD._init_group': getattr(SGD, '_init_group', None),
    'Adam._init_group': getattr(Adam, '_init_group', None),
    'torch.compiler.is_compiling':
    getattr(getattr(torch, 'compiler', None), 'is_compiling', None),
    # AdamW as Adam(decoupled_weight_decay=True), torch >= 2.7 or so
    'AdamW as a subclass of Adam': True if issubclass(AdamW, Adam) else None,
}
#: The internals this torch lacks (empty on the versions checked).
MISSING_INTERNALS = [name for name, obj in _INTERNALS.items() if obj is None]
_default_to_fused_or_foreach = _INTERNALS[
    'torch.optim.optimizer._default_to_fused_or_foreach']
_use_grad_for_differentiable = _INTERNALS[
    'torch.optim.optimizer._use_grad_for_differentiable'] or (lambda f: f)

# Group keys each functional reads, besides the tensors and the path flags.
_SGD_KEYS = ('lr', 'momentum', 'dampening', 'weight_decay', 'nesterov',
             'maximize')
_ADAM_KEYS = ('lr', 'betas', 'eps', 'weight_decay', 'amsgrad', 'maximize',
              'decoupled_weight_decay')


class _Bucket:
    """The tensors of one functional call and the group it takes scalars from.

    Args:
        group (dict): The first param group in the bucket; every group in it
            has the same hyper-parameters.
        foreach (bool): The resolved ``foreach`` of the bucket's groups.
        num_lists (int): Number of tensor lists the functional takes.
    """

    def __init__(self, group: Dict[str, Any], foreach: bool,
                 num_lists: int) -> None:
        self.group = group
        self.foreach = foreach
        self.lists: List[list] = [[] for _ in range(num_lists)]
        self.has_sparse_grad = False
        self.has_complex = False

    def extend(self, lists: List[list]) -> None:
        """Appends one slice's tensors, list by list."""
        for mine, theirs in zip(self.lists, lists):
            mine.extend(theirs)


# --------------------------------------------------------------- keys ---


def _number_key(value: Any) -> Optional[Hashable]:
    """An exact key for a hyper-parameter, or None if it is no plain number.

    Floats are keyed by their exact hex form (``-0.0`` and ``0.0`` differ),
    and every value by its type, so only values that reach the kernels
    identically share a bucket.
    """
    kind = type(value)
    if kind is float:  # the common case first: this runs per group per step
        return (kind, value.hex())
    if kind in (bool, int, str) or value is None:
        return (kind, value)
    if kind is tuple:
        keys = tuple(_number_key(v) for v in value)
        return None if None in keys else (kind, keys)
    if isinstance(value, numbers.Integral):  # numpy integers
        return (kind, int(value))
    if isinstance(value, numbers.Real):  # numpy floats
        return (kind, float(value).hex())
    return None  # a Tensor lr/weight_decay, or anything unknown


def _hyper_key(group: Dict[str, Any], keys: Tuple[str, ...]) -> Hashable:
    """The group's hyper-parameters as a key; a unique one if not numbers."""
    parts = tuple(_number_key(group[k]) for k in keys)
    if any(part is None for part in parts):
        return ('own group', id(group))
    return parts


def _fast_route_safe(tensor_lists: List[list], index: int) -> bool:
    """Whether entry ``index`` can never knock a list off the fast route.

    CUDA's multi-tensor kernels run a list on the fast route only when every
    tensor is dense, non-overlapping, and shaped, strided and typed like its
    counterparts (``ATen/native/ForeachUtils.h``); otherwise the whole list
    takes the per-tensor path. Contiguous tensors of the parameter's shape,
    dtype and device always qualify, so they can share a call with others.
    """
    param = tensor_lists[0][index]
    if param.layout != torch.strided or param.numel() == 0:
        return False
    for tensors in tensor_lists:
        tensor = tensors[index] if tensors else None
        if tensor is None:
            continue
        if (tensor.layout != torch.strided or tensor.shape != param.shape
                or tensor.dtype != param.dtype
                or tensor.device != param.device
                or not tensor.is_contiguous()):
            return False
    return True


def _slices(params: List[Tensor]) -> List[List[int]]:
    """Indices of ``params`` by (device, dtype), in first-seen order."""
    if len(params) == 1:
        return [[0]]
    slices: Dict[Tuple[torch.device, torch.dtype], List[int]] = OrderedDict()
    for i, param in enumerate(params):
        slices.setdefault((param.device, param.dtype), []).append(i)
    return list(slices.values())


def _add_to_buckets(buckets: Dict[Hashable, _Bucket], group: Dict[str, Any],
                    base_key: Hashable, foreach: bool,
                    tensor_lists: List[list],
                    path_flag: Callable[[List[int]], Hashable],
                    checked: int) -> List[_Bucket]:
    """Distributes one group's gathered tensors over the buckets.

    Args:
        buckets (dict): Buckets by key, filled in place.
        group (dict): The param group the tensors come from.
        base_key (Hashable): The group's hyper-parameter key.
        foreach (bool): The group's resolved ``foreach``.
        tensor_lists (list[list]): The lists the functional takes, params
            first, as torch's ``_init_group`` gathered them; empty lists
            (``max_exp_avg_sqs`` without amsgrad) stay empty.
        path_flag (Callable): Gives, for a slice's indices, whatever else
            picks the functional's code path for that slice.
        checked (int): How many leading lists the multi-tensor kernels take
            on the parameters' device (Adam's CPU ``state_steps`` are not).

    Returns:
        list[_Bucket]: The buckets this group's tensors went to.
    """
    touched = []
    for index, indices in enumerate(_slices(tensor_lists[0])):
        key: Hashable = (base_key, foreach, path_flag(indices))
        if foreach and not all(
                _fast_route_safe(tensor_lists[:checked], i) for i in indices):
            key = ('own slice', id(group), index)
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = _Bucket(group, foreach, len(tensor_lists))
        bucket.extend([[tensors[i] for i in indices] if tensors else []
                       for tensors in tensor_lists])
        touched.append(bucket)
    return touched


# ------------------------------------------------------ stock fallback ---


def _stock_step(cls: type) -> Callable:
    """The stock class's ``step`` without torch's hook wrapper.

    ``Optimizer._patch_step_function`` wraps each class's ``step`` once to run
    the step hooks; the fused ``step`` is wrapped the same way, so falling
    back must call the inner function or the hooks would run twice.
    """
    step = cls.step
    return step.__wrapped__ if getattr(step, 'hooked', False) else step


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

    @_use_grad_for_differentiable
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Performs one optimisation step, fused across param groups.

        Args:
            closure (Callable, optional): Re-evaluates the model and returns
                the loss. Defaults to None.

        Returns:
            The closure's loss, or None.
        """
        if _stock_reason(self) is not None:
            return _stock_step(self._stock_step_of)(self, closure)
        self._before_fused_step()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buckets: Dict[Hashable, _Bucket] = OrderedDict()
        for group in self.param_groups:
            self._gather(group, buckets)
        for bucket in buckets.values():
            self._run(bucket)
        self._fused_calls = len(buckets)
        return loss


# ----------------------------------------------------------------- SGD ---


def _sgd_foreach(group: Dict[str, Any], params: List[Tensor]) -> bool:
    """``foreach`` as ``torch.optim.sgd.sgd`` resolves it for this group."""
    foreach, fused = group['foreach'], group['fused']
    if foreach is None and fused is None:
        _, foreach = _default_to_fused_or_foreach(
            params, differentiable=False, use_fused=False)
    return bool(foreach)


class FusedSGD(_FusedStep, SGD):
    """``torch.optim.SGD`` stepping with one call per hyper-parameter set.

    Made by :func:`fuse_optimizer` from an existing ``SGD``; only ``step``
    differs, and its results are the bytes stock ``SGD.step`` gives.
    """

    _stock_step_of = SGD

    def _gather(self, group: Dict[str, Any],
                buckets: Dict[Hashable, _Bucket]) -> None:
        """Gathers one group as stock does and files it into buckets."""
        params: List[Tensor] = []
        grads: List[Tensor] = []
        bufs: List[Optional[Tensor]] = []
        has_sparse_grad = self._init_group(group, params, grads, bufs)
        if not params:
            return
        base_key = _hyper_key(group, _SGD_KEYS)
        if has_sparse_grad:
            base_key = ('own group', id(group))

        def all_bufs(indices: List[int]) -> bool:
            # multi-tensor SGD takes its foreach branch only when every
            # buffer of a (device, dtype) slice exists
            return bool(bufs) and all(bufs[i] is not None for i in indices)

        touched = _add_to_buckets(buckets, group, base_key,
                                  _sgd_foreach(group, params),
                                  [params, grads, bufs], all_bufs, checked=3)
        for bucket in touched:
            bucket.has_sparse_grad |= has_sparse_grad

    def _run(self, bucket: _Bucket) -> None:
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


def _adam_foreach(group: Dict[str, Any], params: List[Tensor]) -> bool:
    """``foreach`` as ``torch.optim.adam.adam`` resolves it for this group."""
    foreach, fused = group['foreach'], group['fused']
    if fused is None and foreach is None:
        _, foreach = _default_to_fused_or_foreach(
            params, group['differentiable'], use_fused=False)
        if (foreach and isinstance(group['lr'], Tensor)
                and not group['capturable']):
            foreach = False
    return bool(foreach)


class _FusedAdamStep(_FusedStep):
    """The fused ``step`` of :class:`FusedAdam` and :class:`FusedAdamW`.

    Stock ``AdamW`` has no ``step`` of its own: it runs ``Adam.step`` with
    ``decoupled_weight_decay=True`` in every group, and so does this one.
    """

    _stock_step_of = Adam

    def _before_fused_step(self) -> None:
        """``Adam.step``'s first check."""
        self._accelerator_graph_capture_health_check()

    def _gather(self, group: Dict[str, Any],
                buckets: Dict[Hashable, _Bucket]) -> None:
        """Gathers one group as stock does (lazy state included), bucketed."""
        lists: List[list] = [[] for _ in range(6)]
        has_complex = self._init_group(group, *lists)
        if not lists[0]:
            return
        # state_steps (last) are CPU scalars unless capturable/fused
        touched = _add_to_buckets(buckets, group,
                                  _hyper_key(group, _ADAM_KEYS),
                                  _adam_foreach(group, lists[0]), lists,
                                  lambda indices: None, checked=5)
        for bucket in touched:
            bucket.has_complex |= has_complex

    def _run(self, bucket: _Bucket) -> None:
        """One ``torch.optim.adam.adam`` call over a bucket."""
        group = bucket.group
        beta1, beta2 = group['betas']
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
    keys, resolve = ((_SGD_KEYS, _sgd_foreach) if stock is SGD else
                     (_ADAM_KEYS, _adam_foreach))
    return len({(_hyper_key(group, keys), resolve(group, group['params']))
                for group in optimizer.param_groups})


def fuse_optimizer(optimizer: Optimizer) -> str:
    """Makes ``optimizer.step`` one call per distinct hyper-parameter set.

    The instance's class becomes :class:`FusedSGD`, :class:`FusedAdam` or
    :class:`FusedAdamW`; nothing else about it changes, and nothing global
    is patched. Calling it again is harmless.

    Args:
        optimizer (Optimizer): A ``torch.optim.SGD``, ``Adam`` or ``AdamW``
            (exactly those types). Anything else is left as it is.

    Returns:
        str: One line for the log, e.g. ``"optimizer: SGD 240 groups -> 2
        fused steps"``, or why the optimizer was left stock.
    """
    name = type(optimizer).__name__
    stock = _STOCK.get(type(optimizer), type(optimizer))
    if MISSING_INTERNALS:
        return (f'optimizer: {name} left stock (torch {torch.__version__} '
                f'lacks {", ".join(MISSING_INTERNALS)}, which the fused '
                f'step uses; checked on torch {CHECKED_ON["torch"]})')
    if stock not in _FUSED:
        return (f'optimizer: {name} left stock (only torch.optim.SGD, Adam '
                'and AdamW themselves have a fused step)')
    for group in optimizer.param_groups:
        for flag in ('fused', 'capturable', 'differentiable'):
            if group.get(flag):
                return (f'optimizer: {name} left stock ({flag}=True is '
                        'out of scope)')
    groups = len(optimizer.param_groups)
    steps = _planned_steps(optimizer, stock)
    if steps >= groups:
        unfuse_optimizer(optimizer)
        return (f'optimizer: {stock.__name__} {groups} '
                f'group{"s" if groups != 1 else ""}, left stock (nothing '
                'to fuse: no two groups share their hyper-parameters)')
    if type(optimizer) is stock:
        optimizer.__class__ = _FUSED[stock]
        # Wraps the new class's step with torch's step hooks (once per
        # class), as Optimizer.__init__ does for every optimizer class.
        optimizer._patch_step_function()
    return (f'optimizer: {stock.__name__} {groups} groups -> {steps} '
            'fused steps')


def unfuse_optimizer(optimizer: Optimizer) -> None:
    """Gives a fused optimizer its stock class (and ``step``) back.

    Args:
        optimizer (Optimizer): An optimizer, fused or not.
    """
    stock = _STOCK.get(type(optimizer))
    if stock is not None:
        optimizer.__class__ = stock
        optimizer._patch_step_function()


def fuse_optim_wrapper(optim_wrapper: Any) -> str:
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
        str: The summaries, ``'; '``-joined (prefixed by name for a dict).
    """
    from mmengine.optim import OptimWrapper, OptimWrapperDict
    if isinstance(optim_wrapper, OptimWrapperDict):
        return '; '.join(f'{name}: {fuse_optim_wrapper(wrapper)}'
                         for name, wrapper in optim_wrapper.items())
    if isinstance(optim_wrapper, OptimWrapper):
        return fuse_optimizer(optim_wrapper.optimizer)
    if isinstance(optim_wrapper, Optimizer):
        return fuse_optimizer(optim_wrapper)
    return (f'optimizer: {type(optim_wrapper).__name__} left stock (not an '
            'optimizer or mmengine optimizer wrapper)')
