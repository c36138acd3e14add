"""Running the sample configs through mmengine's real Runner in tests."""
import uuid
from pathlib import Path
from typing import Any, Dict, List

from mmengine.config import Config
from mmengine.runner import Runner

import fast_parallel


def sample_config(path: str, data: Path, work_dir: Path, fast: bool,
                  **overrides: Any) -> Config:
    """A sample config pointed at ``data``, on the fast or the stock path.

    Args:
        path (str): The config file.
        data (Path): Folder holding ``coco/`` and ``kitti/``.
        work_dir (Path): The run's work dir.
        fast (bool): Keep the fast path (True) or remove it (False).
        **overrides: Merged into the config (``Config.merge_from_dict``).

    Returns:
        Config: The config.
    """
    text = Config.fromfile(path).pretty_text.replace(
        'data/sample/', str(data) + '/')
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
