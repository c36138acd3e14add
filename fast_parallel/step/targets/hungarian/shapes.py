"""Deformable DETR's and DINO's level shapes read from the device once per
call, not once per use: stock's tensors.

``DeformableDETR.gen_encoder_output_proposals`` and
``DeformableDetrTransformerEncoder.get_encoder_reference_points`` loop over
``spatial_shapes`` (a device tensor) and use each level's ``H`` and ``W``
as sizes, slice bounds and ``linspace`` ends: every use reads a 0-dim
tensor back (a host sync on a GPU; 31 of DINO's at batch 2). The forms here
are mmdet 3.3.0's bodies with the shapes read once (``tolist``) and used as
Python ints: a size or bound is the same integer; ``linspace`` takes its
ends as Python numbers either way (``H - 0.5`` is exact in float32); and a
float32 tensor times an integer below 2**24 is the same product whether
the integer is a 0-dim int64 tensor or a Python int. They are put on the
model's instances by the targets switch, where the instance's class has
stock's method and the instance has none of its own.
"""
from types import MethodType
from typing import Any, List, Tuple, Union

import torch
from mmdet.models.detectors import DeformableDETR
from mmdet.models.layers.transformer import DeformableDetrTransformerEncoder
from torch import Tensor

__all__ = [
    'gen_encoder_output_proposals', 'get_encoder_reference_points',
    'switch_level_shapes'
]

_PROPOSALS = 'gen_encoder_output_proposals'
_REFERENCES = 'get_encoder_reference_points'


def gen_encoder_output_proposals(
        self: Any, memory: Tensor, memory_mask: Tensor,
        spatial_shapes: Tensor) -> Tuple[Tensor, Tensor]:
    """Stock's ``gen_encoder_output_proposals`` with host level shapes
    (named as stock's, so that a pickled model finds it)."""
    if type(spatial_shapes) is not Tensor:  # stock's own way for a list
        return DeformableDETR.gen_encoder_output_proposals(
            self, memory, memory_mask, spatial_shapes)
    bs = memory.size(0)
    proposals = []
    _cur = 0  # start index in the sequence of the current level
    for lvl, (HW,
              (H,
               W)) in enumerate(zip(spatial_shapes, spatial_shapes.tolist())):
        if memory_mask is not None:
            mask_flatten_ = memory_mask[:,
                                        _cur:(_cur + H * W)].view(bs, H, W, 1)
            valid_H = torch.sum(~mask_flatten_[:, :, 0, 0], 1).unsqueeze(-1)
            valid_W = torch.sum(~mask_flatten_[:, 0, :, 0], 1).unsqueeze(-1)
            scale = torch.cat([valid_W, valid_H], 1).view(bs, 1, 1, 2)
        else:
            scale = HW.unsqueeze(0).flip(dims=[0, 1]).view(1, 1, 1, 2)
        grid_y, grid_x = torch.meshgrid(
            torch.linspace(
                0, H - 1, H, dtype=torch.float32, device=memory.device),
            torch.linspace(
                0, W - 1, W, dtype=torch.float32, device=memory.device))
        grid = torch.cat([grid_x.unsqueeze(-1), grid_y.unsqueeze(-1)], -1)
        grid = (grid.unsqueeze(0).expand(bs, -1, -1, -1) + 0.5) / scale
        wh = torch.ones_like(grid) * 0.05 * (2.0**lvl)
        proposal = torch.cat((grid, wh), -1).view(bs, -1, 4)
        proposals.append(proposal)
        _cur += (H * W)
    output_proposals = torch.cat(proposals, 1)
    output_proposals_valid = ((output_proposals > 0.01) &
                              (output_proposals < 0.99)).sum(
                                  -1,
                                  keepdim=True) == output_proposals.shape[-1]
    output_proposals = torch.log(output_proposals / (1 - output_proposals))
    if memory_mask is not None:
        output_proposals = output_proposals.masked_fill(
            memory_mask.unsqueeze(-1), float('inf'))
    output_proposals = output_proposals.masked_fill(~output_proposals_valid,
                                                    float('inf'))
    output_memory = memory
    if memory_mask is not None:
        output_memory = output_memory.masked_fill(
            memory_mask.unsqueeze(-1), float(0))
    output_memory = output_memory.masked_fill(~output_proposals_valid,
                                              float(0))
    output_memory = self.memory_trans_fc(output_memory)
    output_memory = self.memory_trans_norm(output_memory)
    return output_memory, output_proposals


def get_encoder_reference_points(spatial_shapes: Tensor, valid_ratios: Tensor,
                                 device: Union[torch.device, str]) -> Tensor:
    """Stock's ``get_encoder_reference_points`` with host level shapes."""
    if type(spatial_shapes) is not Tensor:  # stock's own way for a list
        return DeformableDetrTransformerEncoder.get_encoder_reference_points(
            spatial_shapes, valid_ratios, device=device)
    reference_points_list = []
    for lvl, (H, W) in enumerate(spatial_shapes.tolist()):
        ref_y, ref_x = torch.meshgrid(
            torch.linspace(
                0.5, H - 0.5, H, dtype=torch.float32, device=device),
            torch.linspace(
                0.5, W - 0.5, W, dtype=torch.float32, device=device))
        ref_y = ref_y.reshape(-1)[None] / (valid_ratios[:, None, lvl, 1] * H)
        ref_x = ref_x.reshape(-1)[None] / (valid_ratios[:, None, lvl, 0] * W)
        ref = torch.stack((ref_x, ref_y), -1)
        reference_points_list.append(ref)
    reference_points = torch.cat(reference_points_list, 1)
    reference_points = reference_points[:, :, None] * valid_ratios[:, None]
    return reference_points


def _state(module: Any, owner: type, name: str, fast: Any) -> str:
    """'fast' where ``module`` has ``fast`` in place of ``owner``'s
    ``name``, 'stock' where its class has ``owner``'s own and the instance
    no replacement, else ''."""
    if not isinstance(module, owner):
        return ''
    own = vars(module).get(name)
    if own is not None:
        return 'fast' if getattr(own, '__func__', own) is fast else ''
    return 'stock' if getattr(type(module), name, None) is getattr(
        owner, name) else ''


def switch_level_shapes(model: Any) -> List[str]:
    """Puts the host-shape forms on ``model``'s instances that have
    stock's methods.

    Args:
        model: The model (its modules are walked).

    Returns:
        list[str]: The class names of the instances that have them (also
        those switched before).
    """
    switched = []
    for module in model.modules():
        for owner, name, fast in ((DeformableDETR, _PROPOSALS,
                                   gen_encoder_output_proposals),
                                  (DeformableDetrTransformerEncoder,
                                   _REFERENCES, get_encoder_reference_points)):
            state = _state(module, owner, name, fast)
            if state == 'stock':
                setattr(
                    module, name,
                    MethodType(fast, module)
                    if owner is DeformableDETR else fast)
            if state:
                switched.append(type(module).__name__)
    return switched
