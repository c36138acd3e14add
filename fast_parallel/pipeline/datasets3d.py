"""mmdet3d's datasets without the second deep copy of each sample's info.

``Det3DDataset.prepare_data`` deep-copies the info ``get_data_info`` has
just made (mmengine unpickles it from the serialized list, or deep-copies
the list's entry) before the pipeline: a copy of a fresh object nothing
else holds, which the pipeline cannot tell from the object itself (the
same values, arrays owning C-ordered memory either way, shared objects
shared alike). The fast class hands that info, when it is plain data (its
copy can neither fail nor draw), to stock's ``prepare_data`` as a dict
whose deep copy is a new dict of the same values, so stock's code runs as
it is; ``show_ins_var`` (which reads the info after the pipeline)
keeps stock's copy. One fast class per mmdet3d dataset class that keeps
``Det3DDataset``'s ``prepare_data`` / ``get_data_info`` / ``__getitem__``
(read in mmdet3d 1.4.0), at module level so that a spawned worker finds it.
"""
from typing import Dict, Optional

from mmdet3d.datasets import (KittiDataset, LyftDataset, NuScenesDataset,
                              S3DISDataset, ScanNetDataset, SUNRGBDDataset,
                              WaymoDataset)
from mmdet3d.datasets.det3d_dataset import Det3DDataset
from mmdet3d.structures import (CameraInstance3DBoxes, DepthInstance3DBoxes,
                                LiDARInstance3DBoxes)

from fast_parallel.pipeline.copies import holds_only_plain

__all__ = ['FAST_DATASETS', 'fast_dataset_class']

#: The box classes infos hold (``ann_info``): their deep copies clone a
#: tensor, draw nothing and cannot fail.
_BOXES = frozenset(
    (LiDARInstance3DBoxes, CameraInstance3DBoxes, DepthInstance3DBoxes))


class _Fresh(dict):
    """An info nothing else holds: its deep copy is a new dict of it."""

    def __deepcopy__(self, memo: dict) -> dict:
        return dict(self)


def _prepare_data(self, index: int):
    """Stock's ``prepare_data``, on an info handed without its copy."""
    if self.show_ins_var:  # reads the info after the pipeline
        return Det3DDataset.prepare_data(self, index)
    if self._fp_plain is None:  # this process's own: not shared
        self._fp_plain = {}
    self._fp_hand = True
    try:
        return Det3DDataset.prepare_data(self, index)
    finally:
        self._fp_hand = False


def _get_data_info(self, idx: int) -> dict:
    """Stock's, handed as :class:`_Fresh` to ``prepare_data``'s copy."""
    info = Det3DDataset.get_data_info(self, idx)
    if self._fp_hand:
        self._fp_hand = False  # the one call prepare_data makes
        if type(info) is dict and _plain_info(self, idx, info):
            return _Fresh(info)
    return info


def _plain_info(dataset, idx: int, info: dict) -> bool:
    """:func:`holds_only_plain` of the info of ``idx``, found once per
    index in this process (an index's info is the same each time: the
    dataset's list or its serialized bytes; the walk costs a third of
    the copy it saves)."""
    known = dataset._fp_plain
    plain = known.get(idx)
    if plain is None:
        plain = known[idx] = holds_only_plain(info, _BOXES)
    return plain


def _covered(cls: type) -> bool:
    return all(
        getattr(cls, name) is getattr(Det3DDataset, name)
        for name in ('prepare_data', 'get_data_info', '__getitem__'))


#: Stock dataset class -> its fast class.
FAST_DATASETS: Dict[type, type] = {}
for _stock in (Det3DDataset, KittiDataset, LyftDataset, NuScenesDataset,
               S3DISDataset, ScanNetDataset, SUNRGBDDataset, WaymoDataset):
    if _covered(_stock):
        _name = f'Fast{_stock.__name__}'
        # the stock class as the only base: the instance's class can be
        # switched (a mixin base would change the layout Python compares)
        _fast = type(
            _name, (_stock, ), {
                'prepare_data': _prepare_data,
                'get_data_info': _get_data_info,
                '_fp_hand': False,
                '_fp_plain': None,
                '__module__': __name__,
                '__qualname__': _name,
                '__doc__': f'``{_stock.__name__}`` without the info\'s copy.'
            })
        globals()[_name] = FAST_DATASETS[_stock] = _fast


def fast_dataset_class(cls: type) -> Optional[type]:
    """The fast class of an mmdet3d dataset class (exact), or None."""
    if cls in FAST_DATASETS.values():
        return cls
    return FAST_DATASETS.get(cls)
