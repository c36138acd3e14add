"""``cache_inputs='disk:DIR'``: decoded images kept as ``.npy`` files.

One file per image and decode, named by a hash of the image's absolute
path, its size and mtime, the decode flags and the versions of the
decoders (OpenCV's version and build, mmcv, and the backend's own where it
is not OpenCV): a changed file or decoder is a new name, so a stale file is
never read (an image rewritten with its old size and mtime is not seen). A
file is written under a temporary name and renamed, so a reader sees a
whole file or none; a hit is read into a new array (C-ordered, owning its
memory, writeable: what a decode gives). Workers forked or spawned, and
later runs, share the folder. Why it is exact: ``docs/pipeline.md``.
"""
import hashlib
import os
from typing import Any, Optional

import numpy as np

from fast_parallel.pipeline.cache import DTYPES
from fast_parallel.pipeline.stats import count

__all__ = ['DiskCache', 'decoder_versions']

#: The module holding each mmcv decode backend's decoder.
_BACKEND_MODULES = {
    'pillow': 'PIL',
    'turbojpeg': 'turbojpeg',
    'tifffile': 'tifffile'
}


def decoder_versions(backend: str) -> str:
    """The versions that decide a decode's bytes, e.g. ``cv2 4.8.1; mmcv
    2.1.0``.

    Args:
        backend (str): mmcv's ``imdecode_backend``.

    Returns:
        str: ``name version`` pairs.
    """
    import importlib

    import cv2
    import mmcv
    build = hashlib.sha256(cv2.getBuildInformation().encode()).hexdigest()
    found = [
        f'cv2 {cv2.__version__} (build {build[:16]})',
        f'mmcv {mmcv.__version__}'
    ]
    module = _BACKEND_MODULES.get(backend)
    if module is not None:
        try:
            found.append(f'{module} '
                         f'{importlib.import_module(module).__version__}')
        except (ImportError, AttributeError):
            found.append(f'{module} unknown')
    return '; '.join(found)


class DiskCache:
    """Decoded images as ``.npy`` files under ``root``.

    Args:
        root (str): The folder (made where missing).
        flags (str): The decode flags and decoder versions, part of every
            file's name.
    """

    def __init__(self, root: str, flags: str) -> None:
        self.root = os.path.abspath(root)
        self.flags = flags
        os.makedirs(self.root, exist_ok=True)

    def file_for(self, path: str, stat: os.stat_result) -> str:
        """The cache file of ``path`` as it is at ``stat``."""
        key = '\0'.join((os.path.abspath(path), str(stat.st_size),
                         str(stat.st_mtime_ns), self.flags))
        digest = hashlib.sha256(key.encode('utf-8', 'surrogatepass'))
        name = digest.hexdigest()
        return os.path.join(self.root, name[:2], name + '.npy')

    def get(self, path: str) -> Optional[np.ndarray]:
        """The image kept for ``path`` as the file is now, read into a new
        array; None where there is none (or it cannot be read)."""
        try:
            stat = os.stat(path)
            f = open(self.file_for(path, stat), 'rb')
        except OSError:
            return None
        with f:
            try:
                out = _read(f)
            except (OSError, ValueError) as e:
                count(f'cache: disk file unreadable ({type(e).__name__})')
                return None
        return out

    def put(self, path: str, img: np.ndarray, stat: os.stat_result) -> None:
        """Writes ``img``, decoded from ``path`` as it was at ``stat``
        (nothing where that file is there already, or the image is not a
        C-ordered array of a decode's dtype).

        Args:
            path (str): The image file.
            img (np.ndarray): Its decoded image.
            stat (os.stat_result): The file's, taken before the decode.
        """
        if not isinstance(img, np.ndarray) or img.dtype not in DTYPES or \
                not img.flags.c_contiguous:
            return
        file = self.file_for(path, stat)
        if os.path.exists(file):
            return
        temporary = f'{file}.{os.getpid()}.tmp'
        try:
            os.makedirs(os.path.dirname(file), exist_ok=True)
            with open(temporary, 'wb') as f:
                np.lib.format.write_array(f, img, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())  # whole on disk before it has a name
            os.replace(temporary, file)
        except OSError as e:
            count(f'cache: disk write failed ({type(e).__name__})')
            try:
                os.remove(temporary)
            except OSError:
                pass

    def __repr__(self) -> str:
        return f'DiskCache({self.root!r})'


def _read(f: Any) -> np.ndarray:
    """The array of an open ``.npy`` file, in a new C-ordered array.

    Raises:
        ValueError: Where the file is not a whole ``.npy`` of a decode's
            dtype in C order.
    """
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f'.npy version {version}')
    if fortran or dtype not in DTYPES:
        raise ValueError(f'{dtype}, fortran_order={fortran}')
    out = np.empty(shape, dtype)
    flat = out.reshape(-1).view(np.uint8)
    if f.readinto(flat) != out.nbytes or f.read(1):
        raise ValueError('a file of another size')
    return out
