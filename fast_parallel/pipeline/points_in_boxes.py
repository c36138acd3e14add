"""Which points lie in any of some rotated 3D boxes, as mmdet3d decides it.

``ObjectSample.remove_points_in_boxes`` keeps the points outside every
sampled box: ``box_np_ops.points_in_rbbox(points, boxes).any(-1)``, a numba
test of every point against every face of every box. :func:`in_any_box`
gives the same mask with a grid over the points: where a bound proves that
stock puts no point of a cell in a box, those pairs are skipped; every other
pair runs stock's test, expression for expression. Why the bound is exact:
``docs/pipeline.md``, "Where ObjectSample's time goes". Importing this
module imports numba, not mmdet3d.
"""
from typing import Any, Optional

import numba
import numpy as np

__all__ = ['in_any_box', 'box_faces', 'finite_faces']

#: Largest number of grid cells per axis; the cells grow past CELL_M to
#: keep within it.
MAX_CELLS = 512
#: The grid's cell side in the points' units (metres), at least.
CELL_M = 2.0


def box_faces(boxes: np.ndarray) -> tuple:
    """Stock's face normals and offsets of ``boxes`` (``points_in_rbbox``).

    Args:
        boxes (np.ndarray): ``(M, 7+)`` LiDAR boxes (centre of the bottom
            face, sizes, yaw).

    Returns:
        tuple: ``normal_vec`` ``(M, 6, 3)`` and ``d`` ``(M, 6)``, computed by
        mmdet3d's own ``center_to_corner_box3d`` (its steps, without the
        converter's inspection: ``db_sampler.corner_box3d``),
        ``corner_to_surfaces_3d`` and ``surface_equ_3d``, as
        ``points_in_rbbox`` computes them.
    """
    from mmdet3d.structures.ops import box_np_ops

    from fast_parallel.pipeline.db_sampler import corner_box3d
    corners = corner_box3d(boxes)
    surfaces = box_np_ops.corner_to_surfaces_3d(corners)
    return box_np_ops.surface_equ_3d(surfaces[:, :, :3, :])


def finite_faces(faces: tuple) -> bool:
    """Whether every normal and offset of :func:`box_faces` is finite (the
    grid's bound needs it; else :func:`in_any_box` runs stock's test)."""
    normal_vec, d = faces
    return bool(np.isfinite(normal_vec).all() and np.isfinite(d).all())


@numba.njit(cache=True)
def _inside(points: Any, normal_vec: Any, d: Any, i: int, j: int) -> bool:
    """Stock's test of point ``i`` against box ``j`` (mmdet3d 1.4.0's
    ``_points_in_convex_polygon_3d_jit``, the same expression)."""
    for k in range(normal_vec.shape[1]):
        sign = (
            points[i, 0] * normal_vec[j, k, 0] +
            points[i, 1] * normal_vec[j, k, 1] +
            points[i, 2] * normal_vec[j, k, 2] + d[j, k])
        if sign >= 0:
            return False
    return True


@numba.njit(cache=True)
def _excluded(lo: Any, hi: Any, c: int, normal_vec: Any, d: Any,
              j: int) -> bool:
    """Whether stock's test puts no point with coordinates in
    ``[lo[c], hi[c]]`` in box ``j``: some face's expression, on the corner
    of the cell that minimises each product, is ``>= 0`` (rounding is
    monotone, so it bounds every point's from below)."""
    for k in range(normal_vec.shape[1]):
        x = lo[c, 0] if normal_vec[j, k, 0] >= 0 else hi[c, 0]
        y = lo[c, 1] if normal_vec[j, k, 1] >= 0 else hi[c, 1]
        z = lo[c, 2] if normal_vec[j, k, 2] >= 0 else hi[c, 2]
        bound = (
            x * normal_vec[j, k, 0] + y * normal_vec[j, k, 1] +
            z * normal_vec[j, k, 2] + d[j, k])
        if bound >= 0:
            return True
    return False


