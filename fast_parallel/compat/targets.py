"""The upstream names the batched targets follow, by key.

Each head family computes the same numbers as exact mmdet / mmdet3d
classes, so the code reads them from here rather than importing them
itself: :func:`upstream` finds one, and a missing one is a
:class:`~fast_parallel.compat.CompatError` naming it and the version it was
checked on. Checked on mmdet 3.3.0 and mmdet3d 1.4.0
(:data:`fast_parallel.compat.CHECKED_ON`).
"""
import importlib
from typing import Any, Callable, Dict, List, Optional, Tuple

from fast_parallel.compat.core import CHECKED_ON, CompatError, private
from fast_parallel.compat.mmdet import YOLOX_HEAD_METHODS

_ASSIGNERS = 'mmdet.models.task_modules.assigners'
_DENSE = 'mmdet.models.dense_heads'
_TASKS = 'mmdet.models.task_modules'

#: key -> (module, name, package).
UPSTREAM: Dict[str, Tuple[str, str, str]] = {
    # YOLOX
    'YOLOXHead': (_DENSE, 'YOLOXHead', 'mmdet'),
    'SimOTAAssigner': (_ASSIGNERS, 'SimOTAAssigner', 'mmdet'),
    'SimOTA.INF': (f'{_ASSIGNERS}.sim_ota_assigner', 'INF', 'mmdet'),
    'SimOTA.EPS': (f'{_ASSIGNERS}.sim_ota_assigner', 'EPS', 'mmdet'),
    'bbox_xyxy_to_cxcywh':
    ('mmdet.structures.bbox', 'bbox_xyxy_to_cxcywh', 'mmdet'),
    # RTMDet
    'RTMDetHead': (_DENSE, 'RTMDetHead', 'mmdet'),
    'RTMDetSepBNHead': (_DENSE, 'RTMDetSepBNHead', 'mmdet'),
    'DynamicSoftLabelAssigner':
    (_ASSIGNERS, 'DynamicSoftLabelAssigner', 'mmdet'),
    'DSL.INF': (f'{_ASSIGNERS}.dynamic_soft_label_assigner', 'INF', 'mmdet'),
    'DSL.EPS': (f'{_ASSIGNERS}.dynamic_soft_label_assigner', 'EPS', 'mmdet'),
    'MlvlPointGenerator': (_TASKS, 'MlvlPointGenerator', 'mmdet'),
    'anchor_inside_flags': (_TASKS, 'anchor_inside_flags', 'mmdet'),
    'distance2bbox': ('mmdet.structures.bbox', 'distance2bbox', 'mmdet'),
    # FCOS
    'FCOSHead': (_DENSE, 'FCOSHead', 'mmdet'),
    'NASFCOSHead': (_DENSE, 'NASFCOSHead', 'mmdet'),
    'FCOS.INF': (f'{_DENSE}.fcos_head', 'INF', 'mmdet'),
    # ATSS / GFL
    'ATSSHead': (_DENSE, 'ATSSHead', 'mmdet'),
    'GFLHead': (_DENSE, 'GFLHead', 'mmdet'),
    'ATSSAssigner': (_ASSIGNERS, 'ATSSAssigner', 'mmdet'),
    'TOODHead': (_DENSE, 'TOODHead', 'mmdet'),
    'TaskAlignedAssigner': (_ASSIGNERS, 'TaskAlignedAssigner', 'mmdet'),
    # Mask R-CNN's mask targets
    'FCNMaskHead':
    ('mmdet.models.roi_heads.mask_heads', 'FCNMaskHead', 'mmdet'),
    'HTCMaskHead':
    ('mmdet.models.roi_heads.mask_heads', 'HTCMaskHead', 'mmdet'),
    'BitmapMasks': ('mmdet.structures.mask', 'BitmapMasks', 'mmdet'),
    'roi_align': ('mmcv.ops', 'roi_align', 'mmcv'),
    # the MaxIoUAssigner family
    'RetinaHead': (_DENSE, 'RetinaHead', 'mmdet'),
    'RPNHead': (_DENSE, 'RPNHead', 'mmdet'),
    'StandardRoIHead': ('mmdet.models.roi_heads', 'StandardRoIHead', 'mmdet'),
    'CascadeRoIHead': ('mmdet.models.roi_heads', 'CascadeRoIHead', 'mmdet'),
    'HybridTaskCascadeRoIHead': ('mmdet.models.roi_heads',
                                 'HybridTaskCascadeRoIHead', 'mmdet'),
    'MaxIoUAssigner': (_ASSIGNERS, 'MaxIoUAssigner', 'mmdet'),
    'AssignResult': (_ASSIGNERS, 'AssignResult', 'mmdet'),
    'RandomSampler': (_TASKS, 'RandomSampler', 'mmdet'),
    'SamplingResult': (_TASKS, 'SamplingResult', 'mmdet'),
    'AnchorGenerator': (_TASKS, 'AnchorGenerator', 'mmdet'),
    'DeltaXYWHBBoxCoder': (_TASKS, 'DeltaXYWHBBoxCoder', 'mmdet'),
    # shared by the 2D families
    'BboxOverlaps2D': (_TASKS, 'BboxOverlaps2D', 'mmdet'),
    'PseudoSampler': (_TASKS, 'PseudoSampler', 'mmdet'),
    'reduce_mean': ('mmdet.utils', 'reduce_mean', 'mmdet'),
    'multi_apply': ('mmdet.models.utils', 'multi_apply', 'mmdet'),
    'unpack_gt_instances': ('mmdet.models.utils', 'unpack_gt_instances',
                            'mmdet'),
    # mmdet3d's anchor head
    'Anchor3DHead': ('mmdet3d.models.dense_heads', 'Anchor3DHead', 'mmdet3d'),
    'Max3DIoUAssigner': ('mmdet3d.models.task_modules', 'Max3DIoUAssigner',
                         'mmdet3d'),
    'PseudoSampler3D': ('mmdet3d.models.task_modules', 'PseudoSampler',
                        'mmdet3d'),
    'DeltaXYZWLHRBBoxCoder': ('mmdet3d.models.task_modules',
                              'DeltaXYZWLHRBBoxCoder', 'mmdet3d'),
    'BboxOverlapsNearest3D': ('mmdet3d.structures.ops',
                              'BboxOverlapsNearest3D', 'mmdet3d'),
    'get_direction_target': ('mmdet3d.models.dense_heads.train_mixins',
                             'get_direction_target', 'mmdet3d'),
    # the data preprocessors: mmdet's images, mmdet3d's voxels
    'DetDataPreprocessor': ('mmdet.models.data_preprocessors',
                            'DetDataPreprocessor', 'mmdet'),
    'Det3DDataPreprocessor': ('mmdet3d.models.data_preprocessors',
                              'Det3DDataPreprocessor', 'mmdet3d'),
    'VoxelizationByGridShape': ('mmdet3d.models.data_preprocessors.voxelize',
                                'VoxelizationByGridShape', 'mmdet3d'),
    'Voxelization': ('mmcv.ops', 'Voxelization', 'mmcv'),
    'PointPillarsScatter': ('mmdet3d.models.middle_encoders',
                            'PointPillarsScatter', 'mmdet3d'),
    'PillarFeatureNet': ('mmdet3d.models.voxel_encoders', 'PillarFeatureNet',
                         'mmdet3d'),
    # mmdet3d's CenterPoint head
    'CenterHead': ('mmdet3d.models.dense_heads', 'CenterHead', 'mmdet3d'),
    'gaussian_2d': ('mmdet3d.models.utils', 'gaussian_2d', 'mmdet3d'),
    'LiDARInstance3DBoxes': ('mmdet3d.structures', 'LiDARInstance3DBoxes',
                             'mmdet3d'),
    # the DETR family
    'DETRHead': (_DENSE, 'DETRHead', 'mmdet'),
    'DeformableDETRHead': (_DENSE, 'DeformableDETRHead', 'mmdet'),
    'DINOHead': (_DENSE, 'DINOHead', 'mmdet'),
    'ConditionalDETRHead': (_DENSE, 'ConditionalDETRHead', 'mmdet'),
    'DABDETRHead': (_DENSE, 'DABDETRHead', 'mmdet'),
    'HungarianAssigner': (_ASSIGNERS, 'HungarianAssigner', 'mmdet'),
    'FocalLossCost': (_ASSIGNERS, 'FocalLossCost', 'mmdet'),
    'ClassificationCost': (_ASSIGNERS, 'ClassificationCost', 'mmdet'),
    'BBoxL1Cost': (_ASSIGNERS, 'BBoxL1Cost', 'mmdet'),
    'IoUCost': (_ASSIGNERS, 'IoUCost', 'mmdet'),
    'bbox_overlaps': ('mmdet.structures.bbox', 'bbox_overlaps', 'mmdet'),
    'bbox_cxcywh_to_xyxy': ('mmdet.structures.bbox', 'bbox_cxcywh_to_xyxy',
                            'mmdet'),
    'linear_sum_assignment': (f'{_ASSIGNERS}.hungarian_assigner',
                              'linear_sum_assignment', 'mmdet'),
    'QualityFocalLoss': ('mmdet.models.losses', 'QualityFocalLoss', 'mmdet'),
    'GIoULoss': ('mmdet.models.losses', 'GIoULoss', 'mmdet'),
    'L1Loss': ('mmdet.models.losses', 'L1Loss', 'mmdet'),
    'giou_loss': ('mmdet.models.losses.iou_loss', 'giou_loss', 'mmdet'),
    'FocalLoss': ('mmdet.models.losses', 'FocalLoss', 'mmdet'),
    'CrossEntropyLoss': ('mmdet.models.losses', 'CrossEntropyLoss', 'mmdet'),
    'sigmoid_focal_loss': ('mmdet.models.losses.focal_loss',
                           'sigmoid_focal_loss', 'mmdet'),
    'DistributionFocalLoss': ('mmdet.models.losses', 'DistributionFocalLoss',
                              'mmdet'),
    'DistancePointBBoxCoder': (_TASKS, 'DistancePointBBoxCoder', 'mmdet'),
    'Integral': (f'{_DENSE}.gfl_head', 'Integral', 'mmdet'),
    'l1_loss': ('mmdet.models.losses.smooth_l1_loss', 'l1_loss', 'mmdet'),
}

