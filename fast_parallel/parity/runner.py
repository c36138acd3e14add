"""Stock path vs fast path, the same config and seed, side by side.

``run_parity(cfg, iters)`` trains ``iters`` iterations twice in this
process — once on mmengine's stock path (``pseudo_collate``, mmengine's own
wrapping: ``fast_parallel.disable``) and once on the fast path
(``fast_parallel.enable``) — from the same seed, and records the samples
each iteration trained on (the training order), every loss term of every
iteration, the gradient norm before every optimizer step, a checksum of all
parameters at the end and, optionally, the validation metrics.
``tools/parity.py`` is its command line.
"""
import contextlib
import copy
import functools
import hashlib
import math
import os
import os.path as osp
import uuid
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import Runner

from fast_parallel.config import disable, enable
from fast_parallel.data.packing import PackedBatch

PATHS = ('stock', 'fast')

#: Metainfo keys that name a sample, in the order they are looked for: the
#: dataset's sample index (mmdet ``img_id``, mmdet3d ``sample_idx``), then
#: the file it was read from.
SAMPLE_ID_KEYS = ('img_id', 'sample_idx', 'img_path', 'lidar_path')

#: The ``what`` of the training-order row.
ORDER_ROW = 'training order (sample ids)'


def _plain(value: Any) -> Any:
    """A JSON-friendly copy of a metainfo value (numpy scalars, tuples)."""
    if hasattr(value, 'item') and getattr(value, 'ndim', 1) == 0:
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (int, float, str)) else str(value)


def sample_id(sample: Any) -> Any:
    """The identity of one data sample of a collated batch.

    Args:
        sample: A data sample (mmdet ``DetDataSample``, mmdet3d
            ``Det3DDataSample``: their ``metainfo``) or a dict of metainfo.

    Returns:
        The first of :data:`SAMPLE_ID_KEYS` the sample carries, or None.
    """
    meta = getattr(sample, 'metainfo', sample)
    if not isinstance(meta, Mapping):
        return None
    for key in SAMPLE_ID_KEYS:
        if meta.get(key) is not None:
            return _plain(meta[key])
    return None


def batch_sample_ids(data_batch: Any) -> Optional[List[Any]]:
    """The identities of a training batch's samples, in batch order.

    Args:
        data_batch: What the train loop hands its hooks: stock's
            ``pseudo_collate`` dict (``data_samples``: a list of data
            samples, or for mmdet's ``MultiBranch`` a dict of branches, each
            a list with a data sample or None per sample) or, on the fast
            path, a :class:`PackedBatch`, read through ``unpack()`` where it
            is (no copy to a device).

    Returns:
        list | None: One id per sample (None for a sample without one), or
        None for a batch without ``data_samples``. For branches, see
        :func:`branch_sample_ids`.
    """
    if isinstance(data_batch, PackedBatch):
        data_batch = data_batch.unpack()
    samples = data_batch.get('data_samples') if isinstance(
        data_batch, Mapping) else None
    if isinstance(samples, Mapping):
        return branch_sample_ids(samples)
    if not isinstance(samples, (list, tuple)):
        return None
    return [sample_id(s) for s in samples]


def branch_sample_ids(branches: Mapping) -> Optional[List[Any]]:
    """The sample ids of a ``MultiBranch`` batch, read branch by branch.

    mmdet's ``MultiBranch`` (semi-supervised detection) packs each sample
    once per branch (``sup``, ``unsup_teacher``, ``unsup_student``) and
    leaves None in the branches a sample does not take part in, so after
    collation ``data_samples`` is ``{branch: [sample or None, ...]}``.

    Args:
        branches (Mapping): Branch name -> that branch's data samples.

    Returns:
        list | None: Per sample, the id its branches carry (None where none
        does; ``{branch: id}`` where its branches disagree), or None when no
        branch holds a list of samples.
    """
    per_branch = {
        name: [sample_id(s) for s in samples]
        for name, samples in branches.items()
        if isinstance(samples, (list, tuple))
    }
    if not per_branch:
        return None
    ids = []
    for i in range(max(len(v) for v in per_branch.values())):
        found = {name: v[i] for name, v in per_branch.items()
                 if i < len(v) and v[i] is not None}
        values = list(found.values())
        if all(v == values[0] for v in values[1:]):
            ids.append(values[0] if values else None)
        else:
            ids.append(found)
    return ids


