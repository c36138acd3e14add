"""``Anchor3DHead.anchor_target_3d`` for the whole batch, on one instance.

:func:`install` replaces ``anchor_target_3d`` (which stock's
``loss_by_feat`` calls as ``self.anchor_target_3d``) on one head instance
with :func:`anchor_target_3d`, which returns
:func:`~fast_parallel.step.targets.anchor3d.anchor_target_3d_batched`'s
result: stock's tuple, bit for bit, for one assigner or a list of per-class
assigners.
"""
from types import MethodType
from typing import Any, List, Optional

from torch import Tensor

from fast_parallel.step.targets.anchor3d import (anchor3d_supported,
                                                 anchor_target_3d_batched)
from fast_parallel.step.targets.stats import TargetStats

#: The pair this module covers, as the switch's table and log name it.
HEAD, ASSIGNER = 'Anchor3DHead', 'Max3DIoUAssigner'


def supported(head: Any) -> Optional[str]:
    """None when :func:`install` covers ``head`` exactly, else why not."""
    why = anchor3d_supported(head)
    if why is None and 'anchor_target_3d' in vars(head):
        why = 'anchor_target_3d replaced on the instance'
    return why


def install(head: Any, stats: TargetStats) -> None:
    """Gives ``head`` (one instance) the batched ``anchor_target_3d``.

    Args:
        head: An ``Anchor3DHead`` :func:`supported` accepts.
        stats (TargetStats): Counts the samples that took the stock path.
    """
    head.fast_target_stats = stats
    head.anchor_target_3d = MethodType(anchor_target_3d, head)


def anchor_target_3d(self: Any,
                     anchor_list: List[List[Tensor]],
                     batch_gt_instances_3d: List[Any],
                     batch_input_metas: List[dict],
                     batch_gt_instances_ignore: Optional[List[Any]] = None,
                     label_channels: int = 1,
                     num_classes: int = 1,
                     sampling: bool = True) -> Optional[tuple]:
    """Stock's ``AnchorTrainMixin.anchor_target_3d``, batched.

    The arguments and the result are stock's (see
    :func:`~fast_parallel.step.targets.anchor3d.anchor_target_3d_batched`).
    """
    stats = self.fast_target_stats
    with stats.computing():
        targets, stock = anchor_target_3d_batched(
            self, anchor_list, batch_gt_instances_3d, batch_input_metas,
            batch_gt_instances_ignore, label_channels, num_classes, sampling)
    stats.add(len(batch_input_metas), stock)
    return targets
