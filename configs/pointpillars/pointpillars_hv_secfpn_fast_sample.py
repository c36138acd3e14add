# PointPillars (KITTI, Car) on the sample KITTI set
# (tools/make_sample_data.py), on the fast path: minutes on a CPU, through
# the same KittiDataset, ObjectSample
# / ObjectNoise / RandomFlip3D / GlobalRotScaleTrans pipeline and KITTI metric
# as the full recipe. The pillar grid is 128x128 (0.54 x 0.62 m pillars)
# instead of 432x496 so that a CPU step takes seconds.
_base_ = ('mmdet3d::pointpillars/'
          'pointpillars_hv_secfpn_8xb6-160e_kitti-3d-car.py')

custom_imports = dict(
    imports=[
        'fast_parallel', 'fast_parallel.contrib.kitti_metric',
        'fast_parallel.contrib.db_sampler'
    ],
    allow_failed_imports=False)
custom_hooks = [dict(type='FastParallelHook'), dict(type='ExactResumeHook')]

data_root = 'data/sample/kitti/'
class_names = ['Car']
metainfo = dict(classes=class_names)
point_cloud_range = [0, -39.68, -3, 69.12, 39.68, 1]
voxel_size = [0.54, 0.62, 4]
max_epochs = 2

model = dict(
    data_preprocessor=dict(
        voxel_layer=dict(voxel_size=voxel_size, max_voxels=(8000, 8000))),
    voxel_encoder=dict(voxel_size=voxel_size),
    middle_encoder=dict(output_shape=[128, 128]))

db_sampler = dict(
    type='DataBaseSamplerNp124',  # upstream's np.long fails on numpy 1.26
    data_root=data_root,
    info_path=data_root + 'kitti_dbinfos_train.pkl',
    rate=1.0,
    prepare=dict(filter_by_difficulty=[-1], filter_by_min_points=dict(Car=5)),
    classes=class_names,
    sample_groups=dict(Car=4),
    points_loader=dict(
        type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4, use_dim=4))
train_pipeline = [
    dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4, use_dim=4),
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
    dict(type='ObjectSample', db_sampler=db_sampler, use_ground_plane=False),
    dict(
        type='ObjectNoise',
        num_try=100,
        translation_std=[1.0, 1.0, 0.5],
        global_rot_range=[0.0, 0.0],
        rot_range=[-0.78539816, 0.78539816]),
    dict(type='RandomFlip3D', flip_ratio_bev_horizontal=0.5),
    dict(
        type='GlobalRotScaleTrans',
        rot_range=[-0.78539816, 0.78539816],
        scale_ratio_range=[0.95, 1.05]),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='PointShuffle'),
    dict(
        type='Pack3DDetInputs',
        keys=['points', 'gt_labels_3d', 'gt_bboxes_3d'])
]
test_pipeline = [
    dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4, use_dim=4),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='Pack3DDetInputs', keys=['points'])
]

train_dataloader = dict(
    batch_size=2,
    num_workers=2,
    persistent_workers=False,
    dataset=dict(
        times=1,
        dataset=dict(
            data_root=data_root, pipeline=train_pipeline, metainfo=metainfo)))
val_dataloader = dict(
    batch_size=2,
    num_workers=1,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root, pipeline=test_pipeline, metainfo=metainfo))
test_dataloader = val_dataloader
val_evaluator = dict(
    type='KittiMetricCPU', ann_file=data_root + 'kitti_infos_val.pkl')
test_evaluator = val_evaluator

train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2)
]
default_hooks = dict(
    logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=2))
log_processor = dict(window_size=1)