class ParityRecorderHook(Hook):
    """Records one run: training order, losses, gradient norms, metrics.

    Args:
        record (dict): Filled in place: ``order`` (per iteration, the ids
            of the batch's samples, see :func:`batch_sample_ids`),
            ``losses`` (per iteration, term -> value), ``grad_norm`` (per
            optimizer step, the total gradient norm before any clipping:
            with ``clip_grad`` by norm, the ``grad_norm`` mmengine logs,
            i.e. what ``clip_grad_norm_`` returns; without it, the L2 norm
            of all gradients; None with ``clip_grad`` by value),
            ``grad_norm_clipped`` (per step, the norm of the gradients
            ``optimizer.step`` sees, after ``clip_grad``; empty without
            ``clip_grad``), ``clip_grad`` (the optimizer wrapper's
            ``clip_grad``, None without) and ``metrics``.
        progress (callable, optional): Called once per iteration.
            Defaults to None.
    """

    priority = 'LOWEST'

    def __init__(self, record: dict, progress: Optional[Any] = None) -> None:
        self.record = record
        self.progress = progress
        record.update(order=[], losses=[], grad_norm=[],
                      grad_norm_clipped=[], clip_grad=None, metrics={},
                      packed=0, predictions=None)
        self._predictions = hashlib.sha256()
        # how many gradient norms mmengine had logged at the last step
        self._logged: Dict[int, int] = {}

    def before_train(self, runner) -> None:
        """Hooks the optimizers to see the gradients before each step
        (mmengine's ``OptimWrapper.step`` clips them first)."""
        wrapper = runner.optim_wrapper
        if getattr(wrapper, 'optimizer', None) is None:  # OptimWrapperDict
            wrappers = list(wrapper.values())
        else:
            wrappers = [wrapper]
        for wrapper in wrappers:
            clip = clip_grad_of(wrapper)
            if clip is not None:
                self.record['clip_grad'] = clip
            wrapper.optimizer.register_step_pre_hook(
                functools.partial(self._before_step, wrapper, clip))

    def _before_step(self, wrapper: Any, clip: Optional[dict], optimizer,
                     args, kwargs) -> None:
        squares = [
            p.grad.detach().double().pow(2).sum() for group in
            optimizer.param_groups for p in group['params']
            if p.grad is not None
        ]
        norm = torch.stack(squares).sum().sqrt().item() if squares else 0.0
        if clip is None:  # nothing clips: these are backward's gradients
            self.record['grad_norm'].append(norm)
            return
        self.record['grad_norm_clipped'].append(norm)
        self.record['grad_norm'].append(
            _logged_grad_norm(wrapper, self._logged) if clip['type'] ==
            'norm' else None)

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        """Keeps the batch's sample ids; counts the batches that arrive
        packed (the fast path at work)."""
        self.record['order'].append(batch_sample_ids(data_batch))
        self.record['packed'] += isinstance(data_batch, PackedBatch)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        """Keeps this iteration's loss terms."""
        self.record['losses'].append(
            {k: float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
             for k, v in (outputs or {}).items()})
        if self.progress is not None:
            self.progress()

    def after_val_iter(self, runner, batch_idx: int, data_batch=None,
                       outputs=None) -> None:
        """Hashes every predicted tensor, bit for bit, in sample order."""
        for sample in outputs or []:
            for field in sorted(k for k in sample.keys()
                                if k.startswith('pred')):
                preds = getattr(sample, field)
                keys = sorted(preds.keys()) if hasattr(preds, 'keys') else []
                for key in keys:
                    value = getattr(preds, key)
                    value = getattr(value, 'tensor', value)
                    if isinstance(value, torch.Tensor):
                        self._predictions.update(_tensor_bytes(value))
        self.record['predictions'] = self._predictions.hexdigest()

    def after_val_epoch(self, runner, metrics=None) -> None:
        """Keeps the validation metrics."""
        self.record['metrics'] = {
            k: float(v) if isinstance(v, (int, float)) else str(v)
            for k, v in (metrics or {}).items()
        }


