"""ONNX activations decomposed into WSE primitives: Elu, Selu, Celu, LeakyRelu,
ThresholdedRelu, HardSigmoid, HardSwish, Softplus, Softsign, Mish, Swish, Gelu, Shrink and
PRelu (Relu, Sigmoid and Tanh map to their WSE twins in ``elementwise``).

The activations select between branches (LeakyRelu is
``select(greater(x, 0), x, mul(x, alpha))``); floats narrower than float32 are computed in
float32 and rounded once at the end. The formulas ``elu``, ``leaky_relu``, ``thresholded_relu``,
``hard_sigmoid``, ``softplus`` and ``softsign`` serve the recurrent ops too.

Opset differences handled here: Selu's defaults of opset 1, and PRelu's slope before opset 7
(X's shape or a single element; one-way broadcasting after).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import NodeError, affine, cast, clamp, dtype_of, less, shape_of
from cgc.frontends.formulas import GELU_APPROXIMATIONS, gelu
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr
from cgc.machine.hardware import dtypes

Activation = Callable[[Importer, Node, SSAValue], SSAValue]
"""``f(im, node, x) -> y``: an activation's formula."""


def activation(op_type: str) -> Callable[[Activation], Activation]:
    """Registers ``f(im, node, x) -> y`` as the importer of a one-input activation. Floats
    narrower than float32 are computed in float32 and rounded once at the end: a chain of
    half-precision steps loses too much (``exp(x) - 1`` near 0 in bfloat16, say)."""

    def add(function: Activation) -> Activation:
        def run(im: Importer, node: Node) -> list:
            x = im.value(node, 0)
            dtype = dtype_of(x)
            if not narrow_float(dtype):
                return [function(im, node, x)]
            y = function(im, node, cast(im, x, np.dtype(np.float32)))
            return [cast(im, y, dtype)]

        register(op_type)(run)
        return function

    return add


def narrow_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a float type of fewer than 32 bits."""
    return dtypes.is_float(dtype) and dtype.itemsize < 4


def positive(im: Importer, x: SSAValue) -> SSAValue:
    """``x > 0``."""
    return im.emit(wse.GreaterOp(x, im.scalar(0, x)))


def expm1_scaled(im: Importer, x: SSAValue, alpha: float) -> SSAValue:
    """``alpha * (exp(x) - 1)``."""
    e = im.emit(wse.SubOp(im.emit(wse.ExpOp(x)), im.scalar(1, x)))
    return im.emit(wse.MulOp(e, im.scalar(alpha, x)))


def elu(im: Importer, x: SSAValue, alpha: float) -> SSAValue:
    """``x`` where positive, else ``alpha * (exp(x) - 1)``."""
    return im.emit(wse.SelectOp(positive(im, x), x, expm1_scaled(im, x, alpha)))


@activation("Elu")
def _elu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return elu(im, x, float(node.attr("alpha", 1.0)))


SELU_DEFAULTS = {
    1: (1.673200011253357, 1.0506999492645264),
    6: (1.6732631921768188, 1.0507010221481323),
}
"""Selu's (alpha, gamma) defaults: opset 1 had rounder ones than opset 6 on."""


@activation("Selu")
def _selu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``gamma * x`` where positive, else ``gamma * alpha * (exp(x) - 1)``."""
    alpha0, gamma0 = SELU_DEFAULTS[1 if im.opset < 6 else 6]
    alpha = float(node.attr("alpha", alpha0))
    gamma = float(node.attr("gamma", gamma0))
    y = elu(im, x, alpha)
    return im.emit(wse.MulOp(y, im.scalar(gamma, y)))


@activation("Celu")
def _celu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    alpha = float(node.attr("alpha", 1.0))
    if alpha == 0:
        raise bad_attr("alpha", alpha, " (it divides x)")
    scaled = im.emit(wse.MulOp(x, im.scalar(1 / alpha, x)))
    zero = im.scalar(0, x)
    negative = im.emit(wse.MinOp(expm1_scaled(im, scaled, alpha), zero))
    return im.emit(wse.AddOp(im.emit(wse.MaxOp(x, zero)), negative))


def leaky_relu(im: Importer, x: SSAValue, alpha: float) -> SSAValue:
    """``x`` where positive, else ``alpha * x``."""
    scaled = im.emit(wse.MulOp(x, im.scalar(alpha, x)))
    return im.emit(wse.SelectOp(positive(im, x), x, scaled))


@activation("LeakyRelu")
def _leaky_relu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return leaky_relu(im, x, float(node.attr("alpha", 0.01)))


def thresholded_relu(im: Importer, x: SSAValue, alpha: float) -> SSAValue:
    """``x`` where above ``alpha``, else 0."""
    above = im.emit(wse.GreaterOp(x, im.scalar(alpha, x)))
    return im.emit(wse.SelectOp(above, x, im.scalar(0, x)))


@activation("ThresholdedRelu")
def _thresholded_relu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return thresholded_relu(im, x, float(node.attr("alpha", 1.0)))


def hard_sigmoid(im: Importer, x: SSAValue, alpha: float, beta: float) -> SSAValue:
    """``max(0, min(1, alpha * x + beta))``."""
    y = affine(im, x, alpha, beta, skip_identities=False)
    return clamp(im, y, im.scalar(0, y), im.scalar(1, y))


@activation("HardSigmoid")
def _hard_sigmoid(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    alpha = float(node.attr("alpha", 0.2))
    beta = float(node.attr("beta", 0.5))
    return hard_sigmoid(im, x, alpha, beta)


@activation("HardSwish")
def _hard_swish(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``x * hard_sigmoid(x)`` with alpha 1/6 and beta 1/2."""
    return im.emit(wse.MulOp(x, hard_sigmoid(im, x, 1 / 6, 0.5)))


