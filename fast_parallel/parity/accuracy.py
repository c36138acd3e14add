"""``AccuracyParityHook``: the final validation against a published result.
"""
import json
import os.path as osp
from typing import Dict, Optional

from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from fast_parallel.compat import loop_length, loop_progress, runner_loop


@HOOKS.register_module()
class AccuracyParityHook(Hook):
    """Compares validation metrics with the stock recipe's published result.

    After every validation it writes ``accuracy_parity.json`` into the work
    dir (metric, expected, measured, tolerance, pass/fail, whether this was
    the final validation); after the final one — the end of training, or a
    standalone ``runner.val()`` — it also logs one line::

        accuracy parity PASS: coco/bbox_mAP 0.4060 vs 0.4050 (tolerance
        0.0050), mmdet model zoo

    Args:
        expected (dict): Metric name (as the evaluator reports it) ->
            published value, in the evaluator's units.
        tolerance (float | dict): Largest accepted ``|measured - expected|``
            (one for all metrics, or per metric).
        source (str): Where the published value comes from. Defaults to ''.
    """

    priority = 'LOW'

    def __init__(self,
                 expected: Dict[str, float],
                 tolerance,
                 source: str = '') -> None:
        if not expected:
            raise ValueError('AccuracyParityHook needs expected metrics')
        self.expected = dict(expected)
        self.tolerance = tolerance
        self.source = source
        self.last: Optional[dict] = None

    def _tolerance(self, name: str) -> float:
        if isinstance(self.tolerance, dict):
            return float(self.tolerance[name])
        return float(self.tolerance)

    def check(self, metrics: Dict[str, float]) -> dict:
        """Compares ``metrics`` with the expected values.

        Args:
            metrics (dict): Evaluator output.

        Returns:
            dict: Per metric ``expected``, ``measured``, ``tolerance``,
            ``passed``; and ``passed`` overall. A metric the evaluator did
            not report fails.
        """
        report: dict = dict(source=self.source, metrics={})
        for name, expected in self.expected.items():
            measured = metrics.get(name)
            tol = self._tolerance(name)
            passed = measured is not None and abs(float(measured) -
                                                  expected) <= tol
            report['metrics'][name] = dict(
                expected=expected,
                measured=None if measured is None else float(measured),
                tolerance=tol,
                passed=passed)
        report['passed'] = all(m['passed'] for m in report['metrics'].values())
        return report

    def after_val_epoch(self, runner, metrics=None) -> None:
        """Checks this validation; logs the verdict after the final one."""
        report = self.check(dict(metrics or {}))
        loop = runner_loop(runner, 'train')
        training = loop is not None and not isinstance(loop, dict)
        # mmengine gives an IterBasedTrainLoop max_epochs=1: the loop's
        # class says which counter ends it (fast_parallel.compat).
        report['final'] = not training or (loop_progress(loop)
                                           >= loop_length(loop))
        report['iter'], report['epoch'] = runner.iter, runner.epoch
        self.last = report
        if not is_main_process():
            return
        with open(osp.join(runner.work_dir, 'accuracy_parity.json'), 'w') as f:
            json.dump(report, f, indent=1)
        parts = []
        for name, m in report['metrics'].items():
            got = 'missing' if m['measured'] is None else \
                f'{m["measured"]:.4f}'
            parts.append(f'{name} {got} vs {m["expected"]:.4f} '
                         f'(tolerance {m["tolerance"]:.4f})')
        verdict = 'PASS' if report['passed'] else 'FAIL'
        line = f'accuracy parity {verdict}: {"; ".join(parts)}'
        if self.source:
            line += f', {self.source}'
        if report['final']:
            runner.logger.info(line)
        else:
            runner.logger.info(f'(not the final validation) {line}')
