"""fast_parallel/data/packing.py: pack / PackedBatch on real and random
batches."""
import pickle
from collections import OrderedDict, namedtuple

import pytest
import torch
from helpers import assert_same_tree, tensor_layouts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mmdet.structures import DetDataSample
from mmengine.model import BaseDataPreprocessor
from mmengine.structures import BaseDataElement, InstanceData

from fast_parallel import PackingError, pack, register_tensor_holder
from fast_parallel.data.layout import ALIGN_BYTES
from fast_parallel.data.packing import stock_transfers

CPU = torch.device('cpu')
# ``Tensor.to('meta')`` runs the very code of ``Tensor.to('cuda')`` (the
# strides a move picks) and allocates nothing: a second device on any host.
META = torch.device('meta')


def cast(tree, device=CPU):
    """What stock mmengine hands the model: ``cast_data`` on ``device``."""
    return BaseDataPreprocessor().to(device).cast_data(tree)


def check_roundtrip(tree):
    packed = pack(tree)
    assert_same_tree(packed.unpack(), tree)
    assert_same_tree(packed.to(CPU).unpack(), cast(tree))
    restored = pickle.loads(pickle.dumps(packed))
    assert_same_tree(restored.unpack(), tree)
    return packed


# ---------------------------------------------------------------- edges
def test_empty_and_tensorless_trees():
    for tree in ([], {}, {'a': [1, 'x', None]}, ()):
        packed = check_roundtrip(tree)
        assert packed.num_copies == 0 and packed.nbytes == 0


ALL_DTYPES = [
    torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.float32,
    torch.float64, torch.int32, torch.int64
]


def test_every_dtype_one_buffer_each_aligned():
    tree = {
        str(dt): [torch.arange(7).to(dt),
                  torch.ones(3, 5).to(dt)]
        for dt in ALL_DTYPES
    }
    packed = check_roundtrip(tree)
    assert set(packed.buffers) == set(ALL_DTYPES)
    assert packed.num_copies == len(ALL_DTYPES)
    for dtype, offset, *_ in packed.layout:
        itemsize = packed.buffers[dtype].element_size()
        assert (offset * itemsize) % ALIGN_BYTES == 0


def test_zero_size_noncontiguous_expanded_and_grad_leaves():
    base = torch.randn(4, 6)
    tree = {
        'empty': torch.zeros(0, 4),
        'empty3d': torch.zeros(2, 0, 3, dtype=torch.int64),
        'scalar': torch.tensor(3.5),
        'transposed': base.t(),
        'sliced': base[:, ::2],
        'expanded': torch.tensor([1., 2.]).expand(5, 2),
        'grad': torch.randn(3, requires_grad=True),
    }
    packed = check_roundtrip(tree)
    out = packed.unpack()
    assert out['grad'].requires_grad and out['grad'].is_leaf
    assert not out['transposed'].requires_grad


def test_same_tensor_twice_is_stored_once_and_stays_shared():
    t = torch.randn(5, 3)
    tree = [t, {'again': t}, (t, )]
    packed = check_roundtrip(tree)
    assert packed.num_leaves == 1
    out = packed.unpack()
    assert out[0] is out[1]['again'] is out[2][0]
    assert stock_transfers(tree) == (3, 3 * t.numel() * 4)


Pair = namedtuple('Pair', 'left right')


def test_container_types_kept_and_cast_like_stock():
    tree = OrderedDict(
        pair=Pair(torch.ones(2), torch.zeros(3)),
        seq=(torch.ones(1), [torch.ones(2)]))
    packed = check_roundtrip(tree)
    assert type(packed.unpack()) is OrderedDict
    # stock cast_data turns every Mapping into a plain dict
    assert type(packed.to(CPU).unpack()) is dict


def test_mixed_devices_is_a_clear_error_naming_the_field():
    tree = {'inputs': [torch.ones(2), torch.ones(2, device='meta')]}
    with pytest.raises(PackingError, match=r"sample 1, field inputs\[1\]"):
        pack(tree)


