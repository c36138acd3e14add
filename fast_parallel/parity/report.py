"""The side-by-side report of a parity run: rows, table, verdict.

:func:`compare` turns the stock and fast records into rows (training order
first, then losses, gradient norms, checksums and metrics); ``format_table``
prints them, ``verdict`` reads them. How a parity run works:
``docs/parity.md``.
"""
import math
import os.path as osp
from typing import Any, List, Sequence

import torch

#: The ``what`` of the training-order row.
ORDER_ROW = 'training order (sample ids)'


def _at(values: Sequence[Any], i: int) -> Any:
    """``values[i]``, or None past the end."""
    return values[i] if i < len(values) else None


def _close(a: Any, b: Any, atol: float) -> bool:
    """Equal, or for floats within ``atol`` (NaN matches only NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b if atol == 0 else abs(a - b) <= atol
    return a == b


def _loss_rows(stock: dict, fast: dict, n: int) -> List[dict]:
    """Per iteration: each loss term, then the gradient norms recorded."""
    rows = []
    for i in range(n):
        a = stock['losses'][i] if i < len(stock['losses']) else {}
        b = fast['losses'][i] if i < len(fast['losses']) else {}
        for key in sorted(set(a) | set(b), key=lambda k: (k != 'loss', k)):
            rows.append(
                dict(
                    what=f'iter {i + 1} {key}',
                    stock=a.get(key),
                    fast=b.get(key)))
        for key, what in (('grad_norm', 'grad_norm'),
                          ('grad_norm_clipped', 'grad_norm after clip_grad')):
            ga, gb = (
                _at(record.get(key) or [], i) for record in (stock, fast))
            # None on both sides: not recorded (no clip_grad, or by value)
            if ga is not None or gb is not None:
                rows.append(
                    dict(what=f'iter {i + 1} {what}', stock=ga, fast=gb))
    return rows


def _packed_row(stock: dict, fast: dict, n: int) -> dict:
    """The packed-batch count: the check is only worth something if the
    fast run really ran packed. The two values differ by design: ``same``
    says whether they are what each path must give (stock none, fast every
    batch)."""
    return dict(
        what='packed batches',
        stock=stock['packed'],
        fast=fast['packed'],
        same=stock['packed'] == 0 and fast['packed'] == n > 0,
        by_design=f'stock 0, fast {n}')


def _checksum_row(stock: dict, fast: dict) -> dict:
    """The parameters' sha256 (its first 16 digits shown)."""
    sa, sb = stock['checksum'], fast['checksum']
    return dict(
        what='params sha256',
        stock=sa['sha256'][:16],
        fast=sb['sha256'][:16],
        same=sa['sha256'] == sb['sha256'])


def _state_rows(stock: dict, fast: dict) -> List[dict]:
    """The optimizer state's and the EMA weights' sha256, where recorded."""
    rows = []
    for key, what in (('optimizer', 'optimizer state sha256'),
                      ('ema', 'EMA weights sha256')):
        a, b = stock.get(key), fast.get(key)
        if a or b:
            rows.append(
                dict(
                    what=what,
                    stock=(a or '-')[:16],
                    fast=(b or '-')[:16],
                    same=a == b))
    return rows


def _max_diff_row(stock: dict, fast: dict, atol: float) -> dict:
    """The largest parameter difference, against ``atol``."""
    diff = max(
        (a - b).abs().max().item() if a.is_floating_point(
        ) else float(not torch.equal(a, b))
        for a, b in zip(stock['params'].values(), fast['params'].values()))
    return dict(
        what='params max |diff|', stock=0.0, fast=diff, same=diff <= atol)


def _predictions_row(stock: dict, fast: dict, atol: float) -> dict:
    """The validation predictions' sha256 (bits may differ within
    ``atol``)."""
    sa, sb = stock['predictions'], fast['predictions']
    return dict(
        what='val predictions sha256',
        stock=sa and sa[:16],
        fast=sb and sb[:16],
        same=sa == sb or bool(atol))


