"""``FastDataParallel``: one process, CPU or one or more GPUs."""
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import MODEL_WRAPPERS
from torch import nn
from torch.nn.parallel import parallel_apply

from fast_parallel.compat import preprocessor_device, run_forward
from fast_parallel.data.batch import PackedBatch
from fast_parallel.data.handout import take
from fast_parallel.data.packing import pack
from fast_parallel.wrappers.replicas import replicate_with_own_methods
from fast_parallel.wrappers.scatter import (batch_size_of, chunk_sizes,
                                            gather_log_vars, split_batch)
from fast_parallel.wrappers.transfer import TransferMixin


def module_device(module: nn.Module) -> torch.device:
    """The device a model's batches go to.

    Args:
        module (nn.Module): An mmengine model.

    Returns:
        torch.device: Its data_preprocessor's device, else its first
        parameter's, else CPU.
    """
    preprocessor = getattr(module, 'data_preprocessor', None)
    device = preprocessor_device(preprocessor)
    if device is not None:
        return torch.device(device)
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device('cpu')


@MODEL_WRAPPERS.register_module()
class FastDataParallel(TransferMixin, nn.Module):
    """Data parallelism in one process over packed batches.

    The contract is mmengine's: the loops call :meth:`train_step`,
    :meth:`val_step` and :meth:`test_step`.

    - On one device (CPU or one GPU) each step moves a
      :class:`~fast_parallel.PackedBatch` with one copy per buffer
      (non-blocking from pinned memory), unpacks it and calls the wrapped
      model's own ``train_step`` / ``val_step`` / ``test_step``, so every
      number is computed exactly as without the wrapper.
    - On N > 1 GPUs (``device_ids``) the batch is split by samples into N
      contiguous chunks (sizes differ by at most one), each chunk is packed
      and copied to its GPU on a side stream, the model is replicated, each
      replica runs its data_preprocessor and loss in parallel
      (``parallel_apply``), the losses are gathered on the output device
      weighted by chunk size, and the optim_wrapper does backward and step
      as ``BaseModel.train_step`` does. Predictions of ``val_step`` /
      ``test_step`` come back in sample order.

    Unpacked batches (plain ``pseudo_collate`` output) are accepted too;
    the data_preprocessor moves them as stock ``cast_data`` does.

    The wrapped model is ``self.module``; state-dict keys of the checkpoints
    mmengine saves are unchanged (it saves ``model.module``).

    Args:
        module (nn.Module): The model (an mmengine ``BaseModel``).
        device_ids (Sequence[int | torch.device], optional): GPUs to use.
            None means the device the model is on (CPU or one GPU); the
            model is moved to ``device_ids[0]``. Defaults to None.
        output_device (int | torch.device, optional): Where multi-GPU
            losses are gathered. Defaults to ``device_ids[0]``.
    """

    def __init__(
            self,
            module: nn.Module,
            device_ids: Optional[Sequence[Union[int, torch.device]]] = None,
            output_device: Optional[Union[int, torch.device]] = None) -> None:
        super().__init__()
        if device_ids:
            self.device_ids: List[torch.device] = [
                _cuda(d) for d in device_ids
            ]
            module = module.to(self.device_ids[0])
        else:
            self.device_ids = [module_device(module)]
        self.module = module
        self.output_device = _cuda(output_device) if output_device is not \
            None else self.device_ids[0]

    @property
    def src_device(self) -> torch.device:
        """torch.device: Where the model's parameters live."""
        return self.device_ids[0]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the wrapped model (no scatter): ``model(inputs, ...)``."""
        return self.module(*args, **kwargs)

    # ------------------------------------------------------------ steps
    def train_step(self, data: Any,
                   optim_wrapper: OptimWrapper) -> Dict[str, torch.Tensor]:
        """Moves the batch, then runs the model's training step.

        Args:
            data: A ``PackedBatch`` or a collated batch.
            optim_wrapper (OptimWrapper): Updates the parameters.

        Returns:
            dict[str, Tensor]: The log vars (losses) of this step.
        """
        if len(self.device_ids) == 1:
            data = self.move_batch(data, self.src_device, 'train')
            return self.module.train_step(data, optim_wrapper)
        chunks, sizes = self._scatter(data, 'train')
        with optim_wrapper.optim_context(self.module):
            replicas = replicate_with_own_methods(
                self.module, self.device_ids[:len(chunks)])
            per_chunk = parallel_apply([_LossStep(r) for r in replicas],
                                       [(c, ) for c in chunks],
                                       devices=self.device_ids[:len(chunks)])
        log_vars = gather_log_vars(per_chunk, sizes, self.output_device)
        optim_wrapper.update_params(log_vars['loss'])
        return log_vars

    def val_step(self, data: Any) -> list:
        """Moves the batch, then runs the model's ``val_step``.

        Args:
            data: A ``PackedBatch`` or a collated batch.

        Returns:
            list: The predictions, in sample order.
        """
        return self._predict(data, 'val')

    def test_step(self, data: Any) -> list:
        """Moves the batch, then runs the model's ``test_step``.

        Args:
            data: A ``PackedBatch`` or a collated batch.

        Returns:
            list: The predictions, in sample order.
        """
        return self._predict(data, 'test')

    # ---------------------------------------------------------- helpers
    def _predict(self, data: Any, mode: str) -> list:
        step = f'{mode}_step'
        if len(self.device_ids) == 1:
            data = self.move_batch(data, self.src_device, mode)
            return getattr(self.module, step)(data)
        chunks, _ = self._scatter(data, mode)
        replicas = replicate_with_own_methods(
            self.module, self.device_ids[:len(chunks)], detach=True)
        outputs = parallel_apply([getattr(r, step) for r in replicas],
                                 [(c, ) for c in chunks],
                                 devices=self.device_ids[:len(chunks)])
        return [sample for out in outputs for sample in out]

    def _scatter(self, data: Any, mode: str) -> tuple:
        """Splits the batch by samples and sends chunk i to GPU i."""
        if isinstance(data, PackedBatch):
            data = data.unpack()
        take(data)  # a handed-out batch: split as it is, its record dropped
        batch_size = batch_size_of(data)
        if not batch_size:
            raise ValueError('cannot split an empty batch across GPUs')
        sizes = chunk_sizes(batch_size, len(self.device_ids))
        devices = self.device_ids[:len(sizes)]
        streams = [torch.cuda.Stream(d) for d in devices]
        chunks = []
        for chunk, device, stream in zip(
                split_batch(data, sizes), devices, streams):
            packed = pack(chunk, pin_memory=True)
            with torch.cuda.stream(stream):
                chunks.append(self.move_batch(packed, device, mode))
        for device, stream in zip(devices, streams):
            torch.cuda.current_stream(device).wait_stream(stream)
        return chunks, sizes


class _LossStep:
    """data_preprocessor + loss of one replica, for ``parallel_apply``."""

    def __init__(self, replica: nn.Module) -> None:
        self.replica = replica

    def __call__(self, chunk: Any) -> Dict[str, torch.Tensor]:
        data = self.replica.data_preprocessor(chunk, True)
        losses = run_forward(self.replica, data, mode='loss')
        _, log_vars = self.replica.parse_losses(losses)
        return log_vars


def _cuda(device: Union[int, torch.device, str]) -> torch.device:
    if isinstance(device, int):
        return torch.device('cuda', device)
    return torch.device(device)
