"""Safe loading of mmengine checkpoints on torch >= 2.6.

torch 2.6 made ``torch.load`` default to ``weights_only=True``; mmengine
0.10.7 calls ``torch.load`` without the argument, so loading its own
checkpoints (``load_from``, ``--resume``) fails: the message hub it saves
holds ``HistoryBuffer`` objects with numpy arrays and scalars, and the
statistics methods registered on ``HistoryBuffer``, which pickle as
``getattr(HistoryBuffer, 'mean')``.

:func:`allow_mmengine_checkpoints` keeps safe loading on and adds exactly
those types to torch's allow-list. ``getattr`` is never allowed as such (it
would let a checkpoint reach any attribute of any allowed object, and from
there code): the name is bound to :func:`_history_buffer_method`, which only
returns the registered statistics methods of ``HistoryBuffer``. A checkpoint
that needs anything else — say a ``__reduce__`` that calls ``os.system`` —
is still refused by torch's weights-only unpickler.

``import fast_parallel`` calls it once; nothing switches safe loading off.
"""
from typing import Any, List

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer

from fast_parallel.compat import (NUMPY_PICKLE_MODULES,
                                  history_statistics_methods)

# Registered by HistoryBuffer.__init__; custom ones by register_statistics.
_BUILTIN_STATISTICS = frozenset(('min', 'max', 'current', 'mean'))


def _history_buffer_method(obj: Any, name: str) -> Any:
    """``getattr`` limited to ``HistoryBuffer``'s statistics methods.

    Args:
        obj: What the checkpoint asks an attribute of.
        name (str): The attribute.

    Returns:
        The registered statistics method ``HistoryBuffer.<name>``.

    Raises:
        pickle.UnpicklingError: For anything else.
    """
    allowed = _BUILTIN_STATISTICS.union(history_statistics_methods())
    if obj is HistoryBuffer and name in allowed:
        return getattr(HistoryBuffer, name)
    import pickle
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only the '
        'statistics methods of mmengine HistoryBuffer are allowed')


def mmengine_safe_globals() -> List[Any]:
    """What mmengine checkpoints carry beyond tensors and plain containers.

    Returns:
        list: Entries for ``torch.serialization.add_safe_globals``.
    """
    dtypes = {
        type(np.dtype(t))
        for t in ('bool', 'int8', 'uint8', 'int16', 'uint16', 'int32',
                  'uint32', 'int64', 'uint64', 'float16', 'float32', 'float64')
    }
    return [
        HistoryBuffer,
        np.ndarray,
        np.dtype,
        *numpy_rebuilders(),
        *sorted(dtypes, key=lambda t: t.__name__),
        (_history_buffer_method, 'builtins.getattr'),
    ]


def numpy_rebuilders() -> List[Any]:
    """numpy's array and scalar rebuilders, under every name they pickle as.

    The functions are the ones the installed numpy's own ``__reduce__``
    returns, so they are listed under the module this numpy pickles them
    from (``numpy.core.multiarray`` for numpy 1, ``numpy._core.multiarray``
    for numpy 2) without importing either path (numpy 2's ``numpy.core``
    warns). The other major version's name maps to the same function, so a
    checkpoint written under either numpy loads under this one.

    Returns:
        list: The functions, then ``(function, 'module.name')`` entries for
        the other spelling.
    """
    functions = [
        np.ndarray(0).__reduce__()[0],  # _reconstruct
        np.float64(0).__reduce__()[0]
    ]  # scalar
    aliases = [(fn, f'{module}.{fn.__name__}') for fn in functions
               for module in NUMPY_PICKLE_MODULES if module != fn.__module__]
    return functions + aliases


def allow_mmengine_checkpoints() -> None:
    """Adds :func:`mmengine_safe_globals` to torch's weights-only allow-list.

    Idempotent. Safe loading stays on for everything else.
    """
    add = getattr(torch.serialization, 'add_safe_globals', None)
    if add is not None:  # torch < 2.4 loads without weights_only anyway
        add(mmengine_safe_globals())