def clip_grad_of(optim_wrapper: Any) -> Optional[dict]:
    """The ``clip_grad`` an mmengine optimizer wrapper applies in ``step``.

    Args:
        optim_wrapper: An ``OptimWrapper`` / ``AmpOptimWrapper``.

    Returns:
        dict | None: ``type`` ('norm' or 'value') and the clipping function's
        arguments (``max_norm``, ``norm_type`` / ``clip_value``), or None
        when the wrapper does not clip.
    """
    kwargs = getattr(optim_wrapper, 'clip_grad_kwargs', None)
    if not kwargs:
        return None
    # OptimWrapper logs `train/{grad_name}`: 'grad_norm' or 'grad_value'
    kind = getattr(optim_wrapper, 'grad_name', 'grad_norm')[len('grad_'):]
    return dict(type=kind, **kwargs)


def _logged_grad_norm(optim_wrapper: Any,
                      counts: Dict[int, int]) -> Optional[float]:
    """The ``train/grad_norm`` the wrapper logged in this ``step``, if any.

    ``OptimWrapper.step`` logs what ``clip_grad_norm_`` returns (the total
    norm before clipping) just before it calls ``optimizer.step``; a step
    without gradients logs nothing, hence the count.

    Args:
        optim_wrapper: The ``OptimWrapper`` whose step this is.
        counts (dict[int, int]): Per wrapper, the number of values logged
            at its previous step; updated.

    Returns:
        float | None: The value, or None when this step logged none.
    """
    buffer = optim_wrapper.message_hub.log_scalars.get('train/grad_norm')
    values = [] if buffer is None else buffer.data[0]
    fresh = len(values) > counts.get(id(optim_wrapper), 0)
    counts[id(optim_wrapper)] = len(values)
    return float(values[-1]) if fresh else None


@HOOKS.register_module()
class PerturbFirstBatchHook(Hook):
    """Adds 1.0 to one value of the first training batch: a known change.

    For ``tools/parity.py --fast-hooks PerturbFirstBatchHook``: the fast run
    then trains on a batch that differs from stock's in one number (the
    first element of the float32 buffer of a packed batch, else of the first
    floating-point tensor found), and the report must say DIFFERENT. It
    shows the checker is awake; nothing else uses it.
    """

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        """Changes the first batch in place."""
        if batch_idx != 0 or getattr(runner, 'iter', 0) != 0:
            return
        if isinstance(data_batch, PackedBatch):
            buffer = data_batch.buffers.get(torch.float32)
            if buffer is None:
                buffer = next(b for b in data_batch.buffers.values())
            buffer.view(-1)[0] += 1
            return
        tensor = _first_float(data_batch)
        if tensor is None:
            raise ValueError('PerturbFirstBatchHook: the first batch holds '
                             'no floating-point tensor to change')
        tensor.view(-1)[0] += 1


def _first_float(tree: Any) -> Optional[torch.Tensor]:
    """The first floating-point tensor in a collated batch (depth first)."""
    if isinstance(tree, torch.Tensor):
        return tree if tree.is_floating_point() and tree.numel() else None
    if isinstance(tree, dict):
        tree = list(tree.values())
    elif hasattr(tree, 'all_items'):  # BaseDataElement
        tree = [v for _, v in tree.all_items()]
    if isinstance(tree, (list, tuple)):
        for item in tree:
            found = _first_float(item)
            if found is not None:
                return found
    return None


