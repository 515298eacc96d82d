"""What both frontends build WSE IR with, beyond the ``Emitter``: the helpers that emit the
common ops, and the errors of a node.

The helpers emit through ``Emitter.emit`` (so they carry the current node's location and fold
when their operands are known at compile time; the ONNX importer and the PyTorch lowering are
both emitters) and leave out an op that would change nothing: a cast to the type a value
already has, a reshape or broadcast to its own shape, an identity transpose. Numbers given
where a tensor is expected become rank-0 constants of the other operand's element type. A
problem with one node (an ONNX node, or an ATen op of an exported program) is a ``NodeError``,
which the frontend prefixes with the file, node and op.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.emitter import Emitter
from cgc.machine.hardware import dtypes

# ---------------------------------------------------------------------------------------------
# Nodes and their errors
# ---------------------------------------------------------------------------------------------


class NodeError(Exception):
    """A problem with one node; the frontend prefixes the file, node and op."""


def axis_of(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` of a rank-``rank`` tensor counted from 0 (a negative one from the end)."""
    if not -rank <= axis < max(rank, 1):
        raise NodeError(f"attribute {what}={axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def shape_of(value: SSAValue) -> tuple[int, ...]:
    """The shape of a tensor value."""
    return wse.tensor_shape(value)


NAMES_LISTED = 6
"""How many nodes of one unsupported op an error names before it counts the rest."""


def node_list(names: list[str]) -> str:
    """``node a``, ``nodes a, b`` or ``nodes a, b, ... and 12 more``."""
    shown = ", ".join(names[:NAMES_LISTED])
    more = f" and {len(names) - NAMES_LISTED} more" if len(names) > NAMES_LISTED else ""
    return f"node{'s' if len(names) > 1 else ''} {shown}{more}"


# ---------------------------------------------------------------------------------------------
# Element types
# ---------------------------------------------------------------------------------------------


def dtype_of(value: SSAValue) -> np.dtype:
    """The numpy dtype of a tensor value's elements."""
    return dtypes.dtype(wse.numpy_dtype(wse.element_type(value)))


def require_float(x: SSAValue) -> None:
    """Fails unless ``x`` holds floating-point values."""
    if not dtypes.is_float(dtype_of(x)):
        raise NodeError(f"dtype {dtype_of(x)} is not supported (float types only)")


def cast(im: Emitter, x: SSAValue, dtype: np.dtype | str, saturate: bool = True) -> SSAValue:
    """``x`` converted to ``dtype`` (a numpy dtype or its name); no op when it already has it.
    ``saturate`` (for the 8-bit and 4-bit float types) clamps values beyond the type's range
    to its largest finite value instead of making them infinite or NaN."""
    if dtype_of(x) == dtypes.dtype(dtype):
        return x
    return im.emit(wse.CastOp(x, wse.element_of_numpy(dtype), saturate))


def working_dtype(dtype: np.dtype) -> np.dtype:
    """The float type that resampling and sampling of ``dtype`` values compute in: float32 and
    float64 as they are, the narrow floats and small integers in float32, wider integers in
    float64."""
    if dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        return dtype
    if dtypes.is_float(dtype) or dtype.itemsize <= 2:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


# ---------------------------------------------------------------------------------------------
# Shapes and axes
# ---------------------------------------------------------------------------------------------


def reshape(im: Emitter, x: SSAValue, shape: Sequence[int]) -> SSAValue:
    """``x`` reshaped; no op when the shape does not change."""
    shape = tuple(int(d) for d in shape)
    if shape == shape_of(x):
        return x
    return im.emit(wse.ReshapeOp(x, shape))


def broadcast(im: Emitter, x: SSAValue, shape: Sequence[int]) -> SSAValue:
    """``x`` broadcast to ``shape``; no op when it already has it."""
    shape = tuple(int(d) for d in shape)
    if shape == shape_of(x):
        return x
    return im.emit(wse.BroadcastToOp(x, shape))


def transpose(im: Emitter, x: SSAValue, perm: Sequence[int]) -> SSAValue:
    """``x`` with its axes permuted; no op for the identity."""
    perm = [int(p) for p in perm]
    if perm == list(range(len(perm))):
        return x
    return im.emit(wse.TransposeOp(x, perm))


def along(axis: int, rank: int, values: np.ndarray) -> np.ndarray:
    """A 1-D array shaped to lie along ``axis`` of a rank-``rank`` tensor (size 1 elsewhere)."""
    return values.reshape([values.size if i == axis else 1 for i in range(rank)])


def as_scalar(im: Emitter, value: SSAValue, what: str) -> SSAValue:
    """A one-element tensor as a rank-0 tensor."""
    shape = shape_of(value)
    if prod(shape) != 1:
        raise NodeError(f"input '{what}' must hold one value, got shape {shape}")
    return value if shape == () else im.emit(wse.ReshapeOp(value, ()))


def slice_axes(
    im: Emitter, x: SSAValue, bounds: dict[int, tuple[int, int]], steps: dict[int, int] | None
) -> SSAValue:
    """``x`` sliced to ``[begin, end)`` (with positive ``steps``) on the given axes."""
    shape = shape_of(x)
    starts, limits, strides = [0] * len(shape), list(shape), [1] * len(shape)
    for axis, (begin, end) in bounds.items():
        starts[axis], limits[axis] = begin, end
        strides[axis] = (steps or {}).get(axis, 1)
    if starts == [0] * len(shape) and limits == list(shape) and strides == [1] * len(shape):
        return x
    return im.emit(wse.SliceOp(x, starts, limits, strides))


def int_list(array: np.ndarray | Sequence[int]) -> list[int]:
    """The elements of an integer array (any rank) as Python ints."""
    values = np.asarray(array)
    if values.dtype.kind not in "biuf":
        raise NodeError(f"expected integers, got {values.dtype} values")
    return [int(v) for v in np.ravel(values)]


def unique_axes(axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    """Normalized axes; repeated axes are an error."""
    normalized = [axis_of(int(a), rank, what) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise NodeError(f"{what} {list(axes)} repeat an axis")
    return normalized


# ---------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------


def add(im: Emitter, a: SSAValue | None, b: SSAValue | None) -> SSAValue:
    """``a + b``, or the one of them that is not None (one of them must be given)."""
    if a is None or b is None:
        given = b if a is None else a
        assert given is not None, "add needs at least one term"
        return given
    return im.emit(wse.AddOp(a, b))


def sub(im: Emitter, a: SSAValue, b: SSAValue) -> SSAValue:
    """``a - b``."""
    return im.emit(wse.SubOp(a, b))


def mul(im: Emitter, a: SSAValue, b: SSAValue) -> SSAValue:
    """``a * b``."""
    return im.emit(wse.MulOp(a, b))


def less(im: Emitter, a: SSAValue, b: SSAValue) -> SSAValue:
    """``a < b``, as ``b > a``."""
    return im.emit(wse.GreaterOp(b, a))


def select(im: Emitter, cond: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
    """``a`` where ``cond`` holds, else ``b``."""
    return im.emit(wse.SelectOp(cond, a, b))


def clamp(
    im: Emitter, x: SSAValue, low: SSAValue | float | None, high: SSAValue | float | None
) -> SSAValue:
    """``min(max(x, low), high)``; a missing bound does not clip (NaN stays NaN)."""
    if low is not None:
        x = im.emit(wse.MaxOp(x, _as_tensor(im, low, x)))
    if high is not None:
        x = im.emit(wse.MinOp(x, _as_tensor(im, high, x)))
    return x


def affine(
    im: Emitter,
    x: SSAValue,
    scale: SSAValue | float | None,
    shift: SSAValue | float | None,
    skip_identities: bool = True,
) -> SSAValue:
    """``x * scale + shift``, where ``scale`` and ``shift`` are tensors or numbers. None leaves
    its step out, and so does a number that changes nothing (a scale of 1, a shift of 0) unless
    ``skip_identities`` is off: formulas that must give ONNX's signed zeros take every step
    (``-0.0 + 0`` is ``+0.0``)."""
    if scale is not None and not (skip_identities and _is_number(scale, 1)):
        x = im.emit(wse.MulOp(x, _as_tensor(im, scale, x)))
    if shift is not None and not (skip_identities and _is_number(shift, 0)):
        x = im.emit(wse.AddOp(x, _as_tensor(im, shift, x)))
    return x


def add_channel_bias(im: Emitter, y: SSAValue, bias: SSAValue | None) -> SSAValue:
    """``y`` (N, C, *spatial) plus a per-channel ``bias`` of shape (C,); ``y`` without one."""
    if bias is None:
        return y
    shape = shape_of(y)
    return add(im, y, reshape(im, bias, (1, shape[1], *[1] * (len(shape) - 2))))


def _as_tensor(im: Emitter, value: SSAValue | float, like: SSAValue) -> SSAValue:
    """``value`` as a tensor: a tensor as it is, a number as a scalar of ``like``'s type."""
    return value if isinstance(value, SSAValue) else im.scalar(value, like)


def _is_number(value: SSAValue | float, number: float) -> bool:
    """Whether ``value`` is the given number (not a tensor)."""
    return not isinstance(value, SSAValue) and value == number
