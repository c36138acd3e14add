"""Stock path vs fast path, the same config and seed, side by side.

``run_parity(cfg, iters)`` trains ``iters`` iterations twice in this
process — once on mmengine's stock path (``pseudo_collate``, mmengine's own
wrapping: ``fast_parallel.disable``) and once on the fast path
(``fast_parallel.enable``) — from the same seed, and records every loss term
of every iteration, the gradient norm before every optimizer step, a
checksum of all parameters at the end and, optionally, the validation
metrics. ``tools/parity.py`` is its command line.
"""
import copy
import hashlib
import math
import uuid
from typing import Any, Dict, List, Optional, Sequence

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

from .config import disable, enable
from .packing import PackedBatch

PATHS = ('stock', 'fast')


class ParityRecorderHook(Hook):
    """Records losses, gradient norms and metrics of one run.

    Args:
        record (dict): Filled in place: ``losses`` (per iteration, term ->
            value), ``grad_norm`` (per iteration), ``metrics``.
        progress (callable, optional): Called once per iteration.
            Defaults to None.
    """

    priority = 'LOWEST'

    def __init__(self, record: dict, progress: Optional[Any] = None) -> None:
        self.record = record
        self.progress = progress
        record.update(losses=[], grad_norm=[], metrics={}, packed=0,
                      predictions=None)
        self._predictions = hashlib.sha256()

    def before_train(self, runner) -> None:
        """Hooks the optimizer to see the gradients before each step."""
        optimizer = getattr(runner.optim_wrapper, 'optimizer', None)
        if optimizer is None:  # OptimWrapperDict: several optimizers
            optimizers = [w.optimizer for w in runner.optim_wrapper.values()]
        else:
            optimizers = [optimizer]
        for opt in optimizers:
            opt.register_step_pre_hook(self._grad_norm)

    def _grad_norm(self, optimizer, args, kwargs) -> None:
        squares = [
            p.grad.detach().double().pow(2).sum() for group in
            optimizer.param_groups for p in group['params']
            if p.grad is not None
        ]
        norm = torch.stack(squares).sum().sqrt().item() if squares else 0.0
        self.record['grad_norm'].append(norm)

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        """Counts the batches that arrive packed (the fast path at work)."""
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
    record['params'] = {
        k: v.detach().cpu().clone() for k, v in model.state_dict().items()
    }
    return record


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
        value: each loss term of each iteration, each gradient norm, the
        parameter checksum (or, with ``atol``, the largest parameter
        difference) and each metric.
    """
    rows = []
    n = max(len(stock['losses']), len(fast['losses']))
    for i in range(n):
        a = stock['losses'][i] if i < len(stock['losses']) else {}
        b = fast['losses'][i] if i < len(fast['losses']) else {}
        for key in sorted(set(a) | set(b), key=lambda k: (k != 'loss', k)):
            rows.append(dict(what=f'iter {i + 1} {key}', stock=a.get(key),
                             fast=b.get(key)))
        ga = stock['grad_norm'][i] if i < len(stock['grad_norm']) else None
        gb = fast['grad_norm'][i] if i < len(fast['grad_norm']) else None
        rows.append(dict(what=f'iter {i + 1} grad_norm', stock=ga, fast=gb))
    for row in rows:
        row['same'] = _close(row['stock'], row['fast'], atol)
    # The check is only worth something if the fast run really ran packed.
    rows.append(dict(what='packed batches', stock=stock['packed'],
                     fast=fast['packed'],
                     same=stock['packed'] == 0 and fast['packed'] == n > 0))
    sa, sb = stock['checksum'], fast['checksum']
    rows.append(dict(what='params sha256', stock=sa['sha256'][:16],
                     fast=sb['sha256'][:16],
                     same=sa['sha256'] == sb['sha256']))
    if atol:
        diff = max((a - b).abs().max().item() if a.is_floating_point() else
                   float(not torch.equal(a, b))
                   for a, b in zip(stock['params'].values(),
                                   fast['params'].values()))
        rows.append(dict(what='params max |diff|', stock=0.0, fast=diff,
                         same=diff <= atol))
        rows[-2]['same'] = True  # bits may differ within the tolerance
    if stock['predictions'] or fast['predictions']:
        sa, sb = stock['predictions'], fast['predictions']
        rows.append(dict(what='val predictions sha256',
                         stock=sa and sa[:16], fast=sb and sb[:16],
                         same=sa == sb or bool(atol)))
    for key in sorted(set(stock['metrics']) | set(fast['metrics'])):
        a, b = stock['metrics'].get(key), fast['metrics'].get(key)
        rows.append(dict(what=key, stock=a, fast=b, same=_close(a, b, atol)))
    return rows


def format_table(rows: List[dict]) -> str:
    """A Markdown table of :func:`compare` rows.

    Args:
        rows (list[dict]): The rows.

    Returns:
        str: The table.
    """

    def show(value: Any) -> str:
        if isinstance(value, float):
            return f'{value:.9g}'
        return '-' if value is None else str(value)

    width = max([len(r['what']) for r in rows] + [4])
    head = f'| {"what".ljust(width)} | {"stock":>18} | {"fast":>18} | same |'
    lines = [head,
             f'| {"-" * width} | {"-" * 18}: | {"-" * 18}: | :--: |']
    for r in rows:
        mark = 'yes' if r['same'] else '**NO**'
        lines.append(f'| {r["what"].ljust(width)} | {show(r["stock"]):>18} | '
                     f'{show(r["fast"]):>18} | {mark} |')
    return '\n'.join(lines)
