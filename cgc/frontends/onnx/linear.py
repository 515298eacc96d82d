"""ONNX matrix products: Gemm, MatMul, Einsum, Det and SwiGLU.

Einsum becomes diagonal extractions (strided slices), reductions, transposes, reshapes and
batched matmuls; Det an LU factorization with partial pivoting unrolled over the (static)
matrix size, its row swaps done by gathers.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    broadcast,
    dtype_of,
    require_float,
    reshape,
    shape_of,
    transpose,
)
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.machine.hardware import dtypes


def scale_by(im: Importer, x: SSAValue, factor: float) -> SSAValue:
    """``x * factor`` in ``x``'s type (a whole factor for integers)."""
    if factor == 1.0:
        return x
    exact = int(factor) if dtypes.is_integer(dtype_of(x)) else factor
    return im.emit(wse.MulOp(x, im.scalar(exact, x)))


# ---------------------------------------------------------------------------------------------
# Gemm and MatMul
# ---------------------------------------------------------------------------------------------


@register("Gemm")
def _gemm(im: Importer, node: Node) -> list:
    a, b = im.value(node, 0), im.value(node, 1)
    if len(shape_of(a)) != 2 or len(shape_of(b)) != 2:
        raise NodeError(f"A {shape_of(a)} and B {shape_of(b)} must be matrices")
    if node.attr("transA", 0):
        a = im.emit(wse.TransposeOp(a, (1, 0)))
    if node.attr("transB", 0):
        b = im.emit(wse.TransposeOp(b, (1, 0)))
    if shape_of(a)[1] != shape_of(b)[0]:
        raise NodeError(f"cannot multiply {shape_of(a)} by {shape_of(b)}")
    y = im.emit(wse.MatmulOp(a, b))
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    c = im.value(node, 2) if im.opset < 11 else im.optional(node, 2)
    if c is not None and beta == 0.0:
        c = None  # C * 0 contributes nothing, even where C holds infinities or NaN
    if c is not None:
        _check_gemm_bias(im, node, shape_of(c), shape_of(y))
    dtype = dtype_of(y)
    # integers scaled by fractions: in float64, truncated once at the end (numpy's astype)
    widen = dtypes.is_integer(dtype) and not all(
        f.is_integer() for f in (alpha, beta if c is not None else 1.0)
    )
    if widen:
        y = im.emit(wse.CastOp(y, wse.element_of_numpy("float64")))
        c = None if c is None else im.emit(wse.CastOp(c, wse.element_of_numpy("float64")))
    y = scale_by(im, y, alpha)
    if c is not None:
        y = im.emit(wse.AddOp(y, scale_by(im, c, beta)))
    return [im.emit(wse.CastOp(y, wse.element_of_numpy(dtype))) if widen else y]


def _check_gemm_bias(im: Importer, node: Node, c: tuple, y: tuple) -> None:
    """C must broadcast one way to (M, N); before opset 7 only with ``broadcast=1``."""
    if im.opset < 7 and not node.attr("broadcast", 0):
        if c != y:
            raise NodeError(f"C {c} must have the result's shape {y} when broadcast=0")
        return
    fits = len(c) <= 2 and all(d in (1, n) for d, n in zip(c[::-1], y[::-1], strict=False))
    if not fits:
        raise NodeError(f"C {c} does not broadcast to the result's shape {y}")


@register("MatMul")
def _matmul(im: Importer, node: Node) -> list:
    return [matmul(im, im.value(node, 0), im.value(node, 1))]


def matmul(im: Importer, a: SSAValue, b: SSAValue) -> SSAValue:
    """numpy.matmul of operands of rank >= 1 (a 1-D operand is a row or column vector whose
    axis the result drops)."""
    sa, sb = shape_of(a), shape_of(b)
    if not sa or not sb:
        raise NodeError(f"operands of shapes {sa} and {sb} need rank >= 1")
    if len(sa) >= 2 and len(sb) >= 2:
        return im.emit(wse.MatmulOp(a, b))
    if len(sa) == 1:
        a = im.emit(wse.ReshapeOp(a, (1, sa[0])))
    if len(sb) == 1:
        b = im.emit(wse.ReshapeOp(b, (sb[0], 1)))
    y = im.emit(wse.MatmulOp(a, b))
    *batch, rows, cols = shape_of(y)
    shape = [*batch]
    if len(sa) > 1:
        shape.append(rows)
    if len(sb) > 1:
        shape.append(cols)
    return reshape(im, y, shape)


# ---------------------------------------------------------------------------------------------
# Einsum
# ---------------------------------------------------------------------------------------------


def parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[list[str]], list[str]]:
    """The index letters of every operand and of the output; the axes an ellipsis stands for
    become letters of their own (right-aligned, as numpy broadcasts them)."""
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise bad_attr("equation", equation, f" for {len(ranks)} inputs")
    spans = [_ellipsis_span(term, rank, equation) for term, rank in zip(terms, ranks, strict=True)]
    width = max(spans, default=0)
    ellipsis = [chr(0x2460 + i) for i in range(width)]
    parsed = [
        _letters(term, ellipsis[width - n :], equation)
        for term, n in zip(terms, spans, strict=True)
    ]
    if arrow:
        if rhs.count("...") > 1:
            raise bad_attr("equation", equation, " (more than one ellipsis in the output)")
        output = _letters(rhs, ellipsis, equation)
    else:
        counts: dict[str, int] = {}
        for letters in parsed:
            for letter in letters:
                counts[letter] = counts.get(letter, 0) + 1
        once = sorted(c for c, n in counts.items() if n == 1 and c not in ellipsis)
        output = ellipsis + once
    known = {c for letters in parsed for c in letters}
    if any(c not in known for c in output) or len(set(output)) != len(output):
        raise bad_attr("equation", equation, " (bad output indices)")
    return parsed, output


def _ellipsis_span(term: str, rank: int, equation: str) -> int:
    """How many axes the term's ellipsis stands for (0 without one)."""
    if term.count("...") > 1:
        raise bad_attr("equation", equation, " (more than one ellipsis in a term)")
    named = len(term.replace("...", ""))
    if "..." not in term:
        if named != rank:
            raise bad_attr("equation", equation, f" (term '{term}' for an input of rank {rank})")
        return 0
    if named > rank:
        raise bad_attr("equation", equation, f" (term '{term}' for an input of rank {rank})")
    return rank - named


def _letters(term: str, ellipsis: list[str], equation: str) -> list[str]:
    head, dots, tail = term.partition("...")
    letters = list(head) + (ellipsis if dots else []) + list(tail)
    if any(not (c.isascii() and c.isalpha()) for c in head + tail):
        raise bad_attr("equation", equation, " (indices must be letters)")
    return letters


def diagonal(im: Importer, x: SSAValue, first: int, second: int) -> SSAValue:
    """The diagonal of axes ``first`` and ``second`` (equal sizes), as a new last axis."""
    shape = shape_of(x)
    rank = len(shape)
    n = shape[first]
    if shape[second] != n:
        raise NodeError(f"a repeated index spans axes of sizes {n} and {shape[second]}")
    rest = [i for i in range(rank) if i not in (first, second)]
    moved = transpose(im, x, [*rest, first, second])
    lead = [shape[i] for i in rest]
    flat = reshape(im, moved, [*lead, n * n])
    starts, limits = [0] * (len(lead) + 1), [*lead, n * n]
    return im.emit(wse.SliceOp(flat, starts, limits, [1] * len(lead) + [n + 1]))


def reduce_sum(im: Importer, x: SSAValue, axes: Sequence[int]) -> SSAValue:
    """Sum over ``axes`` (dropped); no op without axes."""
    axes = sorted(axes)
    if not axes:
        return x
    return im.emit(wse.ReduceSumOp(x, axes, False))


class EinsumOperand:
    """An operand of an einsum and the letter of each of its axes."""

    def __init__(self, value: SSAValue, letters: list[str]):
        self.value = value
        self.letters = letters

    def size(self, letter: str) -> int:
        """The size of the axis of ``letter``."""
        return shape_of(self.value)[self.letters.index(letter)]


def take_diagonals(im: Importer, term: EinsumOperand) -> EinsumOperand:
    """Every repeated letter of a term reduced to its diagonal."""
    while len(set(term.letters)) < len(term.letters):
        letters = term.letters
        letter = next(c for c in letters if letters.count(c) > 1)
        first = letters.index(letter)
        second = letters.index(letter, first + 1)
        value = diagonal(im, term.value, first, second)
        rest = [c for i, c in enumerate(letters) if i not in (first, second)]
        term = EinsumOperand(value, [*rest, letter])
    return term


def sum_out(im: Importer, term: EinsumOperand, keep: set[str]) -> EinsumOperand:
    """The term summed over its letters outside ``keep``."""
    axes = [i for i, c in enumerate(term.letters) if c not in keep]
    letters = [c for c in term.letters if c in keep]
    return EinsumOperand(reduce_sum(im, term.value, axes), letters)


