"""ONNX ops that sample at positions that are data: GridSample and RoiAlign; AffineGrid.

Elementwise ops compute every tap's index and weight (nearest, linear, or cubic with Keys'
kernel; taps outside the input read zeros, the border or a reflection), and
``wse.gather_elements`` fetches the taps; DeformConv (in ``conv``) samples the same way.
RoiAlign averages or maxes a grid of bilinear samples per bin; ``sampling_ratio`` 0 needs the
rois at compile time, since each box's extent decides its number of samples. AffineGrid is a
matmul of a constant grid of positions with the affine matrices.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    add,
    affine,
    broadcast,
    cast,
    clamp,
    dtype_of,
    less,
    mul,
    reshape,
    select,
    shape_of,
    sub,
    working_dtype,
)
from cgc.frontends.onnx.attributes import string_attr
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node

# ---------------------------------------------------------------------------------------------
# Taps
# ---------------------------------------------------------------------------------------------


Tap = tuple[SSAValue, SSAValue | None]
"""One interpolation tap along one axis: its input index (a float tensor of whole numbers, or
an int64 tensor once in range) and its weight (None for weight 1)."""


def reflect(im: Importer, v: SSAValue, low: float, high: float) -> SSAValue:
    """Coordinates outside ``[low, high]`` reflected back in by the nearer border, as often as
    needed; coordinates inside are kept."""
    span = high - low
    if span <= 0:
        return affine(im, v, 0.0, low)
    below, above = less(im, v, im.scalar(low, v)), less(im, im.scalar(high, v), v)
    distance = select(im, below, affine(im, v, -1.0, low), affine(im, v, 1.0, -high))
    flips = im.emit(wse.FloorOp(affine(im, distance, 1 / span, 0.0)))
    rest = sub(im, distance, affine(im, flips, span, 0.0))
    even = im.emit(wse.EqualOp(im.emit(wse.ModOp(flips, im.scalar(2, flips))), im.scalar(0, v)))
    from_low, from_high = affine(im, rest, 1.0, low), affine(im, rest, -1.0, high)
    inside_below = select(im, even, from_low, from_high)
    inside_above = select(im, even, from_high, from_low)
    return select(im, below, inside_below, select(im, above, inside_above, v))


def keys_near(im: Importer, d: SSAValue, a: float) -> SSAValue:
    """Keys' cubic kernel for distances ``d`` in [0, 1]."""
    inner = affine(im, d, a + 2, -(a + 3))
    return affine(im, mul(im, mul(im, inner, d), d), 1.0, 1.0)


def keys_far(im: Importer, d: SSAValue, a: float) -> SSAValue:
    """Keys' cubic kernel for distances ``d`` in [1, 2]."""
    inner = affine(im, mul(im, affine(im, d, a, -5 * a), d), 1.0, 8 * a)
    return affine(im, mul(im, inner, d), 1.0, -4 * a)


def interpolation_taps(im: Importer, v: SSAValue, mode: str) -> list[Tap]:
    """The taps of coordinates ``v`` for nearest (``v`` already rounded), linear or cubic
    (Keys, a = -0.75) interpolation."""
    if mode == "nearest":
        return [(v, None)]
    base = im.emit(wse.FloorOp(v))
    frac = sub(im, v, base)
    if mode == "linear":
        return [(base, affine(im, frac, -1.0, 1.0)), (affine(im, base, 1.0, 1.0), frac)]
    a = -0.75
    weights = [
        keys_far(im, affine(im, frac, 1.0, 1.0), a),
        keys_near(im, frac, a),
        keys_near(im, affine(im, frac, -1.0, 1.0), a),
        keys_far(im, affine(im, frac, -1.0, 2.0), a),
    ]
    return [
        (affine(im, base, 1.0, shift), w) for shift, w in zip((-1, 0, 1, 2), weights, strict=True)
    ]


