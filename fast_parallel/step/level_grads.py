"""Shared head weights: each level's gradient summed for all weights at once.

A dense head runs the same convolutions on every FPN level, so autograd adds
each shared weight's level gradients one ``add`` at a time (FCOS: 35-43
weights x 4 adds). Here each level's forward reads leaf aliases of the
weights (the same storage and version counter); autograd hands each alias
its gradient without an add, and when the backward pass ends one
``_foreach_add_`` per level after the first sums them, each weight's in the
order autograd delivered them, the order stock's engine added them in:
stock's bits. Why, and what stays stock: ``docs/step.md``, "Shared head
weights"; which heads and how: :mod:`fast_parallel.step.level_switch`.
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from mmengine.logging import MMLogger
from torch import Tensor, nn

from fast_parallel.compat.autograd import (graph_holds, graph_task,
                                           has_grad_hooks, in_backward_pass,
                                           module_parameters, queue_callback,
                                           run_post_accumulate_hooks,
                                           run_tensor_hooks,
                                           saved_tensors_hooked)
from fast_parallel.compat.optim import foreach_add_

__all__ = ['LevelGrads', 'forward', 'forward_single']

#: Sets of aliases kept for reuse (more live graphs keep their own).
MAX_SETS = 4
#: Device types whose autocast state a forward checks.
AUTOCAST_DEVICES = ('cpu', 'cuda', 'xpu', 'mps', 'hpu')


class LevelGrads:
    """The aliases, arrivals and counts of one switched head.

    Args:
        head (nn.Module): The head.
        params (Sequence[nn.Parameter]): Its weights summed here.
        left (Sequence[str]): The classes of the modules whose weights are
            left to autograd.
    """

    def __init__(self,
                 head: nn.Module,
                 params: Sequence[Tensor],
                 left: Sequence[str] = ()) -> None:
        self.head = head
        self.params = list(params)
        #: The modules whose weights are left to autograd (the start line).
        self.left = list(left)
        index = {id(p): i for i, p in enumerate(self.params)}
        #: Where each weight sits: (module's parameter dict, name, index).
        self.slots: List[Tuple[Dict[str, Any], str, int]] = [
            (module_parameters(module), name, index[id(param)])
            for module in head.modules()
            for name, param in module_parameters(module).items()
            if id(param) in index
        ]
        #: aliases[set][level][i]: weight i's alias (made on first use); a
        #: forward takes a set no live autograd graph holds.
        self.aliases: List[List[List[Optional[Tensor]]]] = []
        #: Per backward pass (its task id): (weight, gradient) in the order
        #: autograd gave them (taken off the alias at once, so that a pass
        #: that raised leaves no alias gradient behind).
        self.arrivals: Dict[int, List[Tuple[int, Tensor]]] = {}
        self.active: Optional[int] = None
        self.level = 0
        self.fast = 0
        self.stock = 0
        self.reported = False
        #: Backward passes that reached a graph of a stock-way forward.
        self.stock_passes: set = set()

    def __getstate__(self) -> dict:
        """Without the aliases (their hooks are closures) or a pass's
        arrivals: a copy makes its own aliases on its first forward."""
        state = dict(vars(self))
        state.update(aliases=[], arrivals={}, active=None, stock_passes=set())
        return state

    # ------------------------------------------------------------ forward
    def stock_reason(self, args: Sequence[Any]) -> Optional[str]:
        """Why this forward keeps stock's accumulation, or None."""
        feats = args[0] if args else None
        first = feats[0] if isinstance(feats, (list, tuple)) and feats \
            else None
        if not isinstance(first, Tensor):
            return 'the features are not a sequence of tensors'
        if first.device.type not in AUTOCAST_DEVICES:
            return f'features on {first.device.type}'
        if in_backward_pass():
            return ('a forward inside a backward pass (a checkpoint\'s '
                    'recomputation)')
        if saved_tensors_hooked():
            return 'saved-tensor hooks (a checkpoint, an offload) are on'
        if torch.is_autocast_enabled(first.device.type):
            return ('autocast: stock sums the shared weights\' half '
                    'gradients before their cast')
        for slots, name, i in self.slots:
            if slots.get(name) is not self.params[i]:
                return f'weight {name} was replaced on its module'
        if any(has_grad_hooks(p) for p in self.params):
            return 'a shared weight has a gradient hook'
        return None

    def count_stock(self, why: str, outs: Any) -> None:
        """Counts one forward that keeps stock's sums (logs the first) and
        marks the backward passes that reach its outputs."""
        if not in_backward_pass():  # the passes marked before have ended
            self.stock_passes.clear()
        _watch(outs, self.mark_stock_pass)
        self.stock += 1
        if not self.reported:
            self.reported = True
            MMLogger.get_current_instance().info(
                f'FastParallelHook: shared head weights: a '
                f'{type(self.head).__name__} forward keeps stock\'s gradient '
                f'sums ({why}); the numbers stay stock\'s. Counted in '
                'fast_level_grads.stock.')

    def begin(self) -> None:
        """Starts one forward on a set of aliases no live graph holds (a
        graph kept from an earlier forward keeps its own: each alias then
        gets at most one gradient per backward pass, as stock's sum
        order needs)."""
        self.level = 0
        self.fast += 1
        self.arrivals.clear()  # no pass runs (stock_reason): any raised
        for k, levels in enumerate(self.aliases):
            if not any(
                    graph_holds(alias) for aliases in levels
                    for alias in aliases if alias is not None):
                self.active = k
                return
        if len(self.aliases) >= MAX_SETS:  # the graphs keep theirs alive
            self.aliases.pop(0)
        self.aliases.append([])
        self.active = len(self.aliases) - 1

    def swap_in(self) -> None:
        """Puts this level's aliases in the modules."""
        levels = self.aliases[self.active]
        if len(levels) <= self.level:
            levels.append([None] * len(self.params))
        aliases = levels[self.level]
        self.level += 1
        for i, param in enumerate(self.params):
            if not param.requires_grad:  # frozen now: no gradient to sum
                continue
            if aliases[i] is None or not _same_tensor(aliases[i], param):
                aliases[i] = self._alias(i, param)
        for slots, name, i in self.slots:
            if self.params[i].requires_grad:
                slots[name] = aliases[i]

    def swap_out(self) -> None:
        """Puts the weights back."""
        for slots, name, i in self.slots:
            slots[name] = self.params[i]

    def _alias(self, i: int, param: Tensor) -> Tensor:
        """A leaf on ``param``'s storage and version counter, whose gradient
        is recorded when autograd gives it."""
        alias = nn.Parameter(param)

        def arrived(tensor: Tensor) -> None:
            if torch.is_grad_enabled():
                _second_order(self.head)
            task = graph_task()
            if task not in self.arrivals:
                self.arrivals[task] = []
                queue_callback(lambda: self.sum_grads(task))
            self.arrivals[task].append((i, tensor.grad))
            tensor.grad = None

        alias.register_post_accumulate_grad_hook(arrived)
        return alias

    # ----------------------------------------------------------- backward
    def mark_stock_pass(self, grad: Tensor) -> None:
        """An output hook of a stock-way forward: this pass reaches it."""
        self.stock_passes.add(graph_task())

    def sum_grads(self, task: int) -> None:
        """When backward pass ``task`` ends: each weight's level gradients
        summed in the order they came, added to its ``.grad`` as stock's
        ``AccumulateGrad`` adds. (A pass that raised never gets here; its
        gradients are dropped at the next forward.)"""
        arrivals = self.arrivals.pop(task, [])
        if task in self.stock_passes:
            self.stock_passes.discard(task)
            _mixed(self.head)
        per_param: Dict[int, List[Tensor]] = {}
        for i, grad in arrivals:
            if self.params[i].requires_grad:  # else frozen since: no .grad
                per_param.setdefault(i, []).append(grad)
        with torch.no_grad():
            sums = {i: grads[0] for i, grads in per_param.items()}
            depth = max(map(len, per_param.values()), default=0)
            for k in range(1, depth):
                rows = [i for i, grads in per_param.items() if len(grads) > k]
                foreach_add_([sums[i] for i in rows],
                             [per_param[i][k] for i in rows])
            hooked = [i for i in sums if has_grad_hooks(self.params[i])]
            for i in hooked:  # hooks registered after the forward; a hook
                # may keep its tensor: .grad gets a copy, as a held buffer
                sums[i] = run_tensor_hooks(self.params[i], sums[i]).clone()
            held = [i for i in sums if self.params[i].grad is not None]
            if held:
                foreach_add_([self.params[i].grad for i in held],
                             [sums[i] for i in held])
            for i, total in sums.items():
                if self.params[i].grad is None:
                    self.params[i].grad = total
            for i in hooked:
                run_post_accumulate_hooks(self.params[i])


