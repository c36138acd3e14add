"""``CenterHead.get_targets`` of a whole batch, bit for bit.

mmdet3d 1.4.0's ``get_targets_single`` loops over every object of every
task: a gaussian radius and a centre from the box (float32 tensor
arithmetic), then, for an object inside the map, a gaussian drawn into its
class's heatmap with an elementwise max, its index, mask and box target.
Here the float arithmetic runs once over every object of the batch, with the
same operations on the same operand kinds (so each element gets stock's
bits), the per-object decisions (``width > 0``, ``int(radius)``, the
in-map test) are taken on the host from one copy of those values, exactly as
stock's Python takes them, and every gaussian of the batch goes into the
heatmaps in one ``scatter_reduce`` (max is exact in any order). Why it is
exact, and what is computed stock's way: ``docs/targets_centerpoint.md``.
"""
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fast_parallel.step.targets.centerpoint.heatmap import (Drawn,
                                                            gaussian_pixels,
                                                            too_large)
from fast_parallel.step.targets.cpu_paths import as_stock
from fast_parallel.step.targets.stock_way import StockWay

__all__ = ['center_targets']

#: Beyond this magnitude float32 -> int32 is not defined (stock's
#: ``center.to(torch.int32)``): such a sample is computed stock's way.
_INT32 = 2.0**31


class Layout(NamedTuple):
    """The head's target settings, as ``get_targets_single`` reads them."""
    tasks: List[List[str]]
    max_objs: int
    width: int  # feature map x size (columns)
    height: int  # feature map y size (rows)
    factor: Any  # out_size_factor, as configured
    min_radius: Any
    overlap: float
    norm_bbox: bool