def padded_tap(im: Importer, tap: Tap, padding: str, bounds: tuple[float, float], size: int):
    """A tap whose index may lie outside ``[0, size)``, read the way ``padding`` says: zeros
    (no weight), border (the edge element) or reflection (mirrored at ``bounds``); the index
    comes back as int64 in range."""
    index, weight = tap
    if padding == "zeros":
        inside = im.emit(
            wse.AndOp(
                im.emit(wse.GreaterEqualOp(index, im.scalar(0, index))),
                im.emit(wse.GreaterEqualOp(im.scalar(size - 1, index), index)),
            )
        )
        one = weight if weight is not None else im.scalar(1, index)
        weight = select(im, inside, one, im.scalar(0, index))
    elif padding == "reflection":
        index = reflect(im, index, *bounds)
    index = clamp(im, index, 0, size - 1)
    return cast(im, index, np.dtype(np.int64)), weight


def gather_taps(
    im: Importer,
    data: SSAValue,
    taps: Sequence[Sequence[Tap]],
    sizes: Sequence[int],
    combine: type[wse.BinaryOp] = wse.AddOp,
) -> SSAValue:
    """``data`` (*lead, prod(sizes)) read at every combination of one tap per axis, weighted,
    and combined (summed, or with ``combine``): the result is (*lead, P).

    Tap indices and weights broadcast to (*lead', P) where ``lead'`` has size 1 on the axes
    they share with all of ``lead``'s channels; they are flattened to one point axis."""
    strides = [prod(sizes[i + 1 :]) for i in range(len(sizes))]
    lead = shape_of(data)[:-1]
    result = None
    for combo in itertools.product(*taps):
        flat, weight = None, None
        for (index, w), stride in zip(combo, strides, strict=True):
            term = index if stride == 1 else mul(im, index, im.scalar(stride, index))
            flat = term if flat is None else add(im, flat, term)
            if w is not None:
                weight = w if weight is None else mul(im, weight, w)
        assert flat is not None  # every caller has at least one axis
        points = shape_of(flat)
        shape = (*points[: len(lead) - 1], 1, prod(points[len(lead) - 1 :]))
        flat = broadcast(im, reshape(im, flat, shape), (*lead, shape[-1]))
        value = im.emit(wse.GatherElementsOp(data, flat, len(lead)))
        if weight is not None:
            value = mul(im, value, reshape(im, broadcast(im, weight, points), shape))
        result = value if result is None else im.emit(combine(result, value))
    assert result is not None
    return result


# ---------------------------------------------------------------------------------------------
# GridSample and AffineGrid
# ---------------------------------------------------------------------------------------------


