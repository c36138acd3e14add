"""fast_parallel/data/collate.py on real mmdet / mmdet3d packed samples."""
import random

import numpy as np
import pytest
import torch
from helpers import assert_same_tree, tensor_layouts
from mmdet.structures import DetDataSample
from mmengine.dataset import default_collate, pseudo_collate
from mmengine.model import BaseDataPreprocessor
from mmengine.registry import FUNCTIONS
from mmengine.structures import InstanceData
from torch.utils.data import DataLoader, Dataset

from fast_parallel import PackedBatch, PackedCollate, packed_collate
from fast_parallel.bench.synthetic import pointpillars_samples, yolox_samples
from fast_parallel.data.collate import packed_for
from fast_parallel.data.loader_state import LoaderState
from fast_parallel.data.ring import DEFAULT_RING, SharedRing
from fast_parallel.resume.hook import random_states, set_random_states

SHAPES = {
    # 8 images 3x640x640 uint8, 0..100 boxes (one sample with none)
    'yolox':
    lambda seed: yolox_samples(
        8,
        seed=seed,
        num_boxes=None if seed else [0, 100, 3, 57, 1, 0, 99, 12]),
    # 6 clouds of 15k..25k points x 4 float32, 0..40 LiDAR boxes
    'pointpillars':
    lambda seed: pointpillars_samples(
        6, seed=seed, num_boxes=None if seed else [0, 40, 7, 1, 0, 23]),
}


def devices():
    out = [torch.device('cpu')]
    if torch.cuda.is_available():
        out.append(torch.device('cuda', 0))
    return out


@pytest.mark.parametrize('shape', sorted(SHAPES))
@pytest.mark.parametrize('seed', [0, 1])
def test_packed_collate_equals_stock(shape, seed):
    samples = SHAPES[shape](seed)
    stock = pseudo_collate(samples)
    packed = packed_collate(samples)
    assert isinstance(packed, PackedBatch)
    assert_same_tree(packed.unpack(), stock)
    for device in devices():
        expected = BaseDataPreprocessor().to(device).cast_data(stock)
        assert_same_tree(packed.to(device).unpack(), expected)
    # one buffer per distinct dtype, at most 4 copies instead of one per tensor
    dtypes = {t.dtype for t in _tensors(stock)}
    assert packed.num_copies == len(dtypes) <= 4
    assert packed.num_leaves == len(_tensors(stock)) > packed.num_copies


def _tensors(tree):
    from fast_parallel.data.walker import Packer as _Packer
    packer = _Packer()
    packer.cast(tree, ())
    return packer.leaves


class SampleSet(Dataset):
    """Deterministic samples, rebuilt from the index in whichever worker."""

    def __init__(self, shape: str, length: int) -> None:
        self.shape, self.length = shape, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        maker = yolox_samples if self.shape == 'yolox' else \
            pointpillars_samples
        return maker(1, seed=100 + i)[0]


@pytest.mark.parametrize('shape,batch_size', [('yolox', 8),
                                              ('pointpillars', 6)])
def test_across_a_real_dataloader_with_workers(shape, batch_size):
    dataset = SampleSet(shape, 2 * batch_size)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=2,
        pin_memory=True,
        collate_fn=packed_collate)
    batches = list(loader)
    assert len(batches) == 2
    for b, packed in enumerate(batches):
        assert isinstance(packed, PackedBatch)
        stock = pseudo_collate(
            [dataset[i] for i in range(b * batch_size, (b + 1) * batch_size)])
        assert_same_tree(packed.unpack(), stock)
        for device in devices():
            expected = BaseDataPreprocessor().to(device).cast_data(stock)
            assert_same_tree(
                packed.to(device, non_blocking=True).unpack(), expected)


class StridedSet(Dataset):
    """Samples whose tensors are not contiguous, as some pipelines make them.

    ``inputs`` are uint8 frames in channels-last (mmdet's PackTrackInputs);
    the data sample holds a transposed, an expanded, a gapped and an
    overlapping tensor.
    """

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict:
        gen = torch.Generator().manual_seed(i)
        frames = torch.randint(
            0, 256, (2, 3, 12, 10), generator=gen, dtype=torch.uint8)
        sample = DetDataSample(metainfo=dict(img_id=i, img_shape=(12, 10)))
        sample.gt_instances = InstanceData(
            bboxes=torch.rand(4, 5, generator=gen).t(),
            labels=torch.tensor(i).expand(5))
        sample.sliced = torch.rand(3, 8, 5, generator=gen)[:, 1::2]
        sample.overlapping = torch.rand(
            10, generator=gen).as_strided((4, 3), (2, 1))
        return dict(
            inputs=frames.contiguous(memory_format=torch.channels_last),
            data_samples=sample)