def _same_tensor(alias: Tensor, param: Tensor) -> bool:
    """Whether ``alias`` still views all of ``param`` (``param.data = ...``
    or a move gives it new storage)."""
    return (alias.data_ptr() == param.data_ptr() and alias.shape == param.shape
            and alias.stride() == param.stride() and alias.dtype == param.dtype
            and alias.device == param.device)


def _second_order(head: nn.Module) -> None:
    raise RuntimeError(
        f'FastParallelHook: shared head weights: a backward pass with '
        f'create_graph=True reached {type(head).__name__}; its per-level '
        'aliases cannot keep stock\'s sum order for second-order gradients. '
        'Set FastParallelHook(fast_shared_grads=False) for this run.')


def _mixed(head: nn.Module) -> None:
    raise RuntimeError(
        f'FastParallelHook: shared head weights: one backward pass reached '
        f'two {type(head).__name__} forwards, one on per-level aliases and '
        'one the stock way (e.g. one checkpointed, one not), whose gradients '
        'stock sums in one sequence. Set FastParallelHook('
        'fast_shared_grads=False) for this run.')


def _watch(outs: Any, hook: Any) -> None:
    """``hook`` on each output tensor that requires grad."""
    pending = [outs]
    while pending:
        item = pending.pop()
        if isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, Tensor) and item.requires_grad:
            item.register_hook(hook)


