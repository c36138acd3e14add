"""fast_parallel/wrappers/replicas.py: after ``replicate``, every method the
fast path put on an instance is bound to that replica's own module."""
from types import MethodType

import pytest
from mmengine.config import Config
from mmengine.hub import get_config
from mmengine.registry import DefaultScope

from fast_parallel.step.targets.switch import switch_targets
from fast_parallel.step.voxelize import switch_voxelize
from fast_parallel.wrappers import data_parallel
from fast_parallel.wrappers.replicas import (rebind_instance_methods,
                                             replicate_with_own_methods)

CONFIGS = {
    'yolox': ('configs/yolox/yolox_tiny_fast_sample.py', 'mmdet'),
    'pointpillars':
    ('configs/pointpillars/pointpillars_hv_secfpn_fast_sample.py', 'mmdet3d'),
    'faster_rcnn':
    ('mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', 'mmdet'),
}


def cpu_replicate(network, copies: int) -> list:
    """What ``torch.nn.parallel.replicate`` does to the modules (each one's
    ``_replicate_for_data_parallel``, children linked to their copies),
    without the broadcast of parameters to GPUs."""
    modules = list(network.modules())
    index = {id(m): i for i, m in enumerate(modules)}
    replicas = [[m._replicate_for_data_parallel() for m in modules]
                for _ in range(copies)]
    for i, module in enumerate(modules):
        for key, child in module._modules.items():
            for replica in replicas:
                replica[i]._modules[key] = None if child is None else \
                    replica[index[id(child)]]
    return [replica[0] for replica in replicas]


def switched_model(name: str):
    path, scope = CONFIGS[name]
    cfg = get_config(path) if '::' in path else Config.fromfile(path)
    import importlib
    importlib.import_module(f'{scope}.utils').register_all_modules(False)
    from mmengine.registry import MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(cfg.model)
    switch_voxelize(model)
    switch_targets(model)
    return model


def instance_methods(model):
    return [(module, name, value) for module in model.modules()
            for name, value in vars(module).items()
            if isinstance(value, MethodType)]


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_every_instance_method_is_bound_to_its_replica(name):
    model = switched_model(name)
    own = instance_methods(model)
    assert own, 'the fast path put no method on any instance'
    assert all(value.__self__ is module for module, _, value in own)
    originals = {id(m) for m in model.modules()}
    replicas = cpu_replicate(model, 2)
    # torch's copy of __dict__ leaves them bound to the original modules
    stale = instance_methods(replicas[1])
    assert stale and all(id(v.__self__) in originals for _, _, v in stale)
    for replica in replicas:
        assert rebind_instance_methods(model, replica) == len(own)
        bound = instance_methods(replica)
        assert len(bound) == len(own)
        mine = {id(m) for m in replica.modules()}
        for module, name_, value in bound:
            assert value.__self__ is module, f'{type(module).__name__}.{name_}'
            assert id(value.__self__) in mine
            assert value.__func__ is getattr(
                model.get_submodule(_path(replica, module)), name_).__func__


def _path(root, module) -> str:
    for name, m in root.named_modules():
        if m is module:
            return name
    raise KeyError(module)


def test_the_data_parallel_wrapper_replicates_with_own_methods():
    assert data_parallel.replicate_with_own_methods is \
        replicate_with_own_methods
    assert 'replicate' not in vars(data_parallel)  # no bare torch replicate
