"""Rotated BEV box overlaps on the CPU: mmdet3d's ``rotate_iou`` kernel
ported to numba ``@njit``, bit for bit the kernel under numba's CUDA
simulator (precision notes: :func:`rotate_iou_cpu_eval`).
"""
import math

import numba
import numpy as np

__all__ = ['rotate_iou_cpu_eval']

# The kernel keeps at most 8 intersection vertices (16 floats). Degenerate
# pairs (shared edges) can report more: the CUDA kernel then writes past its
# local array and the simulator raises IndexError. Here the buffers are large
# enough for every candidate (8 corners + 16 edge crossings).
_MAX_VERTICES = 24

_F32 = np.float32
_F64 = np.float64


@numba.njit(cache=True, error_model='numpy')
def _corners(rbox: np.ndarray, out: np.ndarray) -> None:
    """Writes the 4 corners of a rotated box, as ``rbbox_to_corners`` does.

    ``math.cos``/``math.sin`` return Python floats, so each corner is summed
    in float64 and rounded to float32 once, on the store.

    Args:
        rbox (np.ndarray): ``float32[5]``: centre x, y, dims x, y, angle.
        out (np.ndarray): ``float32[8]`` output, x0, y0, ..., x3, y3.
    """
    angle = _F64(rbox[4])
    a_cos = math.cos(angle)
    a_sin = math.sin(angle)
    center_x = _F64(rbox[0])
    center_y = _F64(rbox[1])
    half_x = _F32(-rbox[2] / 2)  # an exact halving, in any precision
    half_y = _F32(-rbox[3] / 2)
    xs = (half_x, half_x, -half_x, -half_x)
    ys = (half_y, -half_y, -half_y, half_y)
    for i in range(4):
        x = _F64(xs[i])
        y = _F64(ys[i])
        out[2 * i] = _F32(a_cos * x + a_sin * y + center_x)
        out[2 * i + 1] = _F32(-a_sin * x + a_cos * y + center_y)


@numba.njit(cache=True, error_model='numpy')
def _point_in_quadrilateral(pt_x: np.float32, pt_y: np.float32,
                            corners: np.ndarray) -> bool:
    """Whether a point lies in a rectangle given by its corners (float32).

    Args:
        pt_x (np.float32): The point's x.
        pt_y (np.float32): The point's y.
        corners (np.ndarray): ``float32[8]`` corners of the rectangle.

    Returns:
        bool: True inside or on the border.
    """
    ab0 = corners[2] - corners[0]
    ab1 = corners[3] - corners[1]
    ad0 = corners[6] - corners[0]
    ad1 = corners[7] - corners[1]
    ap0 = pt_x - corners[0]
    ap1 = pt_y - corners[1]
    abab = ab0 * ab0 + ab1 * ab1
    abap = ab0 * ap0 + ab1 * ap1
    adad = ad0 * ad0 + ad1 * ad1
    adap = ad0 * ap0 + ad1 * ap1
    return abab >= abap and abap >= 0 and adad >= adap and adap >= 0


