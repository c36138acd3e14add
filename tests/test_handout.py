"""fast_parallel/data/handout.py: a fast DataLoader yields stock's structure,
and the wrappers still move it with one copy per buffer, honouring what user
code changed in it."""
import copy
import pickle

import pytest
import torch
from helpers import assert_same_tree
from mmengine.dataset import pseudo_collate
from mmengine.model import BaseDataPreprocessor
from torch.utils.data import Dataset

from fast_parallel import FastDataParallel, PackedBatch, pack, packed_collate
from fast_parallel.bench.synthetic import pointpillars_samples, yolox_samples
from fast_parallel.data import handout
from fast_parallel.data.handout import (DeviceTwins, hand_out, move_handed,
                                        packed_batch_of, take)
from fast_parallel.data.loader import FastDataLoader


class Samples(Dataset):

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def _cpu_twin(batch: PackedBatch) -> PackedBatch:
    """The batch's buffers copied elsewhere on the CPU: a stand-in for the
    device copy, so that a twin's memory is told from the handed-out
    leaf's."""
    return PackedBatch({
        dt: b.clone()
        for dt, b in batch.buffers.items()
    }, batch.layout, batch.skeleton, torch.device('cpu'))


@pytest.mark.parametrize('workers', [0, 2])
def test_fast_loader_yields_stock_structure(workers):
    samples = yolox_samples(6, 64, seed=3)
    loader = FastDataLoader(
        Samples(samples),
        batch_size=3,
        num_workers=workers,
        collate_fn=packed_collate)
    for b, batch in enumerate(loader):
        assert type(batch) is dict
        stock = pseudo_collate(samples[3 * b:3 * b + 3])
        assert_same_tree(batch, stock)
        assert_same_tree(copy.deepcopy(batch), stock)
        assert_same_tree(pickle.loads(pickle.dumps(batch)), stock)
        assert list(batch) == list(stock) and batch.get('inputs') is not None
        assert isinstance(packed_batch_of(batch), PackedBatch)


def test_handed_out_batches_are_bounded_and_taken_once():
    batches = [
        pack(pseudo_collate(yolox_samples(2, 32, seed=s)))
        for s in range(handout.KEEP + 2)
    ]
    trees = [hand_out(b) for b in batches]
    assert packed_batch_of(trees[0]) is None  # dropped: moved stock's way
    assert packed_batch_of(trees[-1]) is batches[-1]
    record = take(trees[-1])
    assert record.batch is batches[-1] and take(trees[-1]) is None
    # an equal structure that was not handed out is not taken for one
    assert take(pseudo_collate(yolox_samples(2, 32, seed=1))) is None


def test_twins_answer_only_untouched_leaves_and_follow_user_changes():
    samples = yolox_samples(3, 48, seed=5)
    batch = pack(pseudo_collate(samples))
    tree = hand_out(batch)
    # what hooks may do before the step
    tree['inputs'][0].add_(1)  # in place: travels in the buffer
    boxes = tree['data_samples'][1].gt_instances.bboxes
    replaced = type(boxes)(boxes.tensor * 2)
    tree['data_samples'][1].gt_instances.bboxes = replaced
    tree['inputs'][2] = tree['inputs'][2].clone()
    tree['extra'] = torch.arange(4)
    expected = copy.deepcopy(tree)

    record = take(tree)
    twin = _cpu_twin(batch)
    cast = BaseDataPreprocessor().cast_data
    with DeviceTwins(record, twin) as twins:
        out = cast(tree)
    assert_same_tree(out, expected)
    twin_memory = {
        b.untyped_storage().data_ptr()
        for b in twin.buffers.values()
    }

    def in_twin(t):
        return t.untyped_storage().data_ptr() in twin_memory

    assert in_twin(out['inputs'][0]) and in_twin(out['inputs'][1])
    assert out['inputs'][2] is tree['inputs'][2]  # replaced: torch's own .to
    assert out['data_samples'][1].gt_instances.bboxes.tensor is \
        replaced.tensor
    assert in_twin(out['data_samples'][0].gt_instances.bboxes.tensor)
    assert out['extra'] is tree['extra']
    assert twins.stock_copies == 0  # CPU to CPU copies nothing


def test_twins_leave_other_to_calls_to_torch():
    batch = pack(pseudo_collate(yolox_samples(2, 32, seed=2)))
    tree = hand_out(batch)
    record = take(tree)
    leaf = tree['data_samples'][0].gt_instances.bboxes.tensor
    with DeviceTwins(record, _cpu_twin(batch)):
        assert leaf.to('cpu').data_ptr() != leaf.data_ptr()  # a twin
        for call in (lambda: leaf.to(torch.float64),
                     lambda: leaf.to('cpu', torch.float32),
                     lambda: leaf.to('cpu', copy=True),
                     lambda: leaf.to(device='meta'),
                     lambda: leaf.to('cpu', memory_format=torch.channels_last)
                     if leaf.dim() == 4 else leaf.to(torch.int64)):
            out = call()
            assert out.data_ptr() != leaf.data_ptr() or out is leaf
        assert leaf.to('cpu', non_blocking=True).data_ptr() != \
            leaf.data_ptr()  # a twin again
    # reshaped in place: no longer what was handed out, torch moves it
    leaf.unsqueeze_(0)
    with DeviceTwins(record, _cpu_twin(batch)):
        assert leaf.to('cpu') is leaf


def test_wrapper_moves_a_handed_out_batch_on_the_cpu_as_stock():
    samples = pointpillars_samples(2, 200, 300, 3, seed=1)
    tree = hand_out(pack(pseudo_collate(samples)))
    model = FastDataParallel(torch.nn.Linear(1, 1))
    out = model.move_batch(tree, torch.device('cpu'), 'train')
    assert out is tree and packed_batch_of(tree) is None
    assert model.transfer_stats.last['train']['transfer_copies'] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_move_equals_stock_cast_data_with_one_copy_per_dtype():
    samples = yolox_samples(4, 64, seed=7)
    batch = pack(pseudo_collate(samples)).pin_memory()
    tree = hand_out(batch)
    tree['data_samples'][0].gt_instances.bboxes.add_(0.5)
    tree['data_samples'][2].set_metainfo({'flip': True})
    preprocessor = BaseDataPreprocessor().cuda()
    stock = preprocessor.cast_data(copy.deepcopy(tree))
    out, copies, nbytes, stock = move_handed(
        take(tree), torch.device('cuda', torch.cuda.current_device()), True,
        preprocessor.cast_data)
    torch.cuda.synchronize()
    assert_same_tree(out, stock)
    assert copies == len(batch.buffers) and nbytes == batch.nbytes
    assert stock == 0