@pytest.mark.parametrize(
    'collate', [
        packed_collate,
        PackedCollate(),
        PackedCollate(ring=None),
    ],
    ids=['packed_collate', 'PackedCollate-ring', 'PackedCollate-fresh'])
def test_strided_leaves_through_a_dataloader_equal_stock(collate):
    dataset = StridedSet()

    def batches(fn):
        return list(
            DataLoader(dataset, batch_size=3, num_workers=2, collate_fn=fn))

    stock_batches = batches(pseudo_collate)
    fast_batches = batches(collate)
    assert len(fast_batches) == len(stock_batches) == 2
    for packed, stock in zip(fast_batches, stock_batches):
        assert isinstance(packed, PackedBatch)
        out = packed.unpack()
        # values, shapes and strides (assert_same_tree compares them all)
        assert_same_tree(out, stock)
        assert tensor_layouts(out) == tensor_layouts(stock)
        for frames in out['inputs']:
            assert frames.is_contiguous(memory_format=torch.channels_last)
            assert not frames.is_contiguous()
        labels = out['data_samples'][0].gt_instances.labels
        assert labels.stride() == (0, )  # still expanded
        # what the model gets on the CPU, and after a move elsewhere
        assert_same_tree(packed.to('cpu').unpack(), cast(stock, 'cpu'))
        assert tensor_layouts(packed.to('meta').unpack()) == \
            tensor_layouts(cast(stock, 'meta'))
        for device in devices():
            assert_same_tree(packed.to(device).unpack(), cast(stock, device))


def cast(tree, device):
    """Stock ``cast_data`` on ``device``."""
    return BaseDataPreprocessor().to(device).cast_data(tree)


def test_packed_collate_is_registered_and_wraps_other_collates():
    assert FUNCTIONS.get('packed_collate') is packed_collate
    samples = [dict(x=torch.full((3, ), float(i)), y=i) for i in range(4)]
    fn = PackedCollate(default_collate)
    assert_same_tree(fn(samples).unpack(), default_collate(samples))
    assert_same_tree(
        PackedCollate(dict(type='default_collate'))(samples).unpack(),
        default_collate(samples))
    assert packed_collate([]).unpack() == []


class RandomSet(Dataset):
    """Each sample draws from Python's, NumPy's and torch's global state."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict:
        return dict(
            py=random.random(), np=float(np.random.rand()), pt=torch.rand(2))


@pytest.mark.parametrize('ring', [DEFAULT_RING, None], ids=['ring', 'fresh'])
def test_worker_states_are_those_after_each_batch(ring):
    loader = DataLoader(
        RandomSet(),
        batch_size=3,
        num_workers=2,
        collate_fn=PackedCollate(
            ring=ring, state=LoaderState(carries_worker_states=True)))
    batches = list(loader)
    assert [b.worker_states[0] for b in batches] == [0, 1, 0, 1]
    saved = random_states()
    try:
        # a worker's states after batch k make its next batch, k + 2
        for k in range(2):
            set_random_states(batches[k].worker_states[1])
            made = pseudo_collate([RandomSet()[0] for _ in range(3)])
            assert_same_tree(made, batches[k + 2].unpack())
    finally:
        set_random_states(saved)
    # off by default, and nothing to report outside a worker
    assert list(DataLoader(RandomSet(), batch_size=3, num_workers=1,
                           collate_fn=PackedCollate()))[0].worker_states \
        is None
    carrying = PackedCollate(state=LoaderState(carries_worker_states=True))
    assert carrying([RandomSet()[0]]).worker_states is None


def test_packed_for_reads_the_loader_state_and_keeps_the_collate():
    state = LoaderState()
    fn = packed_for(packed_collate, state)
    assert fn.state is state and fn.inner is pseudo_collate
    ring = SharedRing()
    other = PackedCollate(default_collate, ring=ring)
    fn = packed_for(other, state)
    assert fn is not other and other.state is None
    assert fn.inner is default_collate and fn.ring is ring
    assert packed_for(fn, state) is fn
    assert packed_for(fn, LoaderState()) is not fn
    assert packed_for(default_collate, state).inner is default_collate


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_pin_memory_pins_only_buffers():
    packed = packed_collate(yolox_samples(2, size=64)).pin_memory()
    assert all(b.is_pinned() for b in packed.buffers.values())