@numba.njit(cache=True, error_model='numpy')
def _segment_intersection(pts1: np.ndarray, pts2: np.ndarray, i: int, j: int,
                          out: np.ndarray) -> bool:
    """Crossing of edge ``i`` of ``pts1`` and edge ``j`` of ``pts2`` (float32).

    Args:
        pts1 (np.ndarray): ``float32[8]`` corners of the first rectangle.
        pts2 (np.ndarray): ``float32[8]`` corners of the second rectangle.
        i (int): Edge of ``pts1`` (corner ``i`` to corner ``i + 1``).
        j (int): Edge of ``pts2``.
        out (np.ndarray): ``float32[2]`` receiving the crossing point.

    Returns:
        bool: Whether the two edges cross.
    """
    a0 = pts1[2 * i]
    a1 = pts1[2 * i + 1]
    b0 = pts1[2 * ((i + 1) % 4)]
    b1 = pts1[2 * ((i + 1) % 4) + 1]
    c0 = pts2[2 * j]
    c1 = pts2[2 * j + 1]
    d0 = pts2[2 * ((j + 1) % 4)]
    d1 = pts2[2 * ((j + 1) % 4) + 1]
    ba0 = b0 - a0
    ba1 = b1 - a1
    da0 = d0 - a0
    ca0 = c0 - a0
    da1 = d1 - a1
    ca1 = c1 - a1
    acd = da1 * ca0 > ca1 * da0
    bcd = (d1 - b1) * (c0 - b0) > (c1 - b1) * (d0 - b0)
    if acd != bcd:
        abc = ca1 * ba0 > ba1 * ca0
        abd = da1 * ba0 > ba1 * da0
        if abc != abd:
            dc0 = d0 - c0
            dc1 = d1 - c1
            abba = a0 * b1 - b0 * a1
            cddc = c0 * d1 - d0 * c1
            dh = ba1 * dc0 - ba0 * dc1
            dx = abba * dc0 - ba0 * cddc
            dy = abba * dc1 - ba1 * cddc
            out[0] = dx / dh
            out[1] = dy / dh
            return True
    return False


@numba.njit(cache=True, error_model='numpy')
def _quadrilateral_intersection(pts1: np.ndarray, pts2: np.ndarray,
                                int_pts: np.ndarray) -> int:
    """Collects the vertices of the intersection polygon, kernel order.

    Args:
        pts1 (np.ndarray): ``float32[8]`` corners of the first rectangle.
        pts2 (np.ndarray): ``float32[8]`` corners of the second rectangle.
        int_pts (np.ndarray): ``float32[2 * _MAX_VERTICES]`` output.

    Returns:
        int: The number of vertices written.
    """
    num = 0
    for i in range(4):
        if _point_in_quadrilateral(pts1[2 * i], pts1[2 * i + 1], pts2):
            int_pts[num * 2] = pts1[2 * i]
            int_pts[num * 2 + 1] = pts1[2 * i + 1]
            num += 1
        if _point_in_quadrilateral(pts2[2 * i], pts2[2 * i + 1], pts1):
            int_pts[num * 2] = pts2[2 * i]
            int_pts[num * 2 + 1] = pts2[2 * i + 1]
            num += 1
    temp = np.empty(2, dtype=np.float32)
    for i in range(4):
        for j in range(4):
            if _segment_intersection(pts1, pts2, i, j, temp):
                int_pts[num * 2] = temp[0]
                int_pts[num * 2 + 1] = temp[1]
                num += 1
    return num


@numba.njit(cache=True, error_model='numpy')
def _sort_vertices(int_pts: np.ndarray, num: int) -> None:
    """Sorts polygon vertices by angle around their mean, in place.

    The kernel's insertion sort on a pseudo-angle. ``center /= num`` rounds
    once to float32; ``math.sqrt`` gives a float64 that divides the float32
    offset before the store rounds it.

    Args:
        int_pts (np.ndarray): ``float32`` vertices, x0, y0, x1, y1, ...
        num (int): How many vertices are used.
    """
    if num <= 0:
        return
    center0 = _F32(0.0)
    center1 = _F32(0.0)
    for i in range(num):
        center0 = center0 + int_pts[2 * i]
        center1 = center1 + int_pts[2 * i + 1]
    center0 = _F32(center0 / num)
    center1 = _F32(center1 / num)
    vs = np.empty(_MAX_VERTICES, dtype=np.float32)
    for i in range(num):
        v0 = int_pts[2 * i] - center0
        v1 = int_pts[2 * i + 1] - center1
        d = math.sqrt(_F64(v0 * v0 + v1 * v1))
        v0 = _F32(_F64(v0) / d)
        v1 = _F32(_F64(v1) / d)
        if v1 < 0:
            v0 = _F32(-2.0 - _F64(v0))
        vs[i] = v0
    for i in range(1, num):
        if vs[i - 1] > vs[i]:
            temp = vs[i]
            tx = int_pts[2 * i]
            ty = int_pts[2 * i + 1]
            j = i
            while j > 0 and vs[j - 1] > temp:
                vs[j] = vs[j - 1]
                int_pts[j * 2] = int_pts[j * 2 - 2]
                int_pts[j * 2 + 1] = int_pts[j * 2 - 1]
                j -= 1
            vs[j] = temp
            int_pts[j * 2] = tx
            int_pts[j * 2 + 1] = ty


