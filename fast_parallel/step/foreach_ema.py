"""Multi-tensor updates for the averaged models ``EMAHook`` builds.

:func:`fuse_ema` gives one averaged model stock's ``update_parameters`` done
with foreach ops: one call per op and (device, dtype) group instead of one
per tensor, the same bytes. The per-class updates, and why they are exact:
``docs/step.md``. Importing this module never imports mmdet.
"""
import math
import sys
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
from mmengine.model.averaged_model import (BaseAveragedModel,
                                           ExponentialMovingAverage,
                                           MomentumAnnealingEMA,
                                           StochasticWeightAverage)
from torch import Tensor, nn

from fast_parallel.compat import CHECKED_ON
from fast_parallel.compat.optim import (AVERAGED_MODELS, foreach_add_,
                                        foreach_copy_, foreach_lerp_,
                                        foreach_mul_, foreach_sub,
                                        missing_foreach_ops)
from fast_parallel.outcome import Outcome

__all__ = ['FOREACH_DTYPES', 'fuse_ema', 'unfuse_ema', 'is_fused_ema']

#: Dtypes updated with foreach ops. In these a Python scalar rounds to the
#: dtype itself, which is also the compute type of the per-tensor ops. In
#: float16/bfloat16 the per-tensor ops compute in float32 with the scalar
#: rounded to float32, while a foreach op with a scalar may round it to the
#: tensors' dtype first (``_foreach_mul_`` on the CPU does, torch 2.13):
#: those tensors keep stock's ``avg_func``, one by one.
FOREACH_DTYPES = (torch.float32, torch.float64)

Tensors = List[Tensor]
#: ``average(ema, avg, src, steps)``: one foreach update of a group.
Average = Callable[[BaseAveragedModel, Tensors, Tensors, int], None]


# --------------------------------------------------------------------------
# The per-class updates, each the stock ``avg_func`` over a list.
# --------------------------------------------------------------------------
def _ema_lerp(ema: ExponentialMovingAverage, avg: Tensors, src: Tensors,
              steps: int) -> None:
    """``ExponentialMovingAverage.avg_func``: ``lerp_(src, momentum)``."""
    foreach_lerp_(avg, src, ema.momentum)


def _annealing_lerp(ema: MomentumAnnealingEMA, avg: Tensors, src: Tensors,
                    steps: int) -> None:
    """``MomentumAnnealingEMA.avg_func`` (stock reads ``steps.item()``)."""
    momentum = max(ema.momentum, ema.gamma / (ema.gamma + steps))
    foreach_lerp_(avg, src, momentum)


def _exp_momentum(ema: BaseAveragedModel, avg: Tensors, src: Tensors,
                  steps: int) -> None:
    """mmdet ``ExpMomentumEMA.avg_func``: ``mul_(1 - m).add_(src, alpha=m)``.

    Stock gets ``steps`` as the 0-dim int64 tensor; ``float(1 + steps)`` of
    it is exactly ``float(1 + int(steps))``.
    """
    momentum = (1 - ema.momentum) * math.exp(
        -float(1 + steps) / ema.gamma) + ema.momentum
    foreach_mul_(avg, 1 - momentum)
    foreach_add_(avg, src, alpha=momentum)


