"""Shape arithmetic shared by the dialect verifiers, the frontends and the runtime.

Pure Python on tuples of ints, so that the runtime can use it without importing xDSL.
Every function raises ``ValueError`` with a message that says which rule was broken; the
callers turn that into a verifier error or a user error with a location.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

Shape = tuple[int, ...]


def broadcast(*shapes: Sequence[int]) -> Shape:
    """The numpy/ONNX multidirectional broadcast of ``shapes``."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def reduce(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> Shape:
    """The shape of a reduction of ``shape`` over ``axes`` (already normalized)."""
    if len(set(axes)) != len(axes) or any(not 0 <= a < len(shape) for a in axes):
        raise ValueError(f"bad reduction axes {tuple(axes)} for shape {tuple(shape)}")
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def transpose(shape: Sequence[int], perm: Sequence[int]) -> Shape:
    """The shape of ``shape`` permuted by ``perm``."""
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"{tuple(perm)} is not a permutation of {len(shape)} axes")
    return tuple(shape[p] for p in perm)


def matmul(a: Sequence[int], b: Sequence[int]) -> Shape:
    """numpy.matmul's result shape for operands of rank >= 2 with broadcast batch dims."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"matmul operands need rank >= 2, got {tuple(a)} and {tuple(b)}")
    if a[-1] != b[-2]:
        raise ValueError(f"matmul contraction mismatch: {tuple(a)} x {tuple(b)}")
    return (*broadcast(a[:-2], b[:-2]), a[-2], b[-1])


def matmul_transpose_a(a: Sequence[int], b: Sequence[int]) -> Shape:
    """The result shape of ``a^T @ b`` over the last two axes (``a`` ``[..., R, M]``, ``b``
    ``[..., R, N]``: ``[..., M, N]``), batch dims broadcast."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"matmul operands need rank >= 2, got {tuple(a)} and {tuple(b)}")
    if a[-2] != b[-2]:
        raise ValueError(f"matmul_transpose_a contraction mismatch: {tuple(a)} x {tuple(b)}")
    return (*broadcast(a[:-2], b[:-2]), a[-1], b[-1])


def window_output(
    size: int, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int
) -> int:
    """Output length of a sliding window (convolution or pooling) along one axis."""
    span = dilation * (kernel - 1) + 1
    out = (size + pad_begin + pad_end - span) // stride + 1
    if out < 1:
        raise ValueError(f"window of span {span} does not fit in an input of size {size}")
    return out


def conv(
    x: Sequence[int],
    w: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    group: int,
) -> Shape:
    """Shape of an N-d convolution; ``pads`` holds all begins, then all ends (ONNX order)."""
    spatial = len(x) - 2
    if len(w) != len(x) or spatial < 1:
        raise ValueError(f"conv input {tuple(x)} and filter {tuple(w)} ranks do not match")
    if len(strides) != spatial or len(dilations) != spatial or len(pads) != 2 * spatial:
        raise ValueError("conv strides, dilations and pads do not match the spatial rank")
    if x[1] != w[1] * group or w[0] % group:
        raise ValueError(
            f"conv channels do not match: input {x[1]}, filter {tuple(w)}, group {group}"
        )
    out = [
        window_output(x[2 + i], w[2 + i], strides[i], pads[i], pads[spatial + i], dilations[i])
        for i in range(spatial)
    ]
    return (x[0], w[0], *out)


def pool(
    x: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> Shape:
    """Shape of an N-d pooling window over the trailing ``len(kernel)`` axes of ``x``."""
    spatial = len(kernel)
    if len(x) != spatial + 2 or len(strides) != spatial or len(pads) != 2 * spatial:
        raise ValueError(f"pooling kernel {tuple(kernel)} does not match input {tuple(x)}")
    out = [
        window_output(x[2 + i], kernel[i], strides[i], pads[i], pads[spatial + i], dilations[i])
        for i in range(spatial)
    ]
    return (x[0], x[1], *out)


def concat(shapes: Sequence[Sequence[int]], axis: int) -> Shape:
    """Shape of the concatenation of ``shapes`` along ``axis`` (already normalized)."""
    first = tuple(shapes[0])
    for s in shapes[1:]:
        if len(s) != len(first) or any(
            d != e for i, (d, e) in enumerate(zip(s, first, strict=True)) if i != axis
        ):
            raise ValueError(f"cannot concatenate {[tuple(s) for s in shapes]} on axis {axis}")
    return (*first[:axis], sum(s[axis] for s in shapes), *first[axis + 1 :])


def slice_shape(
    shape: Sequence[int], starts: Sequence[int], limits: Sequence[int], strides: Sequence[int]
) -> Shape:
    """Shape of a static strided slice with one (start, limit, stride) per axis."""
    if not len(shape) == len(starts) == len(limits) == len(strides):
        raise ValueError("slice needs one start, limit and stride per axis")
    out = []
    for d, lo, hi, st in zip(shape, starts, limits, strides, strict=True):
        if st < 1 or not 0 <= lo <= hi <= d:
            raise ValueError(f"bad slice [{lo}:{hi}:{st}] of an axis of size {d}")
        out.append(len(range(lo, hi, st)))
    return tuple(out)


def check_reshape(src: Sequence[int], dst: Sequence[int]) -> None:
    """Raises unless ``dst`` holds exactly as many elements as ``src``."""
    if prod(src) != prod(dst):
        raise ValueError(f"cannot reshape {tuple(src)} into {tuple(dst)}")


def check_broadcast_to(src: Sequence[int], dst: Sequence[int]) -> None:
    """Raises unless ``src`` broadcasts to exactly ``dst``."""
    if len(src) > len(dst) or broadcast(src, dst) != tuple(dst):
        raise ValueError(f"{tuple(src)} does not broadcast to {tuple(dst)}")


def gather(data: Sequence[int], indices: Sequence[int], axis: int) -> Shape:
    """Shape of ``take(data, indices, axis)``: the axis replaced by the indices' shape."""
    if not 0 <= axis < len(data):
        raise ValueError(f"gather axis {axis} is out of range for rank {len(data)}")
    return (*data[:axis], *indices, *data[axis + 1 :])


def gather_nd(data: Sequence[int], indices: Sequence[int], batch_dims: int) -> Shape:
    """Shape of ONNX GatherND: each index tuple picks a slice after the batch dims."""
    depth = indices[-1] if indices else 0
    if not indices or batch_dims + depth > len(data):
        raise ValueError(f"indices {tuple(indices)} are too deep for data {tuple(data)}")
    if tuple(indices[:batch_dims]) != tuple(data[:batch_dims]):
        raise ValueError(f"batch dims of data {tuple(data)} and indices {tuple(indices)} differ")
    return (*indices[:-1], *data[batch_dims + depth :])


def tile(shape: Sequence[int], repeats: Sequence[int]) -> Shape:
    """Shape of ``numpy.tile`` with one repeat count per axis."""
    if len(repeats) != len(shape) or any(r < 0 for r in repeats):
        raise ValueError(f"repeats {tuple(repeats)} do not fit a shape of rank {len(shape)}")
    return tuple(d * r for d, r in zip(shape, repeats, strict=True))
