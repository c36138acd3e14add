"""Stock path vs fast path, the same config and seed, side by side.

``run_parity(cfg, iters)`` trains both runs in this process and compares
them; ``tools/parity.py`` is its command line. ``PerturbFirstBatchHook``
lives here so that the tool, which imports this module, can always name it.
What is recorded and compared: ``docs/parity.md``.
"""
import contextlib
import copy
import os
import os.path as osp
import uuid
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import Runner

from fast_parallel.config import disable, enable
from fast_parallel.data.handout import packed_batch_of
from fast_parallel.parity.recorder import (ParityRecorderHook, ema_state,
                                           params_checksum, tree_checksum)
from fast_parallel.parity.report import ORDER_ROW, compare, verdict

PATHS = ('stock', 'fast')


@HOOKS.register_module()
class PerturbFirstBatchHook(Hook):
    """Adds 1.0 to one value of the first training batch: a known change.

    For ``tools/parity.py --fast-hooks PerturbFirstBatchHook``: the fast run
    then trains on a batch that differs from stock's in one number (the
    first element of the float32 buffer of a packed batch, else of the first
    floating-point tensor found), and the report must say DIFFERENT. It
    shows the checker is awake; nothing else uses it.
    """

    def before_train_iter(self,
                          runner: Runner,
                          batch_idx: int,
                          data_batch: Any = None) -> None:
        """Changes the first batch in place."""
        if batch_idx != 0 or getattr(runner, 'iter', 0) != 0:
            return
        packed = packed_batch_of(data_batch)
        if packed is not None:  # the batch's leaves view these buffers
            buffer = packed.buffers.get(torch.float32)
            if buffer is None:
                buffer = next(b for b in packed.buffers.values())
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


#: What cuBLAS needs to run deterministically (CUDA >= 10.2), and what
#: ``torch.use_deterministic_algorithms(True)`` asks for.
CUBLAS_WORKSPACE = ('CUBLAS_WORKSPACE_CONFIG', ':4096:8')


def cuda_determinism(deterministic: bool,
                     environ: Optional[dict] = None,
                     cuda_available: Optional[bool] = None,
                     cuda_initialized: Optional[bool] = None) -> Optional[str]:
    """Makes a deterministic run on CUDA possible, or says why it is not.

    With mmengine's deterministic switch on, a cuBLAS call raises unless
    ``CUBLAS_WORKSPACE_CONFIG`` is set before cuBLAS starts. Where it is
    unset, this sets it to ``:4096:8`` (cuBLAS reads it when torch first
    uses it, later in this process); where CUDA was already in use, that may
    be too late, so it stops with what to set instead.

    Args:
        deterministic (bool): The runs' deterministic switch.
        environ (dict, optional): The environment. Defaults to
            ``os.environ``.
        cuda_available (bool, optional): Defaults to
            ``torch.cuda.is_available()``.
        cuda_initialized (bool, optional): Defaults to
            ``torch.cuda.is_initialized()``.

    Returns:
        str | None: A line for the log when it set the variable, else None.

    Raises:
        RuntimeError: When the variable is unset and CUDA already started.
    """
    environ = os.environ if environ is None else environ
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not deterministic or not cuda_available or \
            CUBLAS_WORKSPACE[0] in environ:
        return None
    if cuda_initialized is None:
        cuda_initialized = torch.cuda.is_initialized()
    name, value = CUBLAS_WORKSPACE
    if cuda_initialized:
        raise RuntimeError(
            f'deterministic parity on CUDA needs {name}={value} (or :16:8) '
            'in the environment before CUDA starts, and CUDA has started in '
            f'this process already: run `export {name}={value}` first, or '
            'pass deterministic=False / --no-deterministic.')
    environ[name] = value
    return (f'set {name}={value}: cuBLAS is deterministic only with it, and '
            'the runs use torch.use_deterministic_algorithms(True)')


# yapf: disable
def parity_config(cfg: Config, path: str, iters: int, evaluate: bool,
                  work_dir: str, seed: int = 0, deterministic: bool = True,
                  fast_hooks: Sequence[str] = ()) -> Config:
    # yapf: enable
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
        cfg.custom_hooks = list(cfg.get(
            'custom_hooks', [])) + [dict(type=t) for t in fast_hooks]
    return cfg


