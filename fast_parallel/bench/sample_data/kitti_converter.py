"""Runs mmdet3d's own ``create_data.py`` on the sample KITTI and nuScenes
sets (KITTI: the converter; nuScenes: the gt database).

Why it runs in a child process with a no-op ``sleep``:
``docs/sample_data.md``.
"""
import os
import subprocess
import sys
from pathlib import Path

#: What the converter writes; all present means the KITTI part is done.
KITTI_OUTPUTS = ('kitti_infos_train.pkl', 'kitti_infos_val.pkl',
                 'kitti_infos_trainval.pkl', 'kitti_infos_test.pkl',
                 'kitti_dbinfos_train.pkl', 'kitti_gt_database',
                 'training/velodyne_reduced')

# Runs create_data.py as __main__ with its arguments, with a no-op sleep in
# update_infos_to_v2 (which uses ``time`` for nothing else).
_CONVERTER_DRIVER = """
import runpy, sys, types
import tools.dataset_converters.update_infos_to_v2 as update_infos
update_infos.time = types.SimpleNamespace(sleep=lambda seconds: None)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def mmdet3d_create_data_script() -> Path:
    """Path of mmdet3d's installed ``tools/create_data.py``.

    Returns:
        Path: ``mmdet3d/.mim/tools/create_data.py``.
    """
    import mmdet3d
    return Path(mmdet3d.__file__).parent / '.mim' / 'tools' / 'create_data.py'


def run_kitti_converter(root: Path) -> None:
    """Runs mmdet3d's ``create_data.py kitti --with-plane`` on ``root``.

    Args:
        root (Path): The KITTI folder.

    Raises:
        RuntimeError: If the converter fails.
    """
    run_create_data(root, [
        'kitti', '--root-path',
        str(root), '--out-dir',
        str(root), '--extra-tag', 'kitti', '--with-plane'
    ])


def run_nuscenes_gt_database(root: Path) -> None:
    """Runs mmdet3d's ``create_data.py nuscenes --only-gt-database``.

    It reads ``nuscenes_infos_train.pkl`` and writes
    ``nuscenes_gt_database/`` and ``nuscenes_dbinfos_train.pkl``.

    Args:
        root (Path): The nuScenes folder.

    Raises:
        RuntimeError: If it fails.
    """
    run_create_data(root, [
        'nuscenes', '--root-path',
        str(root), '--out-dir',
        str(root), '--extra-tag', 'nuscenes', '--only-gt-database'
    ])


def run_create_data(root: Path, args: list) -> None:
    """Runs mmdet3d's ``create_data.py`` with ``args``; log in ``root``.

    The script imports ``tools.dataset_converters``, so it runs with its
    ``.mim`` folder as working directory and first on ``PYTHONPATH``, in a
    child process of this Python. Its log goes to ``root/create_data.log``.

    Args:
        root (Path): The data folder.
        args (list[str]): The script's arguments.

    Raises:
        RuntimeError: If the script fails.
    """
    script = mmdet3d_create_data_script()
    mim = script.parent.parent
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [str(mim)] + [p for p in [env.get('PYTHONPATH')] if p])
    log = root / 'create_data.log'
    with open(log, 'w') as f:
        done = subprocess.run(
            [sys.executable, '-c', _CONVERTER_DRIVER,
             str(script), *args],
            cwd=str(mim),
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f'create_data.py {" ".join(args)} failed '
                           f'({done.returncode}):\n{tail}')