def parity_config(cfg: Config, path: str, iters: int, evaluate: bool,
                  work_dir: str, seed: int = 0, deterministic: bool = True,
                  fast_hooks: Sequence[str] = ()) -> Config:
    """One run's config: ``iters`` iterations on the stock or fast path.

    Args:
        cfg (Config): Any mmdet / mmdet3d config, fast or not.
        path (str): 'stock' or 'fast'.
        iters (int): Training iterations.
        evaluate (bool): Validate after the last iteration.
        work_dir (str): The parent work dir; the run gets ``work_dir/path``.
        seed (int): Random seed. Defaults to 0.
        deterministic (bool): mmengine's deterministic switch. Defaults to
            True.
        fast_hooks (Sequence[str]): Hook types added to the fast run only
            (to debug, or to check that the checker catches a change).
            Defaults to ().

    Returns:
        Config: The run's config.
    """
    cfg = copy.deepcopy(cfg)
    (enable if path == 'fast' else disable)(cfg)
    cfg.train_cfg = dict(
        type='IterBasedTrainLoop',
        max_iters=iters,
        val_interval=iters if evaluate else iters + 1)
    if not evaluate:
        cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.randomness = dict(seed=seed, deterministic=deterministic)
    cfg.work_dir = f'{work_dir}/{path}'
    cfg.experiment_name = f'parity_{path}_{uuid.uuid4().hex[:8]}'
    cfg.load_from, cfg.resume = None, False
    hooks = cfg.get('default_hooks', None) or {}
    if 'checkpoint' in hooks:  # no checkpoints: a parity run leaves no files
        hooks['checkpoint'] = dict(
            type='CheckpointHook', interval=-1, save_last=False)
    if path == 'fast':
        cfg.custom_hooks = list(cfg.get('custom_hooks', [])) + [
            dict(type=t) for t in fast_hooks
        ]
    return cfg


def params_checksum(model: torch.nn.Module) -> Dict[str, Any]:
    """SHA-256 over every parameter and buffer, bit for bit, and their sum.

    Args:
        model (nn.Module): A model (wrappers are looked through).

    Returns:
        dict: ``sha256``, ``sum`` (float64) and ``tensors``.
    """
    if is_model_wrapper(model):
        model = model.module
    digest, total, n = hashlib.sha256(), 0.0, 0
    for name, value in sorted(model.state_dict().items()):
        t = value.detach().cpu()
        digest.update(name.encode())
        digest.update(_tensor_bytes(t))
        if t.is_floating_point():
            total += t.double().sum().item()
        n += 1
    return dict(sha256=digest.hexdigest(), sum=total, tensors=n)


def tree_checksum(tree: Any) -> Optional[str]:
    """SHA-256 of a nested state (dicts, lists, tensors, numbers), bit for bit.

    Used for the optimizer's ``state_dict`` (momentum buffers, Adam moments,
    step counts, every group's hyper-parameters) and the EMA weights.

    Args:
        tree: The state; None gives None.

    Returns:
        str | None: The hex digest.
    """
    if tree is None:
        return None
    digest = hashlib.sha256()

    def walk(node: Any) -> None:
        if isinstance(node, torch.Tensor):
            digest.update(_tensor_bytes(node))
        elif isinstance(node, Mapping):
            digest.update(b'{')
            for key in sorted(node, key=repr):
                digest.update(repr(key).encode())
                walk(node[key])
            digest.update(b'}')
        elif isinstance(node, (list, tuple)):
            digest.update(b'[')
            for item in node:
                walk(item)
            digest.update(b']')
        else:
            digest.update(repr(node).encode())

    walk(tree)
    return digest.hexdigest()


def ema_state(runner: Runner) -> Optional[dict]:
    """The averaged weights of the run's ``EMAHook``, if it has one."""
    from mmengine.hooks import EMAHook
    for hook in runner.hooks:
        if isinstance(hook, EMAHook) and hasattr(hook, 'ema_model'):
            return hook.ema_model.state_dict()
    return None


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's shape, dtype and raw bytes."""
    head = f'{t.dtype}{tuple(t.shape)}'.encode()
    t = t.detach().cpu().contiguous().reshape(-1)
    return head + (t.view(torch.uint8).numpy().tobytes() if t.numel() else b'')


