"""Shared set-up of the command-line tools (tools/*.py)."""
import argparse
import os
import os.path as osp
import subprocess
from typing import List, Optional

import torch
import torch.distributed as dist
from mmengine.config import Config, DictAction
from mmengine.registry import MODEL_WRAPPERS
from torch.nn.parallel import DistributedDataParallel

from fast_parallel.config import disable, enable, is_enabled


def init_cpu_distributed(cfg: Config) -> None:
    """Starts gloo for a launcher run on a machine without CUDA.

    mmengine's ``init_dist`` for the ``pytorch`` and ``slurm`` launchers
    always calls ``torch.cuda.set_device``, which a CPU build of torch does
    not have. With no CUDA, this joins the process group itself (gloo, from
    the ``torchrun`` environment, or from Slurm's as mmengine reads it:
    :func:`slurm_environment`) before the Runner is built; the Runner then
    sees an initialised group and skips its own ``init_dist``.

    The Runner also gives every ``DistributedDataParallel`` it builds
    ``device_ids=[LOCAL_RANK]``, which DDP refuses for a model on the CPU.
    So that stock (``--no-fast``) and fast runs both train, with the same
    wrapper settings, the config's wrapper is made explicit here (see
    :func:`cpu_model_wrapper_cfg`).

    Args:
        cfg (Config): The config; its ``env_cfg.dist_cfg.backend`` is set to
            ``'gloo'`` and its ``model_wrapper_cfg`` completed when this
            starts the group.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher == 'none' or torch.cuda.is_available():
        return
    if not dist.is_initialized():
        if launcher == 'slurm':
            slurm_environment(
                cfg.get('env_cfg', {}).get('dist_cfg', {}).get('port', None))
        dist.init_process_group(backend='gloo')
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = \
        'gloo'
    cfg.model_wrapper_cfg = cpu_model_wrapper_cfg(cfg)


def slurm_environment(port: Optional[int] = None) -> None:
    """The ``torch.distributed`` environment of a Slurm task, as mmengine's
    ``_init_dist_slurm`` sets it (mmengine 0.10.7), without its
    ``torch.cuda.set_device``: ``RANK`` (``SLURM_PROCID``), ``WORLD_SIZE``
    (``SLURM_NTASKS``), ``LOCAL_RANK`` (``SLURM_LOCALID``), ``MASTER_ADDR``
    (the first host of ``SLURM_NODELIST``, from ``scontrol``, unless set)
    and ``MASTER_PORT`` (``port``, else the environment's, else 29500).

    Args:
        port (int, optional): ``env_cfg.dist_cfg.port``. Defaults to None.
    """
    proc_id = int(os.environ['SLURM_PROCID'])
    if port is not None:
        os.environ['MASTER_PORT'] = str(port)
    else:
        os.environ.setdefault('MASTER_PORT', '29500')
    if 'MASTER_ADDR' not in os.environ:
        nodes = os.environ['SLURM_NODELIST']
        os.environ['MASTER_ADDR'] = subprocess.getoutput(
            f'scontrol show hostname {nodes} | head -n1')
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')
    os.environ['RANK'] = str(proc_id)


def cpu_model_wrapper_cfg(cfg: Config) -> Optional[dict]:
    """The ``model_wrapper_cfg`` that builds the Runner's wrapper on the CPU.

    Without a ``model_wrapper_cfg`` the Runner builds
    ``MMDistributedDataParallel`` with ``device_ids=[LOCAL_RANK]``,
    ``broadcast_buffers=False`` and the config's ``find_unused_parameters``
    (False when it has none); this returns exactly that with
    ``device_ids=None``. A config's own ``model_wrapper_cfg`` for a
    ``DistributedDataParallel`` subclass gets ``device_ids=None`` and nothing
    else (keys of the config win over the Runner's ``default_args``); any
    other wrapper is returned unchanged.

    Args:
        cfg (Config): The config.

    Returns:
        dict, optional: The wrapper config (the config's own object,
        completed, when it has one).
    """
    wrapper = cfg.get('model_wrapper_cfg', None)
    if wrapper is None:
        return dict(
            type='MMDistributedDataParallel',
            device_ids=None,
            broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))
    kind = wrapper.get('type', 'MMDistributedDataParallel')
    if isinstance(kind, str):
        kind = MODEL_WRAPPERS.get(kind)
    if isinstance(kind, type) and issubclass(kind, DistributedDataParallel):
        wrapper['device_ids'] = None
    return wrapper


def apply_common_args(cfg: Config, config_path: str, work_dir: Optional[str],
                      launcher: str, fast: Optional[bool]) -> Config:
    """Work dir, launcher and the fast-path switch, as the tools share them.

    Args:
        cfg (Config): The loaded config (``--cfg-options`` merged).
        config_path (str): The config file (names the default work dir).
        work_dir (str, optional): ``--work-dir``.
        launcher (str): ``--launcher``.
        fast (bool, optional): ``--fast`` (True), ``--no-fast`` (False) or
            neither (None: as the config says).

    Returns:
        Config: ``cfg``, changed.
    """
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(config_path))[0])
    if fast is True or (fast is None and is_enabled(cfg)):
        enable(cfg)  # also completes a fast config (its hooks)
    elif fast is False:
        disable(cfg)
    init_cpu_distributed(cfg)
    return cfg


def load_config(args: argparse.Namespace) -> Config:
    """The config of ``args.config`` with the shared switches applied.

    ``--cfg-options`` merged, then :func:`apply_common_args` (work dir,
    launcher, fast path).

    Args:
        args (argparse.Namespace): From :func:`parse_common_args`; needs
            ``config``, ``cfg_options``, ``work_dir``, ``launcher``, ``fast``.

    Returns:
        Config: The config.
    """
    cfg = Config.fromfile(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    return apply_common_args(cfg, args.config, args.work_dir, args.launcher,
                             args.fast)


def build_runner(cfg: Config):
    """The Runner, as mmdet's tools build it (``runner_type`` honoured).

    Args:
        cfg (Config): The config.

    Returns:
        Runner: The runner.
    """
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' not in cfg:
        return Runner.from_cfg(cfg)
    return RUNNERS.build(cfg)


def parse_common_args(parser: argparse.ArgumentParser,
                      argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Adds the flags train.py and test.py share, then parses.

    ``--fast`` / ``--no-fast``, ``--cfg-options``, ``--launcher`` and
    ``--local_rank`` (which sets ``LOCAL_RANK`` when the launcher did not).

    Args:
        parser (ArgumentParser): The tool's parser with its own arguments.
        argv (list[str], optional): The command line. Defaults to
            ``sys.argv[1:]``.

    Returns:
        argparse.Namespace: The parsed arguments.
    """
    parser.add_argument(
        '--fast',
        action=argparse.BooleanOptionalAction,
        default=None,
        help='--fast: switch the fast data path on; --no-fast: off; '
        'neither: as the config says')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings of the config, key=value')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def use_amp(cfg: Config, tool: str) -> None:
    """``--amp``: mmengine's ``AmpOptimWrapper`` (dynamic loss scale), as
    mmdet's ``tools/train.py --amp`` sets it.

    Args:
        cfg (Config): The config, changed in place.
        tool (str): The tool's name, for the message.

    Raises:
        SystemExit: On a machine without an accelerator, where mmengine's
            ``AmpOptimWrapper`` would assert: what to do instead.
    """
    from mmengine.device import (is_mlu_available, is_musa_available,
                                 is_npu_available)
    if not (torch.cuda.is_available() or is_npu_available()
            or is_mlu_available() or is_musa_available()):
        raise SystemExit(
            f'{tool}: --amp needs a GPU: mmengine\'s AmpOptimWrapper '
            'trains in mixed precision on CUDA (or NPU/MLU/MUSA) devices '
            'only, and this machine has none. Run without --amp here.')
    if cfg.optim_wrapper.get('type', 'OptimWrapper') != 'AmpOptimWrapper':
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.loss_scale = 'dynamic'


def visualize_config(cfg: Config, show: bool, show_dir: Optional[str],
                     wait_time: float) -> None:
    """``--show`` / ``--show-dir``: mmdet's ``trigger_visualization_hook``.

    Turns on drawing in ``default_hooks.visualization`` (mmdet's
    ``DetVisualizationHook``, mmdet3d's ``Det3DVisualizationHook``).

    Args:
        cfg (Config): The config, changed in place.
        show (bool): Show each prediction in a window.
        show_dir (str, optional): Save the painted images there (under the
            run's timestamp folder of the work dir).
        wait_time (float): Seconds each shown image stays.

    Raises:
        RuntimeError: The config has no visualization hook.
    """
    hooks = cfg.get('default_hooks') or {}
    if 'visualization' not in hooks:
        raise RuntimeError(
            'VisualizationHook must be included in default_hooks. refer to '
            'usage "visualization=dict(type=\'VisualizationHook\')"')
    hook = hooks['visualization']
    hook['draw'] = True
    if show:
        hook['show'] = True
        hook['wait_time'] = wait_time
    if show_dir:
        hook['test_out_dir'] = show_dir


def tta_config(cfg: Config) -> None:
    """``--tta``: the model under ``cfg.tta_model``, the test set through
    ``cfg.tta_pipeline``, as mmdet's ``tools/test.py --tta``.

    Where the config has neither, mmdet's defaults (``DetTTAModel`` with
    NMS at 0.5 IoU, horizontal flip on and off), with mmdet's warnings; an
    mmdet3d config must name both, as mmdet3d's tool requires.

    Args:
        cfg (Config): The config, changed in place.

    Raises:
        AssertionError: A config of another scope (mmdet3d) without
            ``tta_model`` or ``tta_pipeline``.
    """
    import copy
    import warnings

    from mmengine.config import ConfigDict
    scope = cfg.get('default_scope', 'mmdet')
    if scope != 'mmdet':  # mmdet3d's tools/test.py
        for key in ('tta_model', 'tta_pipeline'):
            if key not in cfg:
                raise AssertionError(f'Cannot find ``{key}`` in config.')
    if 'tta_model' not in cfg:
        warnings.warn('Cannot find ``tta_model`` in config, '
                      'we will set it as default.')
        cfg.tta_model = dict(
            type='DetTTAModel',
            tta_cfg=dict(
                nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
    if 'tta_pipeline' not in cfg:
        warnings.warn('Cannot find ``tta_pipeline`` in config, '
                      'we will set it as default.')
        test_data_cfg = cfg.test_dataloader.dataset
        while 'dataset' in test_data_cfg:
            test_data_cfg = test_data_cfg['dataset']
        cfg.tta_pipeline = copy.deepcopy(test_data_cfg.pipeline)
        cfg.tta_pipeline[-1] = dict(
            type='TestTimeAug',
            transforms=[[
                dict(type='RandomFlip', prob=1.),
                dict(type='RandomFlip', prob=0.)
            ],
                        [
                            dict(
                                type='PackDetInputs',
                                meta_keys=('img_id', 'img_path', 'ori_shape',
                                           'img_shape', 'scale_factor', 'flip',
                                           'flip_direction'))
                        ]])
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