def grid_mode(im: Importer, node: Node) -> str:
    """GridSample's mode as ``nearest``, ``linear`` or ``cubic`` (opset 16 spells the last two
    ``bilinear`` and ``bicubic``)."""
    if im.opset < 20:
        mode = string_attr(node, "mode", "bilinear", ("bilinear", "nearest", "bicubic"))
        return {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    return string_attr(node, "mode", "linear", ("linear", "nearest", "cubic"))


def grid_axis_taps(
    im: Importer, g: SSAValue, size: int, mode: str, padding: str, align: bool
) -> list[Tap]:
    """The taps along one axis of normalized grid coordinates ``g``."""
    if align:
        v, bounds = affine(im, g, (size - 1) / 2, (size - 1) / 2), (0.0, size - 1.0)
    else:
        v, bounds = affine(im, g, size / 2, (size - 1) / 2), (-0.5, size - 0.5)
    if mode == "nearest":
        v = im.emit(wse.RoundOp(v))
    if padding == "border":
        outside = im.emit(
            wse.OrOp(less(im, v, im.scalar(bounds[0], v)), less(im, im.scalar(bounds[1], v), v))
        )
        v = select(im, outside, clamp(im, v, 0, size - 1), v)
    elif padding == "reflection":
        v = reflect(im, v, *bounds)
    return [padded_tap(im, t, padding, bounds, size) for t in interpolation_taps(im, v, mode)]


@register("GridSample")
def _grid_sample(im: Importer, node: Node) -> list:
    x, grid = im.value(node, 0), im.value(node, 1)
    n, c, *sizes = shape_of(x)
    gs = shape_of(grid)
    nd = len(sizes)
    if nd < 1 or len(gs) != nd + 2 or gs[0] != n or gs[-1] != nd:
        raise NodeError(f"grid {gs} does not match an input of shape {shape_of(x)}")
    mode = grid_mode(im, node)
    padding = string_attr(node, "padding_mode", "zeros", ("zeros", "border", "reflection"))
    align = bool(node.attr("align_corners", 0))
    dtype = dtype_of(x)
    work = working_dtype(dtype)
    out = gs[1:-1]
    points = reshape(im, cast(im, grid, work), (n, prod(out), nd))
    taps = []
    for i, size in enumerate(sizes):
        part = nd - 1 - i  # the grid holds (x, y, ...): the last spatial axis first
        g = im.emit(wse.SliceOp(points, [0, 0, part], [n, prod(out), part + 1], [1, 1, 1]))
        g = reshape(im, g, (n, 1, prod(out)))
        taps.append(grid_axis_taps(im, g, size, mode, padding, align))
    data = reshape(im, cast(im, x, work), (n, c, prod(sizes)))
    y = gather_taps(im, data, taps, sizes)
    return [cast(im, reshape(im, y, (n, c, *out)), dtype)]


def normalized_positions(size: int, align: bool) -> np.ndarray:
    """The centres of ``size`` elements on [-1, 1]: the corner elements' centres at -1 and 1
    with ``align``, else the corner elements' outer edges."""
    if align:
        step = 2.0 / (size - 1) if size > 1 else 0.0
        return -1.0 + step * np.arange(size)
    step = 2.0 / size
    return -1.0 + step / 2 + step * np.arange(size)


@register("AffineGrid")
def _affine_grid(im: Importer, node: Node) -> list:
    theta = im.value(node, 0)
    size = [int(v) for v in np.ravel(im.static(node, 1))]
    nd = len(size) - 2
    if nd not in (2, 3) or shape_of(theta) != (size[0], nd, nd + 1):
        raise NodeError(f"theta {shape_of(theta)} does not match size {size}")
    align = bool(node.attr("align_corners", 0))
    spatial = size[2:]
    axes = np.meshgrid(*[normalized_positions(s, align) for s in spatial], indexing="ij")
    columns = [a.reshape(-1) for a in reversed(axes)]  # x (the last axis) first
    base = np.stack([*columns, np.ones(prod(spatial))], axis=1).astype(dtype_of(theta))
    turned = im.emit(wse.TransposeOp(theta, [0, 2, 1]))
    grid = im.emit(wse.MatmulOp(im.const(base), turned))
    return [reshape(im, grid, (size[0], *spatial, nd))]


# ---------------------------------------------------------------------------------------------
# RoiAlign
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoiGeometry:
    """How RoiAlign samples along one axis of the image."""

    size: int
    """The image's extent along the axis."""
    pooled: int
    """Output bins along the axis."""
    columns: tuple[int, int]
    """The roi columns of the box's start and end along the axis."""


def roi_grid_counts(
    rois: np.ndarray | None,
    geometry: RoiGeometry,
    ratio: int,
    scale: float,
    offset: float,
    work: np.dtype,
) -> np.ndarray:
    """Samples per bin along one axis, per roi: ``sampling_ratio``, or when it is 0 the bin's
    extent rounded up (which needs the rois at compile time)."""
    if ratio > 0:
        return np.array([ratio])
    assert rois is not None, "sampling_ratio=0 needs the rois at compile time"
    boxes = rois.astype(work) * work.type(scale) - work.type(offset)
    start, end = boxes[:, geometry.columns[0]], boxes[:, geometry.columns[1]]
    extent = end - start if offset else np.maximum(end - start, work.type(1))
    return np.maximum(np.ceil(extent / work.type(geometry.pooled)), 1).astype(np.int64)


def sample_fractions(geometry: RoiGeometry, counts: np.ndarray) -> np.ndarray:
    """(R or 1, pooled * G): where each sample sits, in bins from the box start; G is the
    largest count, and a roi with fewer samples per bin repeats its last one (masked)."""
    most = int(counts.max())
    sample = np.minimum(np.arange(most)[None, :], counts.reshape(-1, 1) - 1)
    centres = (sample + 0.5) / counts.reshape(-1, 1)
    fractions = np.arange(geometry.pooled)[None, :, None] + centres[:, None, :]
    return fractions.reshape(len(counts), -1)


def sample_present(geometry: RoiGeometry, counts: np.ndarray) -> np.ndarray:
    """(R or 1, pooled * G): which samples exist (rois with fewer samples per bin than the
    largest count have gaps)."""
    most = int(counts.max())
    present = np.arange(most)[None, :] < counts.reshape(-1, 1)
    return np.broadcast_to(present[:, None, :], (len(counts), geometry.pooled, most)).reshape(
        len(counts), -1
    )


def box_side(im: Importer, boxes: SSAValue, column: int) -> SSAValue:
    """Column ``column`` of the (R, 4) boxes, as (R, 1)."""
    r = shape_of(boxes)[0]
    return im.emit(wse.SliceOp(boxes, [0, column], [r, column + 1], [1, 1]))


def roi_axis_taps(
    im: Importer,
    boxes: SSAValue,
    geometry: RoiGeometry,
    counts: np.ndarray,
    half_pixel: bool,
) -> list[tuple[SSAValue, SSAValue]]:
    """The two bilinear taps (R, pooled * G) of every sample along one axis: samples sit at
    the centres of a ``counts``-way split of each bin; samples beyond -1 or the image's extent
    weigh nothing, samples below 0 read element 0 and samples past the last element read it."""
    start = box_side(im, boxes, geometry.columns[0])
    extent = sub(im, box_side(im, boxes, geometry.columns[1]), start)
    if not half_pixel:
        extent = im.emit(wse.MaxOp(extent, im.scalar(1.0, extent)))
    bin_size = affine(im, extent, 1 / geometry.pooled, 0.0)
    fractions = im.const(sample_fractions(geometry, counts).astype(dtype_of(boxes)))
    v = add(im, start, mul(im, bin_size, fractions))
    size = geometry.size
    valid = im.emit(
        wse.AndOp(
            im.emit(wse.GreaterEqualOp(v, im.scalar(-1.0, v))),
            im.emit(wse.GreaterEqualOp(im.scalar(size, v), v)),
        )
    )
    present = sample_present(geometry, counts)
    if not present.all():
        valid = im.emit(wse.AndOp(valid, im.const(present.copy())))
    v = clamp(im, v, 0, size - 1)
    low = im.emit(wse.FloorOp(v))
    high = clamp(im, affine(im, low, 1.0, 1.0), 0, size - 1)
    frac = sub(im, v, low)
    zero = im.scalar(0, v)
    weights = (select(im, valid, affine(im, frac, -1.0, 1.0), zero), select(im, valid, frac, zero))
    return [(cast(im, i, np.dtype(np.int64)), w) for i, w in zip((low, high), weights, strict=True)]


def roi_options(im: Importer, node: Node) -> tuple[str, int, int, int, float, bool]:
    """RoiAlign's mode, output height and width, sampling ratio, spatial scale, and whether
    boxes use half-pixel coordinates (the default from opset 16 on)."""
    mode = string_attr(node, "mode", "avg", ("avg", "max"))
    height, width = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    ratio = int(node.attr("sampling_ratio", 0))
    if height < 1 or width < 1 or ratio < 0:
        raise NodeError(
            f"output_height={height}, output_width={width} and sampling_ratio={ratio} "
            "must be positive (sampling_ratio may be 0)"
        )
    half_pixel = False
    if im.opset >= 16:
        transform = string_attr(
            node,
            "coordinate_transformation_mode",
            "half_pixel",
            ("half_pixel", "output_half_pixel"),
        )
        half_pixel = transform == "half_pixel"
    return mode, height, width, ratio, float(node.attr("spatial_scale", 1.0)), half_pixel


def pool_samples(im: Importer, samples: SSAValue, mode: str, present: np.ndarray) -> SSAValue:
    """The (R, C, out_h, G, out_w, G) samples of RoiAlign's bins averaged or maxed over the
    samples of each bin that are ``present``."""
    if mode == "avg":  # absent samples weigh nothing
        total = im.emit(wse.ReduceSumOp(samples, [3, 5], False))
        count = np.maximum(present.sum(axis=(3, 5)), 1).astype(dtype_of(samples))
        return im.emit(wse.DivOp(total, im.const(count)))
    if not present.all():
        samples = select(im, im.const(present.copy()), samples, im.scalar(-np.inf, samples))
    return im.emit(wse.ReduceMaxOp(samples, [3, 5], False))


@register("RoiAlign")
def _roi_align(im: Importer, node: Node) -> list:
    x, rois, batch = im.value(node, 0), im.value(node, 1), im.value(node, 2)
    xs = shape_of(x)
    if len(xs) != 4 or len(shape_of(rois)) != 2 or shape_of(rois)[1] != 4:
        raise NodeError(f"expected X (N, C, H, W) and rois (R, 4), got {xs} and {shape_of(rois)}")
    n, c, height, width = xs
    r = shape_of(rois)[0]
    mode, out_h, out_w, ratio, scale, half_pixel = roi_options(im, node)
    dtype = dtype_of(x)
    work = working_dtype(dtype)
    offset = 0.5 if half_pixel else 0.0
    boxes = affine(im, cast(im, rois, work), scale, -offset)
    known = im.known_value(node, 1)
    if known is None and ratio == 0:
        why = " for sampling_ratio=0 (the number of samples per bin depends on each box)"
        raise im.not_constant(node, 1, why)
    rows = RoiGeometry(height, out_h, (1, 3))
    cols = RoiGeometry(width, out_w, (0, 2))
    row_counts = roi_grid_counts(known, rows, ratio, scale, offset, work)
    col_counts = roi_grid_counts(known, cols, ratio, scale, offset, work)
    row_taps = roi_axis_taps(im, boxes, rows, row_counts, half_pixel)
    col_taps = roi_axis_taps(im, boxes, cols, col_counts, half_pixel)
    grid_h, grid_w = int(row_counts.max()), int(col_counts.max())
    a, b = out_h * grid_h, out_w * grid_w
    row_taps = [(reshape(im, i, (r, a, 1)), reshape(im, w, (r, a, 1))) for i, w in row_taps]
    col_taps = [(reshape(im, i, (r, 1, b)), reshape(im, w, (r, 1, b))) for i, w in col_taps]
    images = reshape(im, cast(im, x, work), (n, c, height * width))
    data = im.emit(wse.GatherOp(images, batch, 0))
    combine = wse.AddOp if mode == "avg" else wse.MaxOp
    samples = gather_taps(im, data, [row_taps, col_taps], [height, width], combine)
    samples = reshape(im, samples, (r, c, out_h, grid_h, out_w, grid_w))
    present = (
        sample_present(rows, row_counts)[:, :, None] & sample_present(cols, col_counts)[:, None, :]
    )
    y = pool_samples(im, samples, mode, present.reshape(-1, 1, out_h, grid_h, out_w, grid_w))
    return [cast(im, y, dtype)]
