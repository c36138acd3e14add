"""fast_parallel/resume/checkpoint.py: mmengine checkpoints load safely,
nothing else.
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
    state = dict(
        message_hub=hub.state_dict(),
        meta=dict(
            seed=np.int64(7),
            dtype=np.dtype('float32'),
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


def _pickled_globals(buf: io.BytesIO) -> set:
    """``module.name`` of every GLOBAL in a torch checkpoint's pickle."""
    import pickletools
    import zipfile
    with zipfile.ZipFile(buf) as archive:
        name, = [n for n in archive.namelist() if n.endswith('/data.pkl')]
        data = archive.read(name)
    buf.seek(0)
    return {
        arg.replace(' ', '.')
        for op, arg, _ in pickletools.genops(data) if op.name == 'GLOBAL'
    }


def _respelled(buf: io.BytesIO, old: bytes, new: bytes) -> io.BytesIO:
    """The checkpoint with its pickle's ``old`` module name spelled ``new``.

    torch pickles with protocol 2, whose GLOBAL opcode names a module as a
    line of text: the result is what a numpy pickling from ``new`` writes.
    """
    import zipfile
    out = io.BytesIO()
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(
            out, 'w', zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith('/data.pkl'):
                assert old in data
                data = data.replace(old, new)
            dst.writestr(info, data)
    out.seek(0)
    return out


def test_numpy_arrays_load_with_weights_only_as_this_numpy_pickles_them():
    arrays = dict(
        arr=np.arange(6, dtype=np.float32).reshape(2, 3),
        scalar=np.float64(2.5),
        seed=np.int64(7))
    buf = save(arrays)
    # the rebuilders as this numpy pickles them (numpy 1: numpy.core,
    # numpy 2: numpy._core) are on the allow-list under those names
    module = np.ndarray(0).__reduce__()[0].__module__
    assert {f'{module}._reconstruct', f'{module}.scalar'} <= \
        _pickled_globals(buf)
    loaded = torch.load(buf, weights_only=True)
    assert loaded['arr'].dtype == np.float32
    assert loaded['arr'].tobytes() == arrays['arr'].tobytes()
    assert loaded['scalar'] == 2.5 and type(loaded['scalar']) is np.float64
    assert loaded['seed'] == 7 and type(loaded['seed']) is np.int64


@pytest.mark.parametrize('spelling',
                         [b'numpy.core.multiarray', b'numpy._core.multiarray'])
def test_checkpoints_of_either_numpy_major_load_with_weights_only(spelling):
    arr = np.arange(5, dtype=np.int16)
    module = np.ndarray(0).__reduce__()[0].__module__.encode()
    buf = _respelled(save(dict(arr=arr, x=np.float32(1.5))), module, spelling)
    assert spelling.decode() + '._reconstruct' in _pickled_globals(buf)
    loaded = torch.load(buf, weights_only=True)
    assert loaded['arr'].tobytes() == arr.tobytes()
    assert loaded['x'] == np.float32(1.5)


def test_numpy_allow_list_entries_are_the_real_functions():
    import importlib
    import warnings

    from fast_parallel.resume.checkpoint import numpy_rebuilders
    entries = numpy_rebuilders()
    names = set()
    for entry in entries:
        fn, name = entry if isinstance(
            entry, tuple) else (entry,
                                f'{entry.__module__}.{entry.__qualname__}')
        module, attr = name.rsplit('.', 1)
        with warnings.catch_warnings():  # numpy 2's numpy.core warns
            warnings.simplefilter('ignore', DeprecationWarning)
            assert getattr(importlib.import_module(module), attr) is fn, name
        names.add(name)
    assert names == {
        f'{m}.{f}'
        for m in ('numpy.core.multiarray', 'numpy._core.multiarray')
        for f in ('_reconstruct', 'scalar')
    }
    # the numpy functions ndarray and numpy scalars reduce to
    assert np.ndarray(0).__reduce__()[0] in entries
    assert np.float64(0).__reduce__()[0] in entries
