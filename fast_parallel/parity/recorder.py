"""What one parity run records: sample ids, losses, gradients, checksums.

``ParityRecorderHook`` keeps, per iteration, the ids of the batch's samples,
every loss term and the gradient norm before each optimizer step; the
checksums cover the parameters, the optimizer state and the EMA weights, bit
for bit. How a parity run works: ``docs/parity.md``.
"""
import functools
import hashlib
from collections.abc import Mapping
from typing import Any, Dict, List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

from fast_parallel.data.batch import PackedBatch
from fast_parallel.data.handout import packed_batch_of

#: Metainfo keys that name a sample, in the order they are looked for: the
#: dataset's sample index (mmdet ``img_id``, mmdet3d ``sample_idx``), then
#: the file it was read from.
SAMPLE_ID_KEYS = ('img_id', 'sample_idx', 'img_path', 'lidar_path')


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
        found = {
            name: v[i]
            for name, v in per_branch.items()
            if i < len(v) and v[i] is not None
        }
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
        record.update(
            order=[],
            losses=[],
            grad_norm=[],
            grad_norm_clipped=[],
            clip_grad=None,
            metrics={},
            packed=0,
            predictions=None)
        self._predictions = hashlib.sha256()
        # how many gradient norms mmengine had logged at the last step
        self._logged: Dict[int, int] = {}

    def before_train(self, runner: Runner) -> None:
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

    def _before_step(self, wrapper: Any, clip: Optional[dict],
                     optimizer: torch.optim.Optimizer, args: tuple,
                     kwargs: dict) -> None:
        """Records the norm of the gradients this step will apply."""
        squares = [
            p.grad.detach().double().pow(2).sum()
            for group in optimizer.param_groups for p in group['params']
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

    def before_train_iter(self,
                          runner: Runner,
                          batch_idx: int,
                          data_batch: Any = None) -> None:
        """Keeps the batch's sample ids; counts the batches that arrive
        packed (the fast path at work)."""
        self.record['order'].append(batch_sample_ids(data_batch))
        self.record['packed'] += packed_batch_of(data_batch) is not None

    def after_train_iter(self,
                         runner: Runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        """Keeps this iteration's loss terms."""
        self.record['losses'].append({
            k:
            float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
            for k, v in (outputs or {}).items()
        })
        if self.progress is not None:
            self.progress()

    def after_val_iter(self,
                       runner: Runner,
                       batch_idx: int,
                       data_batch: Any = None,
                       outputs: Optional[list] = None) -> None:
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

    def after_val_epoch(self,
                        runner: Runner,
                        metrics: Optional[dict] = None) -> None:
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
