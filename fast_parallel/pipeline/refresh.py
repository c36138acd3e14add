"""Keeps a train pipeline that a hook rebuilds mid-run on the fast forms.

mmdet's ``PipelineSwitchHook`` (RTMDet's last epochs) puts a new ``Compose``
on the train dataset in ``before_train_epoch`` and restarts the workers.
:class:`PipelineRefresher`, registered by ``FastParallelHook`` at the lowest
priority, runs after it in the same ``before_train_epoch``, before the
epoch's workers start, and switches the new transforms too (and hands the
new image loads the run's decoded-input cache).
"""
from typing import Optional

from mmengine.hooks import Hook

from fast_parallel.data.loader import forks_workers
from fast_parallel.pipeline.switch import fast_transforms, switch_pipeline

__all__ = ['PipelineRefresher']


class PipelineRefresher(Hook):
    """Switches transforms put on the train dataset after the run started.

    Args:
        cache_inputs (str, optional): ``FastParallelHook(cache_inputs=...)``.
    """

    priority = 'LOWEST'

    def __init__(self, cache_inputs: Optional[str]) -> None:
        self.cache_inputs = cache_inputs

    def before_train_epoch(self, runner) -> None:
        """Switches what another hook put on the train dataset this epoch.

        Args:
            runner (Runner): The runner.
        """
        loader = runner.train_dataloader
        before = fast_transforms(loader.dataset)
        outcome = switch_pipeline(loader.dataset, True, self.cache_inputs,
                                  forks_workers(loader))
        if fast_transforms(loader.dataset) != before:
            runner.logger.info(
                f'FastParallelHook: the train pipeline was rebuilt: '
                f'{outcome}')