def _watch_second_order(state: 'LevelGrads', feats: Any) -> None:
    """A hook on each input feature that fails a backward pass with
    ``create_graph=True`` through the head (a gradient penalty on its
    inputs): the graph it builds would reach an alias twice. (One that
    reaches the weights fails at their aliases; one that stops at the
    outputs never enters the head.)"""

    def check(grad: Tensor) -> None:
        if torch.is_grad_enabled():
            _second_order(state.head)

    _watch(feats, check)


def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Stock's ``forward``; with grad, each level on its own aliases."""
    state: LevelGrads = self.fast_level_grads
    stock = type(self).forward
    if torch.compiler.is_compiling() or self is not state.head or \
            not torch.is_grad_enabled() or state.active is not None:
        return stock(self, *args, **kwargs)
    why = state.stock_reason(args)
    if why is not None:
        outs = stock(self, *args, **kwargs)
        state.count_stock(why, outs)
        return outs
    state.begin()
    try:
        outs = stock(self, *args, **kwargs)
    finally:
        state.active = None
    _watch_second_order(state, args[0])
    return outs


def forward_single(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Stock's ``forward_single`` on this level's aliases."""
    state: LevelGrads = self.fast_level_grads
    stock = type(self).forward_single
    if self is not state.head or state.active is None:
        return stock(self, *args, **kwargs)
    state.swap_in()
    try:
        return stock(self, *args, **kwargs)
    finally:
        state.swap_out()