def run_once(cfg: Config, progress: Optional[Any] = None) -> dict:
    """Trains (and validates) one parity run.

    Args:
        cfg (Config): From :func:`parity_config`.
        progress (callable, optional): Called once per iteration.

    Returns:
        dict: ``losses``, ``grad_norm``, ``metrics``, ``checksum``, the
        seconds of each iteration (``iter_time``), ``batch_size`` and the
        final ``params`` (CPU copies, for ``--atol`` comparisons).
    """
    record: dict = {}
    runner = Runner.from_cfg(cfg)
    runner.register_hook(ParityRecorderHook(record, progress))
    runner.train()
    model = runner.model.module if is_model_wrapper(runner.model) else \
        runner.model
    times = runner.message_hub.log_scalars.get('train/time')
    record['iter_time'] = times.data[0].tolist() if times is not None else []
    record['batch_size'] = runner.train_dataloader.batch_size
    record['checksum'] = params_checksum(model)
    record['optimizer'] = tree_checksum(runner.optim_wrapper.state_dict())
    record['ema'] = tree_checksum(ema_state(runner))
    record['params'] = {
        k: v.detach().cpu().clone() for k, v in model.state_dict().items()
    }
    return record


def _at(values: Sequence[Any], i: int) -> Any:
    return values[i] if i < len(values) else None


