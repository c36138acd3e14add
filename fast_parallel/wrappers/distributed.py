"""``FastDistributedDataParallel``: mmengine's DDP wrapper over packed batches.
"""
from typing import Any, Dict

import torch
from mmengine.model import MMDistributedDataParallel
from mmengine.optim import OptimWrapper
from mmengine.registry import MODEL_WRAPPERS

from fast_parallel.wrappers.data_parallel import module_device
from fast_parallel.wrappers.transfer import TransferMixin


@MODEL_WRAPPERS.register_module()
class FastDistributedDataParallel(TransferMixin, MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that moves packed batches in one go.

    ``train_step``, ``val_step`` and ``test_step`` have exactly the
    semantics of :class:`mmengine.model.MMDistributedDataParallel`; the only
    difference is that a :class:`~fast_parallel.PackedBatch` is moved to the
    model's device with one copy per buffer (non-blocking from pinned
    memory) and unpacked before the data_preprocessor sees it.

    It adds no state to its parent, so an ``MMDistributedDataParallel``
    built by the Runner can become one in place (see
    :class:`~fast_parallel.FastParallelHook`).

    Args:
        module (nn.Module): The model.
        detect_anomalous_params (bool): See ``MMDistributedDataParallel``.
            Defaults to False.
        **kwargs: Passed to ``DistributedDataParallel``; DDP's own defaults
            otherwise (as for a config-named ``MMDistributedDataParallel``:
            ``broadcast_buffers=True``, ``find_unused_parameters=False``).
            ``device_ids`` is dropped for a model on the CPU (the Runner
            passes ``[LOCAL_RANK]``, which DDP refuses for CPU modules), so
            a config naming this wrapper also trains under gloo on the CPU
            when the Runner is built without ``fast_parallel.cli`` (the
            tools give both paths ``device_ids=None`` themselves, see
            :func:`~fast_parallel.cli.init_cpu_distributed`).
    """

    def __init__(self,
                 module: torch.nn.Module,
                 detect_anomalous_params: bool = False,
                 **kwargs: Any) -> None:
        if module_device(module).type == 'cpu':
            kwargs.pop('device_ids', None)
            kwargs.pop('output_device', None)
        super().__init__(
            module=module,
            detect_anomalous_params=detect_anomalous_params,
            **kwargs)

    @property
    def src_device(self) -> torch.device:
        """torch.device: Where the model's parameters live."""
        return module_device(self.module)

    def train_step(self, data: Any,
                   optim_wrapper: OptimWrapper) -> Dict[str, torch.Tensor]:
        """Moves the batch, then ``MMDistributedDataParallel.train_step``.

        Args:
            data: A ``PackedBatch`` or a collated batch.
            optim_wrapper (OptimWrapper): Updates the parameters.

        Returns:
            dict[str, Tensor]: The log vars (losses) of this step.
        """
        data = self.move_batch(data, self.src_device, 'train')
        return super().train_step(data, optim_wrapper)

    def val_step(self, data: Any) -> list:
        """Moves the batch, then ``MMDistributedDataParallel.val_step``.

        Args:
            data: A ``PackedBatch`` or a collated batch.

        Returns:
            list: The predictions.
        """
        return super().val_step(self.move_batch(data, self.src_device, 'val'))

    def test_step(self, data: Any) -> list:
        """Moves the batch, then ``MMDistributedDataParallel.test_step``.

        Args:
            data: A ``PackedBatch`` or a collated batch.

        Returns:
            list: The predictions.
        """
        return super().test_step(
            self.move_batch(data, self.src_device, 'test'))
