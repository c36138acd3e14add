"""Says when a run waits on its data, and what would cover it.

:class:`DataBoundMonitor` reads the share of iteration time spent waiting
for data from mmengine's ``IterTimerHook`` records (``train/data_time``
against ``train/time``) and the DataLoader workers' CPU time from
``/proc``; when the share is over :data:`DATA_BOUND_SHARE` it adds the
workers' CPU per batch and the ``num_workers`` that would keep up on the
cores present.
"""
import math
import os
from typing import Any, Dict, Optional

from fast_parallel.data.loader_state import loader_state

__all__ = ['DATA_BOUND_SHARE', 'DataBoundMonitor', 'process_cpu_seconds']

#: The share of iteration time waiting for data over which the line says
#: what would cover it.
DATA_BOUND_SHARE = 0.10


def process_cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU seconds of a process (None where unreadable)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _total(hub: Any, key: str) -> Optional[tuple]:
    """(sum, count) of a message-hub scalar's whole history."""
    try:
        values = hub.get_scalar(key).data[0]
    except KeyError:
        return None
    return float(values.sum()), len(values)


class DataBoundMonitor:
    """Workers' CPU and data waits of the train loop, between two reports.

    Args:
        cores (int, optional): Cores this process's workers may use.
            Defaults to ``os.cpu_count()`` shared by the local processes.
    """

    def __init__(self, cores: Optional[int] = None) -> None:
        local = int(os.environ.get('LOCAL_WORLD_SIZE', '1') or 1)
        self.cores = cores or max(1, (os.cpu_count() or 1) // local)
        self._cpu: Dict[int, float] = {}
        self._spent = 0.0  # workers' CPU seconds since the last report
        self._seen = (0.0, 0.0, 0)  # data_time sum, time sum, count

    def tick(self, loop: Any) -> None:
        """Adds the CPU time the loop's live workers (those its fast
        DataLoader iterator started last) spent since the last tick; call
        it each iteration, as workers that are not persistent end with
        their epoch."""
        for pid in loader_state(loop.dataloader).worker_pids:
            now = process_cpu_seconds(pid)
            if now is not None:
                self._spent += now - self._cpu.get(pid, 0.0)
                self._cpu[pid] = now

    def report(self, runner: Any, loop: Any, span: str) -> Optional[str]:
        """The line for the iterations since the last report, or None
        before there are any.

        Args:
            runner (Runner): The runner (its message hub).
            loop: The train loop (its DataLoader's workers).
            span (str): What the line covers, e.g. ``'iterations 1-50'``.

        Returns:
            str | None: E.g. ``data-bound: iterations 1-50 waited for data
            34% of the time (41 ms of 120 ms an iteration); the 4 workers
            spent 320 ms CPU per batch against a 79 ms step: num_workers=5
            would keep up (16 cores)``.
        """
        hub = runner.message_hub
        data, time = _total(hub, 'train/data_time'), _total(hub, 'train/time')
        self.tick(loop)
        cpu, self._spent = self._spent, 0.0
        if data is None or time is None:
            return None
        d0, t0, n0 = self._seen
        count = time[1] - n0
        if count <= 0:
            return None
        data_s, time_s = data[0] - d0, time[0] - t0
        self._seen = (data[0], time[0], time[1])
        share = data_s / time_s if time_s > 0 else 0.0
        line = (f'data-bound: {span} waited for data {share:.0%} of the time '
                f'({data_s / count * 1e3:.0f} ms of '
                f'{time_s / count * 1e3:.0f} ms an iteration)')
        if share <= DATA_BOUND_SHARE:
            return line + '; not data-bound'
        workers = loop.dataloader.num_workers
        step = (time_s - data_s) / count
        per_batch = cpu / count
        if workers == 0 or per_batch <= 0:
            return line + ('; the main process makes the batches '
                           '(num_workers=0)' if workers == 0 else '')
        need = math.ceil(per_batch / step) if step > 0 else workers + 1
        advice = (f'num_workers={need} would keep up ({self.cores} cores)'
                  if need <= self.cores else
                  f'more workers than the {self.cores} cores present would '
                  'be needed: the pipeline is the limit')
        return (
            f'{line}; the {workers} worker{"s" if workers > 1 else ""} spent '
            f'{per_batch * 1e3:.0f} ms CPU per batch against a '
            f'{step * 1e3:.0f} ms step: {advice}')
