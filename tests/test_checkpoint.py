"""fast_parallel/checkpoint.py: mmengine checkpoints load safely, nothing else.
"""
import io
import os
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub

import fast_parallel  # noqa: F401  (installs the allow-list)


class RunsCode:
    """Unpickling this would run a shell command."""

    def __reduce__(self):
        return (os.system, ('echo pwned > /dev/null', ))


class GetattrEscape:
    """Asks the unpickler for getattr on something other than a statistic."""

    def __reduce__(self):
        return (getattr, (HistoryBuffer, '__init__'))


def save(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_message_hub_state_loads_with_weights_only():
    hub = MessageHub.get_instance('checkpoint_test')
    hub.update_scalar('train/loss', 1.5)
    hub.update_scalar('train/loss', np.float64(2.5))
    hub.update_info('iter', 3)
    state = dict(message_hub=hub.state_dict(), meta=dict(
        seed=np.int64(7), dtype=np.dtype('float32'),
        arr=np.arange(3, dtype=np.float32),
        numpy_rng=np.random.RandomState(0).get_state()))
    loaded = torch.load(save(state), weights_only=True)
    buf = loaded['message_hub']['log_scalars']['train/loss']
    assert isinstance(buf, HistoryBuffer)
    assert buf.mean() == 2.0 and buf.current() == 2.5
    assert loaded['meta']['arr'].tolist() == [0.0, 1.0, 2.0]
    assert loaded['meta']['numpy_rng'][1].dtype == np.uint32


@pytest.mark.parametrize('payload', [RunsCode(), GetattrEscape()])
def test_crafted_checkpoints_are_refused(payload):
    buf = save({'state_dict': {}, 'meta': payload})
    with pytest.raises(pickle.UnpicklingError):
        torch.load(buf)  # torch's default: weights_only=True
    with pytest.raises(pickle.UnpicklingError):
        torch.load(save({'meta': payload}), weights_only=True)


def test_safe_loading_stays_on():
    # nothing here switched torch's default off
    assert os.environ.get('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD') in (None, '0')
    with pytest.raises(pickle.UnpicklingError):
        torch.load(save(RunsCode()))