#: DINOHead's denoising loss of one decoder layer (private), which the
#: batched denoising targets stand in for.
DN_LOSS_SINGLE = '_loss_dn_single'

#: The per-image target method of mmdet's dense heads (private), which the
#: batched targets stand for and fall back to.
TARGETS_SINGLE = '_get_targets_single'

#: What mmdet 3.3.0's ``SamplingResult.__init__`` sets, in its order; the
#: RoI families build each image's result with these from batch-wide
#: tensors (``tests/test_targets_max_iou.py`` checks the list against a
#: stock instance's ``vars``).
SAMPLING_RESULT_FIELDS = ('pos_inds', 'neg_inds', 'num_pos', 'num_neg',
                          'avg_factor_with_neg', 'avg_factor', 'pos_priors',
                          'neg_priors', 'pos_is_gt', 'num_gts',
                          'pos_assigned_gt_inds', 'pos_gt_labels',
                          'pos_gt_bboxes')

#: The methods of mmdet's ``RandomSampler`` that decide its draws; one of
#: them set on an instance keeps that sampler stock.
RANDOM_SAMPLER_METHODS = ('sample', '_sample_pos', '_sample_neg',
                          'random_choice')

#: Per upstream class: the methods a batched family stands for. One of them
#: set on an instance (someone else's per-instance change) keeps it stock.
#: ``'<Head>.loss'``: the methods the head's losses of every level at once
#: stand for (they keep only the losses per level).
STANDS_FOR: Dict[str, Tuple[str, ...]] = {
    'YOLOXHead':
    YOLOX_HEAD_METHODS,
    'SimOTAAssigner':
    ('assign', 'get_in_gt_and_in_center_info', 'dynamic_k_matching'),
    'RTMDetHead': ('get_targets', TARGETS_SINGLE, 'get_anchors'),
    'DynamicSoftLabelAssigner': ('assign', 'dynamic_k_matching'),
    'AnchorHead': ('get_anchors', 'get_targets', 'loss_by_feat_single'),
    'FCOSHead': ('get_targets', TARGETS_SINGLE),
    'ATSSHead': ('get_anchors', 'get_targets', TARGETS_SINGLE,
                 'get_num_level_anchors_inside'),
    'GFLHead': ('get_anchors', 'get_targets', TARGETS_SINGLE,
                'get_num_level_anchors_inside'),
    'TOODHead': ('get_anchors', 'get_targets', TARGETS_SINGLE,
                 'get_num_level_anchors_inside'),
    'ATSSHead.loss': ('loss_by_feat_single', 'centerness_target'),
    'DeltaXYWHBBoxCoder': ('decode', ),
    'GFLHead.loss': ('loss_by_feat_single', 'anchor_center'),
    'TOODHead.loss': ('loss_by_feat_single', 'centerness_target'),
    'DistancePointBBoxCoder': ('decode', 'encode'),
    'ATSSAssigner': ('assign', ),
    'TaskAlignedAssigner': ('assign', ),
    'FCNMaskHead': ('get_targets', ),
    'MaxIoUAssigner': ('assign', 'assign_wrt_overlaps'),
    'RandomSampler':
    RANDOM_SAMPLER_METHODS,
    'Anchor3DHead':
    ('anchor_target_3d_single', 'anchor_target_single_assigner'),
    'CenterHead': ('get_targets_single', ),
    'Det3DDataPreprocessor': ('voxelize', ),
    'DetDataPreprocessor': ('forward', 'cast_data'),
    'Voxelization': ('forward', ),
    'PointPillarsScatter': ('forward', 'forward_batch'),
    'DETRHead':
    ('loss_by_feat', 'loss_by_feat_single', 'get_targets', TARGETS_SINGLE),
    'DINOHead': ('loss_by_feat', 'loss_by_feat_single', 'get_targets',
                 TARGETS_SINGLE, DN_LOSS_SINGLE, 'get_dn_targets',
                 '_get_dn_targets_single', 'split_outputs'),
    'HungarianAssigner': ('assign', ),
    'FocalLossCost': ('__call__', '_focal_loss_cost'),
    'ClassificationCost': ('__call__', ),
    'BBoxL1Cost': ('__call__', ),
    'IoUCost': ('__call__', ),
}