def _swa(ema: StochasticWeightAverage, avg: Tensors, src: Tensors,
         steps: int) -> None:
    """``StochasticWeightAverage.avg_func``: ``add_(src - avg, alpha=...)``.
    """
    alpha = 1 / float(steps // ema.interval + 1)
    foreach_add_(avg, foreach_sub(src, avg), alpha=alpha)


#: Stock class (``module.qualname``, from the seam's
#: :data:`~fast_parallel.compat.optim.AVERAGED_MODELS`) -> (fused class name,
#: update).
_UPDATES: Dict[str, Tuple[str, Average]] = {
    AVERAGED_MODELS['ExponentialMovingAverage']:
    ('FusedExponentialMovingAverage', _ema_lerp),
    AVERAGED_MODELS['MomentumAnnealingEMA']:
    ('FusedMomentumAnnealingEMA', _annealing_lerp),
    AVERAGED_MODELS['StochasticWeightAverage']:
    ('FusedStochasticWeightAverage', _swa),
    AVERAGED_MODELS['ExpMomentumEMA']: ('FusedExpMomentumEMA', _exp_momentum),
}


def _qualname(cls: type) -> str:
    """``module.qualname`` of a class: how the table names stock classes."""
    return f'{cls.__module__}.{cls.__qualname__}'


# --------------------------------------------------------------------------
# The fused update_parameters
# --------------------------------------------------------------------------
def _grouped(*lists: Iterable[Tensor]) -> List[Tuple[Tensors, ...]]:
    """Zips tensor lists and groups the rows by their devices and dtypes.

    A foreach op takes its fast (multi-tensor) path only for tensors of one
    device and dtype; the rows are independent, so the grouping changes no
    value.

    Args:
        *lists: Equally long iterables of tensors, row by row.

    Returns:
        list[tuple[list[Tensor], ...]]: Per group, one list per input.
    """
    groups: Dict[tuple, Tuple[Tensors, ...]] = {}
    for row in zip(*lists):
        key = tuple((t.device, t.dtype) for t in row)
        columns = groups.get(key)
        if columns is None:
            columns = groups[key] = tuple([] for _ in row)
        for column, tensor in zip(columns, row):
            column.append(tensor)
    return list(groups.values())


def _foreach_copy(dst: Iterable[Tensor], src: Iterable[Tensor]) -> None:
    """``d.copy_(s)`` for each pair, one ``_foreach_copy_`` per group."""
    for dsts, srcs in _grouped(dst, src):
        foreach_copy_(dsts, srcs)


def _identity(tensor: Tensor) -> tuple:
    """What makes two tensors the same tensor: memory, dtype and layout."""
    return (tensor.device, tensor.data_ptr(), tensor.dtype,
            tuple(tensor.shape), tuple(tensor.stride()))


def _rounds(pairs: Iterable[Tuple[Tensor, Tensor]]) -> List[list]:
    """``(avg, src)`` pairs in rounds with no tensor twice in a round.

    Round ``r`` holds the ``r``-th name of every averaged tensor that has
    one, in stock's order of names. A tensor's updates thus run in stock's
    order (distinct tensors never read each other), and a foreach call never
    gets one tensor twice.

    Args:
        pairs (Iterable[tuple]): ``(averaged, source)`` per name, in order.

    Returns:
        list[list[tuple]]: The rounds; one for a model without tied tensors.
    """
    seen: Dict[tuple, int] = {}
    rounds: List[list] = []
    for avg, src in pairs:
        key = _identity(avg)
        index = seen.get(key, 0)
        seen[key] = index + 1
        if index == len(rounds):
            rounds.append([])
        rounds[index].append((avg, src))
    return rounds


class _ForeachAveraging:
    """Overrides ``BaseAveragedModel.update_parameters`` with foreach ops.

    Mixed in before a stock averaged-model class; ``_average`` is that
    class's ``avg_func`` over lists (the table in ``docs/step.md``).
    """

    _average: Average
    _stock: type

    def update_parameters(self, model: nn.Module) -> None:
        """Stock ``update_parameters``, one foreach call per op and group.

        A tensor that several names share (tied weights) is updated once
        per name, as stock does, in rounds: every tensor's first name, then
        the second names of the shared ones, and so on (:func:`_rounds`).

        Args:
            model (nn.Module): The model whose parameters are averaged.
        """
        src = (
            model.state_dict()
            if self.update_buffers else dict(model.named_parameters()))
        steps = int(self.steps)  # stock compares the tensor twice per call
        if steps == 0:
            copies = ((p.data, src[k].data)
                      for k, p in self.avg_parameters.items())
            for pairs in _rounds(copies):
                _foreach_copy(*zip(*pairs))
        elif steps % self.interval == 0:
            floats = ((p.data, src[k].data.to(p.device))
                      for k, p in self.avg_parameters.items()
                      if p.dtype.is_floating_point)
            for pairs in _rounds(floats):
                for avg, source in _grouped(*zip(*pairs)):
                    if avg[0].dtype in FOREACH_DTYPES:
                        self._average(self, avg, source, steps)
                    else:  # stock's own avg_func, tensor by tensor
                        for a, s in zip(avg, source):
                            self.avg_func(a, s, self.steps)
        if not self.update_buffers:
            # Stock keeps the buffers in sync with the source model.
            pairs = [
                (b_avg.data, b_src.data.to(b_avg.device))
                for b_avg, b_src in zip(self.module.buffers(), model.buffers())
            ]
            if pairs:
                _foreach_copy(*zip(*pairs))
        self.steps += 1

    def _get_name(self) -> str:
        # ``repr`` names the stock class: the fusion is an implementation
        # detail, like the ``update_parameters`` it replaces.
        return self._stock.__name__


def _make_fused(stock: type) -> type:
    """The fused subclass of a stock class in the table, made once.

    It is a global of this module under its own name, so instances pickle
    and unpickle (see :func:`__getattr__`).
    """
    name, average = _UPDATES[_qualname(stock)]
    cls = globals().get(name)
    if cls is None:
        cls = type(
            name, (_ForeachAveraging, stock), {
                '_average':
                staticmethod(average),
                '_stock':
                stock,
                '__module__':
                __name__,
                '__qualname__':
                name,
                '__doc__':
                f'``{stock.__name__}`` updated with foreach ops '
                '(see :mod:`fast_parallel.step.foreach_ema`).',
            })
        globals()[name] = cls
    return cls


def __getattr__(name: str) -> type:
    """Makes a fused class on first access (unpickling a fused model).

    Args:
        name (str): A fused class name from the table.

    Returns:
        type: The fused class; its stock class's module is imported.
    """
    for qualname, (fused_name, _) in _UPDATES.items():
        if fused_name == name:
            module, _, cls_name = qualname.rpartition('.')
            __import__(module)
            return _make_fused(getattr(sys.modules[module], cls_name))
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


for _cls in (ExponentialMovingAverage, MomentumAnnealingEMA,
             StochasticWeightAverage):
    _make_fused(_cls)


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------
def is_fused_ema(ema_model: nn.Module) -> bool:
    """Whether :func:`fuse_ema` fused this averaged model.

    Args:
        ema_model (nn.Module): An averaged model.

    Returns:
        bool: True when its updates are the foreach ones.
    """
    return isinstance(ema_model, _ForeachAveraging)


def fuse_ema(ema_model: nn.Module) -> Outcome:
    """Updates one averaged model with foreach ops from now on.

    Known stock classes only (mmengine's ``ExponentialMovingAverage``,
    ``MomentumAnnealingEMA``, ``StochasticWeightAverage``, mmdet's
    ``ExpMomentumEMA``), exactly: a subclass may have its own ``avg_func``,
    so it is left stock, and so is an instance with its own
    ``avg_func``/``update_parameters`` or with overlapping averaged tensors.
    Calling it again on a fused model changes nothing.

    Args:
        ema_model (nn.Module): E.g. ``EMAHook.ema_model``, after the hook's
            ``before_run`` built it.

    Returns:
        Outcome: ``str()`` is what was done, for the log: e.g. ``'EMA
        (ExpMomentumEMA): 388 tensors in 1 multi-tensor update'``, or why it
        was left stock (``why``).
    """
    stock = getattr(type(ema_model), '_stock', type(ema_model))
    name = f'EMA ({stock.__name__})'
    reason = _why_not(ema_model, stock)
    if reason is not None:
        return Outcome(
            name, False, reason, text=f'{name}: left stock: {reason}')
    ema_model.__class__ = _make_fused(stock)
    return Outcome(name, True, text=_summary(ema_model, stock))


def unfuse_ema(ema_model: nn.Module) -> None:
    """Gives a fused averaged model back its stock class (and updates).

    Args:
        ema_model (nn.Module): A model :func:`fuse_ema` fused; any other is
            left as it is.
    """
    if is_fused_ema(ema_model):
        ema_model.__class__ = ema_model._stock


def _why_not(ema_model: nn.Module, stock: type) -> Optional[str]:
    """Why ``ema_model`` cannot be fused, None when it can."""
    if not isinstance(ema_model, BaseAveragedModel):
        return 'not a BaseAveragedModel'
    lacking = missing_foreach_ops()
    if lacking:
        return (f'torch {torch.__version__} lacks {", ".join(lacking)} '
                f'(checked on torch {CHECKED_ON["torch"]})')
    if _qualname(stock) not in _UPDATES:
        return (f'{_qualname(stock)} is not a known stock class (its '
                'avg_func may differ)')
    own = {'avg_func', 'update_parameters'} & set(vars(ema_model))
    if own:
        return f'the instance sets its own {", ".join(sorted(own))}'
    unique = {_identity(t): t for t in ema_model.avg_parameters.values()}
    if _overlapping(
            unique.values()) or (not ema_model.update_buffers
                                 and _overlapping(ema_model.module.buffers())):
        return ('averaged tensors overlap in part (views of one another), '
                'which stock updates in sequence')
    return None


def _overlapping(tensors: Iterable[Tensor]) -> bool:
    """Whether any two of the tensors touch the same bytes.

    Each tensor counts as the byte range from its first element to its
    last (conservative for strided views). Pass each tensor once: the
    same tensor under two names (tied weights) is not an overlap.
    """
    spans = []
    for t in tensors:
        if t.numel() == 0:
            continue
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
        start = t.data_ptr()
        spans.append((t.device, start, start + extent * t.element_size()))
    spans.sort(key=lambda span: (str(span[0]), span[1]))
    return any(a[0] == b[0] and b[1] < a[2] for a, b in zip(spans, spans[1:]))


def _summary(ema_model: BaseAveragedModel, stock: type) -> str:
    """The log line of a fused model: tensors and multi-tensor calls."""
    floats = [
        p for p in ema_model.avg_parameters.values()
        if p.dtype.is_floating_point
    ]
    rounds = _rounds((p, p) for p in floats)
    fused = [p for p in floats if p.dtype in FOREACH_DTYPES]
    updates = sum(
        len(_grouped([p for p, _ in pairs if p.dtype in FOREACH_DTYPES]))
        for pairs in rounds)
    line = (f'EMA ({stock.__name__}): {len(fused)} tensors in {updates} '
            f'multi-tensor update{"s" if updates != 1 else ""}')
    if len(rounds) > 1:
        tied = len(floats) - len(rounds[0])
        line += (f' ({tied} names of tied tensors in {len(rounds) - 1} more '
                 f'round{"s" if len(rounds) > 2 else ""}, in stock\'s order)')
    if len(fused) < len(floats):
        line += (f', {len(floats) - len(fused)} reduced-precision tensors '
                 'one by one (stock avg_func)')
    if not ema_model.update_buffers:
        buffers = list(ema_model.module.buffers())
        copies = len(_grouped(buffers))
        line += (f', {len(buffers)} buffers in {copies} multi-tensor '
                 f'cop{"ies" if copies != 1 else "y"}')
    return line