def _close(a: Any, b: Any, atol: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b if atol == 0 else abs(a - b) <= atol
    return a == b


def compare(stock: dict, fast: dict, atol: float = 0.0) -> List[dict]:
    """Rows of the side-by-side table.

    Args:
        stock (dict): :func:`run_once` record of the stock run.
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
    rows = []
    n = max(len(stock['losses']), len(fast['losses']))
    for i in range(n):
        a = stock['losses'][i] if i < len(stock['losses']) else {}
        b = fast['losses'][i] if i < len(fast['losses']) else {}
        for key in sorted(set(a) | set(b), key=lambda k: (k != 'loss', k)):
            rows.append(dict(what=f'iter {i + 1} {key}', stock=a.get(key),
                             fast=b.get(key)))
        for key, what in (('grad_norm', 'grad_norm'),
                          ('grad_norm_clipped', 'grad_norm after clip_grad')):
            ga, gb = (_at(record.get(key) or [], i) for record in (stock,
                                                                   fast))
            # None on both sides: not recorded (no clip_grad, or by value)
            if ga is not None or gb is not None:
                rows.append(dict(what=f'iter {i + 1} {what}', stock=ga,
                                 fast=gb))
    for row in rows:
        row['same'] = _close(row['stock'], row['fast'], atol)
    # First: when the runs trained on different batches, no loss can match,
    # and this row says why. Sample ids are compared exactly, ``atol`` or not.
    rows.insert(0, order_row(stock.get('order', []), fast.get('order', [])))
    # The check is only worth something if the fast run really ran packed.
    # The two values differ by design: ``same`` says whether they are what
    # each path must give (stock none, fast every batch).
    rows.append(dict(what='packed batches', stock=stock['packed'],
                     fast=fast['packed'],
                     same=stock['packed'] == 0 and fast['packed'] == n > 0,
                     by_design=f'stock 0, fast {n}'))
    sa, sb = stock['checksum'], fast['checksum']
    rows.append(dict(what='params sha256', stock=sa['sha256'][:16],
                     fast=sb['sha256'][:16],
                     same=sa['sha256'] == sb['sha256']))
    state_rows = []
    for key, what in (('optimizer', 'optimizer state sha256'),
                      ('ema', 'EMA weights sha256')):
        a, b = stock.get(key), fast.get(key)
        if a or b:
            state_rows.append(dict(what=what, stock=(a or '-')[:16],
                                   fast=(b or '-')[:16], same=a == b))
    rows.extend(state_rows)
    if atol:
        diff = max((a - b).abs().max().item() if a.is_floating_point() else
                   float(not torch.equal(a, b))
                   for a, b in zip(stock['params'].values(),
                                   fast['params'].values()))
        rows.append(dict(what='params max |diff|', stock=0.0, fast=diff,
                         same=diff <= atol))
        # bits may differ within the tolerance
        for row in [rows[-2 - len(state_rows)]] + state_rows:
            row['same'] = True
    if stock['predictions'] or fast['predictions']:
        sa, sb = stock['predictions'], fast['predictions']
        rows.append(dict(what='val predictions sha256',
                         stock=sa and sa[:16], fast=sb and sb[:16],
                         same=sa == sb or bool(atol)))
    for key in sorted(set(stock['metrics']) | set(fast['metrics'])):
        a, b = stock['metrics'].get(key), fast['metrics'].get(key)
        rows.append(dict(what=key, stock=a, fast=b, same=_close(a, b, atol)))
    return rows


class _NoIteration:
    """Stands for an iteration one run did not make."""

    def __repr__(self) -> str:
        return 'no iteration'


_NO_ITERATION = _NoIteration()


def _show_id(value: Any) -> str:
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
    return shown + (f' … (+{len(order) - most})' if len(order) > most
                    else '')


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
        return dict(what=ORDER_ROW, stock=_show_order(stock),
                    fast=_show_order(fast), same=True,
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


def run_parity(cfg: Config,
               iters: int,
               evaluate: bool = False,
               work_dir: str = 'work_dirs/parity',
               seed: int = 0,
               deterministic: bool = True,
               fast_hooks: Sequence[str] = (),
               atol: float = 0.0,
               progress: Optional[Callable[[str], Any]] = None,
               capture_output: bool = True) -> dict:
    """Trains the stock run, then the fast run, and compares them.

    Args:
        cfg (Config): Any mmdet / mmdet3d config, fast or not.
        iters (int): Training iterations per run.
        evaluate (bool): Validate after the last iteration.
            Defaults to False.
        work_dir (str): Parent of the runs' work dirs
            (``work_dir/{stock,fast}``). Defaults to 'work_dirs/parity'.
        seed (int): Random seed. Defaults to 0.
        deterministic (bool): mmengine's deterministic switch.
            Defaults to True.
        fast_hooks (Sequence[str]): Hook types for the fast run only.
            Defaults to ().
        atol (float): Absolute tolerance, 0 for identical values.
            Defaults to 0.
        progress (callable, optional): Called with the run's path
            ('stock' / 'fast') once per iteration. Defaults to None.
        capture_output (bool): Send each run's stdout and stderr (logs,
            warnings, COCO tables) to ``work_dir/<path>/output.log``.
            Defaults to True.

    Returns:
        dict: ``records`` (path -> :func:`run_once` record), ``rows``
        (:func:`compare`), ``order`` (the training-order row), ``verdict``
        ('IDENTICAL' / 'DIFFERENT') and ``ok``.
    """
    records = {}
    for path in PATHS:
        run_cfg = parity_config(cfg, path, iters, evaluate, work_dir, seed,
                                deterministic, fast_hooks)
        tick = None if progress is None else (
            lambda path=path: progress(path))
        os.makedirs(run_cfg.work_dir, exist_ok=True)
        with contextlib.ExitStack() as stack:
            if capture_output:
                log = stack.enter_context(
                    open(osp.join(run_cfg.work_dir, 'output.log'), 'w'))
                stack.enter_context(contextlib.redirect_stdout(log))
                stack.enter_context(contextlib.redirect_stderr(log))
            records[path] = run_once(run_cfg, progress=tick)
    rows = compare(records['stock'], records['fast'], atol)
    order = next(r for r in rows if r['what'] == ORDER_ROW)
    result = verdict(rows)
    return dict(records=records, rows=rows, order=order, verdict=result,
                ok=result == 'IDENTICAL')


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
            return ('n/a (differs by design)' if row['same'] else
                    f'**NO** (must be {row["by_design"]})')
        return 'yes' if row['same'] else '**NO**'

    width = max([len(r['what']) for r in rows] + [4])
    head = f'| {"what".ljust(width)} | {"stock":>18} | {"fast":>18} | same |'
    lines = [head,
             f'| {"-" * width} | {"-" * 18}: | {"-" * 18}: | :--: |']
    for r in rows:
        lines.append(f'| {r["what"].ljust(width)} | {show(r["stock"]):>18} | '
                     f'{show(r["fast"]):>18} | {mark(r)} |')
    return '\n'.join(lines)


def grad_norm_note(record: dict) -> str:
    """What the gradient-norm rows of a run's table measure.

    Args:
        record (dict): A :func:`run_once` record (its ``clip_grad``).

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