#: The ``train_cfg`` keys mmdet3d's ``CenterHead.get_targets_single`` reads.
CENTER_HEAD_TRAIN_KEYS = ('grid_size', 'point_cloud_range', 'voxel_size',
                          'out_size_factor', 'dense_reg', 'max_objs',
                          'gaussian_overlap', 'min_radius')


def replaced_on_instance(obj: Any, kind: str) -> List[str]:
    """The methods of :data:`STANDS_FOR` ``[kind]`` set on ``obj`` itself.

    Args:
        obj: A head, assigner or sampler.
        kind (str): A key of :data:`STANDS_FOR`.

    Returns:
        list[str]: Their names, in the table's order.
    """
    own = vars(obj)
    return [name for name in STANDS_FOR[kind] if name in own]


def replaced_reason(*checks: Tuple[Any, str],
                    label: str = '') -> Optional[str]:
    """Why objects stay stock when one of their :data:`STANDS_FOR`
    methods is set on the object itself, or None.

    Args:
        *checks (tuple): ``(obj, kind)`` pairs for
            :func:`replaced_on_instance`.
        label (str): Put before the names (e.g. ``'RandomSampler.'``).

    Returns:
        Optional[str]: ``'<label><names> replaced on the instance'``, or
        None when none is.
    """
    own = [
        name for obj, kind in checks
        for name in replaced_on_instance(obj, kind)
    ]
    return f'{label}{", ".join(own)} replaced on the instance' if own else None