@numba.njit(cache=True)
def _mask(points: Any, normal_vec: Any, d: Any, max_cells: int,
          cell_m: float) -> Any:
    n = points.shape[0]
    m = normal_vec.shape[0]
    out = np.zeros(n, np.bool_)
    finite = np.empty(n, np.bool_)
    x0, y0, x1, y1 = np.inf, np.inf, -np.inf, -np.inf
    for i in range(n):
        ok = (
            np.isfinite(points[i, 0]) and np.isfinite(points[i, 1])
            and np.isfinite(points[i, 2]))
        finite[i] = ok
        if ok:
            x0 = min(x0, float(points[i, 0]))
            x1 = max(x1, float(points[i, 0]))
            y0 = min(y0, float(points[i, 1]))
            y1 = max(y1, float(points[i, 1]))
    step_x = max(cell_m, (x1 - x0) / max_cells)
    step_y = max(cell_m, (y1 - y0) / max_cells)
    nx = min(max_cells, int((x1 - x0) / step_x) + 1) if x1 >= x0 else 1
    ny = min(max_cells, int((y1 - y0) / step_y) + 1) if y1 >= y0 else 1
    cells = nx * ny
    cell = np.full(n, -1, np.int64)
    count = np.zeros(cells, np.int64)
    # each cell's bounds are the coordinates of the points put in it
    lo = np.empty((cells, 3), points.dtype)
    hi = np.empty((cells, 3), points.dtype)
    for i in range(n):
        if not finite[i]:
            continue
        cx = min(nx - 1, max(0, int((float(points[i, 0]) - x0) / step_x)))
        cy = min(ny - 1, max(0, int((float(points[i, 1]) - y0) / step_y)))
        c = cx * ny + cy
        cell[i] = c
        if count[c] == 0:
            for t in range(3):
                lo[c, t] = points[i, t]
                hi[c, t] = points[i, t]
        else:
            for t in range(3):
                lo[c, t] = min(lo[c, t], points[i, t])
                hi[c, t] = max(hi[c, t], points[i, t])
        count[c] += 1
    # per non-empty cell, the boxes no bound excludes (CSR)
    start = np.zeros(cells + 1, np.int64)
    boxes_of = np.empty(4096, np.int64)
    used = 0
    for c in range(cells):
        start[c] = used
        if count[c] == 0:
            continue
        for j in range(m):
            if not _excluded(lo, hi, c, normal_vec, d, j):
                if used == boxes_of.shape[0]:
                    grown = np.empty(2 * used, np.int64)
                    grown[:used] = boxes_of[:used]
                    boxes_of = grown
                boxes_of[used] = j
                used += 1
    start[cells] = used
    for i in range(n):
        if finite[i]:
            c = cell[i]
            for q in range(start[c], start[c + 1]):
                if _inside(points, normal_vec, d, i, boxes_of[q]):
                    out[i] = True
                    break
        else:  # NaN / inf: stock's test against every box
            for j in range(m):
                if _inside(points, normal_vec, d, i, j):
                    out[i] = True
                    break
    return out


def in_any_box(points: np.ndarray,
               boxes: np.ndarray,
               faces: Optional[tuple] = None) -> np.ndarray:
    """``points_in_rbbox(points, boxes).any(-1)``, bit for bit, faster.

    Args:
        points (np.ndarray): ``(N, 3+)`` points (the first three columns are
            read), as ``ObjectSample`` passes ``points.coord.numpy()``.
        boxes (np.ndarray): ``(M, 7+)`` LiDAR boxes.
        faces (tuple, optional): :func:`box_faces` of ``boxes``, if made.

    Returns:
        np.ndarray: ``(N,)`` bool, True where a point is in some box.
    """
    faces = box_faces(boxes) if faces is None else faces
    normal_vec, d = faces
    if len(points) == 0 or len(normal_vec) == 0 or not finite_faces(faces):
        from mmdet3d.structures.ops import box_np_ops
        return box_np_ops.points_in_rbbox(points, boxes).any(-1)
    return _mask(points, normal_vec, d, MAX_CELLS, CELL_M)
