"""mmengine internals: the Runner's loops and DataLoader configs, loop
counters, ``HistoryBuffer``, ``MessageHub``, ``BaseModel``, data elements.

Checked on mmengine 0.10.7 (:data:`fast_parallel.compat.CHECKED_ON`).
"""
from typing import Any

from fast_parallel.compat.core import private

# ------------------------------------------------------ mmengine Runner ---
#: Per loop kind: the Runner's loop attribute and the DataLoader config it
#: keeps.
LOADER_CONFIGS = {
    'train': ('_train_loop', '_train_dataloader'),
    'val': ('_val_loop', '_val_dataloader'),
    'test': ('_test_loop', '_test_dataloader'),
}

#: ``CheckpointHook``'s method that writes one checkpoint (periodic and
#: best), on every rank (``Runner.save_checkpoint`` inside is master-only).
CHECKPOINT_SAVE_METHOD = '_save_checkpoint_with_step'


def checkpoint_save_method(hook: Any) -> Any:
    """``CheckpointHook._save_checkpoint_with_step`` of ``hook`` (bound).

    Args:
        hook (CheckpointHook): The hook.

    Returns:
        The bound method.
    """
    return private(
        hook, CHECKPOINT_SAVE_METHOD, 'mmengine',
        'exact resume of distributed runs (every rank\'s states '
        'right before a checkpoint)')


def loader_config(runner: Any, kind: str) -> Any:
    """The DataLoader config the Runner built a loop's DataLoader from.

    Args:
        runner (Runner): The runner.
        kind (str): 'train', 'val' or 'test'.

    Returns:
        The config (a dict), or whatever the Runner was given.
    """
    return private(runner, LOADER_CONFIGS[kind][1], 'mmengine',
                   'building a started DataLoader again from its config')


def runner_loop(runner: Any, kind: str) -> Any:
    """A Runner's loop as it stands, without building it: the loop, its
    config (not built yet: e.g. the train loop of a run that only tests),
    or None. ``Runner.train_loop`` & co. would build it from its config.

    Args:
        runner (Runner): The runner.
        kind (str): 'train', 'val' or 'test'.

    Returns:
        The loop, a dict or None.
    """
    return private(runner, LOADER_CONFIGS[kind][0], 'mmengine',
                   'finding the loops the Runner built')


def is_resuming(runner: Any) -> bool:
    """Whether the Runner resumes (``resume=True``) rather than loads."""
    return bool(
        private(runner, '_resume', 'mmengine',
                'exact resume (telling a resume from a load)'))


def decide_val_interval(loop: Any) -> None:
    """Lets a train loop update its validation interval for the current
    progress, as its ``run`` does (``_decide_current_val_interval``)."""
    private(loop, '_decide_current_val_interval', 'mmengine',
            'exact resume (the validation interval)')()


def history_statistics_methods() -> set:
    """The statistics methods registered on mmengine's ``HistoryBuffer``."""
    from mmengine.logging import HistoryBuffer
    return set(
        private(HistoryBuffer, '_statistics_methods', 'mmengine',
                'loading checkpoints with weights_only=True'))


def message_hub_instances() -> dict:
    """mmengine's ``MessageHub`` instances, by name (without creating one).
    """
    from mmengine.logging import MessageHub
    return private(MessageHub, '_instance_dict', 'mmengine',
                   'reading the current MessageHub without creating one')


def run_forward(model: Any, data: Any, mode: str) -> Any:
    """``BaseModel._run_forward``: the forward on a dict or a tuple batch."""
    return private(model, '_run_forward', 'mmengine',
                   'the forward of a FastDataParallel replica')(
                       data, mode=mode)


def preprocessor_device(preprocessor: Any) -> Any:
    """The device a data preprocessor moves batches to, or None."""
    return getattr(preprocessor, '_device', None)


def image_steps(preprocessor: Any) -> tuple:
    """``ImgDataPreprocessor``'s ``(_channel_conversion,
    _enable_normalize)``: whether it flips the channels and normalises."""
    used_for = 'the batched image step of the data preprocessor'
    return (private(preprocessor, '_channel_conversion', 'mmengine', used_for),
            private(preprocessor, '_enable_normalize', 'mmengine', used_for))


#: The attributes of a ``BaseDataElement`` that list its field names.
ELEMENT_FIELD_SETS = ('_metainfo_fields', '_data_fields')


def data_element_fields(element: Any) -> tuple:
    """A ``BaseDataElement``'s field names: ``(metainfo, data)`` sets."""
    return (private(element, '_metainfo_fields', 'mmengine',
                    'packing data samples'),
            private(element, '_data_fields', 'mmengine',
                    'packing data samples'))


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


def check_runner(runner: Any) -> None:
    """Checks the Runner internals :class:`FastParallelHook` uses.

    Raises:
        CompatError: Naming the first internal that is missing.
    """
    for kind in LOADER_CONFIGS:
        loader_config(runner, kind)
    randomness_config(runner)
    cls = infinite_iterator_class()
    for attr in ('__init__', '__next__'):
        private(cls, attr, 'mmengine', 'IterBasedTrainLoop\'s iterator')
