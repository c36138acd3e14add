"""The private torch / mmengine internals fast_parallel relies on, in one
place.

fast_parallel works through public registries and hooks, but a few of its
parts need internals that upstream may rename in any release:

- torch's DataLoader iterators (:mod:`fast_parallel.data.loader`: the
  ``__next__`` without the profiler scope, the inherited base seed;
  :mod:`fast_parallel.data.rebuild`: finding a started iterator);
- mmengine's Runner and loops (the DataLoader configs the Runner keeps,
  ``_randomness_cfg``, ``_InfiniteDataloaderIterator``, the loops'
  counters; ``HistoryBuffer``'s statistics methods for safe loading);
- torch's optimizer internals (:mod:`fast_parallel.step.fused_optim`), which are
  optional: without them the optimizer stays stock, with the reason in the
  log.

Each is looked up here, by name. On a version without one, the part that
needs it fails at once with :class:`CompatError`, which names the internal,
the installed version, the versions this was checked on and what to do,
instead of a bare ``AttributeError`` deep in a training run.
"""
import functools
from typing import Any

#: The versions every internal below was checked on (the project's pins).
CHECKED_ON = {'torch': '2.13.0', 'mmengine': '0.10.7', 'mmcv': '2.1.0',
              'mmdet': '3.3.0', 'mmdet3d': '1.4.0'}


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


def missing(package: str, what: str, used_for: str) -> CompatError:
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
        raise missing(package, f'{owner}.{name}', used_for) from None


# ------------------------------------------------------ torch DataLoader ---
_LOADER_USE = 'FastDataLoader (the DataLoader iterators it extends)'


def _dataloader_module() -> Any:
    import torch.utils.data.dataloader as module
    return module


def dataloader_class(name: str) -> type:
    """A class of ``torch.utils.data.dataloader`` by name (private ones).

    Args:
        name (str): E.g. ``'_BaseDataLoaderIter'``.

    Returns:
        type: The class.
    """
    return private(_dataloader_module(), name, 'torch', _LOADER_USE)


#: What the fast iterators use of torch's: (class name, attribute).
_ITERATOR_METHODS = (('_BaseDataLoaderIter', '_next_data'),
                     ('_BaseDataLoaderIter', '_reset'),
                     ('_MultiProcessingDataLoaderIter', '_shutdown_workers'),
                     ('DataLoader', '_get_iterator'),
                     ('DataLoader', 'check_worker_number_rationality'))
#: Attributes torch's iterators set in ``__init__`` that fast_parallel reads.
_ITERATOR_STATE = ('_base_seed', '_sampler_iter', '_num_yielded',
                   '_dataset_kind')


@functools.lru_cache(maxsize=None)
def check_dataloader_internals() -> None:
    """Checks, once, everything fast_parallel uses of torch's DataLoader.

    Raises:
        CompatError: Naming the first internal that is missing.
    """
    from torch.autograd import profiler
    from torch.utils.data import DataLoader
    private(profiler, '_is_profiler_enabled', 'torch', _LOADER_USE)
    for cls, attr in _ITERATOR_METHODS:
        owner = DataLoader if cls == 'DataLoader' else dataloader_class(cls)
        private(owner, attr, 'torch', _LOADER_USE)
    # An iterator draws its base seed: from a generator of its own here, so
    # that the check leaves the global random state (and so the run) alone.
    import torch
    loader = DataLoader([0], generator=torch.Generator())
    private(loader, '_iterator', 'torch', _LOADER_USE)
    iterator = iter(loader)
    for attr in _ITERATOR_STATE:
        private(iterator, attr, 'torch', _LOADER_USE)


# ------------------------------------------------------ mmengine Runner ---
#: The Runner's loop attributes and the DataLoader configs it keeps.
LOADER_CONFIGS = {
    '_train_loop': '_train_dataloader',
    '_val_loop': '_val_dataloader',
    '_test_loop': '_test_dataloader',
}


def loader_config(runner: Any, loop_attr: str) -> Any:
    """The DataLoader config the Runner built a loop's DataLoader from.

    Args:
        runner (Runner): The runner.
        loop_attr (str): A key of :data:`LOADER_CONFIGS`.

    Returns:
        The config (a dict), or whatever the Runner was given.
    """
    return private(runner, LOADER_CONFIGS[loop_attr], 'mmengine',
                   'building a started DataLoader again from its config')