@numba.njit(cache=True, error_model='numpy')
def _polygon_area(int_pts: np.ndarray, num: int) -> float:
    """Fan-triangle area of a sorted convex polygon.

    Each triangle's doubled area is a float32 expression; halving and the
    running sum are float64, as in the kernel.

    Args:
        int_pts (np.ndarray): ``float32`` sorted vertices.
        num (int): How many vertices are used.

    Returns:
        float: The area (float64).
    """
    area_val = 0.0
    a0 = int_pts[0]
    a1 = int_pts[1]
    for i in range(num - 2):
        b0 = int_pts[2 * i + 2]
        b1 = int_pts[2 * i + 3]
        c0 = int_pts[2 * i + 4]
        c1 = int_pts[2 * i + 5]
        doubled = (a0 - c0) * (b1 - c1) - (a1 - c1) * (b0 - c0)
        area_val += abs(_F64(doubled) / 2.0)
    return area_val


@numba.njit(cache=True, error_model='numpy')
def _intersection_area(rbox1: np.ndarray, rbox2: np.ndarray) -> float:
    """Area of the intersection of two rotated boxes (kernel's ``inter``).

    Args:
        rbox1 (np.ndarray): ``float32[5]`` box.
        rbox2 (np.ndarray): ``float32[5]`` box.

    Returns:
        float: The area (float64).
    """
    corners1 = np.empty(8, dtype=np.float32)
    corners2 = np.empty(8, dtype=np.float32)
    int_pts = np.empty(2 * _MAX_VERTICES, dtype=np.float32)
    _corners(rbox1, corners1)
    _corners(rbox2, corners2)
    num = _quadrilateral_intersection(corners1, corners2, int_pts)
    _sort_vertices(int_pts, num)
    return _polygon_area(int_pts, num)


@numba.njit(cache=True, error_model='numpy')
def _rotate_iou(rbox1: np.ndarray, rbox2: np.ndarray, criterion: int) -> float:
    """Overlap of two boxes (kernel's ``devRotateIoUEval``).

    Args:
        rbox1 (np.ndarray): ``float32[5]`` query box.
        rbox2 (np.ndarray): ``float32[5]`` box.
        criterion (int): -1 IoU, 0 over ``rbox1``'s area, 1 over ``rbox2``'s,
            anything else the raw intersection area.

    Returns:
        float: The overlap (float64; the caller rounds it to float32).
    """
    area1 = rbox1[2] * rbox1[3]
    area2 = rbox2[2] * rbox2[3]
    area_inter = _intersection_area(rbox1, rbox2)
    if criterion == -1:
        return area_inter / (_F64(area1 + area2) - area_inter)
    elif criterion == 0:
        return area_inter / _F64(area1)
    elif criterion == 1:
        return area_inter / _F64(area2)
    return area_inter


@numba.njit(cache=True, error_model='numpy')
def _rotate_iou_matrix(boxes: np.ndarray, query_boxes: np.ndarray,
                       criterion: int) -> np.ndarray:
    """``iou[n, k]`` = overlap of query box ``k`` with box ``n``.

    Args:
        boxes (np.ndarray): ``float32[N, 5]``.
        query_boxes (np.ndarray): ``float32[K, 5]``.
        criterion (int): See :func:`_rotate_iou`.

    Returns:
        np.ndarray: ``float32[N, K]``.
    """
    n_boxes = boxes.shape[0]
    n_query = query_boxes.shape[0]
    iou = np.zeros((n_boxes, n_query), dtype=np.float32)
    for n in range(n_boxes):
        for k in range(n_query):
            iou[n, k] = _F32(_rotate_iou(query_boxes[k], boxes[n], criterion))
    return iou


