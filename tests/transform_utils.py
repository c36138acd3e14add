"""Shared by the transform tests: one transform against its fast form on
the same input and random states, outputs or errors and the states after
compared (``first_difference``: bytes, dtypes, strides, points)."""
import copy
import json
import random

import numpy as np
import torch

from fast_parallel.bench.pipeline import first_difference


def states():
    return (np.random.get_state(), random.getstate(),
            torch.random.get_rng_state())


def set_states(saved):
    np.random.set_state(saved[0])
    random.setstate(saved[1])
    torch.random.set_rng_state(saved[2])


def same_states(a, b):
    return (np.array_equal(a[0][1], b[0][1]) and a[0][2:] == b[0][2:]
            and a[1] == b[1] and torch.equal(a[2], b[2]))


def run_both(stock, fast, results):
    """Each transform on its own deep copy of ``results``, from the same
    random states: (stock's output or error, fast's, states equal)."""
    start = states()
    outs = []
    for transform in (stock, fast):
        set_states(start)
        try:
            outs.append(('ok', transform(copy.deepcopy(results))))
        except Exception as error:  # stock's error must be fast's
            outs.append(('raised', f'{type(error).__name__}: {error}'))
        outs[-1] += (states(), )
    return outs[0], outs[1]


def assert_same_run(stock, fast, results):
    """Asserts both give the same output (or error) and random states;
    returns stock's ``(kind, output or error text)``."""
    (s_kind, s_out, s_states), (f_kind, f_out,
                                f_states) = run_both(stock, fast, results)
    assert (s_kind, f_kind) in (('ok', 'ok'), ('raised', 'raised')), \
        (s_kind, s_out if s_kind == 'raised' else f_out)
    if s_kind == 'raised':
        assert s_out == f_out
    else:
        assert first_difference(s_out, f_out) is None, \
            first_difference(s_out, f_out)
    assert same_states(s_states, f_states)
    return s_kind, s_out


def sparse_annotations(sample_data, tmp_path) -> str:
    """The sample COCO train set's annotations with boxes on one image in
    four, written under ``tmp_path``: MixUp's ``get_indexes`` retries, a
    mix sample without boxes. Returns the file's path."""
    with open(sample_data / 'coco/annotations/instances_train2017.json') as f:
        coco = json.load(f)
    keep = {image['id'] for image in coco['images'][::4]}
    coco['annotations'] = [
        a for a in coco['annotations'] if a['image_id'] in keep
    ]
    ann = tmp_path / 'sparse.json'
    ann.write_text(json.dumps(coco))
    return str(ann)


def compare_mix_datasets(cfg,
                         samples,
                         skip=None,
                         seed=0,
                         cache_inputs=None,
                         warm=False,
                         edit=None):
    """Builds ``cfg``'s mixing dataset stock and fast, and asserts both give
    the same samples (or errors) and random states, sample by sample;
    returns the switch's outcome. ``warm``: every image loaded once by the
    fast dataset first (loading draws nothing). ``edit``: called on each
    dataset after the switch (a user's change to the built pipeline)."""
    from mmdet.registry import DATASETS

    from fast_parallel.pipeline import COUNTS, switch_pipeline
    from fast_parallel.pipeline.mix_dataset import FastMultiImageMixDataset
    stock = DATASETS.build(copy.deepcopy(cfg))
    fast = DATASETS.build(copy.deepcopy(cfg))
    outcome = switch_pipeline(fast, cache_inputs=cache_inputs)
    assert type(fast) is FastMultiImageMixDataset
    for dataset in (stock, fast) if skip else ():
        dataset.update_skip_type_keys(skip)
    for dataset in (stock, fast) if edit else ():
        edit(dataset)
    for i in range(len(fast.dataset)) if warm else ():
        fast.dataset[i]
    np.random.seed(seed)
    random.seed(seed)
    torch.manual_seed(seed)
    COUNTS.clear()
    for i in range(samples):
        (s_kind, s_out, s_states), (f_kind, f_out, f_states) = run_both(
            lambda r, i=i: stock[i % len(stock)],
            lambda r, i=i: fast[i % len(fast)],
            None)
        assert s_kind == f_kind, (i, s_out, f_out)
        if s_kind == 'raised':
            assert s_out == f_out
        else:
            assert first_difference(
                s_out, f_out) is None, (i, first_difference(s_out, f_out))
        assert same_states(s_states, f_states), i
        set_states(s_states)
    return outcome
