"""The configs the benchmarks run, and their data.

A preset is a config, the kind of data it reads (which :func:`data_options`
points at a folder made by ``tools/make_sample_data.py``) and a few
overrides for a CPU machine without network. A repository config is on the
fast path already; an upstream one (``mmdet::...``, ``mmdet3d::...``) gets
the two config lines a user adds (``custom_imports`` and
``FastParallelHook``), nothing else of the fast path.

Repository configs (``configs/...``) are read from a configs root, a clone's
root: ``tools/benchmark.py`` passes its own clone (``--configs-root``), and
the functions here default to the current directory, so that an installed
fast_parallel finds them too (``docs/tools.md``).
"""
import ast
import os.path as osp
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Tuple, Union

from mmengine.config import Config
from mmengine.utils import import_modules_from_strings

from fast_parallel.config import is_enabled

PathLike = Union[str, Path]


class Preset(NamedTuple):
    """A config of the benchmarks."""
    #: A repository config, ``configs/...`` (see :func:`config_path`), or
    #: ``mmdet::`` / ``mmdet3d::``.
    config: str
    #: 'yolox', 'mmdet', 'kitti' or 'nuscenes' (see :func:`data_options`).
    data: str
    #: ``--cfg-options`` strings (values as the tools parse them).
    options: Tuple[str, ...] = ()


#: No pretrained weights to download, two workers.
_OFFLINE = ('model.backbone.init_cfg=None', 'train_dataloader.num_workers=2')
#: Batch 8 at 640 px, the size the counts are for.
_MMDET_640 = _OFFLINE + ('train_dataloader.batch_size=8',
                         'train_dataloader.dataset.pipeline.2.scale=(640,640)')

#: DETR recipes: one 224 px resize as the only choice of their random
#: choice of scales (up to 1333 px), so that batch 16 fits a CPU's memory
#: (DINO did not in 23 GB at batch 8 and 640 px, nor at 16 and 320 px: the
#: CPU's deformable attention); the operations per iteration do not depend
#: on the image size (DINO, batch 2: 12,628 at 320 px and at 1333).
_DETR_SMALL = _OFFLINE + (
    "train_dataloader.dataset.pipeline.3.transforms=[[{'type': 'Resize', "
    "'scale': (224, 224), 'keep_ratio': True}]]", )

PRESETS: Dict[str, Preset] = {
    'yolox_s':
    Preset('configs/yolox/yolox_s_fast_8xb8-300e_coco.py', 'yolox'),
    'pointpillars':
    Preset(
        'configs/pointpillars/'
        'pointpillars_hv_secfpn_fast_8xb6-160e_kitti-3d-car.py', 'kitti'),
    'yolox_tiny_sample':
    Preset('configs/yolox/yolox_tiny_fast_sample.py', 'yolox'),
    'pointpillars_sample':
    Preset('configs/pointpillars/pointpillars_hv_secfpn_fast_sample.py',
           'kitti'),
    'rtmdet_tiny':
    Preset('mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py', 'mmdet',
           _OFFLINE + ('train_dataloader.batch_size=8', )),
    'retinanet_r50':
    Preset('mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', 'mmdet',
           _MMDET_640),
    'faster_rcnn_r50':
    Preset('mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', 'mmdet',
           _MMDET_640),
    'mask_rcnn_r50':
    Preset('mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', 'mmdet',
           _MMDET_640),
    'fcos_r50':
    Preset('mmdet::fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py', 'mmdet',
           _MMDET_640),
    'atss_r50':
    Preset('mmdet::atss/atss_r50_fpn_1x_coco.py', 'mmdet', _MMDET_640),
    'gfl_r50':
    Preset('mmdet::gfl/gfl_r50_fpn_1x_coco.py', 'mmdet', _MMDET_640),
    'tood_r50':
    Preset('mmdet::tood/tood_r50_fpn_1x_coco.py', 'mmdet', _MMDET_640),
    'cascade_rcnn_r50':
    Preset('mmdet::cascade_rcnn/cascade-rcnn_r50_fpn_1x_coco.py', 'mmdet',
           _MMDET_640),
    'dino_r50':
    Preset('mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', 'mmdet',
           _DETR_SMALL + ('train_dataloader.batch_size=8', )),
    'deformable_detr_r50':
    Preset(
        'mmdet::deformable_detr/'
        'deformable-detr-refine-twostage_r50_16xb2-50e_coco.py', 'mmdet',
        _DETR_SMALL + ('train_dataloader.batch_size=8', )),
    'detr_r18':
    Preset('mmdet::detr/detr_r18_8xb2-500e_coco.py', 'mmdet',
           _DETR_SMALL + ('train_dataloader.batch_size=2', )),
    'centerpoint_pillar':
    Preset(
        'mmdet3d::centerpoint/'
        'centerpoint_pillar02_second_secfpn_8xb4-cyclic-20e_nus-3d.py',
        'nuscenes', ('train_dataloader.num_workers=2', )),
}


