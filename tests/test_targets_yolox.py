"""Batched YOLOX targets equal stock's, bit for bit
(fast_parallel/step/targets/yolox.py, simota.py, cpu_paths.py).

Each case builds a batch (image size, ground truths per image, predictions)
from a seed and compares :func:`yolox_targets` with stock's
``multi_apply(head._get_targets_single, ...)`` tensor by tensor: dtype, shape
and bits. Ties are built on purpose: those images must be counted as fallbacks
and still come out equal.
"""
import random
from typing import List, Optional, Tuple

import pytest
import torch
from mmdet.models.utils import multi_apply
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.structures import InstanceData
from targets_utils import DEVICES

from fast_parallel.bench.opcount import OpCounter
from fast_parallel.step.targets import cpu_paths
from fast_parallel.step.targets.stock_way import StockWay
from fast_parallel.step.targets.yolox import targets as yolox
from fast_parallel.step.targets.yolox.targets import (assign_batch,
                                                      prior_scores,
                                                      yolox_supported)

register_all_modules()


def yolox_targets(*args, **kwargs):
    """The batched targets and how many images went the stock way."""
    way = StockWay()
    out = yolox.yolox_targets(*args, stock_way=way, **kwargs)
    return out, way.samples


CASES_PER_TEST = 10

pytestmark = pytest.mark.usefixtures('mmdet_scope')


def _head(num_classes: int = 80, **assigner) -> torch.nn.Module:
    """The yolox-tiny head of mmdet's config, with ``num_classes``."""
    return MODELS.build(
        dict(
            type='YOLOXHead',
            num_classes=num_classes,
            in_channels=96,
            feat_channels=96,
            train_cfg=dict(
                assigner=dict(
                    type='SimOTAAssigner', center_radius=2.5, **assigner))))


HEADS = {80: _head(80), 3: _head(3)}


