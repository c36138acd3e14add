"""``--pipeline`` of ``tools/benchmark.py``: worker CPU per sample, stock
against fast, and a bytes check of every sample.

Both arms build the config's train dataset; the fast one gets
:func:`~fast_parallel.pipeline.switch_pipeline`. Samples alternate between
the arms in this one process, under the threads a DataLoader worker has
(torch 1, OpenCV 0), each arm starting from the same random states; each
output and the random states after it must be equal. Times are this
thread's CPU time, per transform and in all, after warm-up samples that
bring each arm to its steady state (stock's arrays of up to 25 MB
page-fault for its first ~100 samples in a process, while the allocator
settles: a worker runs thousands); a sample with a one-time event in any
arm (over 20 times that arm's median: a numba compile) is left out of
every arm's times, and named. Rounds of samples give the spread of the
ratio.
"""
import copy
import random
import statistics
import time
from typing import Any, Dict, List, Optional

import cv2
import numpy as np
import torch

__all__ = ['ARMS', 'compare_pipelines', 'first_difference']

#: The arms, stock first.
ARMS = ('stock', 'fast', 'fast_cached')


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().clone(memory_format=torch.contiguous_format).reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else flat


def first_difference(a: Any, b: Any, path: str = 'sample') -> Optional[str]:
    """Where two samples differ (type, dtype, shape, bytes, keys), or None.

    Args:
        a: A stock sample (or a part of it).
        b: The fast one.
        path (str): The name of this part, for the answer.

    Returns:
        str | None: The first differing path and how, or None when equal.
    """
    from mmengine.structures import BaseDataElement
    if type(a) is not type(b):
        return f'{path}: {type(a).__name__} vs {type(b).__name__}'
    if isinstance(a, torch.Tensor):
        layout = (a.dtype, a.shape, a.stride())
        if layout != (b.dtype, b.shape, b.stride()) or \
                not torch.equal(_bits(a), _bits(b)):
            return f'{path}: tensors differ'
        return None
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape or a.strides != \
                b.strides or a.tobytes() != b.tobytes():
            return f'{path}: arrays differ'
        return None
    if isinstance(a, BaseDataElement):
        return first_difference(
            dict(a.metainfo_items()), dict(b.metainfo_items()),
            f'{path}.metainfo') or first_difference(
                dict(a.items()), dict(b.items()), path)
    if hasattr(a, 'tensor') and hasattr(a, 'box_dim'):  # mmdet boxes
        return first_difference(a.tensor, b.tensor, f'{path}.tensor')
    if hasattr(a, 'tensor') and hasattr(a, 'points_dim'):  # mmdet3d points
        return first_difference((a.tensor, a.points_dim, a.attribute_dims),
                                (b.tensor, b.points_dim, b.attribute_dims),
                                f'{path}.points')
    if hasattr(a, 'masks') and hasattr(a, 'height'):  # mmdet masks
        return first_difference((a.height, a.width, a.masks),
                                (b.height, b.width, b.masks), f'{path}.masks')
    if isinstance(a, dict):
        if list(a) != list(b):
            return f'{path}: keys {list(a)} vs {list(b)}'
        for key in a:
            found = first_difference(a[key], b[key], f'{path}.{key}')
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f'{path}: lengths {len(a)} vs {len(b)}'
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f'{path}[{i}]')
            if found:
                return found
        return None
    if isinstance(a, np.generic):  # numpy scalars: their bits
        if a.dtype == b.dtype and a.tobytes() == b.tobytes():
            return None
        return f'{path}: {a!r} vs {b!r}'
    same = a == b
    if isinstance(same, bool) and (same or (a != a and b != b)):
        return None
    return f'{path}: {a!r} vs {b!r}'


def _seed(seed: int) -> None:
    np.random.seed(seed)
    random.seed(seed)
    torch.manual_seed(seed)


def _states() -> tuple:
    return (np.random.get_state(), random.getstate(),
            torch.random.get_rng_state())


def _set_states(states: tuple) -> None:
    np.random.set_state(states[0])
    random.setstate(states[1])
    torch.random.set_rng_state(states[2])


def _same_states(a: tuple, b: tuple) -> bool:
    return (a[0][0] == b[0][0] and np.array_equal(a[0][1], b[0][1])
            and a[0][2:] == b[0][2:] and a[1] == b[1]
            and torch.equal(a[2], b[2]))


def _transforms(dataset: Any) -> List[Any]:
    from fast_parallel.pipeline.switch import _pipelines
    return [t for _, transforms in _pipelines(dataset) for t in transforms]


