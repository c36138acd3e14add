"""The configs the benchmarks run, and their data.

Each preset is a config of this repository plus the kind of data it reads
(``coco`` or ``kitti``), which :func:`data_options` points at a folder made by
``tools/make_sample_data.py``.
"""
import os.path as osp
from pathlib import Path
from typing import Dict, List, Union

from mmengine.config import Config

#: The repository root (configs are relative to it).
ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

#: name -> (config path relative to the repository root, data kind).
PRESETS: Dict[str, tuple] = {
    'yolox_s': ('configs/yolox/yolox_s_fast_8xb8-300e_coco.py', 'coco'),
    'pointpillars':
    ('configs/pointpillars/'
     'pointpillars_hv_secfpn_fast_8xb6-160e_kitti-3d-car.py', 'kitti'),
    'yolox_tiny_sample': ('configs/yolox/yolox_tiny_fast_sample.py', 'coco'),
    'pointpillars_sample': ('configs/pointpillars/'
                            'pointpillars_hv_secfpn_fast_sample.py', 'kitti'),
}


def data_options(kind: str, root: Union[str, Path]) -> List[str]:
    """``--cfg-options`` pointing a config's data at ``root``.

    Works for the YOLOX configs (``MultiImageMixDataset`` around a
    ``CocoDataset``) and the PointPillars configs (``RepeatDataset`` around a
    ``KittiDataset``, ``ObjectSample`` third in the train pipeline).

    Args:
        kind (str): 'yolox' / 'coco' or 'pointpillars' / 'kitti'.
        root (str | Path): Folder holding ``coco/`` and ``kitti/``.

    Returns:
        list[str]: ``key=value`` strings for the tools.
    """
    if kind in ('yolox', 'coco'):
        coco = f'{root}/coco/'
        ann = f'{coco}annotations/instances_val2017.json'
        return [
            f'train_dataloader.dataset.dataset.data_root={coco}',
            f'val_dataloader.dataset.data_root={coco}',
            f'test_dataloader.dataset.data_root={coco}',
            f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}'
        ]
    if kind not in ('pointpillars', 'kitti'):
        raise ValueError(f'no data options for {kind!r}')
    kitti = f'{root}/kitti/'
    sampler = 'train_dataloader.dataset.dataset.pipeline.2.db_sampler'
    return [
        f'train_dataloader.dataset.dataset.data_root={kitti}',
        f'{sampler}.data_root={kitti}',
        f'{sampler}.info_path={kitti}kitti_dbinfos_train.pkl',
        f'val_dataloader.dataset.data_root={kitti}',
        f'test_dataloader.dataset.data_root={kitti}',
        f'val_evaluator.ann_file={kitti}kitti_infos_val.pkl',
        f'test_evaluator.ann_file={kitti}kitti_infos_val.pkl'
    ]


def load_preset(name: str, data: Union[str, Path]) -> Config:
    """A preset's config, reading its data from ``data``.

    Args:
        name (str): A key of :data:`PRESETS`.
        data (str | Path): Folder holding ``coco/`` and ``kitti/``.

    Returns:
        Config: The config (still on the fast path, as in the file).
    """
    if name not in PRESETS:
        raise ValueError(f'unknown preset {name!r}; one of {list(PRESETS)}')
    path, kind = PRESETS[name]
    cfg = Config.fromfile(osp.join(ROOT, path))
    cfg.merge_from_dict(
        dict(option.split('=', 1) for option in data_options(kind, data)))
    return without_accuracy_check(cfg)


def without_accuracy_check(cfg: Config) -> Config:
    """Drops ``AccuracyParityHook`` from a config, in place.

    The full configs check the final validation against published figures;
    a benchmark does not validate.

    Args:
        cfg (Config): A config.

    Returns:
        Config: ``cfg``.
    """
    cfg.custom_hooks = [
        h for h in cfg.get('custom_hooks', None) or []
        if h.get('type') != 'AccuracyParityHook'
    ]
    return cfg
