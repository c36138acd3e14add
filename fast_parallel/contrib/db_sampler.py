"""mmdet3d 1.4.0 on numpy 1.24 .. 1.26: the ground-truth sampler, fixed.

``DataBaseSampler.sample_all`` builds the sampled labels with
``dtype=np.long``, an alias numpy removed in 1.24 (and brought back in 2.0,
which mmdet3d 1.4 / mmcv 2.1 do not support). On the pinned ``numpy<2`` every
``ObjectSample`` that samples at least one object raises ``AttributeError:
module 'numpy' has no attribute 'long'`` — the stock PointPillars KITTI recipe
cannot train. Upstream later fixed it with ``np.int64``.

``DataBaseSamplerNp124`` is ``DataBaseSampler`` with that one dtype fixed,
registered in mmdet3d's ``TRANSFORMS``; configs select it with
``db_sampler=dict(type='DataBaseSamplerNp124', ...)``. mmdet3d itself is
neither edited nor patched: both the stock and the fast path of a config use
the same class, so parity is unaffected. Importing this module imports
mmdet3d.
"""
import os
from typing import Any, List, Optional

import numpy as np
from mmdet3d.datasets.transforms.dbsampler import DataBaseSampler
from mmdet3d.registry import TRANSFORMS


def database_path(data_root: Optional[str], info: dict) -> str:
    """A gt-database object's points file, as mmdet3d's ``sample_all``
    names it (the readers and the cache must agree on it).

    Args:
        data_root (str, optional): The sampler's ``data_root``.
        info (dict): The object's database info (``path``).

    Returns:
        str: The file's path.
    """
    return os.path.join(data_root, info['path']) if data_root else info['path']


@TRANSFORMS.register_module()
class DataBaseSamplerNp124(DataBaseSampler):
    """``DataBaseSampler`` whose ``sample_all`` runs on numpy >= 1.24.

    Same arguments, same sampling, same random draws as upstream.
    """

    def sample_all(self,
                   gt_bboxes: np.ndarray,
                   gt_labels: np.ndarray,
                   img: Optional[np.ndarray] = None,
                   ground_plane: Optional[np.ndarray] = None) -> dict:
        """Samples all categories of boxes (upstream code, ``np.int64``).

        Args:
            gt_bboxes (np.ndarray): Ground truth bounding boxes.
            gt_labels (np.ndarray): Ground truth labels of boxes.
            img (np.ndarray, optional): Image array. Defaults to None.
            ground_plane (np.ndarray, optional): Ground plane information.
                Defaults to None.

        Returns:
            dict or None: ``gt_labels_3d``, ``gt_bboxes_3d``, ``points`` and
            ``group_ids`` of the sampled objects; None if none was sampled.
        """
        sample_num_per_class = []
        for class_name, max_sample_num in zip(self.sample_classes,
                                              self.sample_max_nums):
            class_label = self.cat2label[class_name]
            sampled_num = int(max_sample_num -
                              np.sum([n == class_label for n in gt_labels]))
            sampled_num = np.round(self.rate * sampled_num).astype(np.int64)
            sample_num_per_class.append(sampled_num)

        sampled = []
        sampled_gt_bboxes = []
        avoid_coll_boxes = gt_bboxes
        for class_name, sampled_num in zip(self.sample_classes,
                                           sample_num_per_class):
            if sampled_num > 0:
                sampled_cls = self.sample_class_v2(class_name, sampled_num,
                                                   avoid_coll_boxes)
                sampled += sampled_cls
                if len(sampled_cls) > 0:
                    if len(sampled_cls) == 1:
                        sampled_gt_box = sampled_cls[0]['box3d_lidar'][
                            np.newaxis, ...]
                    else:
                        sampled_gt_box = np.stack(
                            [s['box3d_lidar'] for s in sampled_cls], axis=0)
                    sampled_gt_bboxes += [sampled_gt_box]
                    avoid_coll_boxes = np.concatenate(
                        [avoid_coll_boxes, sampled_gt_box], axis=0)

        if not sampled:
            return None
        sampled_gt_bboxes = np.concatenate(sampled_gt_bboxes, axis=0)
        s_points_list = self.sampled_points(sampled)

        # The one change: upstream has dtype=np.long.
        gt_labels = np.array([self.cat2label[s['name']] for s in sampled],
                             dtype=np.int64)
        if ground_plane is not None:
            xyz = sampled_gt_bboxes[:, :3]
            dz = (ground_plane[:3][None, :] * xyz).sum(-1) + ground_plane[3]
            sampled_gt_bboxes[:, 2] -= dz
        else:
            dz = None
        return {
            'gt_labels_3d':
            gt_labels,
            'gt_bboxes_3d':
            sampled_gt_bboxes,
            'points':
            self.lowered_cloud(s_points_list, dz),
            'group_ids':
            np.arange(gt_bboxes.shape[0], gt_bboxes.shape[0] + len(sampled))
        }

    def sampled_points(self, sampled: List[dict]) -> Any:
        """The points of each sampled object, read and moved to its box
        (upstream's loop).

        Args:
            sampled (list[dict]): The sampled database infos.

        Returns:
            list[BasePoints]: For :meth:`lowered_cloud` (a subclass may
            give them in another form its own ``lowered_cloud`` reads).
        """
        s_points_list = []
        for info in sampled:
            file_path = database_path(self.data_root, info)
            results = dict(lidar_points=dict(lidar_path=file_path))
            s_points = self.points_loader(results)['points']
            s_points.translate(info['box3d_lidar'][:3])
            s_points_list.append(s_points)
        return s_points_list

    def lowered_cloud(self, s_points_list: Any,
                      dz: Optional[np.ndarray]) -> Any:
        """Each object's points lowered by its ``dz`` (the ground plane's,
        where there is one), concatenated (upstream's steps).

        Args:
            s_points_list: :meth:`sampled_points`'s.
            dz (np.ndarray, optional): One height per object.

        Returns:
            BasePoints: All sampled points, in order.
        """
        if dz is not None:
            for i, s_points in enumerate(s_points_list):
                s_points.tensor[:, 2].sub_(dz[i])
        return s_points_list[0].cat(s_points_list)