def rotate_iou_cpu_eval(boxes: np.ndarray,
                        query_boxes: np.ndarray,
                        criterion: int = -1,
                        device_id: int = 0) -> np.ndarray:
    """CPU drop-in for mmdet3d's ``rotate_iou_gpu_eval``.

    For BEV boxes in the camera frame (the rotation is clockwise), as the
    upstream kernel: corners of both rotated rectangles, clipped
    intersection polygon, vertex sort, fan-triangle area. Each arithmetic
    step is done in the precision the kernel's Python source gives it under
    numba's simulator with NumPy < 2 (``float32`` array elements; ``float64``
    where a ``float32`` meets a Python float, ``math.cos``/``math.sin``/
    ``math.sqrt`` or the ``area`` accumulator), so the results equal the
    simulator's bit for bit, the kernel's quirks included (a zero-area box
    "contains" every point on a line through it, so IoUs can be
    ``inf``/``NaN``). The compiled CUDA kernel is expected to differ from
    the simulator itself by float32 ULPs (numba types ``math.cos`` of a
    float32 as ``cosf`` on the GPU; NVVM may fuse multiply-adds), so neither
    is bit-identical to a real GPU (not measured here); an AP figure only
    moves if an IoU sits within an ULP of a threshold. Pairs whose candidate
    vertices overflow the kernel's 8-vertex array (e.g. a box against itself
    turned by pi) are undefined upstream and computed with all vertices
    here. About 0.3 us per overlapping pair, one thread.

    Args:
        boxes (np.ndarray): ``[N, 5]`` boxes: centre x, y, dims x, y, angle.
        query_boxes (np.ndarray): ``[K, 5]`` boxes in the same format.
        criterion (int): -1 ``inter / (area_query + area_box - inter)``,
            0 ``inter / area_query``, 1 ``inter / area_box``, anything else
            the intersection area itself. Upstream's docstring calls the query
            area "area1". Defaults to -1.
        device_id (int): Ignored; kept for the upstream signature.
            Defaults to 0.

    Returns:
        np.ndarray: ``float32[N, K]``, entry ``[n, k]`` for ``boxes[n]`` and
        ``query_boxes[k]``.
    """
    del device_id
    boxes = np.ascontiguousarray(np.asarray(boxes).astype(np.float32))
    query_boxes = np.ascontiguousarray(
        np.asarray(query_boxes).astype(np.float32))
    if boxes.shape[0] == 0 or query_boxes.shape[0] == 0:
        return np.zeros((boxes.shape[0], query_boxes.shape[0]),
                        dtype=np.float32)
    return _rotate_iou_matrix(
        boxes.reshape(-1, 5), query_boxes.reshape(-1, 5), int(criterion))


@numba.njit(cache=True, error_model='numpy')
def _vertex_counts(boxes: np.ndarray, query_boxes: np.ndarray) -> np.ndarray:
    """How many intersection-polygon vertices the kernel collects per pair.

    Above 8 the upstream kernel overflows its local array (see
    ``_MAX_VERTICES``); tests use this to keep such pairs away from it.

    Args:
        boxes (np.ndarray): ``float32[N, 5]``.
        query_boxes (np.ndarray): ``float32[K, 5]``.

    Returns:
        np.ndarray: ``int64[N, K]``.
    """
    counts = np.zeros((boxes.shape[0], query_boxes.shape[0]), dtype=np.int64)
    corners1 = np.empty(8, dtype=np.float32)
    corners2 = np.empty(8, dtype=np.float32)
    int_pts = np.empty(2 * _MAX_VERTICES, dtype=np.float32)
    for n in range(boxes.shape[0]):
        for k in range(query_boxes.shape[0]):
            _corners(query_boxes[k], corners1)
            _corners(boxes[n], corners2)
            counts[n, k] = _quadrilateral_intersection(corners1, corners2,
                                                       int_pts)
    return counts