def _priors(head, height: int, width: int, device: str) -> torch.Tensor:
    sizes = [(height // s, width // s) for s in (8, 16, 32)]
    return torch.cat(
        head.prior_generator.grid_priors(
            sizes, dtype=torch.float32, device=device, with_stride=True))


def _gts(rng: random.Random, gen: torch.Generator, num: int, height: int,
         width: int, num_classes: int, kind: str) -> InstanceData:
    """``num`` boxes of one image; ``kind`` picks a corner case."""
    cxy = torch.rand(num, 2, generator=gen) * torch.tensor([width, height])
    wh = torch.exp(torch.rand(num, 2, generator=gen) * 5.5) + 1
    boxes = torch.cat([cxy - wh / 2, cxy + wh / 2], 1)
    boxes = torch.min(
        boxes.clamp(min=0),
        torch.tensor([width, height, width, height], dtype=torch.float32))
    labels = torch.randint(0, num_classes, (num, ), generator=gen)
    if kind == 'edge' and num:  # boxes on the image border
        boxes[:, 0] = 0.
        boxes[::2, 2] = float(width)
    elif kind == 'far' and num:  # no prior in any box or centre region
        boxes = boxes - 4 * max(height, width)
    elif kind == 'corner' and num:  # few valid priors, off the top-left
        size = torch.rand(num, 1, generator=gen) * 3 + 1
        start = -12 - torch.rand(num, 1, generator=gen) * 6
        boxes = torch.cat([start, start, start + size, start + size], 1)
    elif kind in ('dup', 'dup_label') and num:  # duplicated boxes
        pick = torch.randint(0, num, (max(1, num // 3), ), generator=gen)
        boxes = torch.cat([boxes, boxes[pick]])
        extra = labels[pick] if kind == 'dup' else torch.randint(
            0, num_classes, (pick.numel(), ), generator=gen)
        labels = torch.cat([labels, extra])
    return InstanceData(bboxes=boxes, labels=labels)


def _predictions(
        gen: torch.Generator, priors: torch.Tensor, gts: List[InstanceData],
        num_classes: int,
        tie: List[bool]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits through sigmoid and boxes near the ground truths."""
    num_imgs, num_priors = len(gts), priors.shape[0]
    cls = torch.randn(num_imgs, num_priors, num_classes, generator=gen) * 3
    obj = torch.randn(num_imgs, num_priors, generator=gen) * 3
    ctr = priors[:, :2] + priors[:, 2:] * 0.5
    side = priors[:, 2:] * torch.exp(
        torch.randn(num_imgs, num_priors, 2, generator=gen))
    boxes = torch.cat([ctr - side, ctr + side], -1)
    for i, gt in enumerate(gts):
        if len(gt) == 0:
            continue
        near = torch.randint(0, len(gt), (num_priors, ), generator=gen)
        jitter = 1 + 0.2 * torch.randn(num_priors, 4, generator=gen)
        use = torch.rand(num_priors, generator=gen) < 0.6
        boxes[i][use] = (gt.bboxes[near] * jitter)[use]
        if tie[i]:  # every prior alike: costs tie everywhere
            cls[i], obj[i], boxes[i] = 0.5, 0.5, gt.bboxes[0]
    return cls, obj, boxes


def make_case(seed: int, device: str = 'cpu'):
    """A generated batch: (head, priors, cls, boxes, obj, gts, tie flags)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_classes = rng.choice([80, 80, 3])
    head = HEADS[num_classes]
    head.use_l1 = rng.random() < 0.5
    tiny = rng.random() < 0.1
    height, width = (32, 32) if tiny else (32 * rng.randint(2, 10),
                                           32 * rng.randint(2, 10))
    num_imgs = rng.randint(1, 4)
    gts, tie = [], []
    for _ in range(num_imgs):
        num = rng.choice(
            [0, 1, 1, 3, 8, 20, 120 if height * width <= 256 * 256 else 30])
        kind = rng.choice(['plain'] * 6 +
                          ['edge', 'far', 'corner', 'dup', 'dup_label', 'tie'])
        gts.append(_gts(rng, gen, num, height, width, num_classes, kind))
        tie.append(kind == 'tie' and num > 0)
    priors = _priors(head, height, width, 'cpu')
    cls, obj, boxes = _predictions(gen, priors, gts, num_classes, tie)
    gts = [
        InstanceData(bboxes=g.bboxes.to(device), labels=g.labels.to(device))
        for g in gts
    ]
    return (head, priors.to(device), cls.to(device), boxes.to(device),
            obj.to(device), gts, tie)


def stock_targets(head, priors, cls, boxes, obj, gts, ignore=None) -> tuple:
    """What ``YOLOXHead.loss_by_feat`` gets from ``multi_apply``."""
    num_imgs = len(gts)
    return multi_apply(head._get_targets_single,
                       priors.unsqueeze(0).repeat(num_imgs, 1, 1), cls, boxes,
                       obj, gts, [{}] * num_imgs, ignore or [None] * num_imgs)


def bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bits, as integers of its width."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def assert_same(stock: tuple, fast: tuple, where: str) -> None:
    """Same lists, dtypes, shapes and bits."""
    assert len(stock) == len(fast) == 6
    for k, (stock_list, fast_list) in enumerate(zip(stock, fast)):
        assert len(stock_list) == len(fast_list), where
        for i, (a, b) in enumerate(zip(stock_list, fast_list)):
            at = f'{where}: result {k}, image {i}'
            if isinstance(a, int):
                assert type(b) is int and a == b, at
                continue
            assert a.dtype == b.dtype and a.shape == b.shape, at
            assert a.device == b.device, at
            assert torch.equal(a, b), at
            if a.is_floating_point():  # the sign of zeros too
                assert torch.equal(bits(a), bits(b)), at


def _check(seed: int,
           device: str,
           dtype: torch.dtype = torch.float32,
           box_dtype: Optional[torch.dtype] = None) -> Tuple[int, int]:
    head, priors, cls, boxes, obj, gts, tie = make_case(seed, device)
    # the head's outputs in ``dtype`` (under AMP: float16), the decoded
    # boxes in ``box_dtype`` (CUDA autocast: float32); gts float32
    priors, cls, obj = (t.to(dtype) for t in (priors, cls, obj))
    boxes = boxes.to(box_dtype or dtype)
    stock = stock_targets(head, priors, cls, boxes, obj, gts)
    fast, fallbacks = yolox_targets(head, priors, cls, boxes, obj, gts,
                                    [{}] * len(gts))
    assert_same(stock, fast, f'seed {seed}')
    assert fallbacks >= sum(tie), f'seed {seed}: a tie was not detected'
    assert fallbacks <= len(gts)
    return fallbacks, len(gts)


@pytest.mark.parametrize('block', range(24))
def test_matches_stock(block: int) -> None:
    """240 generated batches: every corner case of the module docstring."""
    for seed in range(block * CASES_PER_TEST, (block + 1) * CASES_PER_TEST):
        _check(seed, 'cpu')


@pytest.mark.parametrize('boxes', ['half', 'float32'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('block', range(2))
def test_half_outputs_match_stock(block: int, dtype: torch.dtype,
                                  boxes: str) -> None:
    """Half-precision outputs (AMP), stock and batched on the same tensors:
    the same results, dtypes included; with the decoded boxes half too, or
    float32 as CUDA autocast makes them (their ``exp`` runs in float32)."""
    box_dtype = dtype if boxes == 'half' else torch.float32
    stock_way = images = 0
    for seed in range(block * CASES_PER_TEST, (block + 1) * CASES_PER_TEST):
        fallbacks, num = _check(seed, 'cpu', dtype, box_dtype)
        stock_way, images = stock_way + fallbacks, images + num
    assert stock_way <= images // 2  # batched, not sent the stock way


@pytest.mark.parametrize('device', DEVICES)
def test_constructed_ties_fall_back(device: str) -> None:
    """Equal costs everywhere, duplicated boxes: counted, and still equal."""
    head = HEADS[80]
    priors = _priors(head, 128, 160, device)
    gen = torch.Generator().manual_seed(1)
    box = torch.tensor([[30., 40., 90., 100.]])
    gts = [
        InstanceData(bboxes=box, labels=torch.tensor([3])),
        InstanceData(bboxes=box.repeat(2, 1), labels=torch.tensor([5, 5])),
        InstanceData(bboxes=box + 7, labels=torch.tensor([1]))
    ]
    cls, obj, boxes = _predictions(gen, priors.cpu(), gts, 80,
                                   [True, False, False])
    gts = [
        InstanceData(bboxes=g.bboxes.to(device), labels=g.labels.to(device))
        for g in gts
    ]
    args = (priors, cls.to(device), boxes.to(device), obj.to(device), gts)
    fast, fallbacks = yolox_targets(head, *args, [{}] * 3)
    assert_same(stock_targets(head, *args), fast, 'ties')
    assert fallbacks == 2  # image 0: top-k boundary; image 1: min tie


@pytest.mark.parametrize('device', DEVICES)
def test_no_ground_truth_and_no_valid_prior(device: str) -> None:
    """Stock's two early branches, alone and mixed with normal images."""
    head = HEADS[80]
    priors = _priors(head, 96, 64, device)
    gen = torch.Generator().manual_seed(2)
    far = torch.tensor([[-900., -900., -880., -870.]])
    for boxes_per_image in ([0, 0], [0, 1], [far, 0], [far, 1, 0]):
        gts = [
            _gts(random.Random(0), gen, b, 96, 64, 80, 'plain') if isinstance(
                b, int) else InstanceData(bboxes=b, labels=torch.tensor([7]))
            for b in boxes_per_image
        ]
        cls, obj, boxes = _predictions(gen, priors.cpu(), gts, 80,
                                       [False] * len(gts))
        gts = [
            InstanceData(
                bboxes=g.bboxes.to(device), labels=g.labels.to(device))
            for g in gts
        ]
        args = (priors, cls.to(device), boxes.to(device), obj.to(device), gts)
        fast, fallbacks = yolox_targets(head, *args, [{}] * len(gts))
        assert_same(stock_targets(head, *args), fast, str(boxes_per_image))
        assert fallbacks == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_generated_cases_on_cuda() -> None:
    """The generated batches on the GPU: stock and batched both on CUDA."""
    for seed in range(24 * CASES_PER_TEST):
        _check(seed, 'cuda')


def test_priors_repeated_per_image() -> None:
    """``(B, N, 4)`` priors, as stock's ``multi_apply`` gets them."""
    for seed in (3, 4, 5):
        head, priors, cls, boxes, obj, gts, _ = make_case(seed)
        repeated = priors.unsqueeze(0).repeat(len(gts), 1, 1)
        fast, _ = yolox_targets(head, repeated, cls, boxes, obj, gts,
                                [{}] * len(gts))
        assert_same(
            stock_targets(head, priors, cls, boxes, obj, gts), fast,
            f'seed {seed}')


def test_ignore_boxes_change_nothing() -> None:
    """Stock's SimOTA never reads ignore boxes; batched leaves them out.

    Non-empty ignore boxes (random, some over the ground truths) give
    stock's targets exactly, with no image sent the stock way.
    """
    for seed in (7, 8, 9):
        head, priors, cls, boxes, obj, gts, _ = make_case(seed)
        metas, gen = [{}] * len(gts), torch.Generator().manual_seed(seed)
        ignore = []
        for gt in gts:
            xy = torch.rand(5, 2, generator=gen) * 500
            extra = torch.cat(
                [xy, xy + 20 + torch.rand(5, 2, generator=gen) * 100], 1)
            ignore.append(InstanceData(bboxes=torch.cat([gt.bboxes, extra])))
        fast, fallbacks = yolox_targets(head, priors, cls, boxes, obj, gts,
                                        metas, ignore)
        stock = stock_targets(head, priors, cls, boxes, obj, gts, ignore)
        assert_same(stock, fast, f'seed {seed}')
        plain, _ = yolox_targets(head, priors, cls, boxes, obj, gts, metas)
        assert_same(plain, fast, f'seed {seed}, without ignore boxes')


def test_uncovered_batches_take_the_stock_path() -> None:
    """Non-contiguous CPU predictions: all stock."""
    head, priors, cls, boxes, obj, gts, _ = make_case(7)
    metas, num_imgs = [{}] * len(gts), len(gts)
    strided = cls.transpose(1, 2).contiguous().transpose(1, 2)
    fast, fallbacks = yolox_targets(head, priors, strided, boxes, obj, gts,
                                    metas)
    assert fallbacks == num_imgs
    assert_same(
        stock_targets(head, priors, strided, boxes, obj, gts), fast,
        'non-contiguous')


def test_supported() -> None:
    """Stock YOLOXHead + SimOTA is covered; the rest says why not."""
    assert yolox_supported(_head()) is None

    class MyHead(type(_head())):
        pass

    sub = MyHead(
        num_classes=80,
        in_channels=96,
        train_cfg=dict(assigner=dict(type='SimOTAAssigner')))
    assert 'not YOLOXHead' in yolox_supported(sub)
    assert 'BboxOverlaps2D' in yolox_supported(
        _head(iou_calculator=dict(type='BboxOverlaps2D', dtype='fp16')))
    no_train = MODELS.build(
        dict(type='YOLOXHead', num_classes=80, in_channels=96))
    assert 'SimOTAAssigner' in yolox_supported(no_train)
    patched = _head()
    patched._get_targets_single = lambda *a: None
    assert 'replaced' in yolox_supported(patched)


@pytest.mark.parametrize('block', range(3))
def test_cost_matrix_and_dynamic_k_as_stock(block: int) -> None:
    """The intermediates the targets show only when a bit flips a choice:
    stock's cost matrix (class BCE summed over classes, IoU cost, INF), bit
    for bit, and its dynamic k, image by image, as stock's
    ``dynamic_k_matching`` receives them. The sum of the top IoUs itself may
    differ in its last bits (its order is the kernel's): an image whose sum
    is too close to an integer falls back."""
    for seed in range(2000 + block * CASES_PER_TEST,
                      2000 + (block + 1) * CASES_PER_TEST):
        head, priors, cls, boxes, obj, gts, _ = make_case(seed)
        seen = []
        matching = head.assigner.dynamic_k_matching

        def spy(cost, ious, num_gt, valid_mask):
            seen.append((cost.clone(), ious.clone(), valid_mask.clone()))
            return matching(cost, ious, num_gt, valid_mask)

        head.assigner.dynamic_k_matching = spy  # this test's instance only
        try:
            stock_targets(head, priors, cls, boxes, obj, gts)
        finally:
            del head.assigner.dynamic_k_matching
        assigned = assign_batch(head, priors, cls, boxes, obj, gts)
        if assigned is None:
            assert not seen
            continue
        found = assigned[2]
        images = [
            i for i, g in enumerate(gts)
            if len(g) and found.cost[i].isfinite().any()
        ]
        assert len(seen) == len(images), f'seed {seed}'
        topk = head.assigner.candidate_topk
        for (cost, ious, valid), i in zip(seen, images):
            num_gt = len(gts[i])
            assert torch.equal(found.cost[i][:, :num_gt].isfinite().any(1),
                               valid), f'seed {seed}'
            mine = found.cost[i][valid][:, :num_gt]
            assert torch.equal(mine.view(torch.int32),
                               cost.view(torch.int32)), f'seed {seed}'
            if valid.sum() >= topk and not found.fallback[i]:
                want = torch.clamp(
                    torch.topk(ious, topk, dim=0)[0].sum(0).int(), min=1)
                assert torch.equal(found.dynamic_k[i, :num_gt],
                                   want.long()), f'seed {seed}'


def _counted(fn, *args) -> OpCounter:
    with OpCounter() as counter:
        fn(*args)
    return counter


def _batch(num_imgs: int, num_gts: int, size: int = 640):
    """Predictions and well-separated ground truths: no ties, no fallback."""
    head = HEADS[80]
    gen = torch.Generator().manual_seed(num_imgs * 100 + num_gts)
    priors = _priors(head, size, size, 'cpu')
    gts = []
    for _ in range(num_imgs):
        cxy = torch.rand(num_gts, 2, generator=gen) * (size - 160) + 80
        wh = torch.rand(num_gts, 2, generator=gen) * 120 + 24
        gts.append(
            InstanceData(
                bboxes=torch.cat([cxy - wh / 2, cxy + wh / 2], 1),
                labels=torch.randint(0, 80, (num_gts, ), generator=gen)))
    cls, obj, boxes = _predictions(gen, priors, gts, 80, [False] * num_imgs)
    return head, priors, cls, boxes, obj, gts


def test_operations_do_not_grow_with_batch_or_boxes() -> None:
    """The batched path dispatches the same operations at any batch size and
    number of boxes; stock's grow with both."""
    figures = {}
    for num_imgs, num_gts in ((2, 10), (8, 10), (8, 3), (8, 30)):
        head, priors, cls, boxes, obj, gts = _batch(num_imgs, num_gts)
        args = (head, priors, cls, boxes, obj, gts, [{}] * num_imgs)
        yolox_targets(*args)  # the first call calibrates cpu_paths
        with OpCounter() as fast:
            _, fallbacks = yolox_targets(*args)
        assert fallbacks == 0
        stock = _counted(stock_targets, *args[:-1])
        figures[num_imgs,
                num_gts] = (stock.total, stock.ops['_local_scalar_dense'],
                            fast.total, fast.ops['_local_scalar_dense'])
    # (images, gts): (stock ops, stock .item(), batched ops, batched .item())
    # on this CPU: (2, 10): (331, 30, 207, 4), (8, 10): (1363, 120, 207, 4),
    # (8, 3): (1159, 64, 207, 4), (8, 30): (1849, 280, 207, 4).
    assert len({v[2] for v in figures.values()}) == 1
    assert len({v[3] for v in figures.values()}) == 1
    assert figures[8, 10][0] > 3 * figures[2, 10][0]
    assert figures[2, 10][0] > figures[2, 10][2]
    assert figures[8, 10][3] <= 4  # CPU one_hot's two range checks, twice


@pytest.mark.parametrize('threads', [1, 2, 3])
def test_cpu_paths_as_stock(threads: int) -> None:
    """Each element of a concatenation gets the value of its own tensor's
    call, whatever the thread count (the sigmoid's loops differ on AVX2)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(threads)
        sizes = [0, 5, 17, 1000, 33000, 70001, 16, 31] + [13] * 100
        parts = [torch.randn(n, generator=gen) * 8 for n in sizes]
        for name in ('sigmoid', 'log'):
            xs = parts if name == 'sigmoid' else [
                p.abs() + 1e-3 for p in parts
            ]
            op = cpu_paths.OPS[name][0]
            want = torch.cat([op(x) for x in xs])
            got = cpu_paths.as_stock(name, torch.cat(xs), sizes)
            assert torch.equal(want.view(torch.int32), got.view(torch.int32))
            if cpu_paths.calibrate(name, threads):  # the layout matters here
                naive = op(torch.cat(xs))
                assert not torch.equal(
                    want.view(torch.int32), naive.view(torch.int32))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize('threads', [1, 2, 3])
def test_prior_scores_as_stock_per_image(threads: int) -> None:
    """The scores SimOTA's class cost uses: stock's per-image bits, including
    the priors of each image's last, scalar-computed elements (96 px: 189
    priors, 13 in the tail), where one batched sigmoid differs (64 images:
    832 such elements, about 4 % of them differ on AVX2)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(threads)
        for num_imgs, num_priors, num_classes in ((8, 189, 80), (64, 189, 3),
                                                  (3, 525, 3), (2, 2100, 80),
                                                  (5, 21, 7)):
            cls = torch.randn(
                num_imgs, num_priors, num_classes, generator=gen) * 8
            obj = torch.randn(num_imgs, num_priors, generator=gen) * 8
            want = torch.stack([
                (c.sigmoid() * o.unsqueeze(1).sigmoid()).sqrt_()
                for c, o in zip(cls, obj)
            ])
            got = prior_scores(cls, obj)
            assert torch.equal(want.view(torch.int32), got.view(torch.int32))
            if cpu_paths.calibrate('sigmoid', threads) and num_imgs == 64:
                naive = (cls.sigmoid() * obj.unsqueeze(-1).sigmoid()).sqrt_()
                assert not torch.equal(
                    want.view(torch.int32), naive.view(torch.int32))
    finally:
        torch.set_num_threads(before)