def targets_single(head: Any) -> Callable:
    """``type(head)._get_targets_single``: stock's per-image targets.

    Args:
        head: An mmdet dense head.

    Returns:
        callable: The class's (unbound) method.
    """
    return private(
        type(head), TARGETS_SINGLE, 'mmdet',
        'images whose targets take the stock path')


def raw_positive_infos(head: Any) -> dict:
    """``head._raw_positive_infos``: where mmdet's ``BaseDenseHead.loss``
    keeps the sampling results ``get_positive_infos`` reads (private).

    Args:
        head: An mmdet dense head.

    Returns:
        dict: The head's own dict (updated in place by the caller).
    """
    return private(head, '_raw_positive_infos', 'mmdet',
                   'the sampling results get_positive_infos reads')


#: torch's hook tables a plain ``module(...)`` call runs (private).
_MODULE_HOOKS = ('_forward_hooks', '_forward_pre_hooks',
                 '_forward_hooks_with_kwargs', '_forward_hooks_always_called',
                 '_backward_hooks', '_backward_pre_hooks')
_GLOBAL_HOOKS = ('_global_forward_hooks', '_global_forward_pre_hooks',
                 '_global_backward_hooks', '_global_backward_pre_hooks')


def runs_forward_only(module: Any) -> bool:
    """Whether ``module(...)`` would run nothing but its class's
    ``forward``: no hook on it or on every module, no ``forward`` set on
    the instance (the batched DETR losses then run that forward's body).

    Args:
        module (nn.Module): A loss module.

    Returns:
        bool: True when nothing else would run.
    """
    import torch.nn.modules.module as torch_module
    used_for = 'the batched DETR losses (whether a loss call runs hooks)'
    if 'forward' in vars(module):
        return False
    # module.compile(): __call__ runs the compiled forward
    if getattr(module, '_compiled_call_impl', None) is not None:
        return False
    for name in _MODULE_HOOKS:
        if private(module, name, 'torch', used_for):
            return False
    return not any(
        private(torch_module, name, 'torch', used_for)
        for name in _GLOBAL_HOOKS)


def reduce_mean_reduces() -> bool:
    """Whether mmdet's ``reduce_mean`` would all-reduce (its own test:
    ``torch.distributed`` available and initialised); else it returns its
    tensor unchanged, which the batched losses decide on the host."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def upstream(key: str) -> Any:
    """The upstream class, function or constant of :data:`UPSTREAM`.

    Args:
        key (str): A key of :data:`UPSTREAM`.

    Returns:
        The object.

    Raises:
        CompatError: When the installed package has no such name.
    """
    module, name, package = UPSTREAM[key]
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise CompatError(
            f'fast_parallel batched targets need `{module}.{name}` (checked '
            f'on {package} {CHECKED_ON[package]}); it is missing. Set '
            'FastParallelHook(fast_targets=False) to keep the stock '
            'targets.') from None


def is_upstream(obj: Any, *keys: str) -> bool:
    """Whether ``type(obj)`` is exactly one of the classes ``keys`` name.

    A class missing from the installed version counts as no match.

    Args:
        obj: An instance.
        *keys (str): Keys of :data:`UPSTREAM`.

    Returns:
        bool: True for an exact class match (not a subclass).
    """
    for key in keys:
        try:
            if type(obj) is upstream(key):
                return True
        except CompatError:
            continue
    return False
