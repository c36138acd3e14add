"""The gt-database files of mmdet3d's ``ObjectSample``, read once per run.

Stock's sampler reads every picked object's ``.bin`` file again at each
pick (``LoadPointsFromFile``: the file's bytes, then ``np.frombuffer``).
:class:`FastLoadPointsFromFile`, given to the sampler's points loader by
the switch, keeps each file's bytes in the run's shared
:class:`~fast_parallel.pipeline.cache.DecodedCache` and hands a hit out as
a new ``bytes`` object of the same content, read as stock reads its own:
the points stock makes, byte for byte, from a file unchanged since (size
and mtime). Importing this module imports mmdet3d.
"""
import os
from typing import Any, List, Tuple, Union

import numpy as np
from mmdet3d.datasets.transforms import LoadPointsFromFile
from mmdet3d.datasets.transforms.dbsampler import DataBaseSampler

from fast_parallel.compat.mmdet3d import points_file_read
from fast_parallel.contrib.db_sampler import database_path
from fast_parallel.pipeline.stats import count

__all__ = ['FastLoadPointsFromFile', 'database_files']

#: The name of stock's file read on ``LoadPointsFromFile`` (compat).
READ_NAME, _stock_read = points_file_read()


class FastLoadPointsFromFile(LoadPointsFromFile):
    """``LoadPointsFromFile`` whose file read takes the file's bytes from
    the run's cache (``_fp_cache``, set by the switch) when it has them."""

    _fp_cache: Any = None

    def read_points(self, pts_filename: str) -> np.ndarray:
        """Stock's read of ``pts_filename`` (installed under stock's name):
        ``np.frombuffer`` of the file's bytes, cached or read.

        Args:
            pts_filename (str): The points file.

        Returns:
            np.ndarray: Its ``float32`` values, read-only as stock's.
        """
        cache = self._fp_cache
        if cache is None:
            return _stock_read(self, pts_filename)
        data = cache.get_bytes(pts_filename)
        if data is not None:
            count('cache: gt-database hits')
            return np.frombuffer(data, dtype=np.float32)
        try:
            stat = os.stat(pts_filename)
        except OSError:
            stat = None
        points = _stock_read(self, pts_filename)
        if stat is not None and type(points.base) is bytes:
            count('cache: gt-database files read')
            cache.put(pts_filename, np.frombuffer(points.base, np.uint8), stat)
        return points


setattr(FastLoadPointsFromFile, READ_NAME, FastLoadPointsFromFile.read_points)


def database_files(sampler: Any) -> Union[Tuple[Any, List[str], int], str]:
    """The points loader of a gt-database sampler, every file it may read
    and their size, or why it cannot be cached.

    The sizes come from the database infos (``num_points_in_gt`` points of
    ``load_dim`` ``float32`` values each), without reading a file or
    drawing a random number.

    Args:
        sampler: An ``ObjectSample``'s ``db_sampler``.

    Returns:
        tuple | str: ``(loader, paths, bytes)``, or the reason.
    """
    if not isinstance(sampler, DataBaseSampler):
        return "the gt-database sampler is not mmdet3d's DataBaseSampler"
    loader = sampler.points_loader
    if type(loader) not in (LoadPointsFromFile, FastLoadPointsFromFile):
        return "the gt-database's points loader is not LoadPointsFromFile"
    if loader.backend_args is not None:
        return 'gt-database files read through a storage backend'
    root = sampler.data_root
    paths, total = {}, 0
    for name in dict.fromkeys(sampler.sample_classes):
        for info in sampler.group_db_infos.get(name, ()):
            if 'num_points_in_gt' not in info or 'path' not in info:
                return 'the gt-database infos give no point counts'
            path = database_path(root, info)
            if path not in paths:
                paths[path] = True
                total += int(info['num_points_in_gt']) * loader.load_dim * 4
    return loader, list(paths), total
