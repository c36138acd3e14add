"""Which heads get batched targets (:data:`COVERED`), and the switch.

:func:`switch_targets` walks the model, finds the modules that compute
training targets and gives each one a covered row accepts the batched methods
of its family, on that instance only (nothing global changes, the state dict
stays stock's). Everything else stays stock and is named, with the reason, in
the start-of-run line. Each family is a package of this one
(``targets/<package>/``) with ``supported(head)`` and the methods it replaces;
how to add one: ``docs/targets.md``.
"""
import importlib
from types import MethodType
from typing import Iterator, List, NamedTuple, Optional, Tuple

from mmengine.model import is_model_wrapper
from torch import nn

from fast_parallel.compat import YOLOX_HEAD_METHODS
from fast_parallel.compat.targets import DN_LOSS_SINGLE
from fast_parallel.outcome import Outcome
from fast_parallel.step.targets.prior_cache import keep_priors
from fast_parallel.step.targets.stats import TargetStats


class Covered(NamedTuple):
    """One head class with batched targets, and where they live.

    ``package`` names ``fast_parallel.step.targets.<package>``, which has
    ``supported(head) -> Optional[str]`` (None: covered exactly, else why
    not) and one function per name in ``replaces``: the methods
    :func:`install` puts on the head instance in place of the class's (they
    run their targets in
    :func:`~fast_parallel.step.targets.stock_way.batch_targets`).
    ``stock_targets`` are the (dotted) methods a stock head computes its
    targets in, which the op counter times as the targets phase.
    ``assigner`` is empty for a head without one (``CenterHead``).
    """
    head: str
    assigner: str
    package: str
    unit: str
    replaces: Tuple[str, ...]
    stock_targets: Tuple[str, ...]


#: The heads with batched targets, by exact class name.
COVERED: Tuple[Covered, ...] = (
    Covered(
        head='YOLOXHead',
        assigner='SimOTAAssigner',
        package='yolox',
        unit='images',
        replaces=('loss_by_feat', ),
        stock_targets=(YOLOX_HEAD_METHODS[0], )),
    Covered(
        head='Anchor3DHead',
        assigner='Max3DIoUAssigner',
        package='anchor3d',
        unit='samples',
        replaces=('anchor_target_3d', ),
        stock_targets=('anchor_target_3d', )),
    *(Covered(
        head=head,
        assigner='DynamicSoftLabelAssigner',
        package='rtmdet',
        unit='images',
        replaces=('loss_by_feat', ),
        stock_targets=('get_targets', ))
      for head in ('RTMDetHead', 'RTMDetSepBNHead')),
    *(Covered(
        head=head,
        assigner='MaxIoUAssigner',
        package='max_iou',
        unit='images',
        replaces=('loss_by_feat', ),
        stock_targets=('get_anchors', 'get_targets'))
      for head in ('RetinaHead', 'RPNHead')),
    Covered(
        head='CenterHead',
        assigner='',
        package='centerpoint',
        unit='samples',
        replaces=('get_targets', ),
        stock_targets=('get_targets', )),
    *(Covered(
        head=head,
        assigner='HungarianAssigner',
        package='hungarian',
        unit='images',
        replaces=('loss_by_feat', 'loss_by_feat_single'),
        stock_targets=('get_targets', ))
      for head in ('DETRHead', 'DeformableDETRHead', 'ConditionalDETRHead',
                   'DABDETRHead')),
    Covered(
        head='DINOHead',
        assigner='HungarianAssigner',
        package='hungarian',
        unit='images',
        replaces=('loss_by_feat', 'loss_by_feat_single', DN_LOSS_SINGLE),
        stock_targets=('get_targets', 'get_dn_targets')),
    *(Covered(
        head=head,
        assigner='',
        package='fcos',
        unit='images',
        replaces=('get_targets', ),
        stock_targets=('get_targets', ))
      for head in ('FCOSHead', 'NASFCOSHead')),
    *(Covered(
        head=head,
        assigner='ATSSAssigner',
        package='atss',
        unit='images',
        replaces=('get_anchors', 'get_targets', 'loss_by_feat'),
        stock_targets=('get_targets', )) for head in ('ATSSHead', 'GFLHead')),
    Covered(
        head='TOODHead',
        assigner='ATSSAssigner',
        package='tood',
        unit='images',
        replaces=('get_anchors', 'get_targets', 'loss_by_feat'),
        stock_targets=('get_targets', )),
    *(Covered(
        head=head,
        assigner='',
        package='mask',
        unit='images',
        replaces=('get_targets', ),
        stock_targets=('get_targets', ))
      for head in ('FCNMaskHead', 'HTCMaskHead')),
    Covered(
        head='StandardRoIHead',
        assigner='MaxIoUAssigner',
        package='roi',
        unit='images',
        replaces=('loss', ),
        stock_targets=('bbox_assigner.assign', 'bbox_sampler.sample')),
    Covered(
        head='CascadeRoIHead',
        assigner='MaxIoUAssigner',
        package='cascade',
        unit='images',
        replaces=('loss', ),
        # a list per stage: each stage's is counted
        stock_targets=('bbox_assigner.assign', 'bbox_sampler.sample')),
    Covered(
        head='HybridTaskCascadeRoIHead',
        assigner='MaxIoUAssigner',
        package='htc',
        unit='images',
        replaces=('loss', ),
        # a list per stage: each stage's is counted
        stock_targets=('bbox_assigner.assign', 'bbox_sampler.sample')),
)


