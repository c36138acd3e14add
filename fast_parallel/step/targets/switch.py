"""Which heads get batched targets (:data:`COVERED`), and the switch.

:func:`switch_targets` walks the model, finds the modules that compute
training targets (a ``loss_by_feat`` or ``get_targets`` method) and gives
each one a covered pair accepts its batched target method, on that instance
only (nothing global changes, the state dict stays stock's). Everything else
stays stock and is named, with the reason, in the start-of-run line. How to
add a head: ``docs/targets.md``.
"""
import importlib
from types import MethodType
from typing import Iterator, List, NamedTuple, Optional, Tuple

from mmengine.model import is_model_wrapper
from torch import nn

from fast_parallel.compat import YOLOX_HEAD_METHODS
from fast_parallel.step.targets.stats import TargetStats


class Covered(NamedTuple):
    """One head/assigner pair with batched targets.

    ``module`` names a module with ``supported(head) -> Optional[str]``
    (None: covered exactly, else why not) and a function named ``replaces``:
    the batched method that :func:`install` puts on the head instance in
    place of the class's (it calls ``self.fast_target_stats.computing()``
    around the targets and ``.add(...)`` after them). ``stock_method`` is the
    head method stock computes the targets in (per sample or per batch),
    which the op counter observes on a stock head.
    """
    head: str
    assigner: str
    module: str
    unit: str
    replaces: str
    stock_method: str


#: The head/assigner pairs with batched targets, by head class name.
COVERED: Tuple[Covered, ...] = (
    Covered('YOLOXHead', 'SimOTAAssigner',
            'fast_parallel.step.targets.yolox_loss', 'images', 'loss_by_feat',
            YOLOX_HEAD_METHODS[0]),
    Covered('Anchor3DHead', 'Max3DIoUAssigner',
            'fast_parallel.step.targets.anchor3d_head', 'samples',
            'anchor_target_3d', 'anchor_target_3d'),
)


def supported(head: nn.Module, covered: Covered) -> Optional[str]:
    """None when ``covered``'s batched method is exact for ``head``.

    Args:
        head (nn.Module): A head of class ``covered.head``.
        covered (Covered): Its row of :data:`COVERED`.

    Returns:
        Optional[str]: None, or why the head stays stock (for the log).
    """
    why = importlib.import_module(covered.module).supported(head)
    if why is None and covered.replaces in vars(head):
        why = f'{covered.replaces} replaced on the instance'
    return why


def install(head: nn.Module, covered: Covered) -> TargetStats:
    """Puts ``covered``'s batched method on this one head instance.

    Args:
        head (nn.Module): A head :func:`supported` accepted.
        covered (Covered): Its row of :data:`COVERED`.

    Returns:
        TargetStats: The head's counter (also ``head.fast_target_stats``).
    """
    stats = TargetStats(f'{covered.head}/{covered.assigner}', covered.unit)
    method = getattr(importlib.import_module(covered.module), covered.replaces)
    head.fast_target_stats = stats
    setattr(head, covered.replaces, MethodType(method, head))
    return stats


def _computes_targets(module: nn.Module) -> bool:
    """Whether ``module`` is a head that computes training targets."""
    cls = type(module)
    return any(
        callable(getattr(cls, name, None))
        for name in ('loss_by_feat', 'get_targets'))


def assigner_name(head: nn.Module) -> Optional[str]:
    """The class name of the head's assigner(s), if it has any."""
    for name in ('assigner', 'bbox_assigner'):
        found = getattr(head, name, None)
        if isinstance(found, (list, tuple)) and found:
            found = found[0]
        if found is not None:
            return type(found).__name__
    return None


def _label(head: nn.Module) -> str:
    assigner = assigner_name(head)
    name = type(head).__name__
    return f'{name}/{assigner}' if assigner else name


def target_heads(
        model: nn.Module) -> Iterator[Tuple[nn.Module, Optional[Covered]]]:
    """The modules of ``model`` that compute targets, with their table row.

    Args:
        model (nn.Module): The model (a wrapper's module is looked into).

    Yields:
        tuple: ``(head, row)``; ``row`` is None for a head not covered.
    """
    if is_model_wrapper(model):
        model = model.module
    for head in model.modules():
        if _computes_targets(head):
            yield head, _covering(head)


def _covering(head: nn.Module) -> Optional[Covered]:
    return next((c for c in COVERED if c.head == type(head).__name__), None)


def switch_targets(model: nn.Module,
                   enabled: bool = True) -> Tuple[str, List[TargetStats]]:
    """Switches every covered head of ``model`` to batched targets.

    Args:
        model (nn.Module): The model (a wrapper's module is looked into).
        enabled (bool): False leaves every head stock. Defaults to True.

    Returns:
        tuple: The ``targets: ...`` part of the start-of-run line, e.g.
        ``targets: YOLOXHead/SimOTAAssigner batched``, and the counters of
        the switched heads.
    """
    if not enabled:
        return 'targets: left stock (fast_targets=False)', []
    parts, stats = [], []
    for head, covered in target_heads(model):
        if isinstance(getattr(head, 'fast_target_stats', None), TargetStats):
            stats.append(head.fast_target_stats)  # switched by an earlier run
            parts.append(f'{_label(head)} batched')
            continue
        if covered is None:
            parts.append(f'{_label(head)} stock (not covered)')
            continue
        why = supported(head, covered)
        if why is not None:
            parts.append(f'{_label(head)} stock ({why})')
            continue
        stats.append(install(head, covered))
        parts.append(f'{_label(head)} batched')
    return 'targets: ' + (', '.join(parts) or 'no dense head found'), stats
