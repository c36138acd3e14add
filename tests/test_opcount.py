"""fast_parallel.bench.opcount: what is counted, and the phases of an
iteration."""
import torch
from torch import nn

from fast_parallel.bench.opcount import OpCounter


def test_views_are_left_out_and_backward_is_counted():
    x = torch.randn(4, 3, requires_grad=True)
    with OpCounter() as counter:
        y = x.view(3, 4).t()  # views only
        assert counter.total == 0
        (y * 2).sum().backward()
    assert counter.ops['mul'] >= 2  # forward, and backward of mul
    assert counter.ops['sum'] == 1
    assert 'view' not in counter.ops and 't' not in counter.ops
    assert counter.phases['all'] == counter.total


def test_phases_split_the_count():
    net = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, foreach=True)
    counter = OpCounter('step')
    with counter:
        net(torch.randn(5, 3)).sum().backward()
        counter.phase = 'optimizer'
        optimizer.step()
    # one multi-tensor add for both parameters, not one per tensor
    assert counter.phases['optimizer'] == 1
    assert counter.ops['_foreach_add_'] == 1
    assert counter.phases['step'] == counter.total - 1