def _metric_rows(stock: dict, fast: dict, atol: float) -> List[dict]:
    """Each metric, by name."""
    rows = []
    for key in sorted(set(stock['metrics']) | set(fast['metrics'])):
        a, b = stock['metrics'].get(key), fast['metrics'].get(key)
        rows.append(dict(what=key, stock=a, fast=b, same=_close(a, b, atol)))
    return rows


def compare(stock: dict, fast: dict, atol: float = 0.0) -> List[dict]:
    """Rows of the side-by-side table.

    Args:
        stock (dict): The stock run's record
            (:func:`fast_parallel.parity.runner.run_once`).
        fast (dict): The same for the fast run.
        atol (float): Absolute tolerance; 0 asks for identical values.
            Defaults to 0.

    Returns:
        list[dict]: ``what``, ``stock``, ``fast``, ``same`` per compared
        value: the training order (first; see :func:`order_row`), each loss
        term of each iteration, each gradient norm (``grad_norm``: before
        clipping, as mmengine logs it; with ``clip_grad`` also ``grad_norm
        after clip_grad``, what the optimizer step sees), the parameter
        checksum (or, with ``atol``, the largest parameter difference) and
        each metric. The ``packed batches`` row differs by design: it has
        ``by_design`` (what each path must give) and is ``same`` when both
        paths give it.
    """
    n = max(len(stock['losses']), len(fast['losses']))
    losses = _loss_rows(stock, fast, n)
    for row in losses:
        row['same'] = _close(row['stock'], row['fast'], atol)
    checksum = _checksum_row(stock, fast)
    states = _state_rows(stock, fast)
    # First: when the runs trained on different batches, no loss can match,
    # and this row says why. Sample ids are compared exactly, ``atol`` or not.
    rows = [order_row(stock.get('order', []), fast.get('order', []))]
    rows += losses + [_packed_row(stock, fast, n), checksum] + states
    if atol:
        rows.append(_max_diff_row(stock, fast, atol))
        for row in [checksum] + states:  # bits may differ within atol
            row['same'] = True
    if stock['predictions'] or fast['predictions']:
        rows.append(_predictions_row(stock, fast, atol))
    return rows + _metric_rows(stock, fast, atol)


class _NoIteration:
    """Stands for an iteration one run did not make."""

    def __repr__(self) -> str:
        return 'no iteration'


_NO_ITERATION = _NoIteration()


def _show_id(value: Any) -> str:
    """A sample id as the table shows it (a path by its file name)."""
    if isinstance(value, str):  # a file path: its name is enough to read
        return osp.basename(value)
    if isinstance(value, list):
        return '[' + ', '.join(_show_id(v) for v in value) + ']'
    return str(value)


def _show_batch(ids: Any) -> str:
    """``[5, 4]``; ``-`` for a batch without ids."""
    if ids is _NO_ITERATION:
        return 'no iteration'
    return '-' if ids is None else _show_id(list(ids))


def _show_order(order: List[Any], most: int = 4) -> str:
    """The first batches of a training order: ``[5, 4] [8, 3] … (+6)``."""
    if all(i is None for ids in order for i in (ids or [])):
        return 'no sample ids'
    shown = ' '.join(_show_batch(ids) for ids in order[:most])
    return shown + (f' … (+{len(order) - most})' if len(order) > most else '')


