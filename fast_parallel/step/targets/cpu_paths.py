"""Stock's bits for CPU elementwise ops whose vector and scalar loops differ.

ATen's CPU elementwise kernels run a vectorised body over whole blocks of
``2 * Vectorized::size()`` elements of each thread's chunk and a scalar
function over the rest of the chunk. For some ops the two disagree in the last
bit (``sigmoid`` on AVX2: Sleef's ``exp`` in the body, libm's in the tail), so
an element's value depends on where it sat in the tensor it was computed in.
:func:`as_stock` computes such an op once over the concatenation of what stock
computes as separate tensors, then recomputes the few elements whose path
differs, so that each one gets the value stock's own call gives it. The model
of the layout is checked against the running build once per op and thread
count (:func:`calibrate`); where it does not hold, :class:`PathModelError`
tells the caller to take the stock path. On CUDA every element runs the same
function, so nothing is recomputed.
"""
import functools
from typing import Callable, Dict, List, Sequence, Set, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

#: ``at::internal::GRAIN_SIZE``: a CPU kernel runs serially up to this numel.
GRAIN = 32768
#: The ops :func:`as_stock` knows, with the sample values calibration uses.
OPS: Dict[str, Tuple[Callable[[Tensor], Tensor], Callable]] = {
    'sigmoid': (torch.sigmoid, lambda g, n: torch.randn(n, generator=g) * 8),
    'log': (torch.log, lambda g, n: torch.rand(n, generator=g) * 4 + 1e-7),
    # RTMDet's soft centre prior, ``torch.pow(10, distance - radius)``
    'pow10': (lambda x: torch.pow(10, x),
              lambda g, n: torch.rand(n, generator=g) * 13 - 3),
    # CenterPoint's box targets: each object's rotation and dimensions
    'sin': (torch.sin, lambda g, n: torch.randn(n, generator=g) * 4),
    'cos': (torch.cos, lambda g, n: torch.randn(n, generator=g) * 4),
    # Not recomputed, only checked (require_same_paths): the BCE of SimOTA's
    # class cost against targets 0 and 1.
    'bce0': (lambda x: F.binary_cross_entropy(
        x, torch.zeros_like(x), reduction='none'),
             lambda g, n: torch.rand(n, generator=g)),
    'bce1':
    (lambda x: F.binary_cross_entropy(x, torch.ones_like(x), reduction='none'),
     lambda g, n: torch.rand(n, generator=g)),
    # ... and RTMDet's soft class cost, BCE with logits against soft labels
    # (here a target in [0, 1) from the sample itself, exactly)
    'bce_logits': (lambda x: F.binary_cross_entropy_with_logits(
        x, (x * 0.25).frac().abs(), reduction='none'),
                   lambda g, n: torch.randn(n, generator=g) * 6),
}

__all__ = [
    'PathModelError', 'as_stock', 'calibrate', 'power', 'require_same_paths',
    'scalar_ranges'
]


def power(exponent: float) -> str:
    """The :data:`OPS` name of ``x ** exponent`` on values in [0, 1] (TOOD's
    ``TaskAlignedAssigner``: scores and IoUs), registered on first use.

    Args:
        exponent (float): The exponent, as stock's code passes it.

    Returns:
        str: The name for :func:`as_stock`.
    """
    name = f'pow{exponent!r}'
    if name not in OPS:
        OPS[name] = (lambda x: x**exponent,
                     lambda g, n: torch.rand(n, generator=g))
    return name


class PathModelError(RuntimeError):
    """The vector/scalar layout of this build is not the one modelled here."""


