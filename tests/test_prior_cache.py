"""Kept priors: mmdet's grid_priors once per feature map sizes, handed out
as clones with stock's values, for point and anchor generators."""
import copy
import pickle

import pytest
import torch
from mmdet.models.task_modules.prior_generators import (AnchorGenerator,
                                                        MlvlPointGenerator)
from targets_utils import DEVICES

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.targets.prior_cache import (KEEP, KEEP_BYTES,
                                                    KeptPriors, keep_priors)


class _Head:

    def __init__(self, generator):
        self.prior_generator = generator


def _generators():
    return [
        MlvlPointGenerator([8, 16, 32, 64, 128], offset=0.5),
        MlvlPointGenerator([8, 16, 32], offset=0),
        AnchorGenerator(
            strides=[8, 16, 32, 64, 128],
            ratios=[0.5, 1.0, 2.0],
            octave_base_scale=8,
            scales_per_octave=1),
        AnchorGenerator(
            strides=[12, 24], ratios=[1.0], scales=[4, 8], center_offset=0.5),
    ]


def _bits_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.device == y.device
        assert torch.equal(
            x.view(torch.int8) if x.dtype.is_floating_point else x,
            y.view(torch.int8) if y.dtype.is_floating_point else y)


@pytest.mark.parametrize('device', DEVICES)
def test_kept_priors_are_stocks_every_call(device):
    sizes = [[(80, 80), (40, 40), (20, 20), (10, 10), (5, 5)],
             [(100, 152), (50, 76), (25, 38), (13, 19), (7, 10)],
             [(1, 1), (1, 2), (2, 1), (1, 1), (1, 1)]]
    for generator in _generators():
        stock = copy.deepcopy(generator)
        assert keep_priors(_Head(generator))
        assert isinstance(vars(generator)['grid_priors'], KeptPriors)
        levels = generator.num_levels
        for featmap_sizes in sizes * 2:  # kept, then again from the keep
            featmap_sizes = featmap_sizes[:levels]
            for kwargs in (dict(), dict(dtype=torch.float16),
                           dict(dtype=torch.float64)):
                extra = dict(with_stride=True) if isinstance(
                    generator, MlvlPointGenerator) else {}
                for more in ({}, extra):
                    want = stock.grid_priors(
                        featmap_sizes, device=device, **kwargs, **more)
                    got = generator.grid_priors(
                        featmap_sizes, device=device, **kwargs, **more)
                    _bits_equal(got, want)
        # a caller writing into what it got changes nothing kept
        got = generator.grid_priors(sizes[0][:levels], device=device)
        for p in got:
            p.fill_(7)
        _bits_equal(
            generator.grid_priors(sizes[0][:levels], device=device),
            stock.grid_priors(sizes[0][:levels], device=device))


def test_kept_priors_cost_one_copy_a_level_and_stay_bounded():
    generator = _generators()[0]
    keep_priors(_Head(generator))
    sizes = [(80, 80), (40, 40), (20, 20), (10, 10), (5, 5)]
    counts = []
    for _ in range(3):
        with OpCounter() as counter:
            generator.grid_priors(sizes, device='cpu')
        counts.append(counter.total)
    assert counts[0] > 5 * 5 and counts[1] == counts[2] == 5
    for i in range(KEEP + 4):
        generator.grid_priors([(i + 1, i + 2)] * 5, device='cpu')
    kept = generator.grid_priors
    assert len(kept.kept) == KEEP
    # and bounded in bytes: large maps push the oldest out
    anchors = _generators()[2]
    keep_priors(_Head(anchors))
    for i in range(6):
        anchors.grid_priors([(400 + i, 400)] * 5, device='cpu')
    assert anchors.grid_priors.bytes <= KEEP_BYTES
    assert anchors.grid_priors.bytes == sum(
        p.numel() * p.element_size()
        for ps in anchors.grid_priors.kept.values() for p in ps)
    assert 1 <= len(anchors.grid_priors.kept) < 6


def test_a_copied_or_pickled_head_keeps_its_own():
    generator = _generators()[2]
    head = _Head(generator)
    keep_priors(head)
    generator.grid_priors([(4, 4)] * 5, device='cpu')
    for other in (copy.deepcopy(head), pickle.loads(pickle.dumps(head))):
        kept = vars(other.prior_generator)['grid_priors']
        assert isinstance(kept, KeptPriors)
        assert kept.method.__self__ is other.prior_generator
        _bits_equal(
            other.prior_generator.grid_priors([(4, 4)] * 5, device='cpu'),
            generator.grid_priors([(4, 4)] * 5, device='cpu'))
    # a subclass, or another generator, keeps stock's method

    class Own(MlvlPointGenerator):
        pass

    assert not keep_priors(_Head(Own([8])))
    assert not keep_priors(_Head(None))


def test_sizes_and_devices_it_cannot_key_are_made_as_stock_makes_them():
    """A fractional size (stock's arange of 2.5 has 3 steps), a float
    tensor, a device without an index, a bad argument: never kept, and
    stock's result or error."""
    generator = _generators()[0]
    stock = copy.deepcopy(generator)
    keep_priors(_Head(generator))
    whole = [(2, 2)] * 5
    generator.grid_priors(whole, device='cpu')
    for sizes in ([(2.5, 2.5)] * 5, [(torch.tensor(2.5), 2)] * 5,
                  [(True, 2)] * 5):
        _bits_equal(
            generator.grid_priors(sizes, device='cpu'),
            stock.grid_priors(sizes, device='cpu'))
    # integer tensors and numpy integers are sizes like ints
    import numpy as np
    _bits_equal(
        generator.grid_priors(
            [(torch.tensor(2), np.int64(2))] * 5, device='cpu'),
        stock.grid_priors(whole, device='cpu'))
    assert len(generator.grid_priors.kept) == 1
    # 'cuda' (the current device) is not a key
    from fast_parallel.step.targets.prior_cache import _key
    assert _key(dict(featmap_sizes=whole, device='cuda')) is None
    assert _key(dict(featmap_sizes=whole, device='cuda:1')) is not None
    with pytest.raises(TypeError) as got:
        generator.grid_priors(whole, device='cpu', nothing=1)
    with pytest.raises(TypeError) as want:
        stock.grid_priors(whole, device='cpu', nothing=1)
    assert str(got.value) == str(want.value)
