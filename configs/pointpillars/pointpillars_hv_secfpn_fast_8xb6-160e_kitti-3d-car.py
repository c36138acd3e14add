# PointPillars on KITTI (Car): mmdet3d's recipe on the fast data path, with the
# final validation checked against the published result.
_base_ = ('mmdet3d::pointpillars/'
          'pointpillars_hv_secfpn_8xb6-160e_kitti-3d-car.py')

custom_imports = dict(
    imports=[
        'fast_parallel', 'fast_parallel.contrib.kitti_metric',
        'fast_parallel.contrib.db_sampler'
    ],
    allow_failed_imports=False)

# The one change to the recipe: mmdet3d 1.4.0's DataBaseSampler uses np.long,
# which numpy 1.24-1.26 (the pinned numpy<2) no longer has; the registered
# DataBaseSamplerNp124 is the same sampler with np.int64
# (fast_parallel/contrib/db_sampler.py).
train_pipeline = _base_.train_pipeline
for _step in train_pipeline:
    if _step['type'] == 'ObjectSample':
        _step['db_sampler']['type'] = 'DataBaseSamplerNp124'
train_dataloader = dict(dataset=dict(dataset=dict(pipeline=train_pipeline)))

# KittiMetric on a GPU when numba's CUDA works there, else the CPU kernel
# with the same results (fast_parallel/contrib/kitti_metric.py).
val_evaluator = dict(type='KittiMetricCPU')
test_evaluator = val_evaluator

custom_hooks = [
    *_base_.get('custom_hooks', []),
    dict(type='FastParallelHook'),
    dict(type='ExactResumeHook'),
    dict(
        type='AccuracyParityHook',
        # mmdet3d 1.x model zoo, configs/pointpillars/metafile.yml: AP 77.6
        # (Car, 3D, moderate, 11 recall points)
        expected={
            'Kitti metric/pred_instances_3d/KITTI/Car_3D_AP11_moderate_strict':
            77.6
        },
        tolerance=1.0,
        source='mmdet3d model zoo, '
        'pointpillars_hv_secfpn_8xb6-160e_kitti-3d-car'),
]
del _step