def scalar_ranges(numel: int, threads: int,
                  step: int) -> List[Tuple[int, int]]:
    """The index ranges a contiguous CPU elementwise op computes by its scalar
    function.

    ``TensorIterator::for_each`` runs serially up to :data:`GRAIN` elements or
    on one thread, else ``at::parallel_for`` splits ``numel`` into
    ``min(threads, ceil(numel / GRAIN))`` chunks of ``ceil(numel / tasks)``;
    each chunk's last ``len % step`` elements take the scalar function.

    Args:
        numel (int): Elements of the (contiguous) tensor.
        threads (int): ``torch.get_num_threads()``.
        step (int): ``2 * Vectorized<scalar_t>::size()``.

    Returns:
        list[tuple[int, int]]: ``[start, end)`` ranges.
    """
    if numel <= GRAIN or threads == 1:
        chunks = [(0, numel)]
    else:
        tasks = min(threads, -(-numel // GRAIN))
        size = -(-numel // tasks)
        chunks = [(b, min(numel, b + size)) for b in range(0, numel, size)]
    return [(end - (end - begin) % step, end) for begin, end in chunks
            if (end - begin) % step]


def _strided(x: Tensor) -> Tensor:
    """A copy of 1-D ``x`` with stride 2: kernels take their scalar loop."""
    buffer = x.new_empty(2 * x.numel())[::2]
    buffer.copy_(x)
    return buffer


def _indices(ranges: Sequence[Tuple[int, int]], offset: int = 0) -> Set[int]:
    return {offset + i for begin, end in ranges for i in range(begin, end)}


def _every_value(dtype: torch.dtype) -> Tensor:
    """Every finite value of a 16-bit float dtype, in two halves of
    :data:`GRAIN` (each runs as one serial loop)."""
    bits = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(dtype)
    return values[torch.isfinite(values)]


def _differing(op: Callable[[Tensor], Tensor], values: Tensor) -> Tensor:
    """The values whose vector and scalar results differ (each block of
    :data:`GRAIN` computed as one serial loop)."""
    found = []
    for block in values.split(GRAIN):
        vector, scalar = op(block), op(_strided(block))
        same = (vector == scalar) | (torch.isnan(vector) & torch.isnan(scalar))
        found.append(block[~same])
    return torch.cat(found)


@functools.lru_cache(maxsize=None)
def calibrate(name: str,
              threads: int,
              dtype: torch.dtype = torch.float32) -> int:
    """The vector step of op ``name`` on ``dtype`` if its two loops differ,
    else 0.

    Finds a value whose vector and scalar results differ (float32: from a
    private generator, the global random state is left alone; a 16-bit
    float: among every one of its values, so 0 is a proof) and checks, on
    tensors of many sizes, that exactly the elements :func:`scalar_ranges`
    names get the scalar result.

    Args:
        name (str): A key of :data:`OPS`.
        threads (int): The thread count to check the model with.
        dtype (torch.dtype): The input dtype (float32, float16 or
            bfloat16). Defaults to float32.

    Returns:
        int: ``2 * Vectorized::size()``, or 0 when the two loops gave the same
        bits on every sample (then the layout does not matter).

    Raises:
        PathModelError: When no step explains what the build does.
    """
    op, sample = OPS[name]
    if dtype == torch.float32:
        values = sample(torch.Generator().manual_seed(0), GRAIN)
    else:
        values = _every_value(dtype)
    differ = _differing(op, values)
    if differ.numel() == 0:
        return 0
    marker = differ[:1]
    marked = op(_strided(marker))
    sizes = list(range(1, 130)) + [GRAIN + 1, 2 * GRAIN + 3, 5 * GRAIN + 77]
    seen = {}
    for numel in sizes:
        out = op(marker.expand(numel).contiguous())
        seen[numel] = set((out == marked).nonzero().flatten().tolist())
    for step in (4, 8, 16, 32, 64, 128):
        if all(seen[n] == _indices(scalar_ranges(n, threads, step))
               for n in sizes):
            return step
    raise PathModelError(f'{name}: no vector step explains the CPU loops')


def as_stock(name: str, x: Tensor, sizes: Sequence[int]) -> Tensor:
    """``op(x)`` where ``x`` is what stock computes as separate tensors.

    Args:
        name (str): A key of :data:`OPS`.
        x (Tensor): Contiguous; its flat elements are the concatenation of
            stock's tensors, in order.
        sizes (Sequence[int]): The numel of each of stock's tensors (their sum
            is ``x.numel()``).

    Returns:
        Tensor: Shaped like ``x``; element for element the value stock's
        per-tensor call gives.

    Raises:
        PathModelError: When the layout model does not hold on this build.
    """
    op = OPS[name][0]
    out = op(x)
    if x.device.type != 'cpu':
        return out
    threads = torch.get_num_threads()
    step = calibrate(name, threads, x.dtype)
    if not step:
        return out
    if not x.is_contiguous() or sum(sizes) != x.numel():
        raise PathModelError(f'{name}: input not laid out as stock tensors')
    mine = _indices(scalar_ranges(x.numel(), threads, step))
    stock: Set[int] = set()
    offset = 0
    for numel in sizes:
        stock |= _indices(scalar_ranges(numel, threads, step), offset)
        offset += numel
    flat_x, flat = x.view(-1), out.view(-1)
    # Elements stock computed by the scalar function and this call did not.
    index = torch.tensor(sorted(stock - mine), dtype=torch.long)
    flat[index] = op(_strided(flat_x[index]))
    # And the other way: a padded buffer of whole vector blocks, one loop.
    index = torch.tensor(sorted(mine - stock), dtype=torch.long)
    padded = -(-index.numel() // step) * step
    if padded > GRAIN:
        raise PathModelError(f'{name}: {padded} elements to recompute')
    buffer = flat_x.new_ones(padded)
    buffer[:index.numel()] = flat_x[index]
    flat[index] = op(buffer)[:index.numel()]
    return out


def require_same_paths(name: str, dtype: torch.dtype = torch.float32) -> None:
    """Checks that op ``name``'s two CPU loops agree on this build.

    Args:
        name (str): A key of :data:`OPS`.
        dtype (torch.dtype): The input dtype. Defaults to float32.

    Raises:
        PathModelError: When they differ (the op is not recomputed here).
    """
    if calibrate(name, torch.get_num_threads(), dtype):
        raise PathModelError(f'{name}: vector and scalar loops differ')
