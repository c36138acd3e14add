"""fast_parallel/packing.py: pack / PackedBatch on real and random batches."""
import pickle
from collections import OrderedDict, namedtuple

import pytest
import torch
from helpers import assert_same_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mmengine.model import BaseDataPreprocessor
from mmengine.structures import BaseDataElement, InstanceData

from fast_parallel import PackingError, pack, register_tensor_holder
from fast_parallel.packing import ALIGN_BYTES, stock_transfers

CPU = torch.device('cpu')


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


ALL_DTYPES = [torch.uint8, torch.bool, torch.float16, torch.bfloat16,
              torch.float32, torch.float64, torch.int32, torch.int64]


def test_every_dtype_one_buffer_each_aligned():
    tree = {str(dt): [torch.arange(7).to(dt), torch.ones(3, 5).to(dt)]
            for dt in ALL_DTYPES}
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
    tree = OrderedDict(pair=Pair(torch.ones(2), torch.zeros(3)),
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
    with pytest.raises(PackingError,
                       match=r'sample 2, field data_samples\[2\]\.boxes'):
        pack({'data_samples': [BaseDataElement(), BaseDataElement(), elem]})


def test_unpacked_elements_do_not_share_field_sets():
    elem = BaseDataElement(metainfo=dict(a=1))
    elem.x = torch.ones(1)
    packed = pack([elem])
    first = packed.unpack()[0]
    first.set_metainfo(dict(b=2))
    assert 'b' not in packed.unpack()[0].metainfo_keys()


# ------------------------------------------------------- property tests
DTYPES = st.sampled_from(ALL_DTYPES)


@st.composite
def tensors(draw):
    dtype = draw(DTYPES)
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    t = (torch.rand(shape, generator=gen) * 100).to(dtype)
    kind = draw(st.sampled_from(['plain', 'transposed', 'expanded', 'grad']))
    if kind == 'transposed' and t.dim() >= 2:
        t = t.transpose(0, 1)
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
        for name in draw(st.lists(st.sampled_from(['bboxes', 'labels']),
                                  unique=True, max_size=2)):
            inst[name] = torch.rand(n, 4) if name == 'bboxes' else \
                torch.arange(n)
        elem.gt_instances = inst
        fields = draw(st.dictionaries(
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
            st.lists(children, max_size=4),
            st.tuples(children, children),
            st.dictionaries(st.text(min_size=1, max_size=3), children,
                            max_size=4),
            elements(children)),
        max_leaves=12)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_property_pack_unpack_equals_input_and_cast_data(tree):
    packed = check_roundtrip(tree)
    dtypes = {dt for dt, *_ in packed.layout}
    assert packed.num_copies == len(dtypes)
