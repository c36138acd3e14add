"""``Anchor3DHead.anchor_target_3d`` for the whole batch, on one instance.

:func:`~fast_parallel.step.targets.switch.install` puts
:func:`anchor_target_3d` on one head instance in place of the class's (stock's
``loss_by_feat`` calls it as ``self.anchor_target_3d``); it returns
:func:`~fast_parallel.step.targets.anchor3d.targets.anchor_target_3d_batched`'s
result: stock's tuple, bit for bit, for one assigner or a list of per-class
assigners.
"""
from typing import Any, List, Optional

from torch import Tensor

from fast_parallel.step.targets.anchor3d.targets import (
    anchor3d_supported, anchor_target_3d_batched)
from fast_parallel.step.targets.stock_way import batch_targets

#: None when :func:`anchor_target_3d` is exact for a head, else why not.
supported = anchor3d_supported


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
    :func:`~fast_parallel.step.targets.anchor3d.targets.anchor_target_3d_batched`).
    """
    with batch_targets(self, len(batch_input_metas)) as stock_way:
        return anchor_target_3d_batched(self, anchor_list,
                                        batch_gt_instances_3d,
                                        batch_input_metas,
                                        batch_gt_instances_ignore,
                                        label_channels, num_classes, sampling,
                                        stock_way)