def contract(im: Importer, a: EinsumOperand, b: EinsumOperand, keep: set[str]) -> EinsumOperand:
    """The product of two terms summed over the shared letters outside ``keep``, as one
    batched matmul: (batch, a-only, shared) x (batch, shared, b-only); without shared letters
    an elementwise product."""
    a = sum_out(im, a, keep | set(b.letters))
    b = sum_out(im, b, keep | set(a.letters))
    batch = [c for c in a.letters if c in b.letters and c in keep]
    shared = [c for c in a.letters if c in b.letters and c not in keep]
    left = [c for c in a.letters if c not in b.letters]
    right = [c for c in b.letters if c not in a.letters]
    sizes = {c: max(a.size(c), b.size(c)) for c in batch + shared}
    sizes |= {c: a.size(c) for c in left} | {c: b.size(c) for c in right}
    if not shared:
        return _product(im, a, b, (batch, left, right), sizes)
    lhs = _arranged(im, a, batch + left + shared, sizes)
    rhs = _arranged(im, b, batch + shared + right, sizes)
    lead = [sizes[c] for c in batch]
    m, k, n = (prod(sizes[c] for c in group) for group in (left, shared, right))
    lhs = reshape(im, lhs, [*lead, m, k] if lead else [m, k])
    rhs = reshape(im, rhs, [*lead, k, n] if lead else [k, n])
    product = im.emit(wse.MatmulOp(lhs, rhs))
    letters = batch + left + right
    return EinsumOperand(reshape(im, product, [sizes[c] for c in letters]), letters)


def _product(
    im: Importer, a: EinsumOperand, b: EinsumOperand, groups: tuple, sizes: dict[str, int]
) -> EinsumOperand:
    """Two terms with no letter to sum over multiplied elementwise (broadcasting): the result
    has the batch letters, then ``a``'s own, then ``b``'s own."""
    batch, left, right = groups
    lead = [sizes[c] for c in batch]
    mine, theirs = [sizes[c] for c in left], [sizes[c] for c in right]
    lhs = reshape(im, _arranged(im, a, batch + left, sizes), [*lead, *mine, *[1] * len(right)])
    rhs = reshape(im, _arranged(im, b, batch + right, sizes), [*lead, *[1] * len(left), *theirs])
    return EinsumOperand(im.emit(wse.MulOp(lhs, rhs)), batch + left + right)


def _arranged(
    im: Importer, term: EinsumOperand, order: list[str], sizes: dict[str, int]
) -> SSAValue:
    """The term's axes in ``order``, broadcast to the common sizes."""
    value = transpose(im, term.value, [term.letters.index(c) for c in order])
    return broadcast(im, value, [sizes[c] for c in order])


def einsum(im: Importer, equation: str, values: list[SSAValue]) -> SSAValue:
    """An einsum of ``values``: diagonals, reductions and pairwise batched matmuls."""
    parsed, output = parse_einsum(equation, [len(shape_of(v)) for v in values])
    terms = [
        take_diagonals(im, EinsumOperand(v, letters))
        for v, letters in zip(values, parsed, strict=True)
    ]
    for i, term in enumerate(terms):
        elsewhere = {c for j, t in enumerate(terms) if j != i for c in t.letters}
        terms[i] = sum_out(im, term, set(output) | elsewhere)
    result = terms[0]
    for i in range(1, len(terms)):
        later = {c for t in terms[i + 1 :] for c in t.letters}
        result = contract(im, result, terms[i], set(output) | later)
    result = sum_out(im, result, set(output))
    return transpose(im, result.value, [result.letters.index(c) for c in output])


@register("Einsum")
def _einsum(im: Importer, node: Node) -> list:
    equation = node.attr("equation", None)
    if equation is None:
        raise NodeError("attribute equation is required")
    values = [im.value(node, i) for i in range(len(node.proto.input))]
    if not values:
        raise NodeError("there are no inputs")
    return [einsum(im, str(equation), values)]


# ---------------------------------------------------------------------------------------------
# Det
# ---------------------------------------------------------------------------------------------


def _entry(im: Importer, a: SSAValue, row: int, col: int) -> SSAValue:
    """``a[..., row, col]`` as a tensor of the batch shape."""
    *batch, _, _ = shape_of(a)
    rank = len(batch)
    piece = im.emit(
        wse.SliceOp(a, [0] * rank + [row, col], [*batch, row + 1, col + 1], [1] * (rank + 2))
    )
    return reshape(im, piece, batch)


def _det_small(im: Importer, a: SSAValue) -> SSAValue:
    """The determinant of 1x1 and 2x2 matrices in closed form."""
    n = shape_of(a)[-1]
    if n == 1:
        return _entry(im, a, 0, 0)
    ad = im.emit(wse.MulOp(_entry(im, a, 0, 0), _entry(im, a, 1, 1)))
    bc = im.emit(wse.MulOp(_entry(im, a, 0, 1), _entry(im, a, 1, 0)))
    return im.emit(wse.SubOp(ad, bc))


