"""The seam's core: ``CHECKED_ON``, ``CompatError``, ``private``.

fast_parallel works through public registries and hooks, but a few of its
parts need internals that upstream may rename in any release:

- torch's DataLoader iterators (:mod:`fast_parallel.data.loader`: the
  ``__next__`` without the profiler scope, the inherited base seed;
  :mod:`fast_parallel.data.rebuild`: finding a started iterator);
- mmengine's Runner and loops (the DataLoader configs the Runner keeps,
  ``_randomness_cfg``, ``_InfiniteDataloaderIterator``, the loops'
  counters; ``HistoryBuffer``'s statistics methods for safe loading);
- torch's optimizer internals (:mod:`fast_parallel.compat.optim`), which are
  optional: without them the optimizer stays stock, with the reason in the
  log.

Each is looked up here, by name. On a version without one, the part that
needs it fails at once with :class:`CompatError`, which names the internal,
the installed version, the versions this was checked on and what to do,
instead of a bare ``AttributeError`` deep in a training run.
"""
from typing import Any

#: The versions every internal below was checked on (the project's pins).
CHECKED_ON = {
    'torch': '2.13.0',
    'mmengine': '0.10.7',
    'mmcv': '2.1.0',
    'mmdet': '3.3.0',
    'mmdet3d': '1.4.0'
}

#: The aten operation of ``Tensor.item()`` (and ``int()``, ``float()``,
#: ``bool()`` of a tensor): on a GPU, a device sync where the tensor is on
#: the device.
ITEM_OP = '_local_scalar_dense'


class CompatError(RuntimeError):
    """An internal fast_parallel needs is missing from the installed version.
    """


def installed_version(package: str) -> str:
    """The installed version of ``package``, or ``'not installed'``."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:
        return 'not installed'


def missing_internal_error(package: str, what: str,
                           used_for: str) -> CompatError:
    """The error for an internal ``what`` of ``package`` that is not there.

    Args:
        package (str): 'torch' or 'mmengine'.
        what (str): The internal, e.g. ``'Runner._train_dataloader'``.
        used_for (str): What fast_parallel needs it for.

    Returns:
        CompatError: With a message that says what to do.
    """
    return CompatError(
        f'fast_parallel needs {package} internal `{what}` for {used_for}, '
        f'but {package} {installed_version(package)} does not have it '
        f'(fast_parallel was checked on {package} {CHECKED_ON[package]}). '
        f'Install a {package} version fast_parallel supports, or remove '
        'FastParallelHook / ExactResumeHook from the config to train on '
        'the stock path.')


def private(obj: Any, name: str, package: str, used_for: str) -> Any:
    """``getattr(obj, name)`` for an upstream internal, failing loudly.

    Args:
        obj: The object (module, class or instance) holding the internal.
        name (str): The attribute.
        package (str): Whose internal it is ('torch' or 'mmengine').
        used_for (str): What fast_parallel needs it for.

    Returns:
        The attribute.

    Raises:
        CompatError: When ``obj`` has no ``name``.
    """
    try:
        return getattr(obj, name)
    except AttributeError:
        owner = obj.__name__ if isinstance(obj, type) or hasattr(
            obj, '__file__') else type(obj).__name__
        raise missing_internal_error(package, f'{owner}.{name}',
                                     used_for) from None
