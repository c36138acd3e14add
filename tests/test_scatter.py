"""fast_parallel/wrappers/scatter.py: chunk splitting and loss gathering."""
from collections import OrderedDict

import pytest
import torch
from helpers import assert_same_tree
from mmengine.dataset import default_collate, pseudo_collate

from fast_parallel.bench.synthetic import yolox_samples
from fast_parallel.wrappers import (batch_size_of, chunk_sizes,
                                    gather_log_vars, split_batch)


@pytest.mark.parametrize('batch,n', [(8, 2), (8, 3), (7, 4), (3, 8), (1, 2),
                                     (16, 5), (0, 3)])
def test_chunk_sizes_are_contiguous_and_balanced(batch, n):
    sizes = chunk_sizes(batch, n)
    assert sum(sizes) == batch
    assert len(sizes) == min(batch, n)
    assert all(s > 0 for s in sizes)
    if sizes:
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)


def test_chunk_sizes_rejects_no_device():
    with pytest.raises(ValueError):
        chunk_sizes(4, 0)


def test_split_pseudo_collate_batch_by_samples():
    samples = yolox_samples(5, size=32, max_boxes=4)
    batch = pseudo_collate(samples)
    assert batch_size_of(batch) == 5
    sizes = chunk_sizes(5, 2)
    chunks = split_batch(batch, sizes)
    assert [batch_size_of(c) for c in chunks] == [3, 2]
    # the chunks are exactly the collation of the sample slices, in order
    assert_same_tree(chunks[0], pseudo_collate(samples[:3]))
    assert_same_tree(chunks[1], pseudo_collate(samples[3:]))


def test_split_stacked_batch_and_shared_entries():
    samples = [dict(x=torch.full((2, ), float(i)), i=i) for i in range(4)]
    batch = default_collate(samples)
    batch['shared'] = 'same for all'
    chunks = split_batch(batch, [2, 2])
    assert torch.equal(chunks[1]['x'], batch['x'][2:])
    assert chunks[0]['shared'] == chunks[1]['shared'] == 'same for all'


def test_split_rejects_lists_of_another_length():
    with pytest.raises(ValueError, match=r"batch\['other'\] has 2 entries"):
        split_batch({'inputs': [1, 2, 3], 'other': [1, 2]}, [2, 1])


def test_gathered_loss_is_the_chunk_size_weighted_mean():
    # per-sample losses; each chunk reports its mean, like a mean-reduced loss
    per_sample = torch.tensor([1., 2., 3., 4., 10.], requires_grad=True)
    sizes = [3, 2]
    chunks = [per_sample[:3], per_sample[3:]]
    log_vars = [
        OrderedDict(loss=c.mean(), loss_cls=2 * c.mean()) for c in chunks
    ]
    out = gather_log_vars(log_vars, sizes, torch.device('cpu'))
    assert list(out) == ['loss', 'loss_cls']
    assert torch.allclose(out['loss'], per_sample.mean())
    assert torch.allclose(out['loss_cls'], 2 * per_sample.mean())
    out['loss'].backward()
    # every sample weighs 1/B, whichever chunk it was in
    assert torch.allclose(per_sample.grad, torch.full((5, ), 1 / 5))
