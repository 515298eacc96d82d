"""ONNX ops that build, rearrange, index or scatter tensors.

Shapes are static in cgc, so every operand that decides a result's shape (Reshape's ``shape``,
Slice's ``starts``, Pad's ``pads``, ...) must be known at compile time (``Importer.static``):
an initializer, a Constant node, or shape arithmetic on those, which the importer folds. Operands
that only decide values (Trilu's ``k``, OneHot's ``values``, ReverseSequence's lengths,
TensorScatter's write indices, Pad's constant value) may be run-time tensors.

Results that depend only on shapes and attributes (Shape, Size, ConstantOfShape, EyeLike,
Range) are compile-time constants; they become ops only where a consumer needs them as tensors.
Ops whose result shape depends on the data (NonZero, Unique, Compress, NonMaxSuppression) are
evaluated at compile time, so their shape-deciding inputs must be known then.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil, prod

import numpy as np
from onnx import numpy_helper
from xdsl.ir import SSAValue

from cgc import dtypes, shapes
from cgc.dialects import wse
from cgc.frontends.onnx.builders import along, cast, dtype_of
from cgc.frontends.onnx.importer import (
    Importer,
    Lazy,
    Node,
    NodeError,
    axis_of,
    bad_attr,
    dtype_attribute,
    register,
    shape_of,
)

BOOL = wse.element_of_numpy("bool")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def known(im: Importer, node: Node, array: np.ndarray) -> Lazy:
    """A compile-time result of ``node`` (its first output); an op only once something uses it."""
    return Lazy(np.asarray(array), node.proto.output[0], False, im.loc)


def int_list(array: np.ndarray | Sequence[int]) -> list[int]:
    """The elements of an integer array (any rank) as Python ints."""
    return [int(v) for v in np.ravel(np.asarray(array))]


def static_ints(im: Importer, node: Node, index: int) -> list[int]:
    """A compile-time integer input as a list of Python ints."""
    return int_list(im.static(node, index))


def static_scalar(im: Importer, node: Node, index: int) -> np.generic:
    """A compile-time input of exactly one element."""
    array = np.asarray(im.static(node, index))
    if array.size != 1:
        raise NodeError(
            f"input '{node.proto.input[index]}' must hold one value, got shape {array.shape}"
        )
    return array.reshape(())[()]


def unique_axes(axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    """Normalized axes; repeated axes are an error."""
    normalized = [axis_of(int(a), rank, what) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise NodeError(f"{what} {list(axes)} repeat an axis")
    return normalized


def as_scalar(im: Importer, value: SSAValue, what: str) -> SSAValue:
    """A one-element tensor as a rank-0 tensor."""
    shape = shape_of(value)
    if prod(shape) != 1:
        raise NodeError(f"input '{what}' must hold one value, got shape {shape}")
    return value if shape == () else im.emit(wse.ReshapeOp(value, ()))


def slice_axes(
    im: Importer, x: SSAValue, bounds: dict[int, tuple[int, int]], steps: dict[int, int] | None
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


# ---------------------------------------------------------------------------------------------
# Constants and shapes
# ---------------------------------------------------------------------------------------------


def sparse_to_dense(sparse) -> np.ndarray:
    """The dense array of a SparseTensorProto: values at linear or coordinate indices."""
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 2:  # [NNZ, rank] coordinates
        dense[tuple(indices.T)] = values
    else:  # [NNZ] linear positions
        dense.reshape(-1)[indices] = values
    return dense


@register("Constant")
def _constant(im: Importer, node: Node) -> list:
    attrs = node.attrs
    if len(attrs) != 1:
        raise NodeError(f"expected exactly one value attribute, got {sorted(attrs) or 'none'}")
    key, value = next(iter(attrs.items()))
    if key == "value":
        array = numpy_helper.to_array(value)
    elif key == "sparse_value":
        array = sparse_to_dense(value)
    elif key in ("value_float", "value_floats"):
        array = np.array(value, dtype=np.float32)
    elif key in ("value_int", "value_ints"):
        array = np.array(value, dtype=np.int64)
    elif key in ("value_string", "value_strings"):
        raise NodeError(f"attribute {key} is not supported (cgc has no string tensors)")
    else:
        raise NodeError(f"attribute {key} is not supported")
    if array.dtype == object or array.dtype.kind in "SU":
        raise NodeError(f"attribute {key} holds strings, which cgc does not support")
    return [known(im, node, array)]


def clamped_range(start: int, end: int | None, size: int) -> tuple[int, int]:
    """ONNX's ``[start, end)`` of a shape: negative values count from the end, then clamp."""
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    return min(max(start, 0), size), min(max(end, 0), size)