def data_options(kind: str, root: PathLike) -> List[str]:
    """``--cfg-options`` pointing a config's data at ``root``.

    Args:
        kind (str): 'yolox' (also 'coco': a ``MultiImageMixDataset`` around
            a ``CocoDataset``), 'mmdet' (a ``CocoDataset``), 'pointpillars'
            / 'kitti' (a ``RepeatDataset`` around a ``KittiDataset``,
            ``ObjectSample`` third in the train pipeline) or 'nuscenes' (a
            ``CBGSDataset`` around a ``NuScenesDataset``, ``ObjectSample``
            fourth, as in mmdet3d's CenterPoint configs).
        root (str | Path): Folder holding ``coco/``, ``kitti/`` and
            ``nuscenes/``.

    Returns:
        list[str]: ``key=value`` strings for the tools.
    """
    if kind in ('yolox', 'coco', 'mmdet'):
        coco = f'{root}/coco/'
        ann = f'{coco}annotations/instances_val2017.json'
        train = 'train_dataloader.dataset' + ('' if kind == 'mmdet' else
                                              '.dataset')
        return [
            f'{train}.data_root={coco}',
            f'val_dataloader.dataset.data_root={coco}',
            f'test_dataloader.dataset.data_root={coco}',
            f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}'
        ]
    if kind == 'nuscenes':
        nus = f'{root}/nuscenes/'
        train = 'train_dataloader.dataset.dataset'
        sampler = f'{train}.pipeline.3.db_sampler'
        return [
            f'{train}.data_root={nus}', f'{sampler}.data_root={nus}',
            f'{sampler}.info_path={nus}nuscenes_dbinfos_train.pkl',
            f'{sampler}.type=DataBaseSamplerNp124'
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


def preset_options(name: str, data: PathLike) -> List[str]:
    """Every ``--cfg-options`` string of a preset: its data, then its own.

    Args:
        name (str): A key of :data:`PRESETS`.
        data (str | Path): The data folder.

    Returns:
        list[str]: ``key=value`` strings.
    """
    preset = PRESETS[name]
    return data_options(preset.data, data) + list(preset.options)


def _value(text: str) -> Any:
    """A ``--cfg-options`` value: a Python literal, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def with_fast_lines(cfg: Config) -> Config:
    """The two config lines of the README, added to ``cfg`` in place.

    Args:
        cfg (Config): An upstream config.

    Returns:
        Config: ``cfg``, importing ``fast_parallel`` (and the fixed database
        sampler some mmdet3d recipes need on numpy 1.24 .. 1.26) and with a
        ``FastParallelHook`` after its own custom hooks.
    """
    imports = ['fast_parallel']
    if 'mmdet3d' in str(cfg.get('default_scope', '')):
        imports.append('fast_parallel.contrib.db_sampler')
    cfg.custom_imports = dict(imports=imports, allow_failed_imports=False)
    cfg.custom_hooks = list(cfg.get('custom_hooks', None)
                            or []) + [dict(type='FastParallelHook')]
    # what Config.fromfile does with a file's custom_imports
    import_modules_from_strings(**cfg.custom_imports)
    return cfg


def config_path(config: str, configs_root: PathLike = '.') -> str:
    """Where a repository config (``configs/...``) is read from.

    Args:
        config (str): The config, relative to a clone's root.
        configs_root (str | Path): The folder holding ``configs/`` (a
            clone's root). Defaults to the current directory.

    Returns:
        str: ``configs_root/config``.

    Raises:
        FileNotFoundError: When there is no such file (the message says
            how to point at the configs).
    """
    path = osp.join(str(configs_root), config)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'no {config} under {osp.abspath(str(configs_root))}: run from '
            'a clone of fast_parallel, or point --configs-root at one')
    return path


def load_preset(name: str,
                data: PathLike,
                configs_root: PathLike = '.') -> Config:
    """A preset's config, reading its data from ``data``.

    Args:
        name (str): A key of :data:`PRESETS`.
        data (str | Path): Folder holding ``coco/``, ``kitti/`` and
            ``nuscenes/``.
        configs_root (str | Path): The folder holding the repository's
            ``configs/`` (:func:`config_path`). Defaults to the current
            directory.

    Returns:
        Config: The config on the fast path.
    """
    if name not in PRESETS:
        raise ValueError(f'unknown preset {name!r}; one of {list(PRESETS)}')
    preset = PRESETS[name]
    cfg = load_config(preset.config if '::' in preset.
                      config else config_path(preset.config, configs_root))
    cfg.merge_from_dict({
        key: _value(value)
        for key, value in (option.split('=', 1)
                           for option in preset_options(name, data))
    })
    return cfg


def load_config(config: str) -> Config:
    """A user's config (a file, or ``mmdet::`` / ``mmdet3d::``), on the
    fast path, its data where it says.

    Args:
        config (str): The config.

    Returns:
        Config: The config, with the two config lines of the README added
        (:func:`with_fast_lines`) when it has no ``FastParallelHook``.

    Raises:
        FileNotFoundError: When ``config`` is neither an upstream name nor
            a file.
    """
    if '::' in config:
        from mmengine.hub import get_config
        cfg = get_config(config)
    elif osp.isfile(config):
        cfg = Config.fromfile(config)
    else:
        raise FileNotFoundError(
            f'no config {config!r}: a file, or mmdet::... / mmdet3d::...')
    if not is_enabled(cfg):
        with_fast_lines(cfg)
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