@contextlib.contextmanager
def same_cpu_threads(notes: List[str]) -> Iterator[Callable[[str], None]]:
    """Starts every run of a block at the CPU thread count of its start.

    A run can change torch's intra-op thread count for the rest of the
    process: numba's parallel kernels (``parallel=True``, e.g. mmdet3d's
    KITTI overlaps) set OpenMP's count, which torch reads as its own. A
    second run would then compute on another count, and a CPU reduction
    split another way can round differently. The block yields
    ``start_run(path)``, which puts the count back before a run and adds a
    line to ``notes`` when it had changed; on exit the count is put back.

    Args:
        notes (list[str]): Gets one line per count put back.

    Yields:
        callable: ``start_run(path)``, called before each run.
    """
    threads = torch.get_num_threads()
    previous: List[str] = []

    def start_run(path: str) -> None:
        now = torch.get_num_threads()
        if now != threads:
            notes.append(
                f'the {previous[-1]} run left torch at {now} CPU threads '
                f'(numba\'s parallel kernels, e.g. mmdet3d\'s KITTI '
                f'evaluation, set them); the {path} run started at '
                f'{threads}, as the {previous[0]} run did')
            torch.set_num_threads(threads)
        previous.append(path)

    try:
        yield start_run
    finally:
        torch.set_num_threads(threads)


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
        k: v.detach().cpu().clone()
        for k, v in model.state_dict().items()
    }
    return record


def epoch_switch_notes(cfg: Config) -> List[str]:
    """What the recipes' epoch-switch hooks do in a parity run.

    A parity run is iteration-based: its loop has one epoch (mmengine gives
    ``max_epochs`` 1), so ``YOLOXModeSwitchHook`` switches at the start
    when ``num_last_epochs >= 0`` and never otherwise, and
    ``PipelineSwitchHook`` at the start when ``switch_epoch <= 0`` and
    never otherwise (read in mmdet 3.3.0).

    Args:
        cfg (Config): The config both runs start from.

    Returns:
        list[str]: One line per such hook: which pipeline both runs use,
        and the setting that compares the other.
    """
    notes = []
    for hook in cfg.get('custom_hooks', None) or []:
        kind = hook.get('type', '')
        kind = getattr(kind, '__name__', str(kind)).rsplit('.', 1)[-1]
        if kind == 'YOLOXModeSwitchHook':
            last = hook.get('num_last_epochs', 15)
            skipped = ', '.join(
                hook.get('skip_type_keys',
                         ('Mosaic', 'RandomAffine', 'MixUp')))
            notes.append(f'YOLOXModeSwitchHook(num_last_epochs={last}) ' + (
                f'switches at the start (a parity run has one epoch): '
                f'both runs use the last epochs\' pipeline, without '
                f'{skipped}; num_last_epochs=-1 compares the mixing '
                f'epochs' if last >=
                0 else 'never switches in a parity run: both runs mix; '
                'num_last_epochs=0 compares the last epochs'))
        elif kind == 'PipelineSwitchHook':
            epoch = hook.get('switch_epoch')
            notes.append(f'PipelineSwitchHook(switch_epoch={epoch}) ' + (
                'switches at the start (a parity run has one epoch): both '
                'runs use its switch_pipeline; a positive switch_epoch '
                'compares the first pipeline' if epoch is not None
                and epoch <= 0 else 'never switches in a parity run: both '
                'runs use the first pipeline; switch_epoch=0 compares its '
                'switch_pipeline'))
    return notes


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

    Both runs start at the CPU thread count torch had on entry
    (:func:`same_cpu_threads`), which is also what torch has on return.

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
        (:func:`fast_parallel.parity.report.compare`), ``order`` (the
        training-order row), ``verdict`` ('IDENTICAL' / 'DIFFERENT') and
        ``ok``.
    """
    cuda_determinism(deterministic)  # tools/parity.py says it set it
    records, notes = {}, epoch_switch_notes(cfg)
    with same_cpu_threads(notes) as start_run:
        for path in PATHS:
            run_cfg = parity_config(cfg, path, iters, evaluate, work_dir, seed,
                                    deterministic, fast_hooks)
            tick = None if progress is None else (
                lambda path=path: progress(path))
            os.makedirs(run_cfg.work_dir, exist_ok=True)
            start_run(path)
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
    return dict(
        records=records,
        rows=rows,
        order=order,
        verdict=result,
        ok=result == 'IDENTICAL',
        notes=notes)
