# CenterPoint-pillar (nuScenes, 10 classes) on the sample nuScenes set
# (tools/make_sample_data.py), on the fast path: mmdet3d's own model and
# train pipeline (key frame + 9 of 10 sweeps, ObjectSample from the gt
# database, CBGSDataset), batch 2. The pillars are 0.8 m (a 128 x 128 grid,
# 32 x 32 heatmaps) instead of 0.2 m so that a CPU step takes a second or
# two. The sample set has no nuScenes tables, which NuScenesMetric needs: no
# validation.
_base_ = ('mmdet3d::centerpoint/'
          'centerpoint_pillar02_second_secfpn_8xb4-cyclic-20e_nus-3d.py')

custom_imports = dict(
    imports=['fast_parallel', 'fast_parallel.contrib.db_sampler'],
    allow_failed_imports=False)
custom_hooks = [dict(type='FastParallelHook'), dict(type='ExactResumeHook')]

data_root = 'data/sample/nuscenes/'
class_names = [
    'car', 'truck', 'construction_vehicle', 'bus', 'trailer', 'barrier',
    'motorcycle', 'bicycle', 'pedestrian', 'traffic_cone'
]
point_cloud_range = [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0]
voxel_size = [0.8, 0.8, 8]
grid = 128
max_epochs = 2

model = dict(
    data_preprocessor=dict(voxel_layer=dict(voxel_size=voxel_size)),
    pts_voxel_encoder=dict(voxel_size=voxel_size),
    pts_middle_encoder=dict(output_shape=(grid, grid)),
    pts_bbox_head=dict(bbox_coder=dict(voxel_size=voxel_size[:2])),
    train_cfg=dict(pts=dict(grid_size=[grid, grid, 1], voxel_size=voxel_size)),
    test_cfg=dict(pts=dict(voxel_size=voxel_size[:2])))

db_sampler = dict(
    type='DataBaseSamplerNp124',  # upstream's np.long fails on numpy 1.26
    data_root=data_root,
    info_path=data_root + 'nuscenes_dbinfos_train.pkl',
    rate=1.0,
    prepare=dict(
        filter_by_difficulty=[-1],
        filter_by_min_points={name: 5
                              for name in class_names}),
    classes=class_names,
    sample_groups=dict(
        car=2,
        truck=3,
        construction_vehicle=7,
        bus=4,
        trailer=6,
        barrier=2,
        motorcycle=6,
        bicycle=6,
        pedestrian=2,
        traffic_cone=2),
    points_loader=dict(
        type='LoadPointsFromFile',
        coord_type='LIDAR',
        load_dim=5,
        use_dim=[0, 1, 2, 3, 4]))
train_pipeline = [
    dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=5),
    dict(
        type='LoadPointsFromMultiSweeps',
        sweeps_num=9,
        use_dim=[0, 1, 2, 3, 4],
        pad_empty_sweeps=True,
        remove_close=True),
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
    dict(type='ObjectSample', db_sampler=db_sampler),
    dict(
        type='GlobalRotScaleTrans',
        rot_range=[-0.3925, 0.3925],
        scale_ratio_range=[0.95, 1.05],
        translation_std=[0, 0, 0]),
    dict(
        type='RandomFlip3D',
        sync_2d=False,
        flip_ratio_bev_horizontal=0.5,
        flip_ratio_bev_vertical=0.5),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectNameFilter', classes=class_names),
    dict(type='PointShuffle'),
    dict(
        type='Pack3DDetInputs',
        keys=['points', 'gt_bboxes_3d', 'gt_labels_3d'])
]

train_dataloader = dict(
    batch_size=2,
    num_workers=2,
    dataset=dict(dataset=dict(data_root=data_root, pipeline=train_pipeline)))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None

train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1000)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2)
]
default_hooks = dict(
    logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=2))
log_processor = dict(window_size=1)