def _time_transforms(dataset: Any, spent: Dict[str, float]) -> None:
    """Times each transform instance's ``transform`` into ``spent``."""
    for t in _transforms(dataset):
        name = type(t).__name__.replace('Fast', '', 1) \
            if type(t).__module__.startswith('fast_parallel') \
            else type(t).__name__
        inner = t.transform

        def timed(results, _inner=inner, _name=name):
            start = time.thread_time()
            try:
                return _inner(results)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.thread_time() - \
                    start

        t.transform = timed


def compare_pipelines(cfg: Any,
                      samples: int = 200,
                      seed: int = 0,
                      rounds: int = 10,
                      warmup: Optional[int] = None) -> dict:
    """Stock and fast train pipelines of ``cfg``, sample by sample.

    Each arm runs as a DataLoader worker does, on one torch and no OpenCV
    thread; the process's thread counts are put back on return.

    Args:
        cfg (Config): A config (its ``train_dataloader.dataset``).
        samples (int): Samples per arm. Defaults to 200.
        seed (int): Seed of the first sample's random states. Defaults to 0.
        rounds (int): Rounds the samples are split into for the spread.
            Defaults to 10.
        warmup (int, optional): Samples each arm makes first, untimed (from
            ``seed + 1``; every arm's outputs compared alike). Defaults to
            ``min(samples, 150)``.

    Returns:
        dict: ``stock_ms``, ``fast_ms``, ``fast_cached_ms`` (CPU per
        sample; the cached arm's cache filled first, as from a run's second
        epoch), ``ratio`` and ``cached_ratio`` (to stock), ``spread`` and
        ``cached_spread`` (min, median, max of the rounds' ratios),
        ``samples``, ``equal`` (samples whose outputs and random states
        matched stock's in both fast arms), ``first_difference``,
        ``warmup``, ``one_time`` (the samples left out of the times:
        :func:`_one_time`), ``switch`` and ``switch_cached`` (the start
        line's words),
        ``by_transform`` (ms per sample by transform, per arm) and
        ``counts`` (:data:`fast_parallel.pipeline.COUNTS`).
    """
    threads, cv_threads = torch.get_num_threads(), cv2.getNumThreads()
    torch.set_num_threads(1)
    cv2.setNumThreads(0)
    try:
        return _compare(cfg, samples, seed, rounds,
                        min(samples, 150) if warmup is None else warmup)
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv_threads)


def _one_sample(arms: dict, i: int, total: Dict[str,
                                                List[float]]) -> Optional[str]:
    """Sample ``i`` from every arm (in a rotating order, each from the same
    random states), its CPU time appended to ``total``; the states left as
    stock's leave them. Returns the first difference from stock's, or
    None."""
    start_states = _states()
    order = ARMS[i % 3:] + ARMS[:i % 3]
    out = {}
    for name in order:
        _set_states(start_states)
        start = time.thread_time()
        sample = arms[name][i % len(arms[name])]
        total[name].append(time.thread_time() - start)
        out[name] = (sample, _states())
    found = None
    for name in ARMS[1:]:
        found = found or first_difference(out['stock'][0], out[name][0])
        if found is None and not _same_states(out['stock'][1], out[name][1]):
            found = f'random states after the sample ({name})'
    _set_states(out['stock'][1])
    return found