def test_unknown_objects_travel_untouched():

    class Opaque:
        pass

    class WithTo:

        def __init__(self, moved=None):
            self.moved = moved

        def to(self, device, non_blocking=False):
            return WithTo(moved=(str(device), non_blocking))

    opaque, with_to = Opaque(), WithTo()
    elem = BaseDataElement(metainfo=dict(tag='x'))
    elem.thing = with_to
    elem.other = opaque
    elem.tensors = [torch.ones(2)]  # stock does not move lists in elements
    tree = {'a': opaque, 'b': with_to, 'e': elem}
    out = pack(tree).unpack()
    assert out['a'] is opaque and out['b'] is with_to
    assert out['e'].thing is with_to and out['e'].other is opaque
    moved = pack(tree).to(CPU).unpack()
    stock = cast(tree)
    # at top level stock never calls .to on unknown objects ...
    assert moved['b'] is with_to and stock['b'] is with_to
    # ... inside a data element it does, with the same arguments
    assert moved['e'].thing.moved == stock['e'].thing.moved == ('cpu', False)
    assert moved['e'].tensors[0] is elem.tensors[0]
    blocking = pack(tree).to(CPU, non_blocking=True).unpack()
    assert blocking['e'].thing.moved == ('cpu', True)


class Polygons:
    """A user structure type: the README's adapter example."""

    def __init__(self, coords, closed=True):
        self.coords = coords
        self.closed = closed

    def __len__(self):
        return len(self.coords)

    def to(self, device, **kwargs):
        return Polygons(self.coords.to(device, **kwargs), self.closed)


def test_adapter_for_a_user_type():
    register_tensor_holder(Polygons, attr='coords')
    inst = InstanceData(polys=Polygons(torch.randn(4, 2), closed=False))
    packed = check_roundtrip({'inst': [inst]})
    assert packed.num_leaves == 1
    assert packed.unpack()['inst'][0].polys.closed is False


def test_failing_adapter_names_sample_and_field():

    class Broken:

        def __init__(self):
            self.tensor = 'not a tensor'

        def to(self, *args, **kwargs):
            return self

    register_tensor_holder(Broken)
    elem = BaseDataElement()
    elem.boxes = Broken()
    with pytest.raises(
            PackingError, match=r'sample 2, field data_samples\[2\]\.boxes'):
        pack({'data_samples': [BaseDataElement(), BaseDataElement(), elem]})


def test_unpacked_elements_do_not_share_field_sets():
    elem = BaseDataElement(metainfo=dict(a=1))
    elem.x = torch.ones(1)
    packed = pack([elem])
    first = packed.unpack()[0]
    first.set_metainfo(dict(b=2))
    assert 'b' not in packed.unpack()[0].metainfo_keys()


def test_worker_states_travel_with_the_batch():
    packed = pack({'x': torch.arange(4.)})
    assert packed.worker_states is None
    states = (1, dict(python=(3, (1, 2), None), torch=b'\x01'))
    packed.worker_states = states
    for out in (pickle.loads(pickle.dumps(packed)), packed.to(CPU),
                packed.to(META)):
        assert out.worker_states == states
    if torch.cuda.is_available():
        assert packed.pin_memory().worker_states == states


# ------------------------------------------------------------- strides
# Each leaf kind as a function of ``rand(*shape)``; stock keeps every one of
# them as it is on its own device (``Tensor.to`` returns the tensor itself).
LEAVES = {
    'contiguous':
    lambda rand: rand(3, 4),
    'offset_slice':
    lambda rand: rand(6, 4)[2:5],
    'channels_last':
    lambda rand: rand(2, 3, 5, 4).contiguous(memory_format=torch.channels_last
                                             ),
    # mmdet's PackTrackInputs: uint8 frames, channels-last
    'channels_last_uint8':
    lambda rand: (rand(2, 3, 6, 5) * 255).to(torch.uint8).contiguous(
        memory_format=torch.channels_last),
    'channels_last_3d':
    lambda rand: rand(2, 3, 4, 5, 2).contiguous(memory_format=torch.
                                                channels_last_3d),
    'transposed':
    lambda rand: rand(4, 6).t(),
    'permuted':
    lambda rand: rand(2, 3, 4).permute(2, 0, 1),
    'gapped_slice':
    lambda rand: rand(3, 8, 5)[:, 1::2],
    'expanded':
    lambda rand: rand(3).expand(4, 3),
    'zeros_expanded':
    lambda rand: torch.zeros_like(rand(3)).expand(4, 3),
    'zero_stride':
    lambda rand: rand(3, 1, 2).expand(3, 4, 2),
    'overlapping':
    lambda rand: rand(10).as_strided((4, 3), (2, 1)),
    'grad_expanded':
    lambda rand: rand(3).requires_grad_().expand(2, 3),
    'scalar':
    lambda rand: rand(),
    'empty':
    lambda rand: rand(0, 4),
    'empty_expanded':
    lambda rand: rand(0, 1).expand(0, 4),
}
# What stock's ``Tensor.to(other_device)`` makes of the leaves that are not
# non-overlapping and dense: fresh dense strides. Every other kind keeps its
# strides on another device too.
MOVED_STRIDE = {
    'gapped_slice': (20, 5, 1),
    'expanded': (3, 1),
    'zeros_expanded': (3, 1),
    'zero_stride': (8, 2, 1),
    'overlapping': (3, 1),
    'grad_expanded': (3, 1),
}