def softplus(im: Importer, x: SSAValue) -> SSAValue:
    """``log(1 + exp(x))`` as ``max(x, 0) + log(1 + exp(-|x|))``, which never overflows."""
    tail = im.emit(wse.ExpOp(im.emit(wse.NegOp(im.emit(wse.AbsOp(x))))))
    tail = im.emit(wse.LogOp(im.emit(wse.AddOp(tail, im.scalar(1, x)))))
    return im.emit(wse.AddOp(im.emit(wse.ReluOp(x)), tail))


@activation("Softplus")
def _softplus(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return softplus(im, x)


def softsign(im: Importer, x: SSAValue) -> SSAValue:
    """``x / (1 + |x|)``."""
    denominator = im.emit(wse.AddOp(im.emit(wse.AbsOp(x)), im.scalar(1, x)))
    return im.emit(wse.DivOp(x, denominator))


@activation("Softsign")
def _softsign(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    return softsign(im, x)


@activation("Mish")
def _mish(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``x * tanh(softplus(x))``."""
    return im.emit(wse.MulOp(x, im.emit(wse.TanhOp(softplus(im, x)))))


@activation("Swish")
def _swish(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``x * sigmoid(alpha * x)``."""
    alpha = float(node.attr("alpha", 1.0))
    scaled = x if alpha == 1.0 else im.emit(wse.MulOp(x, im.scalar(alpha, x)))
    return im.emit(wse.MulOp(x, im.emit(wse.SigmoidOp(scaled))))


@activation("Gelu")
def _gelu(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    approximate = node.attr("approximate", "none")
    if approximate not in GELU_APPROXIMATIONS:
        raise bad_attr("approximate", approximate, " (none or tanh)")
    return gelu(im, x, approximate)


@activation("Shrink")
def _shrink(im: Importer, node: Node, x: SSAValue) -> SSAValue:
    """``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, else 0. Integers are
    computed in float64 and truncated back, so fractional bounds and biases hold exactly."""
    lambd = float(node.attr("lambd", 0.5))
    bias = float(node.attr("bias", 0.0))
    wide = cast(im, x, np.dtype(np.float64)) if dtypes.is_integer(dtype_of(x)) else x
    below = less(im, wide, im.scalar(-lambd, wide))
    above = im.emit(wse.GreaterOp(wide, im.scalar(lambd, wide)))
    lowered = im.emit(wse.SubOp(wide, im.scalar(bias, wide)))
    raised = im.emit(wse.AddOp(wide, im.scalar(bias, wide)))
    y = im.emit(wse.SelectOp(above, lowered, im.scalar(0, wide)))
    y = im.emit(wse.SelectOp(below, raised, y))
    return cast(im, y, dtype_of(x))


@register("PRelu")
def _prelu(im: Importer, node: Node) -> list:
    """``x`` where non-negative, else ``slope * x``; the slope broadcasts to X (one way from
    opset 7; before, it has X's shape or a single element)."""
    x, slope = im.value(node, 0), im.value(node, 1)
    sx, ss = shape_of(x), shape_of(slope)
    if im.opset < 7 and ss != sx and math.prod(ss) != 1:
        raise NodeError(f"slope {ss} must have X's shape {sx} or one element before opset 7")
    if im.opset < 7 and ss != sx:
        slope = im.emit(wse.ReshapeOp(slope, ()))
    elif not _broadcasts_to(ss, sx):
        raise NodeError(f"slope {ss} does not broadcast to X {sx}")
    scaled = im.emit(wse.MulOp(x, slope))
    return [im.emit(wse.SelectOp(less(im, x, im.scalar(0, x)), scaled, x))]


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts one way to ``target``."""
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(shape[::-1], target[::-1], strict=False))