def input_layout(im: Importer, node: Node, index: int) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of an input, without making an op of a not yet used constant."""
    entry = im.entry(node, index)
    if isinstance(entry, Lazy):
        return tuple(entry.array.shape), entry.array.dtype
    return shape_of(entry), dtype_of(entry)


@register("Shape")
def _shape(im: Importer, node: Node) -> list:
    shape, _ = input_layout(im, node, 0)
    begin, end = clamped_range(int(node.attr("start", 0)), node.attr("end", None), len(shape))
    return [known(im, node, np.array(shape[begin : max(begin, end)], dtype=np.int64))]


@register("Size")
def _size(im: Importer, node: Node) -> list:
    shape, _ = input_layout(im, node, 0)
    return [known(im, node, np.array(prod(shape), dtype=np.int64))]


@register("ConstantOfShape")
def _constant_of_shape(im: Importer, node: Node) -> list:
    dims = static_ints(im, node, 0)
    if any(d < 0 for d in dims):
        raise NodeError(f"input 'input' asks for the negative dimensions of {dims}")
    tensor = node.attr("value", None)
    fill = np.zeros((), np.float32) if tensor is None else numpy_helper.to_array(tensor)
    if fill.size != 1:
        raise bad_attr("value", f"<tensor of shape {fill.shape}>", " (needs one element)")
    # A broadcast view: no memory per element until something materializes it.
    return [known(im, node, np.broadcast_to(fill.reshape(()), tuple(dims)))]


@register("EyeLike")
def _eye_like(im: Importer, node: Node) -> list:
    shape, dtype = input_layout(im, node, 0)
    if len(shape) != 2:
        raise NodeError(f"the input must be 2-D, got shape {shape}")
    code = node.attr("dtype", None)
    if code is not None:
        dtype = dtype_attribute("dtype", code)
    k = int(node.attr("k", 0))
    return [known(im, node, np.eye(shape[0], shape[1], k).astype(dtype))]


def range_count(start: float, limit: float, delta: float, integral: bool) -> int:
    """``max(ceil((limit - start) / delta), 0)``, exact for integers."""
    if delta == 0:
        raise NodeError("input 'delta' must not be zero")
    if integral:
        return max(-((int(start) - int(limit)) // int(delta)), 0)
    return max(ceil((float(limit) - float(start)) / float(delta)), 0)


@register("Range")
def _range(im: Importer, node: Node) -> list:
    start, limit, delta = (static_scalar(im, node, i) for i in range(3))
    dtype = np.asarray(start).dtype
    integral = dtypes.is_integer(dtype)
    count = range_count(start, limit, delta, integral)
    if integral:
        values = int(start) + np.arange(count, dtype=np.int64) * int(delta)
    else:
        values = float(start) + np.arange(count, dtype=np.float64) * float(delta)
    return [known(im, node, values.astype(dtype))]


# ---------------------------------------------------------------------------------------------
# Reshapes
# ---------------------------------------------------------------------------------------------


@register("Flatten")
def _flatten(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    axis = int(node.attr("axis", 1))
    if not -len(shape) <= axis <= len(shape):
        raise NodeError(f"attribute axis={axis} is out of range for rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    return [im.emit(wse.ReshapeOp(x, (prod(shape[:axis]), prod(shape[axis:]))))]


def reshape_target(src: Sequence[int], spec: Sequence[int], allowzero: bool) -> tuple:
    """The shape ONNX Reshape's ``spec`` (with 0 and -1) means for an input of shape ``src``."""
    dims = []
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= len(src):
                raise NodeError(f"shape {list(spec)} copies axis {i} of a rank-{len(src)} input")
            dims.append(src[i])
        elif d < -1:
            raise NodeError(f"shape {list(spec)} has the negative dimension {d}")
        else:
            dims.append(d)
    if dims.count(-1) > 1:
        raise NodeError(f"shape {list(spec)} has more than one -1")
    if -1 in dims:
        rest = prod(d for d in dims if d != -1)
        if rest == 0 or prod(src) % rest:
            raise NodeError(f"cannot reshape {tuple(src)} into shape {list(spec)}")
        dims[dims.index(-1)] = prod(src) // rest
    if prod(dims) != prod(src):
        raise NodeError(f"cannot reshape {tuple(src)} into shape {list(spec)}")
    return tuple(dims)


