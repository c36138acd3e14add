"""Operations dispatched per training iteration: a count, not a timing.

On a GPU every non-view aten operation the main process dispatches is (at
least) one kernel launch, and the host's time to issue them is what leaves
the GPU idle when kernels are small. The count is exact and the same on
every machine for the same batches, so a CPU machine can measure what a GPU
would launch, as long as the code takes the GPU's paths: force the
optimizer's ``foreach`` on (torch's default on CUDA, off on CPU).

:class:`OpCounter` counts through a ``TorchDispatchMode`` (the dispatcher's
Python key), so it sees forward, backward (autograd carries the mode into its
engine) and the optimizer alike; a composite operation counts as the
operations it decomposes into; views (``view``, ``detach``, ``select``...)
launch nothing and are left out, as are operations outside the ``aten``
namespace.

:func:`count_iteration_ops` counts the main process's work of each training
iteration under mmengine's Runner, from the first ``before_train_iter`` hook
to the last ``after_train_iter`` hook, split into phases: the hooks before
the step, ``train_step`` (moving the batch, data preprocessor, forward, loss,
backward), the optimizer's ``step`` and the hooks after the step
(``EMAHook``'s update, logging). The training targets (YOLOX's SimOTA,
PointPillars' anchor targets, stock or batched: the heads of
:data:`~fast_parallel.step.targets.switch.COVERED`) are a phase of their own,
cut out of ``train_step``. The wait for the next batch is not in it.
It also records how many tensor copies to the device the batch would need
(stock ``cast_data``: one per tensor; fast: one per packed buffer), which a
CPU run does not dispatch.
"""
from collections import Counter
from functools import wraps
from typing import Any, Callable, Dict, List, Optional

from mmengine.hooks import Hook

from fast_parallel.compat import ITEM_OP, dispatch_mode_class
from fast_parallel.data.handout import packed_batch_of
from fast_parallel.data.packing import stock_transfers
from fast_parallel.step.targets.stats import TargetStats
from fast_parallel.step.targets.switch import target_heads

TorchDispatchMode = dispatch_mode_class()

#: The phases of an iteration, in order (``targets`` is within the step).
PHASES = ('before_iter_hooks', 'train_step', 'targets', 'optimizer_step',
          'after_iter_hooks')


class OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched while it is active.

    Views are left out (they launch no kernel). ``phase`` names the part of
    the work the next operations belong to.

    Example::

        with OpCounter() as counter:
            model(x).sum().backward()
        counter.total, counter.ops.most_common(5)
    """

    def __init__(self, phase: str = 'all') -> None:
        super().__init__()
        self.phase = phase
        self.ops: Counter = Counter()
        self.phases: Counter = Counter()

    @property
    def total(self) -> int:
        """int: Operations counted."""
        return sum(self.ops.values())

    def __torch_dispatch__(self,
                           func: Callable,
                           types: Any,
                           args=(),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        if func.namespace == 'aten' and not func.is_view:
            self.ops[func.overloadpacket.__name__] += 1
            self.phases[self.phase] += 1
        return func(*args, **(kwargs or {}))


def _optimizers(optim_wrapper: Any) -> list:
    """The torch optimizers of an ``OptimWrapper`` or ``OptimWrapperDict``."""
    inner = getattr(optim_wrapper, 'optimizer', None)
    if inner is not None:
        return [inner]
    return [w.optimizer for w in optim_wrapper.values()]


class _CountStart(Hook):
    """First hook of ``before_train_iter`` and ``after_train_iter``."""

    priority = 'HIGHEST'

    def __init__(self, record: List[dict]) -> None:
        self.record = record
        self.counter: Optional[OpCounter] = None
        self.copies = 0
        self.observed = False
        self._outer_phase = 'train_step'

    def before_train(self, runner) -> None:
        """Marks each optimizer step as its own phase."""
        for optimizer in _optimizers(runner.optim_wrapper):
            optimizer.register_step_pre_hook(self._enter_step)
            optimizer.register_step_post_hook(self._leave_step)

    def _enter_step(self, *args: Any) -> None:
        if self.counter is not None:
            self.counter.phase = 'optimizer_step'

    def _leave_step(self, *args: Any) -> None:
        if self.counter is not None:
            self.counter.phase = 'train_step'

    def _targets(self, entering: bool) -> None:
        """The targets phase, around each head's target computation."""
        if self.counter is None:
            return
        if entering:
            self._outer_phase = self.counter.phase
            self.counter.phase = 'targets'
        else:
            self.counter.phase = self._outer_phase

    def _observe_targets(self, model) -> None:
        """Marks the targets of every covered head, stock or batched."""
        self.observed = True
        for head, covered in target_heads(model):
            stats = getattr(head, 'fast_target_stats', None)
            if isinstance(stats, TargetStats):
                stats.observer = self._targets
            elif covered is not None:
                for dotted in covered.stock_targets:
                    *path, name = dotted.split('.')
                    self._observe(head, path, name)

    def _observe(self, owner: Any, path: List[str], name: str) -> None:
        """Wraps ``owner.<path>.<name>``; a list on the way (a cascade's
        assigners, one per stage) has each of its items wrapped."""
        if isinstance(owner, (list, tuple)):
            for item in owner:
                self._observe(item, path, name)
        elif path:
            self._observe(getattr(owner, path[0]), path[1:], name)
        else:
            setattr(owner, name, self._observed(getattr(owner, name)))

    def _observed(self, method: Callable) -> Callable:

        @wraps(method)
        def observed(*args: Any, **kwargs: Any) -> Any:
            self._targets(True)
            try:
                return method(*args, **kwargs)
            finally:
                self._targets(False)

        return observed

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch=None) -> None:
        """Starts counting; notes the batch's copies to a device."""
        if not self.observed:  # after every before_train: heads switched
            self._observe_targets(runner.model)
        packed = packed_batch_of(data_batch)
        self.copies = (
            packed.num_copies
            if packed is not None else stock_transfers(data_batch)[0])
        self.counter = OpCounter('before_iter_hooks')
        self.counter.__enter__()

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        """The step is over: what follows is hooks' work."""
        if self.counter is not None:
            self.counter.phase = 'after_iter_hooks'


class _CountStop(Hook):
    """Last hook of ``before_train_iter`` and ``after_train_iter``."""

    priority = 'LOWEST'

    def __init__(self, start: _CountStart) -> None:
        self.start = start

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch=None) -> None:
        """The hooks before the step are done: the step begins."""
        if self.start.counter is not None:
            self.start.counter.phase = 'train_step'

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        """Stops counting and keeps the iteration's record."""
        counter, self.start.counter = self.start.counter, None
        if counter is None:
            return
        counter.__exit__(None, None, None)
        self.start.record.append(
            dict(
                total=counter.total,
                ops=dict(counter.ops),
                phases={p: counter.phases[p]
                        for p in PHASES},
                items=counter.ops[ITEM_OP],
                device_copies=self.start.copies))


def count_iteration_ops(runner) -> List[dict]:
    """Counts the operations of each training iteration of ``runner``.

    Registers two hooks (highest and lowest priority) that start and stop
    the count around each iteration's hooks and ``train_step``, and step
    hooks on the optimizers. Call it before ``runner.train()``.

    Args:
        runner (Runner): A built mmengine Runner.

    Returns:
        list[dict]: Filled during training, one dict per iteration:
        ``total`` operations, ``ops`` (name -> times dispatched),
        ``phases`` (phase -> operations, see ``PHASES``), ``items``
        (``.item()`` calls, :data:`ITEM_OP`) and ``device_copies`` (tensor
        copies the batch needs to reach a device).
    """
    record: List[dict] = []
    start = _CountStart(record)
    runner.register_hook(start)
    runner.register_hook(_CountStop(start))
    return record
