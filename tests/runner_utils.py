"""Running the sample configs through mmengine's real Runner in tests."""
import os
import uuid
from pathlib import Path
from typing import Any, Dict, List

import torch
from mmengine.config import Config
from mmengine.runner import Runner

import fast_parallel
from fast_parallel.bench.presets import data_options  # noqa: F401

#: torch's CPU thread count when the tests started; :func:`sample_config`
#: and every test start on it (``conftest.py``), since a run may change it
#: (numba's parallel kernels in mmdet3d's KITTI evaluation set numba's).
START_THREADS = torch.get_num_threads()

#: The tests folder: on PYTHONPATH, subprocess configs import crash_hook.
TESTS = str(Path(__file__).resolve().parent)


def sample_config(path: str, data: Path, work_dir: Path, fast: bool,
                  **overrides: Any) -> Config:
    """A sample config pointed at ``data``, on the fast or the stock path.

    Also puts torch's CPU thread count back to :data:`START_THREADS`, so
    that the runs a test compares start on the same count.

    Args:
        path (str): The config file.
        data (Path): Folder holding ``coco/`` and ``kitti/``.
        work_dir (Path): The run's work dir.
        fast (bool): Keep the fast path (True) or remove it (False).
        **overrides: Merged into the config (``Config.merge_from_dict``).

    Returns:
        Config: The config.
    """
    text = Config.fromfile(path).pretty_text.replace('data/sample/',
                                                     str(data) + '/')
    torch.set_num_threads(START_THREADS)  # the runs compared start alike
    cfg = Config.fromstring(text, '.py')
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = f'{"fast" if fast else "stock"}_{uuid.uuid4().hex}'
    cfg.randomness = dict(seed=0)
    cfg.merge_from_dict(overrides)
    return cfg if fast else fast_parallel.disable(cfg)


def loss_history(runner: Runner) -> Dict[str, List[float]]:
    """Every logged training loss of every iteration."""
    out = {}
    for key, buf in runner.message_hub.log_scalars.items():
        if key.startswith('train/loss') or key == 'train/grad_norm':
            out[key] = buf.data[0].tolist()
    return out


def with_fault_hook(cfg: Config, hook: str, path: Path) -> Path:
    """Writes ``cfg`` plus one hook of ``crash_hook.py`` for the tools.

    Args:
        cfg (Config): The config.
        hook (str): A hook type defined in ``tests/crash_hook.py``.
        path (Path): Where to write the config.

    Returns:
        Path: ``path``; run it with :func:`fault_env`.
    """
    cfg.custom_imports['imports'] = list(
        cfg.custom_imports['imports']) + ['crash_hook']
    cfg.custom_hooks = list(cfg.custom_hooks) + [dict(type=hook)]
    cfg.dump(str(path))
    return path


def fault_env(**variables: str) -> Dict[str, str]:
    """This process's environment with ``crash_hook`` importable.

    Args:
        **variables: Set on top (e.g. ``FP_KILL_AT_ITER='6'``); the fault
            variables not given are removed.

    Returns:
        dict: The environment for a tool's subprocess.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('FP_KILL_AT_ITER', 'FP_KILL_RANK', 'FP_KILL_STAMP',
                     'FP_RAISE_AT_ITER', 'FP_RAISE_RANK', 'FP_RECORD_DIR')
    }
    env.update(variables, PYTHONPATH=TESTS)
    return env


def checkpoint_tensors(path: Path) -> Dict[str, Any]:
    """Every tensor a checkpoint holds: model, EMA, optimizer state.

    Args:
        path (Path): The checkpoint (loaded with ``weights_only=True``).

    Returns:
        dict: ``model.<key>``, ``ema.<key>``, ``optim.<param>.<key>``.
    """
    import torch
    ckpt = torch.load(path)
    tensors = {f'model.{k}': v for k, v in ckpt['state_dict'].items()}
    tensors.update({f'ema.{k}': v for k, v in ckpt['ema_state_dict'].items()})
    for pid, state in ckpt['optimizer']['state'].items():
        tensors.update({
            f'optim.{pid}.{k}': v
            for k, v in state.items() if torch.is_tensor(v)
        })
    return tensors


def differing(a: Dict[str, Any], b: Dict[str, Any]) -> List[str]:
    """The keys whose tensors differ in dtype, shape or any byte."""
    import torch
    assert a.keys() == b.keys()
    return [
        k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
        or not torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(
            -1).view(torch.uint8))
    ]