@register("Reshape")
def _reshape(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    if im.opset < 5:
        spec = node.attr("shape", None)
        if spec is None:
            raise NodeError("attribute shape is required")
        spec = int_list(spec)
    else:
        spec = static_ints(im, node, 1)
    allowzero = bool(node.attr("allowzero", 0))
    return [im.emit(wse.ReshapeOp(x, reshape_target(shape_of(x), spec, allowzero)))]


def squeeze_axes(im: Importer, node: Node) -> list[int] | None:
    """The axes of Squeeze/Unsqueeze: an attribute before opset 13, an input from it."""
    if im.opset < 13:
        axes = node.attr("axes", None)
        return None if axes is None else int_list(axes)
    return static_ints(im, node, 1) if node.has_input(1) else None


def squeezed(shape: tuple[int, ...], given: list[int] | None) -> list[int]:
    """Squeeze's result shape: ``shape`` without the ``given`` axes, which must have size 1,
    or without every axis of size 1."""
    if given is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    else:
        axes = unique_axes(given, len(shape))
        wide = [a for a in axes if shape[a] != 1]
        if wide:
            raise NodeError(f"cannot squeeze axis {wide[0]} of size {shape[wide[0]]}")
    return [d for i, d in enumerate(shape) if i not in axes]


def unsqueezed(shape: tuple[int, ...], given: list[int] | None) -> list[int]:
    """Unsqueeze's result shape: ``shape`` with axes of size 1 at the ``given`` positions."""
    if given is None:
        raise NodeError("the axes are required")
    rank = len(shape) + len(given)
    axes = set(unique_axes(given, rank))
    rest = iter(shape)
    return [1 if i in axes else next(rest) for i in range(rank)]


SQUEEZES = {"Squeeze": squeezed, "Unsqueeze": unsqueezed}


@register(*SQUEEZES)
def _squeeze(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = SQUEEZES[node.op_type](shape_of(x), squeeze_axes(im, node))
    return [im.emit(wse.ReshapeOp(x, shape))]


@register("Transpose")
def _transpose(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    rank = len(shape_of(x))
    perm = node.attr("perm", None)
    perm = list(range(rank))[::-1] if perm is None else int_list(perm)
    if sorted(p % rank if rank else p for p in perm) != list(range(rank)):
        raise bad_attr("perm", perm, f" for rank {rank}")
    return [im.emit(wse.TransposeOp(x, [p % rank for p in perm]))]


def block_size(node: Node, shape: tuple[int, ...]) -> int:
    """The blocksize of DepthToSpace/SpaceToDepth, for an input that must be 4-D."""
    if len(shape) != 4:
        raise NodeError(f"the input must be 4-D (N, C, H, W), got shape {shape}")
    size = node.attr("blocksize", None)
    if size is None:
        raise NodeError("attribute blocksize is required")
    if int(size) < 1:
        raise bad_attr("blocksize", size)
    return int(size)


def block_mode(node: Node) -> str:
    """DCR (depth, column, row: the default) or CRD."""
    mode = node.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise bad_attr("mode", mode, " (expected DCR or CRD)")
    return mode


@register("DepthToSpace")
def _depth_to_space(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    n, c, h, w = shape = shape_of(x)
    bs = block_size(node, shape)
    if c % (bs * bs):
        raise NodeError(f"{c} channels do not divide into blocks of {bs}x{bs}")
    depth = c // (bs * bs)
    if block_mode(node) == "DCR":
        split, perm = (n, bs, bs, depth, h, w), (0, 3, 4, 1, 5, 2)
    else:
        split, perm = (n, depth, bs, bs, h, w), (0, 1, 4, 2, 5, 3)
    y = im.emit(wse.TransposeOp(im.emit(wse.ReshapeOp(x, split)), perm))
    return [im.emit(wse.ReshapeOp(y, (n, depth, h * bs, w * bs)))]


@register("SpaceToDepth")
def _space_to_depth(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    n, c, h, w = shape = shape_of(x)
    bs = block_size(node, shape)
    if h % bs or w % bs:
        raise NodeError(f"spatial size {h}x{w} does not divide into blocks of {bs}x{bs}")
    perm = (0, 3, 5, 1, 2, 4) if block_mode(node) == "DCR" else (0, 1, 3, 5, 2, 4)
    blocks = im.emit(wse.ReshapeOp(x, (n, c, h // bs, bs, w // bs, bs)))
    y = im.emit(wse.TransposeOp(blocks, perm))
    return [im.emit(wse.ReshapeOp(y, (n, c * bs * bs, h // bs, w // bs)))]


# ---------------------------------------------------------------------------------------------
# Joining, splitting, slicing
# ---------------------------------------------------------------------------------------------


@register("Concat")
def _concat(im: Importer, node: Node) -> list:
    values = [im.value(node, i) for i in range(len(node.proto.input)) if node.has_input(i)]
    if not values:
        raise NodeError("there are no inputs")
    axis = node.attr("axis", 1 if im.opset < 4 else None)
    if axis is None:
        raise NodeError("attribute axis is required")
    shapes_in = [shape_of(v) for v in values]
    axis = axis_of(int(axis), len(shapes_in[0]))
    try:
        joined = shapes.concat(shapes_in, axis)
    except ValueError as error:
        raise NodeError(str(error)) from None
    # Pieces empty along the axis add nothing; leaving them out keeps zero-size tensors out of
    # the program.
    pieces = [v for v in values if shape_of(v)[axis]]
    if not pieces:
        return [im.const(np.zeros(joined, dtype=dtype_of(values[0])))]
    if len(pieces) == 1:
        return [pieces[0]]
    return [im.emit(wse.ConcatOp(pieces, axis))]


def split_sizes(im: Importer, node: Node, size: int, count: int) -> list[int]:
    """The length of every output of Split along its axis."""
    if im.opset < 2:
        given = node.attr("split", None)
        if given is None and node.has_input(1):
            given = im.static(node, 1)
    elif im.opset < 13:
        given = node.attr("split", None)
    else:
        given = im.static(node, 1) if node.has_input(1) else None
    parts = node.attr("num_outputs", None) if im.opset >= 18 else None
    if given is not None:
        sizes = int_list(given)
        if len(sizes) != count or sum(sizes) != size or min(sizes, default=0) < 0:
            raise NodeError(f"split {sizes} does not cut an axis of {size} into {count} parts")
        return sizes
    if parts is not None:
        if int(parts) != count or count < 1:
            raise bad_attr("num_outputs", parts, f" (the node has {count} outputs)")
        chunk = -(-size // count)
        last = size - chunk * (count - 1)
        if last < 0:
            raise bad_attr("num_outputs", parts, f" for an axis of {size}")
        return [chunk] * (count - 1) + [last]
    if size % count:
        raise NodeError(f"an axis of {size} does not split into {count} equal parts")
    return [size // count] * count


@register("Split")
def _split(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    axis = axis_of(int(node.attr("axis", 0)), len(shape))
    count = len(node.proto.output)
    sizes = split_sizes(im, node, shape[axis], count)
    outputs, begin = [], 0
    for length in sizes:
        outputs.append(slice_axes(im, x, {axis: (begin, begin + length)}, None))
        begin += length
    return outputs


def slice_spec(im: Importer, node: Node) -> tuple[list[int], list[int], list | None, list | None]:
    """starts, ends, axes and steps of Slice: attributes before opset 10, inputs from it."""
    if im.opset < 10:
        starts, ends = node.attr("starts", None), node.attr("ends", None)
        if starts is None or ends is None:
            raise NodeError("attributes starts and ends are required")
        axes = node.attr("axes", None)
        return int_list(starts), int_list(ends), None if axes is None else int_list(axes), None
    starts, ends = static_ints(im, node, 1), static_ints(im, node, 2)
    axes = static_ints(im, node, 3) if node.has_input(3) else None
    steps = static_ints(im, node, 4) if node.has_input(4) else None
    return starts, ends, axes, steps


def slice_bounds(start: int, end: int, step: int, size: int) -> tuple[int, int]:
    """ONNX's clamped ``start`` and ``end`` along an axis of ``size`` for ``step``."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return min(max(start, 0), size), min(max(end, 0), size)
    return min(max(start, 0), size - 1), min(max(end, -1), size - 1)


@register("Slice")
def _slice(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    starts, ends, axes, steps = slice_spec(im, node)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise NodeError("starts, ends, axes and steps must have the same length")
    axes = unique_axes(axes, len(shape))
    bounds, strides, flipped = {}, {}, []
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        if step == 0:
            raise NodeError(f"the step of axis {axis} is zero")
        size = shape[axis]
        begin, stop = slice_bounds(start, end, step, size)
        if step < 0:  # the same elements, counted from the end of the reversed axis
            flipped.append(axis)
            begin, stop, step = size - 1 - begin, size - 1 - stop, -step
        bounds[axis], strides[axis] = (begin, max(begin, stop)), step
    if flipped:
        x = im.emit(wse.ReverseOp(x, sorted(flipped)))
    return [slice_axes(im, x, bounds, strides)]


@register("Tile")
def _tile(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    rank = len(shape_of(x))
    if im.opset < 6:  # Tile-1: `tiles` copies along one `axis`
        tiles, axis = int(static_scalar(im, node, 1)), int(static_scalar(im, node, 2))
        repeats = [1] * rank
        repeats[axis_of(axis, rank)] = tiles
    else:
        repeats = static_ints(im, node, 1)
    if len(repeats) != rank or min(repeats, default=1) < 0:
        raise NodeError(f"repeats {repeats} do not fit an input of rank {rank}")
    if all(r == 1 for r in repeats):
        return [x]
    return [im.emit(wse.TileOp(x, repeats))]


@register("Expand")
def _expand(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    spec = static_ints(im, node, 1)
    try:
        target = shapes.broadcast(shape_of(x), spec)
    except ValueError:
        raise NodeError(f"shape {shape_of(x)} does not expand to {spec}") from None
    if target == shape_of(x):
        return [x]
    return [im.emit(wse.BroadcastToOp(x, target))]


# ---------------------------------------------------------------------------------------------
# Padding and cropping
# ---------------------------------------------------------------------------------------------

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_amounts(im: Importer, node: Node, rank: int) -> tuple[list[int], list[int]]:
    """Pad's amounts before and after every axis (negative amounts crop)."""
    if im.opset < 11:
        key = "paddings" if im.opset < 2 else "pads"
        pads = node.attr(key, None)
        if pads is None:
            raise NodeError(f"attribute {key} is required")
        pads, axes = int_list(pads), list(range(rank))
    else:
        pads = static_ints(im, node, 1)
        given = static_ints(im, node, 3) if im.opset >= 18 and node.has_input(3) else None
        axes = list(range(rank)) if given is None else unique_axes(given, rank)
    if len(pads) != 2 * len(axes):
        raise NodeError(f"pads {pads} need two amounts for each of {len(axes)} axes")
    low, high = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        low[axis], high[axis] = pads[i], pads[len(axes) + i]
    return low, high


def pad_region(low: Sequence[int], high: Sequence[int], shape: Sequence[int]) -> list:
    """Per padded axis, a boolean array (shaped along that axis) marking the padded positions."""
    masks = []
    for axis, (lo, hi, size) in enumerate(zip(low, high, shape, strict=True)):
        if lo or hi:
            outside = np.ones(lo + size + hi, dtype=bool)
            outside[lo : lo + size] = False
            masks.append(along(axis, len(shape), outside))
    return masks


def pad_with_value(
    im: Importer, x: SSAValue, low: list[int], high: list[int], value: SSAValue
) -> SSAValue:
    """Constant padding with a run-time value: pad with zeros, then select the value where
    the padding is."""
    padded = im.emit(wse.PadOp(x, low, high, 0.0, "constant"))
    masks = [im.const(m) for m in pad_region(low, high, shape_of(x))]
    outside = masks[0]
    for mask in masks[1:]:
        outside = im.emit(wse.OrOp(outside, mask))
    return im.emit(wse.SelectOp(outside, value, padded))


def pad_value(im: Importer, node: Node, x: SSAValue) -> float | SSAValue:
    """Pad's constant: an attribute before opset 11; from it, an optional input that may be a
    run-time tensor."""
    if im.opset < 11:
        return float(node.attr("value", 0.0))
    if not node.has_input(2):
        return 0.0
    array = im.known_value(node, 2)
    if array is not None:
        if np.asarray(array).size != 1:
            raise NodeError("input 'constant_value' must hold one value")
        return float(np.asarray(array).astype(np.float64).reshape(()))
    value = as_scalar(im, im.value(node, 2), "constant_value")
    if wse.element_type(value) != wse.element_type(x):
        raise NodeError("input 'constant_value' must have the data's type")
    return value


def crop_then_pad(
    im: Importer,
    x: SSAValue,
    low: list[int],
    high: list[int],
    value: float | SSAValue,
    mode: str,
) -> SSAValue:
    """Negative amounts crop first; the rest pads the cropped tensor."""
    shape = shape_of(x)
    crops = {
        axis: (max(-lo, 0), size - max(-hi, 0))
        for axis, (lo, hi, size) in enumerate(zip(low, high, shape, strict=True))
        if lo < 0 or hi < 0
    }
    for axis, (begin, end) in crops.items():
        if begin > end:
            raise NodeError(f"pads crop more than the {shape[axis]} elements of axis {axis}")
    x = slice_axes(im, x, crops, None)
    low, high = [max(v, 0) for v in low], [max(v, 0) for v in high]
    if not any(low) and not any(high):
        return x
    if mode != "constant" and 0 in shape_of(x):
        raise NodeError(f"mode {mode} cannot pad an empty axis")
    if isinstance(value, SSAValue):
        return pad_with_value(im, x, low, high, value)
    return im.emit(wse.PadOp(x, low, high, value, mode))


@register("Pad")
def _pad(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    mode = node.attr("mode", "constant")
    if mode not in PAD_MODES or (mode == "wrap" and im.opset < 19):
        raise bad_attr("mode", mode)
    low, high = pad_amounts(im, node, len(shape_of(x)))
    value = pad_value(im, node, x) if mode == "constant" else 0.0
    return [crop_then_pad(im, x, low, high, value, mode)]


@register("CenterCropPad")
def _center_crop_pad(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    given = node.attr("axes", None)
    axes = list(range(len(shape))) if given is None else unique_axes(int_list(given), len(shape))
    target = static_ints(im, node, 1)
    if len(target) != len(axes):
        raise NodeError(f"shape {target} needs one size for each of the {len(axes)} axes")
    low, high = [0] * len(shape), [0] * len(shape)
    for axis, size in zip(axes, target, strict=True):
        if size < 0:
            raise NodeError(f"shape {target} has a negative size")
        change = size - shape[axis]  # > 0 pads, < 0 crops; the odd element goes to the end
        low[axis] = change // 2 if change >= 0 else -(-change // 2)
        high[axis] = change - low[axis]
    return [crop_then_pad(im, x, low, high, 0.0, "constant")]


# ---------------------------------------------------------------------------------------------
# Gathers and scatters
# ---------------------------------------------------------------------------------------------


def index_value(im: Importer, node: Node, index: int) -> SSAValue:
    """An indices input, which must be int32 or int64."""
    value = im.value(node, index)
    if not dtypes.is_integer(dtype_of(value)):
        raise NodeError(f"input '{node.proto.input[index]}' must be integers")
    return value


@register("Gather")
def _gather(im: Importer, node: Node) -> list:
    data, indices = im.value(node, 0), index_value(im, node, 1)
    axis = axis_of(int(node.attr("axis", 0)), len(shape_of(data)))
    return [im.emit(wse.GatherOp(data, indices, axis))]


@register("GatherElements")
def _gather_elements(im: Importer, node: Node) -> list:
    data, indices = im.value(node, 0), index_value(im, node, 1)
    rank = len(shape_of(data))
    if len(shape_of(indices)) != rank:
        raise NodeError(f"indices {shape_of(indices)} must have the data's rank {rank}")
    axis = axis_of(int(node.attr("axis", 0)), rank)
    return [im.emit(wse.GatherElementsOp(data, indices, axis))]


@register("GatherND")
def _gather_nd(im: Importer, node: Node) -> list:
    data, indices = im.value(node, 0), index_value(im, node, 1)
    batch_dims = int(node.attr("batch_dims", 0))
    if batch_dims < 0:
        raise bad_attr("batch_dims", batch_dims)
    return [im.emit(wse.GatherNDOp(data, indices, batch_dims))]


def scatter_reduction(im: Importer, node: Node) -> str:
    """The reduction of ScatterElements/ScatterND allowed at the model's opset."""
    reduction = node.attr("reduction", "none")
    allowed = ("none",) if im.opset < 16 else ("none", "add", "mul")
    allowed = allowed if im.opset < 18 else ("none", "add", "mul", "max", "min")
    if reduction not in allowed:
        raise bad_attr("reduction", reduction, f" at opset {im.opset}")
    return reduction


def scatter_operands(im: Importer, node: Node) -> tuple[SSAValue, SSAValue, SSAValue]:
    """data, indices and updates of a scatter; updates must have the data's type."""
    data, indices, updates = im.value(node, 0), index_value(im, node, 1), im.value(node, 2)
    if wse.element_type(updates) != wse.element_type(data):
        raise NodeError("updates must have the data's type")
    return data, indices, updates


@register("Scatter", "ScatterElements")
def _scatter_elements(im: Importer, node: Node) -> list:
    data, indices, updates = scatter_operands(im, node)
    rank = len(shape_of(data))
    if shape_of(indices) != shape_of(updates) or len(shape_of(indices)) != rank:
        raise NodeError(
            f"indices {shape_of(indices)} and updates {shape_of(updates)} need one shape of "
            f"the data's rank {rank}"
        )
    axis = axis_of(int(node.attr("axis", 0)), rank)
    reduction = scatter_reduction(im, node) if node.op_type == "ScatterElements" else "none"
    return [im.emit(wse.ScatterElementsOp(data, indices, updates, axis, reduction))]


@register("ScatterND")
def _scatter_nd(im: Importer, node: Node) -> list:
    data, indices, updates = scatter_operands(im, node)
    ds, xs, us = shape_of(data), shape_of(indices), shape_of(updates)
    if not xs or xs[-1] > len(ds) or us != (*xs[:-1], *ds[xs[-1] :]):
        raise NodeError(f"indices {xs} and updates {us} do not address data {ds}")
    return [im.emit(wse.ScatterNDOp(data, indices, updates, scatter_reduction(im, node)))]


@register("TensorScatter")
def _tensor_scatter(im: Importer, node: Node) -> list:
    cache, update = im.value(node, 0), im.value(node, 1)
    cs, us = shape_of(cache), shape_of(update)
    axis = axis_of(int(node.attr("axis", -2)), len(cs))
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise bad_attr("mode", mode, " (expected linear or circular)")
    if axis == 0:
        raise bad_attr("axis", node.attr("axis", -2), " (axis 0 is the batch)")
    fits = all(c == u for i, (c, u) in enumerate(zip(cs, us, strict=True)) if i != axis)
    if len(cs) != len(us) or not fits or us[axis] > cs[axis]:
        raise NodeError(f"update {us} does not fit cache {cs} along axis {axis}")
    if wse.element_type(update) != wse.element_type(cache):
        raise NodeError("update must have the cache's type")
    if not node.has_input(2):  # every sample writes from position 0
        rest = slice_axes(im, cache, {axis: (us[axis], cs[axis])}, None)
        return [update if us == cs else im.emit(wse.ConcatOp([update, rest], axis))]
    starts = cast(im, im.value(node, 2), "int64")
    if shape_of(starts) != (cs[0],):
        raise NodeError(f"write_indices {shape_of(starts)} must have shape ({cs[0]},)")
    starts = im.emit(wse.ReshapeOp(starts, along(0, len(cs), np.zeros(cs[0])).shape))
    offsets = im.const(along(axis, len(cs), np.arange(us[axis], dtype=np.int64)))
    positions = im.emit(wse.AddOp(starts, offsets))
    if mode == "circular":
        positions = im.emit(wse.ModOp(positions, im.const(np.array(cs[axis], np.int64))))
    positions = im.emit(wse.BroadcastToOp(positions, us))
    return [im.emit(wse.ScatterElementsOp(cache, positions, update, axis, "none"))]


@register("ReverseSequence")
def _reverse_sequence(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    rank = len(shape)
    if rank < 2:
        raise NodeError(f"the input needs rank >= 2, got {rank}")
    batch_axis = axis_of(int(node.attr("batch_axis", 1)), rank, "batch_axis")
    time_axis = axis_of(int(node.attr("time_axis", 0)), rank, "time_axis")
    if batch_axis == time_axis or max(batch_axis, time_axis) > 1:
        raise NodeError(f"batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1")
    lengths = cast(im, im.value(node, 1), "int64")
    if shape_of(lengths) != (shape[batch_axis],):
        raise NodeError(f"sequence_lens {shape_of(lengths)} must have shape ({shape[batch_axis]},)")
    per_sample = along(batch_axis, rank, np.zeros(shape[batch_axis])).shape
    lengths = im.emit(wse.ReshapeOp(lengths, per_sample))
    steps = im.const(along(time_axis, rank, np.arange(shape[time_axis], dtype=np.int64)))
    inside = im.emit(wse.GreaterOp(lengths, steps))
    last = im.emit(wse.SubOp(lengths, im.const(np.array(1, np.int64))))
    mirrored = im.emit(wse.SubOp(last, steps))  # length - 1 - t
    source = im.emit(wse.BroadcastToOp(im.emit(wse.SelectOp(inside, mirrored, steps)), shape))
    return [im.emit(wse.GatherElementsOp(x, source, time_axis))]


# ---------------------------------------------------------------------------------------------
# Masks, one-hot, running sums
# ---------------------------------------------------------------------------------------------


@register("Trilu")
def _trilu(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    shape = shape_of(x)
    if len(shape) < 2:
        raise NodeError(f"the input needs rank >= 2, got shape {shape}")
    rows, cols = shape[-2:]
    k = im.const(np.array(0, np.int64))
    if node.has_input(1):
        k = as_scalar(im, cast(im, im.value(node, 1), "int64"), "k")
    # keep col - row >= k (upper) or col - row <= k (lower), i.e. compare col with row + k
    row = im.const(np.arange(rows, dtype=np.int64).reshape(rows, 1))
    col = im.const(np.arange(cols, dtype=np.int64).reshape(1, cols))
    shifted = im.emit(wse.AddOp(row, k))
    upper = bool(node.attr("upper", 1))
    keep = wse.GreaterEqualOp(col, shifted) if upper else wse.GreaterEqualOp(shifted, col)
    return [im.emit(wse.SelectOp(im.emit(keep), x, im.scalar(0, x)))]


def one_hot_values(im: Importer, node: Node) -> tuple[SSAValue, SSAValue]:
    """OneHot's off and on values as rank-0 tensors."""
    values = im.value(node, 2)
    if prod(shape_of(values)) != 2:
        raise NodeError(f"input 'values' must hold [off, on], got shape {shape_of(values)}")
    flat = im.emit(wse.ReshapeOp(values, (2,)))
    off, on = (im.emit(wse.SliceOp(flat, [i], [i + 1], [1])) for i in (0, 1))
    return im.emit(wse.ReshapeOp(off, ())), im.emit(wse.ReshapeOp(on, ()))


@register("OneHot")
def _one_hot(im: Importer, node: Node) -> list:
    indices = im.value(node, 0)
    depth_value = static_scalar(im, node, 1)
    depth = int(depth_value)
    if depth < 1:
        raise NodeError(f"input 'depth' must be positive, got {depth_value}")
    rank = len(shape_of(indices)) + 1
    axis = axis_of(int(node.attr("axis", -1)), rank)
    indices = cast(im, indices, "int64")
    if im.opset >= 11:  # indices in [-depth, 0) count from the end
        negative = im.emit(wse.GreaterOp(im.scalar(0, indices), indices))
        wrapped = im.emit(wse.AddOp(indices, im.scalar(depth, indices)))
        indices = im.emit(wse.SelectOp(negative, wrapped, indices))
    hot = im.emit(wse.OneHotOp(indices, depth, BOOL))
    if axis != rank - 1:
        perm = [*range(axis), rank - 1, *range(axis, rank - 1)]
        hot = im.emit(wse.TransposeOp(hot, perm))
    off, on = one_hot_values(im, node)
    return [im.emit(wse.SelectOp(hot, on, off))]


def cumulative_axis(im: Importer, node: Node, rank: int) -> int:
    """The axis input of CumSum and CumProd; a rank-1 input has only one axis, so it need
    not be known (and a run-time axis out of range goes unnoticed, as there is no other)."""
    if rank == 1 and im.known_value(node, 1) is None:
        return 0
    return axis_of(int(static_scalar(im, node, 1)), rank)


SCANS = {"CumSum": wse.CumSumOp, "CumProd": wse.CumProdOp}


@register(*SCANS)
def _scan(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    axis = cumulative_axis(im, node, len(shape_of(x)))
    exclusive = bool(node.attr("exclusive", 0))
    reverse = bool(node.attr("reverse", 0))
    return [im.emit(SCANS[node.op_type](x, axis, exclusive, reverse))]


# ---------------------------------------------------------------------------------------------
# Ops whose result shape depends on the data
# ---------------------------------------------------------------------------------------------


def shape_deciding(im: Importer, node: Node, index: int) -> np.ndarray:
    """The compile-time value of an input that decides the output's shape."""
    array = im.known_value(node, index)
    if array is None:
        why = f": the output shape of {node.op_type} depends on it (cgc compiles static shapes)"
        raise im.not_constant(node, index, why)
    return np.asarray(array)


@register("NonZero")
def _non_zero(im: Importer, node: Node) -> list:
    array = shape_deciding(im, node, 0)
    return [known(im, node, np.array(np.nonzero(array), dtype=np.int64))]


@register("Compress")
def _compress(im: Importer, node: Node) -> list:
    condition = shape_deciding(im, node, 1)
    x = im.value(node, 0)
    axis = node.attr("axis", None)
    if axis is None:
        x, axis = im.emit(wse.ReshapeOp(x, (prod(shape_of(x)),))), 0
    axis = axis_of(int(axis), len(shape_of(x)))
    picked = np.nonzero(np.ravel(condition).astype(bool))[0]
    if picked.size and picked[-1] >= shape_of(x)[axis]:
        raise NodeError(f"condition selects beyond the {shape_of(x)[axis]} slices of axis {axis}")
    return [im.emit(wse.GatherOp(x, im.const(picked.astype(np.int64)), axis))]


@register("Unique")
def _unique(im: Importer, node: Node) -> list:
    """Unique of a compile-time tensor: the distinct values (or slices along ``axis``), sorted
    or in order of first occurrence, with their first indices, the inverse map and counts."""
    x = shape_deciding(im, node, 0)
    axis = node.attr("axis", None)
    if axis is not None:
        axis = axis_of(int(axis), x.ndim)
    values, first, inverse, counts = np.unique(
        x, return_index=True, return_inverse=True, return_counts=True, axis=axis
    )
    if not node.attr("sorted", 1):
        order = np.argsort(first, kind="stable")
        values = np.take(values, order, axis=0 if axis is None else axis)
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[np.ravel(inverse)]
    results = [values, first, np.ravel(inverse), counts]
    return [
        Lazy(a if i == 0 else a.astype(np.int64), name, False, im.loc) if name else None
        for i, (a, name) in enumerate(zip(results, node.proto.output, strict=False))
    ]


@register("NonMaxSuppression")
def _non_max_suppression(im: Importer, node: Node) -> list:
    """NonMaxSuppression of compile-time boxes and scores (how many boxes survive decides the
    output's shape): per batch and class, the boxes in decreasing score (ties: lower index
    first) above ``score_threshold``, each kept unless its IoU with a kept one exceeds
    ``iou_threshold``, at most ``max_output_boxes_per_class`` of them."""
    boxes, scores = shape_deciding(im, node, 0), shape_deciding(im, node, 1)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise NodeError(
            f"expected boxes (B, N, 4) and scores (B, C, N), got {boxes.shape} and {scores.shape}"
        )
    if scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise NodeError(f"scores {scores.shape} do not match boxes {boxes.shape}")
    center = int(node.attr("center_point_box", 0))
    if center not in (0, 1):
        raise bad_attr("center_point_box", center, " (expected 0 or 1)")
    limit, iou, floor = (
        np.ravel(shape_deciding(im, node, i))[0] if node.has_input(i) else None for i in (2, 3, 4)
    )
    overlapping = iou_exceeds(box_corners(boxes, center), 0.0 if iou is None else iou)
    picked = []
    for b, c in np.ndindex(scores.shape[:2]):
        order = np.argsort(-scores[b, c], kind="stable")
        if floor is not None:
            order = order[scores[b, c, order] > floor]
        kept: list[int] = []
        for box in order:
            if len(kept) >= (limit or 0):
                break
            if not overlapping[b, box, kept].any():
                kept.append(int(box))
        picked += [(b, c, box) for box in kept]
    return [known(im, node, np.array(picked, dtype=np.int64).reshape(-1, 3))]


def box_corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """``(x_min, x_max, y_min, y_max)`` per box from ``[y1, x1, y2, x2]`` (any two opposite
    corners) or, with ``center_point_box``, ``[x_center, y_center, width, height]``."""
    if center_point_box:
        half_w, half_h = boxes[..., 2] / 2, boxes[..., 3] / 2
        x, y = boxes[..., 0], boxes[..., 1]
        return np.stack([x - half_w, x + half_w, y - half_h, y + half_h], axis=-1)
    xs, ys = np.sort(boxes[..., [1, 3]], axis=-1), np.sort(boxes[..., [0, 2]], axis=-1)
    return np.concatenate([xs, ys], axis=-1)


def iou_exceeds(corners: np.ndarray, threshold: float) -> np.ndarray:
    """``[B, N, N]``: whether the intersection over union of two boxes of a batch exceeds
    ``threshold`` (boxes that do not overlap, or have no area, never do)."""
    a, b = corners[:, :, None, :], corners[:, None, :, :]
    width = np.minimum(a[..., 1], b[..., 1]) - np.maximum(a[..., 0], b[..., 0])
    height = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 2], b[..., 2])
    area = (corners[..., 1] - corners[..., 0]) * (corners[..., 3] - corners[..., 2])
    inter = width * height
    union = area[:, :, None] + area[:, None, :] - inter
    valid = (width > 0) & (height > 0) & (area[:, :, None] > 0) & (area[:, None, :] > 0)
    valid &= union > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        return valid & (inter / np.where(valid, union, 1) > threshold)