def make_leaf(kind, device=CPU):
    """A fresh ``kind`` leaf; equal values for equal kinds."""
    gen = torch.Generator().manual_seed(len(kind))

    def rand(*shape):
        return torch.rand(shape, generator=gen).to(device)

    return LEAVES[kind](rand)


def strided_tree(kind, device=CPU):
    """``kind`` leaves in plain containers and in a real ``DetDataSample``.
    """
    sample = DetDataSample(metainfo=dict(img_id=3, img_shape=(5, 4)))
    sample.leaf = make_leaf(kind, device)
    leaf = make_leaf(kind, device)
    if leaf.dim():
        sample.gt_instances = InstanceData(bboxes=leaf)
    return {
        'inputs': [make_leaf(kind, device),
                   torch.ones(2, device=device)],
        'data_samples': [sample],
        'extra': {
            'pair': (make_leaf(kind, device), 7)
        },
    }


def leaves_of(tree):
    """The ``kind`` leaves of a ``strided_tree`` (or its unpacked copy)."""
    sample = tree['data_samples'][0]
    out = [tree['inputs'][0], sample.leaf, tree['extra']['pair'][0]]
    if 'gt_instances' in sample:
        out.append(sample.gt_instances.bboxes)
    return out


@pytest.mark.parametrize('kind', sorted(LEAVES))
def test_leaf_keeps_its_strides_where_it_was_packed(kind):
    tree = strided_tree(kind)
    packed = check_roundtrip(tree)  # values, shapes and strides, 3 ways
    out, moved = packed.unpack(), packed.to(CPU).unpack()
    # stock's .to(cpu) is the tensor itself: expanded and overlapping views
    # come back expanded and overlapping
    for got in leaves_of(out) + leaves_of(moved):
        want = make_leaf(kind)
        assert got.stride() == want.stride(), kind
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.requires_grad == want.requires_grad
    assert tensor_layouts(out) == tensor_layouts(tree)
    assert tensor_layouts(moved) == tensor_layouts(cast(tree))
    # still one buffer, hence one copy, per dtype; every span 64-byte aligned
    assert packed.num_copies == len({t.dtype
                                     for t in leaves_of(tree)}
                                    | {torch.float32})
    for dtype, offset, *_ in packed.layout:
        itemsize = packed.buffers[dtype].element_size()
        assert (offset * itemsize) % ALIGN_BYTES == 0


@pytest.mark.parametrize('kind', sorted(LEAVES))
def test_leaf_after_a_move_has_the_strides_stock_to_gives(kind):
    tree = strided_tree(kind)
    packed = pack(tree).to(META)
    out = packed.unpack()
    want = MOVED_STRIDE.get(kind, make_leaf(kind).stride())
    for got in leaves_of(out):
        assert got.device == META and got.stride() == want, kind
        # a dense leaf stays a view of its moved buffer (no extra copy);
        # any other one is the fresh dense copy stock's .to makes too
        base = got._base
        if kind in MOVED_STRIDE:
            assert base is None
        else:
            assert base is packed.buffers[got.dtype]
    assert tensor_layouts(out) == tensor_layouts(cast(tree, META))
    # the move survives pickling (a batch moved, then sent on)
    restored = pickle.loads(pickle.dumps(packed))
    assert tensor_layouts(restored.unpack()) == tensor_layouts(out)


