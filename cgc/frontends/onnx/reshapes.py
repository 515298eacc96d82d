"""ONNX ops that regroup a tensor's elements: Flatten, Reshape, Squeeze, Unsqueeze,
Transpose, DepthToSpace and SpaceToDepth.

Shapes are static in cgc, so the operands that decide the result's shape (Reshape's ``shape``,
the ``axes`` of Squeeze and Unsqueeze from opset 13 on) must be known at compile time
(``Importer.static``): an initializer, a Constant node, or shape arithmetic on those, which the
importer folds. Every op here becomes a ``wse.reshape`` or a ``wse.transpose``; DepthToSpace and
SpaceToDepth a reshape, a transpose and a reshape (DCR or CRD order).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, int_list, shape_of, unique_axes
from cgc.frontends.onnx.attributes import static_ints
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr


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