def randomness_config(runner: Any) -> dict:
    """The Runner's ``randomness`` settings (``diff_rank_seed`` & co.)."""
    return private(runner, '_randomness_cfg', 'mmengine',
                   'building a started DataLoader again with the same seed')


def infinite_iterator_class() -> type:
    """mmengine's ``_InfiniteDataloaderIterator`` (``IterBasedTrainLoop``)."""
    from mmengine.runner import loops
    return private(loops, '_InfiniteDataloaderIterator', 'mmengine',
                   'finding the iterator IterBasedTrainLoop started')


def loop_progress(loop: Any) -> int:
    """Iterations (``IterBasedTrainLoop``) or epochs (any other loop, e.g.
    ``EpochBasedTrainLoop``) done so far.

    Both loop classes have ``max_iters`` and ``max_epochs``, so the class
    decides, not the attributes.

    Args:
        loop: An mmengine train loop.

    Returns:
        int: ``loop._iter`` or ``loop._epoch``.
    """
    name = '_iter' if counts_iterations(loop) else '_epoch'
    return private(loop, name, 'mmengine', 'exact resume (the loop counters)')


def counts_iterations(loop: Any) -> bool:
    """Whether a train loop runs for iterations (``IterBasedTrainLoop``)
    rather than epochs; the class decides (see :func:`loop_progress`).

    Args:
        loop: An mmengine train loop.

    Returns:
        bool: True for ``IterBasedTrainLoop`` and its subclasses.
    """
    from mmengine.runner import IterBasedTrainLoop
    return isinstance(loop, IterBasedTrainLoop)


def loop_length(loop: Any) -> int:
    """What :func:`loop_progress` counts up to: ``max_iters`` for an
    ``IterBasedTrainLoop``, ``max_epochs`` for any other loop.

    Args:
        loop: An mmengine train loop.

    Returns:
        int: The loop's length in its own unit.
    """
    return loop.max_iters if counts_iterations(loop) else loop.max_epochs


def train_loop(runner: Any) -> Any:
    """The Runner's train loop as it stands: built, a config not built yet
    (a run that only validates or tests), or None.

    ``Runner.train_loop`` would build it from its config.

    Args:
        runner (Runner): The runner.

    Returns:
        The loop, its config (a dict) or None.
    """
    return private(runner, '_train_loop', 'mmengine',
                   'telling the final validation from the others')


def check_runner(runner: Any) -> None:
    """Checks the Runner internals :class:`FastParallelHook` uses.

    Raises:
        CompatError: Naming the first internal that is missing.
    """
    for loop_attr in LOADER_CONFIGS:
        loader_config(runner, loop_attr)
    randomness_config(runner)
    cls = infinite_iterator_class()
    for attr in ('__init__', '__next__'):
        private(cls, attr, 'mmengine', 'IterBasedTrainLoop\'s iterator')


# ------------------------------------------ persistent workers, resume ---
_PERSISTENT_USE = 'exact resume (the persistent workers\' iterator)'


def persistent_iterator(loader: Any) -> Any:
    """A DataLoader's persistent iterator (``loader._iterator``), or None.
    """
    return private(loader, '_iterator', 'torch', _PERSISTENT_USE)


def set_persistent_iterator(loader: Any, iterator: Any) -> None:
    """Sets ``loader._iterator``, which ``DataLoader.__iter__`` reuses
    (``_reset``) or, when None, starts anew (``_get_iterator``)."""
    private(loader, '_iterator', 'torch', _PERSISTENT_USE)
    loader._iterator = iterator


#: mmdet hooks that switch the train pipeline once, restarting persistent
#: workers to do it, and the attribute that says they have switched
#: (mmdet 3.3.0). A resumed run's instance starts unswitched: it switches
#: again in the first resumed epoch, wherever the original switched.
SWITCH_ONCE_HOOKS = {'YOLOXModeSwitchHook': '_has_switched',
                     'PipelineSwitchHook': '_has_switched'}


def switched_hooks(hooks: Any) -> set:
    """The names of the switch-once hooks among ``hooks`` that switched.

    Args:
        hooks (list[Hook]): The Runner's hooks.

    Returns:
        set[str]: Class names from :data:`SWITCH_ONCE_HOOKS`.
    """
    done = set()
    for hook in hooks:
        name = type(hook).__name__
        if name in SWITCH_ONCE_HOOKS and private(
                hook, SWITCH_ONCE_HOOKS[name], 'mmdet',
                'exact resume (whether the hook switched the pipeline)'):
            done.add(name)
    return done
