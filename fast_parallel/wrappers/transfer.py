"""Moving a batch to the model's device, and the figures of that move."""
import time
from typing import Any, Dict, Optional

import torch
from mmengine.logging import MessageHub

from fast_parallel.compat import message_hub_instances
from fast_parallel.data.batch import PackedBatch
from fast_parallel.data.handout import move_handed, take
from fast_parallel.data.packing import stock_transfers


class TransferStats:
    """Running totals of batch transfers, per mode (train/val/test).

    Attributes:
        last (dict): The latest batch's figures, per mode.
        totals (dict): Summed figures and batch counts, per mode, since the
            last ``pop_totals``.
        stock_leaves (dict): Per mode, leaves moved stock's way since the
            last ``pop_totals`` (replaced by user code before the step).
    """

    def __init__(self) -> None:
        self.last: Dict[str, Dict[str, float]] = {}
        self.totals: Dict[str, Dict[str, float]] = {}
        #: Per mode: leaves of handed-out batches that user code replaced
        #: before the step, moved stock's way (copies included above).
        self.stock_leaves: Dict[str, int] = {}

    def add(self, mode: str, seconds: float, copies: int, nbytes: int) -> None:
        """Records one batch.

        Args:
            mode (str): 'train', 'val' or 'test'.
            seconds (float): Time spent moving and unpacking the batch.
            copies (int): Host-to-device copies made.
            nbytes (int): Bytes moved.
        """
        figures = dict(
            transfer_time=seconds,
            transfer_copies=float(copies),
            transfer_mb=nbytes / 2**20)
        self.last[mode] = figures
        total = self.totals.setdefault(mode, dict.fromkeys(figures, 0.0))
        for key, value in figures.items():
            total[key] += value
        total['batches'] = total.get('batches', 0.0) + 1

    def pop_totals(self, mode: str) -> Optional[Dict[str, float]]:
        """Returns and clears the per-batch means for ``mode``.

        Args:
            mode (str): 'train', 'val' or 'test'.

        Returns:
            dict or None: Mean figures per batch, None if no batch was seen.
        """
        total = self.totals.pop(mode, None)
        if not total:
            return None
        n = total.pop('batches')
        means = {key: value / n for key, value in total.items()}
        means['stock_leaves'] = self.stock_leaves.pop(mode, 0)
        return means


class TransferMixin:
    """Gives a model wrapper ``move_batch`` and ``transfer_stats``.

    The figures of the latest training batch also go into the current
    ``MessageHub`` as ``train/transfer_time`` (seconds),
    ``train/transfer_copies`` and ``train/transfer_mb``, so the training
    log shows them next to ``data_time``. Validation and test figures stay
    out of it: mmengine's ``LogProcessor`` reports every ``val/*`` and
    ``test/*`` scalar as a metric (the log's metrics line,
    ``scalars.json``), and metrics are the evaluator's; their per-batch
    means are in :attr:`transfer_stats` (``FastParallelHook`` logs them).
    On CUDA with pinned buffers the copies are non-blocking: the time is
    what the host spent issuing them.
    """

    def _stats(self) -> TransferStats:
        stats = self.__dict__.get('_fast_parallel_transfer_stats')
        if stats is None:
            stats = TransferStats()
            self.__dict__['_fast_parallel_transfer_stats'] = stats
        return stats

    @property
    def transfer_stats(self) -> TransferStats:
        """TransferStats: The transfer figures recorded so far."""
        return self._stats()

    def move_batch(self, data: Any, device: torch.device, mode: str) -> Any:
        """Moves a packed batch with one copy per buffer.

        A batch a fast DataLoader handed out (stock's structure, CPU views
        into packed buffers: :mod:`fast_parallel.data.handout`) is moved by
        its buffers and rebuilt on ``device`` with the model's own
        ``cast_data``, so whatever hooks changed in it before the step is
        what the model sees, as on stock; a ``PackedBatch`` is moved and
        unpacked. The copy is non-blocking where the batch says its buffers
        are pinned (:attr:`PackedBatch.pinned`); nothing here asks the
        driver. Anything else (e.g. plain ``pseudo_collate`` output) is
        returned as is: the model's data_preprocessor moves it as stock
        would, and the figures record what that will copy. A move to the
        device the batch is on already (CPU training) copies nothing and
        records 0.

        Args:
            data: The batch from the DataLoader.
            device (torch.device): The model's device.
            mode (str): 'train', 'val' or 'test'.

        Returns:
            The batch, unpacked (and on ``device`` if it was packed).
        """
        start = time.perf_counter()
        record = take(data)
        if record is not None:
            cast = getattr(
                getattr(self.module, 'data_preprocessor', None), 'cast_data',
                None)
            if cast is None:  # no stock cast to follow: the stock way
                copies, nbytes = _stock_figures(data, device)
            else:
                data, copies, nbytes, stock = move_handed(
                    record, device, _pinned(record.batch, device), cast)
                if stock:
                    stats = self._stats().stock_leaves
                    stats[mode] = stats.get(mode, 0) + stock
        elif isinstance(data, PackedBatch):
            moved = data.to(device, non_blocking=_pinned(data, device))
            # Buffers' devices, not the requested one ('cuda' vs 'cuda:0').
            copies = moved.num_copies \
                if moved.buffer_device != data.buffer_device else 0
            nbytes = moved.nbytes if copies else 0
            data = moved.unpack()
        else:
            copies, nbytes = _stock_figures(data, device)
        self._stats().add(mode, time.perf_counter() - start, copies, nbytes)
        if mode == 'train':  # val/test scalars would read as metrics
            _publish(mode, self._stats().last[mode])
        return data


def _pinned(batch: PackedBatch, device: torch.device) -> bool:
    # Known from how the batch was made (the pin thread, or
    # ``pack(..., pin_memory=True)``): ``Tensor.is_pinned`` per buffer would
    # be a driver query per batch.
    return device.type != 'cpu' and batch.pinned


def _stock_figures(data: Any, device: torch.device) -> tuple:
    """What stock's ``cast_data`` will copy of an unpacked batch."""
    if device.type != 'cpu':
        return stock_transfers(data)
    return 0, 0  # batches from the DataLoader are on the CPU already


def _publish(mode: str, figures: Dict[str, float]) -> None:
    if not message_hub_instances():
        return
    hub = MessageHub.get_current_instance()
    for key, value in figures.items():
        # resumed=False: the plugin's figures stay out of checkpoints, so a
        # stock run resumed from a fast one does not print stale values.
        hub.update_scalar(f'{mode}/{key}', value, resumed=False)