def test_buffers_hold_the_storage_each_view_touches():
    floats = 16  # float32 elements in ALIGN_BYTES

    def buffer_len(t):
        return pack([t]).buffers[t.dtype].numel()

    # an expanded view: only the underlying elements
    assert buffer_len(torch.arange(3.).expand(1000, 3)) == floats
    # a dense view, whatever its memory format: exactly its elements
    assert buffer_len(
        torch.rand(2, 4, 4,
                   4).contiguous(memory_format=torch.channels_last)) == 128
    # a slice with gaps: its first to its last element, gaps included
    span = 1 + 2 * 40 + 3 * 10 + 4 * 1  # (3, 4, 5) over strides (40, 10, 1)
    assert buffer_len(torch.rand(3, 8, 5)[:, 1::2]) == -(-span // floats) * \
        floats
    assert buffer_len(torch.rand(0, 4)) == 0


def test_channels_last_leaf_gives_a_bit_identical_conv():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    packed = pack({'inputs': [x]})
    with torch.no_grad():
        want = conv(x)
        for got in (packed.unpack()['inputs'][0],
                    packed.to(CPU).unpack()['inputs'][0]):
            assert got.is_contiguous(memory_format=torch.channels_last)
            assert not got.is_contiguous()
            out = conv(got)
            assert out.stride() == want.stride()
            assert torch.equal(out.view(torch.int32), want.view(torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('kind', sorted(LEAVES))
def test_leaf_on_the_gpu_equals_stock_to(kind):
    gpu = torch.device('cuda', torch.cuda.current_device())
    tree = strided_tree(kind)
    # host -> device, from pinned buffers as the DataLoader hands them over
    out = pack(tree).pin_memory().to('cuda', non_blocking=True).unpack()
    assert_same_tree(out, cast(tree, gpu))
    for got, leaf in zip(leaves_of(out), leaves_of(tree)):
        assert got.stride() == leaf.to('cuda').stride()
    # packed on the GPU: 'cuda' is its own device, stock's .to is a no-op
    on_gpu = strided_tree(kind, gpu)
    assert_same_tree(pack(on_gpu).to('cuda').unpack(), on_gpu)
    # device -> host, blocking or not
    for non_blocking in (False, True):
        back = pack(on_gpu).to(CPU, non_blocking=non_blocking).unpack()
        torch.cuda.synchronize()
        assert_same_tree(back, cast(on_gpu, CPU))


# ------------------------------------------------------- property tests
DTYPES = st.sampled_from(ALL_DTYPES)


@st.composite
def tensors(draw):
    dtype = draw(DTYPES)
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    t = (torch.rand(shape, generator=gen) * 100).to(dtype)
    kind = draw(
        st.sampled_from(['plain', 'transposed', 'sliced', 'expanded', 'grad']))
    if kind == 'transposed' and t.dim() >= 2:
        t = t.transpose(0, 1)
    elif kind == 'sliced' and t.dim() >= 1:
        t = t[..., 1::2]
    elif kind == 'expanded':
        t = t.reshape(1, -1).expand(2, -1)
    elif kind == 'grad' and dtype.is_floating_point:
        t = t.float().requires_grad_()
    return t


def elements(children):
    metas = st.dictionaries(
        st.sampled_from(['img_shape', 'img_id', 'flip', 'path']),
        st.one_of(st.integers(), st.text(max_size=5), st.booleans(),
                  st.tuples(st.integers(), st.integers())),
        max_size=3)

    @st.composite
    def build(draw):
        elem = BaseDataElement(metainfo=draw(metas))
        n = draw(st.integers(0, 3))
        inst = InstanceData()
        for name in draw(
                st.lists(
                    st.sampled_from(['bboxes', 'labels']),
                    unique=True,
                    max_size=2)):
            inst[name] = torch.rand(n, 4) if name == 'bboxes' else \
                torch.arange(n)
        elem.gt_instances = inst
        fields = draw(
            st.dictionaries(
                st.sampled_from(['x', 'y', 'z']), children, max_size=2))
        for name, value in fields.items():
            elem.set_field(value, name)
        return elem

    return build()


def trees():
    leaves = st.one_of(tensors(), st.integers(), st.text(max_size=3),
                       st.none())
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.tuples(children, children),
            st.dictionaries(
                st.text(min_size=1, max_size=3), children, max_size=4),
            elements(children)),
        max_leaves=12)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_property_pack_unpack_equals_input_and_cast_data(tree):
    packed = check_roundtrip(tree)
    dtypes = {dt for dt, *_ in packed.layout}
    assert packed.num_copies == len(dtypes)
