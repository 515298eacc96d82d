"""A numpy interpreter for functions of ``wse`` and ``ws`` ops.

It gives every op its meaning on whole arrays: primitives through
``cgc.machine.reference.evaluate`` and composites through their textbook formulas (written
here independently of the ``decompose`` pass, so that tests can check one against the other).
The compiler uses it to fold constants; tests use it to check frontends and passes without the
fabric simulator. Indices and integer divisors that come with the data are checked as the
runtime checks them (``DataError``, reported with the op's source node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from xdsl.dialects import func
from xdsl.ir import Block, Operation, SSAValue

from cgc.dialects import shapes, ws, wse
from cgc.dialects.ir import dense_to_numpy
from cgc.errors import DataError
from cgc.machine import reference
from cgc.machine.hardware import dtypes


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _layer_norm(x, scale, bias, axis: int, epsilon: float) -> np.ndarray:
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + epsilon) * scale
    return y if bias is None else y + bias


def _batch_norm(x, scale, bias, mean, var, epsilon: float) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = 1.0 / np.sqrt(var.reshape(shape) + epsilon)
    return (x - mean.reshape(shape)) * inv * scale.reshape(shape) + bias.reshape(shape)


def _softmax_cross_entropy(scores, labels, weights, reduction: str, ignore_index) -> np.ndarray:
    reference.check_labels(labels, scores.shape[1], ignore_index)
    logp = _log_softmax(scores, 1)
    valid = np.ones(labels.shape, dtype=bool) if ignore_index is None else labels != ignore_index
    safe = np.where(valid, labels, 0)
    picked = -np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = np.ones_like(picked) if weights is None else weights[safe]
    w = np.where(valid, w, 0).astype(scores.dtype)
    loss = picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


def _conv(x, filt, props: dict) -> np.ndarray:
    group = props["group"]
    cols = reference.im2col(
        x, filt.shape[2:], props["strides"], props["pads"], props["dilations"], group
    )
    k = filt.shape[0]
    mat = filt.reshape(group, k // group, -1).transpose(0, 2, 1)
    out = cols @ mat  # [g, N * prod(out), K/g]
    spatial = shapes.conv(
        x.shape, filt.shape, props["strides"], props["pads"], props["dilations"], group
    )[2:]
    out = out.reshape(group, x.shape[0], *spatial, k // group)
    out = np.moveaxis(out, (0, -1), (1, 2))
    return out.reshape(x.shape[0], k, *spatial)


def _composite(op: Operation, args: list[np.ndarray], props: dict) -> np.ndarray | None:
    """Evaluates a composite op, or returns None if ``op`` is not one."""
    if isinstance(op, wse.SoftmaxOp):
        return _softmax(args[0], props["axis"])
    if isinstance(op, wse.LogSoftmaxOp):
        return _log_softmax(args[0], props["axis"])
    if isinstance(op, wse.LayerNormOp):
        bias = args[2] if len(args) > 2 else None
        return _layer_norm(args[0], args[1], bias, props["axis"], props["epsilon"])
    if isinstance(op, wse.BatchNormOp):
        x, scale, bias, mean, var = args
        return _batch_norm(x, scale, bias, mean, var, props["epsilon"])
    if isinstance(op, wse.SoftmaxCrossEntropyOp):
        weights = args[2] if len(args) > 2 else None
        return _softmax_cross_entropy(
            args[0], args[1], weights, props["reduction"], props.get("ignore_index")
        )
    if isinstance(op, wse.ConvOp):
        return _conv(args[0], args[1], props)
    return None


class Interpreter:
    """Runs functions of a module on numpy arrays; weights come from ``weights``.

    ``gradients`` collects what ``ws.stream_gradient`` ops send, summed per weight and mapped
    back onto the stored weight's shape, as MemoryX would.
    """

    def __init__(self, weights: Mapping[str, np.ndarray]):
        self.weights = weights
        self.gradients: dict[str, np.ndarray] = {}
        self.caches: dict[str, np.ndarray] = {}
        """The key-value caches by name: they stay from one run of a function to the next."""

    def run_function(self, fn: func.FuncOp, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Runs ``fn`` on ``inputs`` and returns its results."""
        return self.run_block(fn.body.block, inputs)

    def run_block(self, block: Block, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Runs a block whose terminator returns or yields values."""
        env: dict[SSAValue, np.ndarray] = dict(zip(block.args, inputs, strict=True))
        for op in block.ops:
            args = [env[v] for v in op.operands]
            if isinstance(op, func.ReturnOp | wse.YieldOp):
                return args
            for result, value in zip(op.results, self.evaluate(op, args), strict=True):
                env[result] = value
        raise ValueError("block has no terminator")

    def evaluate(self, op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
        """The results of one op on argument arrays."""
        if isinstance(op, wse.LayerOp):
            return self.run_block(op.body.block, args)
        if isinstance(op, wse.ConstantOp):
            return [dense_to_numpy(op.value)]
        if isinstance(op, wse.WeightOp | ws.StreamWeightOp):
            return [self._weight(op)]
        if isinstance(op, ws.StreamGradientOp):
            self._gradient(op, args[0])
            return []
        if isinstance(op, wse.KvCacheOp):
            shape = wse.tensor_shape(op.result)
            dtype = dtypes.dtype(wse.numpy_dtype(wse.element_type(op.result)))
            return [self.caches.setdefault(op.cache_name.data, np.zeros(shape, dtype))]
        if isinstance(op, ws.OptimizerStepOp):
            return []
        if isinstance(op, wse.StopGradientOp):
            return args
        try:
            return self._compute(op, args)
        except DataError as e:
            raise e.located(wse.location_name(op), wse.mnemonic(op)) from None

    def _compute(self, op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
        """The results of a composite or primitive op."""
        if isinstance(op, wse.FusedMatmulOp):
            props = op.kernel_attrs()
        else:
            props = wse.properties_as_python(op)
        with np.errstate(all="ignore"):
            composite = _composite(op, args, props)
        results = [(wse.tensor_shape(r), wse.numpy_dtype(wse.element_type(r))) for r in op.results]
        if composite is not None:
            shape, dtype = results[0]
            return [np.asarray(composite).astype(dtypes.dtype(dtype), copy=False).reshape(shape)]
        return reference.evaluate_all(wse.mnemonic(op), props, args, results)

    def _weight(self, op: wse.WeightOp | ws.StreamWeightOp) -> np.ndarray:
        stored = self.weights[op.weight_name.data]
        perm = None if op.perm is None else list(op.perm.get_values())
        return reference.weight_view(stored, wse.tensor_shape(op.result), perm)

    def _gradient(self, op: ws.StreamGradientOp, grad: np.ndarray) -> None:
        name = op.weight_name.data
        perm = None if op.perm is None else list(op.perm.get_values())
        mapped = reference.weight_unview(grad, self.weights[name].shape, perm)
        self.gradients[name] = self.gradients.get(name, 0) + mapped