def order_row(stock: Sequence[Any], fast: Sequence[Any]) -> dict:
    """The training-order row: did both runs train on the same batches?

    Args:
        stock (Sequence): Per iteration, the sample ids of the stock run's
            batch (``ParityRecorderHook``'s ``order``).
        fast (Sequence): The same for the fast run.

    Returns:
        dict: A :func:`compare` row, ``what`` = :data:`ORDER_ROW`. Same
        order: both cells show the batches (the first four), ``same``
        True, ``first_difference`` None. Else ``same`` False, each cell
        shows that run's batch at the first iteration where they differ
        (``iter 1: [5, 4]``, 1-based like the loss rows), and
        ``first_difference`` is ``dict(iter=1, stock=[5, 4], fast=[11,
        5])`` (None for a side that made no such iteration); ``detail``
        reads ``iter 1: stock [5, 4] / fast [11, 5]``.
    """
    stock, fast = list(stock), list(fast)

    def at(order: List[Any], i: int) -> Any:
        return order[i] if i < len(order) else _NO_ITERATION

    first = next((i for i in range(max(len(stock), len(fast)))
                  if at(stock, i) != at(fast, i)), None)
    if first is None:
        return dict(
            what=ORDER_ROW,
            stock=_show_order(stock),
            fast=_show_order(fast),
            same=True,
            first_difference=None,
            detail=f'{len(stock)} iterations, the same batches')
    a, b = at(stock, first), at(fast, first)
    detail = (f'iter {first + 1}: stock {_show_batch(a)} / '
              f'fast {_show_batch(b)}')
    return dict(
        what=ORDER_ROW,
        stock=f'iter {first + 1}: {_show_batch(a)}',
        fast=f'iter {first + 1}: {_show_batch(b)}',
        same=False,
        first_difference=dict(
            iter=first + 1,
            stock=None if a is _NO_ITERATION else a,
            fast=None if b is _NO_ITERATION else b),
        detail=detail)


def verdict(rows: List[dict]) -> str:
    """``IDENTICAL`` when every row matches, else ``DIFFERENT``."""
    return 'IDENTICAL' if all(r['same'] for r in rows) else 'DIFFERENT'


def format_table(rows: List[dict]) -> str:
    """A Markdown table of :func:`compare` rows.

    Args:
        rows (list[dict]): The rows.

    Returns:
        str: The table. Column ``same``: ``yes`` / ``**NO**``; for a row
        whose values differ by design (``by_design``, the packed-batch
        count) ``n/a (differs by design)`` when both paths give what they
        must, else ``**NO**`` and what they must give.
    """

    def show(value: Any) -> str:
        if isinstance(value, float):
            return f'{value:.9g}'
        return '-' if value is None else str(value)

    def mark(row: dict) -> str:
        if row.get('by_design'):
            return ('n/a (differs by design)'
                    if row['same'] else f'**NO** (must be {row["by_design"]})')
        return 'yes' if row['same'] else '**NO**'

    width = max([len(r['what']) for r in rows] + [4])
    head = f'| {"what".ljust(width)} | {"stock":>18} | {"fast":>18} | same |'
    lines = [head, f'| {"-" * width} | {"-" * 18}: | {"-" * 18}: | :--: |']
    for r in rows:
        lines.append(f'| {r["what"].ljust(width)} | {show(r["stock"]):>18} | '
                     f'{show(r["fast"]):>18} | {mark(r)} |')
    return '\n'.join(lines)


def grad_norm_note(record: dict) -> str:
    """What the gradient-norm rows of a run's table measure.

    Args:
        record (dict): A run's record
            (:func:`fast_parallel.parity.runner.run_once`; its
            ``clip_grad``).

    Returns:
        str: One line for under the table.
    """
    clip = record.get('clip_grad')
    if clip is None:
        return ('grad_norm: L2 norm of all gradients before each optimizer '
                'step (the config sets no clip_grad)')
    args = ', '.join(f'{k}={v}' for k, v in clip.items() if k != 'type')
    after = ('grad_norm after clip_grad: L2 norm of the gradients the '
             f'optimizer step sees (clip_grad by {clip["type"]}: {args})')
    if clip['type'] != 'norm':
        return after + '; mmengine logs no grad_norm when clipping by value'
    return ('grad_norm: total norm before clipping, what mmengine logs as '
            'grad_norm (clip_grad_norm_\'s return); ' + after)
