"""Real YOLOX / PointPillars models and batches, small enough for CPU tests."""
import os.path as osp
import random
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from torch import nn

from fast_parallel.bench.synthetic import pointpillars_samples, yolox_samples

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = {
    'yolox':
    osp.join(ROOT, 'configs/yolox/yolox_tiny_fast_sample.py'),
    'pointpillars':
    osp.join(ROOT,
             'configs/pointpillars/pointpillars_hv_secfpn_fast_sample.py'),
}


def seed_all(seed: int) -> None:
    """Seeds every generator the models and augmentations use."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(kind: str, seed: int = 0) -> nn.Module:
    """Builds the sample config's model with its real registry, seeded.

    Args:
        kind (str): 'yolox' or 'pointpillars'.
        seed (int): Seed for the weight initialisation. Defaults to 0.

    Returns:
        nn.Module: The initialised model, on CPU.
    """
    cfg = Config.fromfile(CONFIGS[kind])
    init_default_scope(cfg.default_scope)
    if kind == 'yolox':
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    else:
        from mmdet3d.registry import MODELS
        from mmdet3d.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    seed_all(seed)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model


def sample_batches(kind: str,
                   steps: int,
                   batch_size: int = 2) -> List[List[Dict]]:
    """Per step, the packed samples of one batch (different every step).

    Args:
        kind (str): 'yolox' or 'pointpillars'.
        steps (int): Number of batches.
        batch_size (int): Samples per batch. Defaults to 2.

    Returns:
        list[list[dict]]: ``steps`` lists of ``batch_size`` samples.
    """
    make: Callable = {
        'yolox':
        lambda n, s: yolox_samples(n, size=128, max_boxes=6, seed=s),
        'pointpillars':
        lambda n, s: pointpillars_samples(n, 1500, 2500, max_boxes=4, seed=s),
    }[kind]
    return [make(batch_size, 1000 + i) for i in range(steps)]


def snapshot(model: nn.Module) -> Dict[str, torch.Tensor]:
    """A detached copy of a model's state dict."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_tensors(a: Dict[str, torch.Tensor],
                        b: Dict[str, torch.Tensor]) -> Tuple[int, int]:
    """Asserts two name->tensor dicts are bitwise equal.

    Returns:
        tuple[int, int]: (number of tensors, number of elements) compared.
    """
    assert list(a) == list(b)
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f'{len(different)} tensors differ: {different[:5]}'
    return len(a), sum(v.numel() for v in a.values())