def _compare(cfg: Any, samples: int, seed: int, rounds: int,
             warmup: int) -> dict:
    """:func:`compare_pipelines` on the threads it set."""
    from mmengine.registry import DATASETS, init_default_scope

    from fast_parallel.pipeline import COUNTS, switch_pipeline
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    arms = {}
    for name in ARMS:
        # from the same random states: a dataset may draw while it is built
        # (mmdet3d's gt-database sampler shuffles its lists)
        _seed(seed)
        arms[name] = DATASETS.build(
            copy.deepcopy(cfg.train_dataloader.dataset))
    switch = str(switch_pipeline(arms['fast']))
    cached = str(switch_pipeline(arms['fast_cached'], cache_inputs='auto'))
    _warm_cache(arms['fast_cached'])
    spent: Dict[str, Dict[str, float]] = {name: {} for name in ARMS}
    for name, dataset in arms.items():
        _time_transforms(dataset, spent[name])
    total: Dict[str, List[float]] = {name: [] for name in ARMS}
    equal, difference = 0, None
    _seed(seed)
    for dataset in arms.values():  # lazy set-up (full_init, databases)
        start_states = _states()
        dataset[0]
        _set_states(start_states)
    _seed(seed + 1)
    for i in range(warmup):  # (untimed: each arm to its steady state)
        found = _one_sample(arms, i, {name: [] for name in ARMS})
        if found is not None and difference is None:
            difference = f'warm-up sample {i}: {found}'
    _seed(seed)
    for spent_arm in spent.values():
        spent_arm.clear()
    COUNTS.clear()
    steps = []  # (each sample's CPU time by transform, per arm)
    for i in range(samples):
        before = {name: dict(arm) for name, arm in spent.items()}
        found = _one_sample(arms, i, total)
        steps.append({
            name: {
                k: v - before[name].get(k, 0.0)
                for k, v in arm.items()
            }
            for name, arm in spent.items()
        })
        if found is None:
            equal += 1
        elif difference is None:
            difference = f'sample {i}: {found}'
    once = _one_time(total)
    kept = [i for i in range(samples) if i not in once]
    for name in ARMS:
        total[name] = [total[name][i] for i in kept]
        for i in once:
            for k, v in steps[i][name].items():
                spent[name][k] -= v
    parts = [
        part for part in np.array_split(np.arange(len(kept)), rounds)
        if len(part)
    ]  # (rounds of sizes within one of each other)

    def spread(name: str) -> List[float]:
        ratios = [
            sum(total[name][k] for k in part) / sum(total['stock'][k]
                                                    for k in part)
            for part in parts
        ]
        return [min(ratios), statistics.median(ratios), max(ratios)]

    stock_s = sum(total['stock'])
    return dict(
        stock_ms=stock_s / len(kept) * 1e3,
        fast_ms=sum(total['fast']) / len(kept) * 1e3,
        fast_cached_ms=sum(total['fast_cached']) / len(kept) * 1e3,
        ratio=sum(total['fast']) / stock_s,
        cached_ratio=sum(total['fast_cached']) / stock_s,
        spread=spread('fast'),
        cached_spread=spread('fast_cached'),
        samples=samples,
        warmup=warmup,
        one_time=sorted(once),
        equal=equal,
        first_difference=difference,
        switch=switch,
        switch_cached=cached,
        by_transform={
            arm: {
                k: v / len(kept) * 1e3
                for k, v in spent[arm].items()
            }
            for arm in spent
        },
        counts=dict(COUNTS))


#: A sample whose CPU time in some arm is over this many times that arm's
#: median holds a one-time event (a numba compile for a new signature, a
#: first call), not per-sample work.
ONE_TIME = 20


def _one_time(total: Dict[str, List[float]]) -> set:
    """Sample indices left out of every arm's times: those where any arm
    took over :data:`ONE_TIME` times its own median (stock's ObjectSample
    compiles a numba kernel for a new signature once, ~0.2 s, where its
    samples take ~3 ms), where they are few (at most 1 % of the samples,
    and at least one may be): more are a recurring tail, which stays."""
    samples = len(next(iter(total.values()), []))
    once = set()
    for times in total.values():
        limit = ONE_TIME * statistics.median(times) if times else 0.0
        once.update(i for i, t in enumerate(times) if t > limit)
    return once if len(once) <= max(1, samples // 100) else set()


def _warm_cache(dataset: Any) -> None:
    """Decodes every image (and reads every gt-database file) of
    ``dataset`` once into its cache, with Mosaic's and MixUp's resizes
    where those are kept (a run's first epoch), leaving the random states
    as they were."""
    from fast_parallel.pipeline.cache import FastLoadImageFromFile
    from fast_parallel.pipeline.fit_cache import fit_size
    from fast_parallel.pipeline.switch import _pipelines
    fits = [
        t._fp_fit for _, transforms in _pipelines(dataset) for t in transforms
        if getattr(t, '_fp_fit', None) is not None
    ]
    for holder, transforms in _pipelines(dataset):
        for load in transforms:
            if type(load) is FastLoadImageFromFile:
                for i in range(len(holder)):
                    loaded = load(holder.get_data_info(i))
                    for fit in fits if loaded is not None else ():
                        # and its Mosaic / MixUp resize, where kept
                        fit.resized(loaded, loaded['img'],
                                    fit_size(loaded['img'].shape, fit.scale))
            loader = getattr(
                getattr(load, 'db_sampler', None), 'points_loader', None)
            cache = getattr(loader, '_fp_cache', None)
            for path in getattr(cache, 'slots', ()):
                loader(dict(lidar_points=dict(lidar_path=path)))
