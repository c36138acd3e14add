"""Deformable DETR's proposals and encoder reference points with the level
shapes read once are stock's tensors (bits): drawn level shapes, batch
sizes, padding masks and valid ratios, with and without a mask; and the
switch puts them only on instances with stock's methods."""
import pickle

import pytest
import torch
from mmdet.models.detectors import DeformableDETR
from mmdet.models.layers.transformer import DeformableDetrTransformerEncoder
from targets_utils import DEVICES
from torch import nn

from fast_parallel.step.targets.hungarian.shapes import (
    gen_encoder_output_proposals, get_encoder_reference_points,
    switch_level_shapes)


class _Trans(nn.Module):
    """What ``gen_encoder_output_proposals`` reads of its detector."""

    def __init__(self, dims: int) -> None:
        super().__init__()
        self.memory_trans_fc = nn.Linear(dims, dims)
        self.memory_trans_norm = nn.LayerNorm(dims)


class Holder(nn.Module):
    """A model holding the given modules."""

    def __init__(self, *children):
        super().__init__()
        self.items = nn.ModuleList(children)


def _bits(a, b):
    assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride())
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def _case(seed, device):
    gen = torch.Generator().manual_seed(seed)
    levels = int(torch.randint(1, 5, (1, ), generator=gen))
    shapes = torch.randint(1, 23, (levels, 2), generator=gen)
    bs = int(torch.randint(1, 4, (1, ), generator=gen))
    total = int(shapes.prod(1).sum())
    mask = None
    if seed % 3:
        mask = torch.zeros(bs, total, dtype=torch.bool)
        start = 0
        for h, w in shapes.tolist():  # padding at the bottom and right
            level = mask[:, start:start + h * w].view(bs, h, w)
            for b in range(bs):
                vh = int(torch.randint(1, h + 1, (1, ), generator=gen))
                vw = int(torch.randint(1, w + 1, (1, ), generator=gen))
                level[b, vh:] = True
                level[b, :, vw:] = True
            start += h * w
        mask = mask.to(device)
    memory = torch.randn(bs, total, 8, generator=gen).to(device)
    ratios = (torch.rand(bs, levels, 2, generator=gen) * 0.7 + 0.3).to(device)
    return shapes.to(device), memory, mask, ratios


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('seed', range(30))
def test_level_shape_forms_are_stocks(seed, device):
    shapes, memory, mask, ratios = _case(seed, device)
    torch.manual_seed(seed)
    owner = _Trans(8).to(device)
    stock = DeformableDETR.gen_encoder_output_proposals(
        owner, memory, mask, shapes)
    fast = gen_encoder_output_proposals(owner, memory, mask, shapes)
    for a, b in zip(stock, fast):
        _bits(a, b)
    _bits(
        DeformableDetrTransformerEncoder.get_encoder_reference_points(
            shapes, ratios, device=device),
        get_encoder_reference_points(shapes, ratios, device=device))
    as_list = [tuple(hw) for hw in shapes.tolist()]  # stock's list branch
    for a, b in zip(
            DeformableDETR.gen_encoder_output_proposals(
                owner, memory, mask, as_list),
            gen_encoder_output_proposals(owner, memory, mask, as_list)):
        _bits(a, b)


def test_the_switch_takes_instances_with_stocks_methods_only():

    class Mine(DeformableDETR):

        def gen_encoder_output_proposals(self, *args):  # a user's own
            raise AssertionError

    stock_like = DeformableDETR.__new__(DeformableDETR)
    nn.Module.__init__(stock_like)
    mine = Mine.__new__(Mine)
    nn.Module.__init__(mine)
    encoder = DeformableDetrTransformerEncoder(
        num_layers=1,
        layer_cfg=dict(
            self_attn_cfg=dict(embed_dims=8, num_heads=2, num_levels=1),
            ffn_cfg=dict(embed_dims=8, feedforward_channels=16)))
    names = switch_level_shapes(Holder(stock_like, mine, encoder))
    assert names == ['DeformableDETR', 'DeformableDetrTransformerEncoder']
    assert stock_like.gen_encoder_output_proposals.__func__ is \
        gen_encoder_output_proposals
    assert encoder.get_encoder_reference_points is \
        get_encoder_reference_points
    assert 'gen_encoder_output_proposals' not in vars(mine)
    # a second switch finds them switched (and says so)
    assert switch_level_shapes(Holder(stock_like, mine, encoder)) == names
    assert stock_like.gen_encoder_output_proposals.__func__ is \
        gen_encoder_output_proposals
    # a switched model pickles; its copy computes as stock does
    copied = pickle.loads(pickle.dumps(Holder(stock_like, encoder)))
    assert type(copied.items[0]) is DeformableDETR
