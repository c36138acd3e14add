# YOLOX-s on COCO: mmdet's recipe unchanged, on the fast data path, with the
# final validation checked against the published result.
_base_ = 'mmdet::yolox/yolox_s_8xb8-300e_coco.py'

custom_imports = dict(imports=['fast_parallel'], allow_failed_imports=False)

custom_hooks = [
    *_base_.custom_hooks,
    dict(type='FastParallelHook'),
    dict(type='ExactResumeHook'),
    dict(
        type='AccuracyParityHook',
        # mmdet 3.x model zoo, configs/yolox/metafile.yml: box AP 40.5
        expected={'coco/bbox_mAP': 0.405},
        tolerance=0.005,
        source='mmdet model zoo, yolox_s_8xb8-300e_coco'),
]