def _pivot_rows(im: Importer, a: SSAValue, k: int) -> SSAValue:
    """The row index (``(*batch, 1)``, int64) of the largest magnitude in column ``k`` at or
    below the diagonal; ties pick the upper row."""
    *batch, n, _ = shape_of(a)
    rank = len(batch)
    column = im.emit(wse.SliceOp(a, [0] * rank + [0, k], [*batch, n, k + 1], [1] * (rank + 2)))
    column = reshape(im, im.emit(wse.AbsOp(column)), [*batch, n])
    above = im.const(np.arange(n) < k)
    column = im.emit(wse.SelectOp(above, im.scalar(-1.0, column), column))
    _, index = im.emit_all(wse.TopKOp(column, rank, 1, True))
    return index


def _swap_rows(im: Importer, a: SSAValue, k: int, pivot: SSAValue) -> SSAValue:
    """``a`` with rows ``k`` and ``pivot`` exchanged (a gather along the row axis)."""
    *batch, n, _ = shape_of(a)
    rows = im.const(np.arange(n, dtype=np.int64))
    at_k = im.const(np.arange(n) == k)
    k_value = im.const(np.array(k, dtype=np.int64))
    at_pivot = im.emit(wse.EqualOp(rows, pivot))
    order = im.emit(wse.SelectOp(at_pivot, k_value, rows))
    order = im.emit(wse.SelectOp(at_k, pivot, order))
    order = broadcast(im, reshape(im, order, [*batch, n, 1]), [*batch, n, n])
    return im.emit(wse.GatherElementsOp(a, order, len(batch)))


def _eliminate(im: Importer, a: SSAValue, k: int) -> SSAValue:
    """Subtracts multiples of row ``k`` from the rows below it to zero column ``k``."""
    *batch, n, _ = shape_of(a)
    rank = len(batch)
    ones = [1] * (rank + 2)
    pivot = im.emit(wse.SliceOp(a, [0] * rank + [k, k], [*batch, k + 1, k + 1], ones))
    zero = im.emit(wse.EqualOp(pivot, im.scalar(0.0, pivot)))
    pivot = im.emit(wse.SelectOp(zero, im.scalar(1.0, pivot), pivot))
    column = im.emit(wse.SliceOp(a, [0] * rank + [0, k], [*batch, n, k + 1], ones))
    row = im.emit(wse.SliceOp(a, [0] * rank + [k, 0], [*batch, k + 1, n], ones))
    factors = im.emit(wse.DivOp(column, pivot))
    updated = im.emit(wse.SubOp(a, im.emit(wse.MulOp(factors, row))))
    below = im.const((np.arange(n) > k).reshape(n, 1))
    return im.emit(wse.SelectOp(below, updated, a))


def determinant(im: Importer, a: SSAValue) -> SSAValue:
    """The determinant of ``(*batch, n, n)``: LU with partial pivoting, then the signed product
    of the diagonal."""
    *batch, n, m = shape_of(a)
    if n != m:
        raise NodeError(f"the input {shape_of(a)} is not a batch of square matrices")
    if n <= 2:
        return _det_small(im, a)
    sign = im.const(np.ones(batch, dtype=dtype_of(a)))
    for k in range(n - 1):
        pivot = _pivot_rows(im, a, k)
        a = _swap_rows(im, a, k, pivot)
        moved = im.emit(wse.EqualOp(pivot, im.const(np.array(k, dtype=np.int64))))
        flip = im.emit(wse.SelectOp(moved, im.scalar(1.0, a), im.scalar(-1.0, a)))
        sign = im.emit(wse.MulOp(sign, reshape(im, flip, batch)))
        a = _eliminate(im, a, k)
    rank = len(batch)
    flat = reshape(im, a, [*batch, n * n])
    diag = im.emit(wse.SliceOp(flat, [0] * (rank + 1), [*batch, n * n], [1] * rank + [n + 1]))
    return im.emit(wse.MulOp(sign, im.emit(wse.ReduceProdOp(diag, [rank], False))))


@register("Det")
def _det(im: Importer, node: Node) -> list:
    x = im.value(node, 0)
    if len(shape_of(x)) < 2:
        raise NodeError(f"the input {shape_of(x)} needs rank >= 2")
    require_float(x)
    return [determinant(im, x)]


# ---------------------------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------------------------


@register("SwiGLU")
def _swiglu(im: Importer, node: Node) -> list:
    gate, linear = im.value(node, 0), im.value(node, 1)
    if shape_of(gate) != shape_of(linear):
        raise NodeError(f"A {shape_of(gate)} and B {shape_of(linear)} must have one shape")
    alpha = float(node.attr("alpha", 1.0))
    scaled = gate if alpha == 1.0 else im.emit(wse.MulOp(gate, im.scalar(alpha, gate)))
    swish = im.emit(wse.MulOp(gate, im.emit(wse.SigmoidOp(scaled))))
    return [im.emit(wse.MulOp(swish, linear))]