def layout(head: Any) -> Layout:
    """The settings of ``head``'s ``train_cfg`` that the targets use."""
    cfg = head.train_cfg
    grid = torch.tensor(cfg['grid_size'])
    fmap = (grid[:2] // cfg['out_size_factor']).tolist()
    return Layout([list(names) for names in head.class_names],
                  cfg['max_objs'] * cfg['dense_reg'], fmap[0], fmap[1],
                  cfg['out_size_factor'], cfg['min_radius'],
                  cfg['gaussian_overlap'], bool(head.norm_bbox))


def _radius(height: Tensor, width: Tensor, min_overlap: float) -> Tensor:
    """mmdet3d's ``gaussian_radius`` over many boxes: its operations, in
    its order, on vectors (its ``min`` of three is ``minimum``)."""
    a1 = 1
    b1 = (height + width)
    c1 = width * height * (1 - min_overlap) / (1 + min_overlap)
    sq1 = torch.sqrt(b1**2 - 4 * a1 * c1)
    r1 = (b1 + sq1) / 2

    a2 = 4
    b2 = 2 * (height + width)
    c2 = (1 - min_overlap) * width * height
    sq2 = torch.sqrt(b2**2 - 4 * a2 * c2)
    r2 = (b2 + sq2) / 2

    a3 = 4 * min_overlap
    b3 = -2 * min_overlap * (height + width)
    c3 = (min_overlap - 1) * width * height
    sq3 = torch.sqrt(b3**2 - 4 * a3 * c3)
    r3 = (b3 + sq3) / 2
    return torch.minimum(torch.minimum(r1, r2), r3)


def _object_values(head: Any, boxes: Tensor, cfg: Layout) -> Tensor:
    """``(n, 5)`` float32: length, width, radius, centre x, centre y of every
    object, each with stock's per-object arithmetic."""
    train_cfg = head.train_cfg
    # CPU tensors, as stock makes them (never moved to the device)
    pc_range = torch.tensor(train_cfg['point_cloud_range'])
    voxel_size = torch.tensor(train_cfg['voxel_size'])
    factor = cfg.factor
    length = boxes[:, 3] / voxel_size[0] / factor
    width = boxes[:, 4] / voxel_size[1] / factor
    radius = _radius(width, length, cfg.overlap)
    coor_x = (boxes[:, 0] - pc_range[0]) / voxel_size[0] / factor
    coor_y = (boxes[:, 1] - pc_range[1]) / voxel_size[1] / factor
    return torch.stack([length, width, radius, coor_x, coor_y], dim=1)


def _box_targets(boxes: Tensor, centers: Tensor, cells: Tensor,
                 norm_bbox: bool) -> Tensor:
    """``(m, 10)`` stock's ``anno_box`` rows of the drawn objects.

    Args:
        boxes (Tensor): ``(m, 9)`` their gravity-centre boxes.
        centers (Tensor): ``(m, 2)`` float32 centres on the map.
        cells (Tensor): ``(m, 2)`` int32 their cells.
        norm_bbox (bool): The head's ``norm_bbox``.
    """
    count = boxes.shape[0]
    dims = boxes[:, 3:6]
    if norm_bbox:  # stock: log of each object's 3 dims, one small tensor
        dims = as_stock('log', dims.contiguous(), [3] * count)
    rot = boxes[:, 6].contiguous()
    return torch.cat([
        centers - cells, boxes[:, 2:3], dims,
        as_stock('sin', rot, [1] * count)[:, None],
        as_stock('cos', rot, [1] * count)[:, None], boxes[:, 7:9]
    ],
                     dim=1)


def _decide(labels: List[int], values: List[List[float]], first: int,
            sample: int, cfg: Layout) -> Optional[List[Drawn]]:
    """One sample's objects as stock's loop decides them, or None where a
    value is one stock's conversions do not define (computed stock's way).

    Args:
        labels (list[int]): The sample's labels.
        values (list[list[float]]): Their rows of :func:`_object_values`.
        first (int): The sample's first row in the batch.
        sample (int): Its index.
        cfg (Layout): The settings.

    Returns:
        list[Drawn] | None: Per task and object drawn: where.
    """
    drawn: List[Drawn] = []
    flag = 0
    for task, names in enumerate(cfg.tasks):
        members = [
            k for j in range(len(names)) for k, label in enumerate(labels)
            if label == j + flag
        ]
        for slot, k in enumerate(members[:cfg.max_objs]):
            length, width, radius, coor_x, coor_y = values[k]
            if not (width > 0 and length > 0):
                continue
            if not (abs(radius) < float('inf') and abs(coor_x) < _INT32
                    and abs(coor_y) < _INT32):
                return None  # stock's int(radius) raises; int32 undefined
            radius = max(cfg.min_radius, int(radius))
            if too_large(radius):
                return None
            x, y = int(coor_x), int(coor_y)  # float32 -> int32 truncates
            if not (0 <= x < cfg.width and 0 <= y < cfg.height):
                continue
            drawn.append(
                Drawn(task, labels[k] - flag, slot, first + k, sample, x, y,
                      radius))
        flag += len(names)
    return drawn


def center_targets(head: Any, gts: Sequence[Any],
                   stock_way: StockWay) -> Tuple[List[Tensor], ...]:
    """Stock's ``get_targets`` result for a batch of covered samples.

    Args:
        head: A ``CenterHead`` the switch accepted.
        gts (Sequence[InstanceData]): ``bboxes_3d`` (9-dim
            ``LiDARInstance3DBoxes``, float32) and ``labels_3d``, one device.
        stock_way (StockWay): Counts samples computed stock's way.

    Returns:
        tuple: Per task: heatmaps ``(B, C_t, H, W)``, anno boxes ``(B,
        max_objs, 10)``, inds ``(B, max_objs)`` int64, masks ``(B,
        max_objs)`` uint8.
    """
    cfg = layout(head)
    device = gts[0].labels_3d.device
    boxes = torch.cat([
        torch.cat((gt.bboxes_3d.gravity_center, gt.bboxes_3d.tensor[:, 3:]),
                  dim=1) for gt in gts
    ]).to(device)
    objects = _object_values(head, boxes, cfg)
    values = objects.tolist()  # the one copy to the host
    labels = torch.cat([gt.labels_3d for gt in gts]).tolist()
    rows: List[Optional[List[Drawn]]] = []
    first = 0
    for sample, gt in enumerate(gts):
        count = len(gt.labels_3d)
        rows.append(
            _decide(labels[first:first + count], values[first:first + count],
                    first, sample, cfg))
        first += count
    out = Targets.zeros(cfg, len(gts), boxes)
    drawn = [d for row in rows if row is not None for d in row]
    if drawn:
        out.draw(drawn, boxes, objects[:, 3:5], cfg)
    stock_way.fill(rows, lambda b: out.put_stock(b, head, gts[b]))
    return out.heatmaps, out.anno_boxes, out.inds, out.masks


class Targets(NamedTuple):
    """The batch's outputs: one buffer per kind, a view per task."""
    heat: Tensor
    heatmaps: List[Tensor]
    anno: Tensor
    ind: Tensor
    mask: Tensor

    @property
    def anno_boxes(self) -> List[Tensor]:
        return list(self.anno.unbind(0))

    @property
    def inds(self) -> List[Tensor]:
        return list(self.ind.unbind(0))

    @property
    def masks(self) -> List[Tensor]:
        return list(self.mask.unbind(0))

    @classmethod
    def zeros(cls, cfg: Layout, num: int, boxes: Tensor) -> 'Targets':
        """Zeroed targets of ``num`` samples (stock's dtypes)."""
        sizes = [len(names) for names in cfg.tasks]
        area = cfg.height * cfg.width
        heat = boxes.new_zeros(num * sum(sizes) * area)
        views, start = [], 0
        for size in sizes:
            views.append(heat[start:start + num * size * area].view(
                num, size, cfg.height, cfg.width))
            start += num * size * area
        shape = (len(sizes), num, cfg.max_objs)
        device = boxes.device
        return cls(heat, views,
                   boxes.new_zeros(shape + (10, ), dtype=torch.float32),
                   torch.zeros(shape, dtype=torch.int64, device=device),
                   torch.zeros(shape, dtype=torch.uint8, device=device))

    def draw(self, drawn: List[Drawn], boxes: Tensor, centers: Tensor,
             cfg: Layout) -> None:
        """Writes the drawn objects' gaussians, indices, masks, box rows."""
        device = boxes.device
        num = self.anno.shape[1]
        pixels, values = gaussian_pixels(drawn,
                                         [h.shape[1] for h in self.heatmaps],
                                         num, cfg.height, cfg.width)
        self.heat.scatter_reduce_(0, pixels.to(device), values.to(device),
                                  'amax')
        host = torch.tensor([[
            d.row, (d.task * num + d.sample) * cfg.max_objs + d.slot, d.x, d.y,
            d.y * cfg.width + d.x
        ] for d in drawn],
                            dtype=torch.int64).to(device)
        rows, slots = host[:, 0], host[:, 1]
        self.anno.view(-1,
                       10)[slots] = _box_targets(boxes[rows], centers[rows],
                                                 host[:, 2:4].to(torch.int32),
                                                 cfg.norm_bbox)
        self.ind.view(-1)[slots] = host[:, 4]
        self.mask.view(-1)[slots] = 1

    def put_stock(self, sample: int, head: Any, gt: Any) -> bool:
        """Stock's ``get_targets_single`` for one sample, written in place."""
        heatmaps, anno_boxes, inds, masks = type(head).get_targets_single(
            head, gt)
        for task, heatmap in enumerate(heatmaps):
            self.heatmaps[task][sample] = heatmap
            self.anno[task, sample] = anno_boxes[task]
            self.ind[task, sample] = inds[task]
            self.mask[task, sample] = masks[task]
        return True
