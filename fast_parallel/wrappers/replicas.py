"""Replicas that call their own instance methods.

``torch.nn.parallel.replicate`` copies each module's ``__dict__``, so a
method fast_parallel put on an instance (a head's batched targets, the data
preprocessor's ``voxelize``, a pillar encoder's ``forward_batch``: a
``MethodType`` bound to that module) would, in every replica, still run on
the original module: replica 0's weights on another GPU's features.
:func:`replicate_with_own_methods` binds each such method to its replica.
"""
from types import MethodType
from typing import List, Sequence, Union

import torch
from torch import nn
from torch.nn.parallel import replicate

__all__ = ['rebind_instance_methods', 'replicate_with_own_methods']


def rebind_instance_methods(original: nn.Module, replica: nn.Module) -> int:
    """Binds the replica's instance methods to the replica's modules.

    Every ``MethodType`` in the ``__dict__`` of a module of ``replica``
    that is bound to a module of ``original`` is bound to that module's
    counterpart in ``replica`` instead (same place in ``modules()``).

    Args:
        original (nn.Module): The module replicated.
        replica (nn.Module): One replica of it (same structure).

    Returns:
        int: The methods rebound.
    """
    counterpart = {
        id(o): r
        for o, r in zip(original.modules(), replica.modules())
    }
    rebound = 0
    for module in replica.modules():
        for name, value in list(vars(module).items()):
            if not isinstance(value, MethodType):
                continue
            twin = counterpart.get(id(value.__self__))
            if twin is not None and twin is not value.__self__:
                module.__dict__[name] = MethodType(value.__func__, twin)
                rebound += 1
    return rebound


def replicate_with_own_methods(module: nn.Module,
                               devices: Sequence[Union[int, torch.device]],
                               detach: bool = False) -> List[nn.Module]:
    """``torch.nn.parallel.replicate``, each replica's instance methods
    bound to itself (:func:`rebind_instance_methods`).

    Args:
        module (nn.Module): The module to replicate.
        devices (Sequence[int | torch.device]): One replica per device.
        detach (bool): Passed to ``replicate``. Defaults to False.

    Returns:
        list[nn.Module]: The replicas.
    """
    replicas = replicate(module, devices, detach=detach)
    for replica in replicas:
        rebind_instance_methods(module, replica)
    return replicas