def family(covered: Covered):
    """The package of ``covered``'s family (imported on first use)."""
    return importlib.import_module(
        f'fast_parallel.step.targets.{covered.package}')


def supported(head: nn.Module, covered: Covered) -> Optional[str]:
    """None when ``covered``'s batched methods are exact for ``head``.

    Args:
        head (nn.Module): A head of class ``covered.head``.
        covered (Covered): Its row of :data:`COVERED`.

    Returns:
        Optional[str]: None, or why the head stays stock (for the log).
    """
    why = family(covered).supported(head)
    replaced = [name for name in covered.replaces if name in vars(head)]
    if why is None and replaced:
        why = f'{", ".join(replaced)} replaced on the instance'
    return why


def install(head: nn.Module, covered: Covered) -> TargetStats:
    """Puts ``covered``'s batched methods on this one head instance.

    Args:
        head (nn.Module): A head :func:`supported` accepted.
        covered (Covered): Its row of :data:`COVERED`.

    Returns:
        TargetStats: The head's counter (also ``head.fast_target_stats``).
    """
    name = '/'.join(filter(None, (covered.head, covered.assigner)))
    stats = TargetStats(name, covered.unit)
    module = family(covered)
    head.fast_target_stats = stats
    for name in covered.replaces:  # '_x' is the family's function 'x'
        setattr(head, name,
                MethodType(getattr(module, name.lstrip('_')), head))
    return stats


def _computes_targets(module: nn.Module) -> bool:
    """Whether ``module`` is a head that computes training targets: a
    dense head or box / mask head (``loss_by_feat``, ``get_targets``), or an
    RoI head (``bbox_assigner`` and ``bbox_sampler``)."""
    cls = type(module)
    return any(
        callable(getattr(cls, name, None))
        for name in ('loss_by_feat', 'get_targets')) or (hasattr(
            module, 'bbox_assigner') and hasattr(module, 'bbox_sampler'))


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


def _head_outcome(head: nn.Module, why: Optional[str]) -> Outcome:
    """One head's part of the line: ``<head>/<assigner> batched``, or
    ``... stock (<why>)``."""
    label = _label(head)
    if why is None:
        return Outcome(label, True, text=f'{label} batched')
    return Outcome(label, False, why, text=f'{label} stock ({why})')


def _switch_detr(model: nn.Module) -> Tuple[List[Outcome], List[TargetStats]]:
    """The DETR family's detector-side parts (imported only where the model
    has one): DINO's ``CdnQueryGenerator`` batched, and the level shapes of
    Deformable DETR's proposals and encoder read once. Their parts of the
    line, and the generator's counter."""
    names = ('CdnQueryGenerator', 'FastCdnQueryGenerator',
             'DeformableDetrTransformerEncoder')
    if not any(type(m).__name__ in names for m in model.modules()):
        return [], []
    from fast_parallel.step.targets.hungarian.queries import switch_queries
    from fast_parallel.step.targets.hungarian.shapes import switch_level_shapes
    parts, stats = [], []
    queries = switch_queries(model)
    if queries is not None:
        stats.append(queries)
        parts.append(
            Outcome(queries.name, True, text=f'{queries.name} batched'))
    if switch_level_shapes(model):
        parts.append(
            Outcome('level shapes', True, text='level shapes read once'))
    return parts, stats


def switch_targets(model: nn.Module,
                   enabled: bool = True) -> Tuple[Outcome, List[TargetStats]]:
    """Switches every covered head of ``model`` to batched targets.

    Args:
        model (nn.Module): The model (a wrapper's module is looked into).
        enabled (bool): False leaves every head stock. Defaults to True.

    Returns:
        tuple: The ``targets`` outcome, one of its ``parts`` per head, whose
        line is the ``targets: ...`` part of the start-of-run line, e.g.
        ``targets: YOLOXHead/SimOTAAssigner batched``; and the counters of
        the switched heads.
    """
    if not enabled:
        return Outcome('targets', False, 'fast_targets=False'), []
    heads, stats = [], []
    for head, covered in target_heads(model):
        if isinstance(getattr(head, 'fast_target_stats', None), TargetStats):
            stats.append(head.fast_target_stats)  # switched by an earlier run
            heads.append(_head_outcome(head, None))
            if isinstance(getattr(head, 'fast_loss_stats', None), TargetStats):
                stats.append(head.fast_loss_stats)
            continue
        if covered is None:
            heads.append(_head_outcome(head, 'not covered'))
            continue
        why = supported(head, covered)
        if why is None:
            stats.append(install(head, covered))
            keep_priors(head)
        heads.append(_head_outcome(head, why))
        if why is None and 'loss_by_feat' in covered.replaces and hasattr(
                family(covered), 'loss_part'):
            part, counter = family(covered).loss_part(head)
            heads.append(part)
            stats.append(counter)
    parts, queries = _switch_detr(
        model.module if is_model_wrapper(model) else model)
    heads.extend(parts)
    stats.extend(queries)
    done = any(h.done for h in heads)
    why = None if done else ('; '.join(f'{h.name}: {h.why}' for h in heads)
                             or 'no dense head found')
    text = 'targets: ' + (', '.join(map(str, heads)) or 'no dense head found')
    return Outcome('targets', done, why, text=text, parts=tuple(heads)), stats
