"""Gradients of ONNX ops through the whole training path, against torch.autograd.

Each case is one ONNX op whose float inputs are ``X + dX`` (X a fixed initializer, dX a zero
initializer, the only trainable tensors) and whose loss is ``sum(op(...) * P) * one`` for a
random probe P and a graph input ``one`` (a batch of one sample holding 1). One SGD step with
learning rate 1 leaves ``dX = -dloss/dX``: the gradient that autodiff built, the simulator
computed and MemoryX received, compared with torch's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import cgc

F = torch.nn.functional
FLOAT = TensorProto.FLOAT


@dataclass
class Case:
    """``op`` applied to the float ``inputs`` (shapes) and integer ``constants``; ``torch_op``
    does the same to torch tensors."""

    op: str
    inputs: dict[str, tuple[int, ...]]
    torch_op: Callable
    attrs: dict = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    opset: int = 18
    domain: tuple[float, float] | None = None
    """The range the float inputs are drawn from (default -1.5 to 1.5)."""
    positive: tuple[str, ...] = ()
    """Float inputs that enter the op as ``|v| + 0.5`` (variances, class weights)."""
    order: list[str] | None = None
    """The op's inputs by name, when not the float inputs followed by the constants."""


def _batch_norm(x, scale, bias, mean, var):
    """Inference batch norm written out (torch's does not differentiate the statistics)."""
    shape = (1, -1, 1, 1)
    normal = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + 1e-5)
    return normal * scale.view(shape) + bias.view(shape)


def _nll_loss(x, weight, target, ignore_index):
    """Weighted mean NLL written out (torch's does not differentiate the class weights)."""
    kept = target != ignore_index
    picked = x[torch.arange(len(target)), target] * weight[target]
    return -(picked * kept).sum() / (weight[target] * kept).sum()


CASES = {
    "conv": Case(
        "Conv",
        {"x": (2, 4, 6, 5), "w": (6, 2, 3, 2)},
        lambda x, w: F.conv2d(F.pad(x, (0, 1, 1, 2)), w, stride=(2, 1), dilation=(1, 2), groups=2),
        {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2], "group": 2},
    ),
    "conv_transpose": Case(
        "ConvTranspose",
        {"x": (2, 3, 4, 4), "w": (3, 2, 3, 3)},
        lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    "max_pool": Case(
        "MaxPool",
        {"x": (2, 3, 7, 6)},
        lambda x: F.max_pool2d(x, (3, 2), (2, 2), (1, 1), ceil_mode=True),
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    "average_pool": Case(
        "AveragePool",
        {"x": (2, 3, 7, 6)},
        lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    "global_average_pool": Case(
        "GlobalAveragePool", {"x": (2, 3, 4, 5)}, lambda x: x.mean((2, 3), keepdim=True)
    ),
    "batch_norm": Case(
        "BatchNormalization",
        {"x": (2, 3, 4, 4), "scale": (3,), "bias": (3,), "mean": (3,), "var": (3,)},
        lambda x, s, b, m, v: _batch_norm(x, s, b, m, v.abs() + 0.5),
        {"epsilon": 1e-5},
        positive=("var",),
    ),
    "instance_norm": Case(
        "InstanceNormalization",
        {"x": (2, 3, 4, 5), "scale": (3,), "bias": (3,)},
        lambda x, s, b: F.instance_norm(x, weight=s, bias=b, eps=1e-5),
        {"epsilon": 1e-5},
    ),
    "layer_norm": Case(
        "LayerNormalization",
        {"x": (2, 3, 8), "scale": (8,), "bias": (8,)},
        lambda x, s, b: F.layer_norm(x, (8,), s, b, 1e-5),
        {"epsilon": 1e-5},
    ),
    "group_norm": Case(
        "GroupNormalization",
        {"x": (2, 4, 3, 3), "scale": (4,), "bias": (4,)},
        lambda x, s, b: F.group_norm(x, 2, s, b, 1e-5),
        {"epsilon": 1e-5, "num_groups": 2},
        opset=21,
    ),
    "gemm": Case(
        "Gemm",
        {"a": (3, 5), "b": (4, 5), "c": (4,)},
        lambda a, b, c: 0.5 * a @ b.T + 2.0 * c,
        {"transB": 1, "alpha": 0.5, "beta": 2.0},
    ),
    "matmul_broadcast": Case("MatMul", {"a": (2, 1, 3, 4), "b": (3, 4, 5)}, lambda a, b: a @ b),
    "embedding": Case(
        "Gather",
        {"table": (7, 5)},
        lambda t, i: t[i],
        constants={"tokens": np.array([[1, 6, 1], [0, 6, 6]], np.int64)},
    ),
    "softmax": Case("Softmax", {"x": (3, 5)}, lambda x: torch.softmax(x, -1), {"axis": -1}),
    "log_softmax": Case(
        "LogSoftmax", {"x": (3, 5)}, lambda x: torch.log_softmax(x, 1), {"axis": 1}
    ),
    "gelu": Case("Gelu", {"x": (3, 5)}, F.gelu, opset=20),
    "gelu_tanh": Case(
        "Gelu",
        {"x": (3, 5)},
        lambda x: F.gelu(x, approximate="tanh"),
        {"approximate": "tanh"},
        opset=20,
    ),
    "erf": Case("Erf", {"x": (3, 5)}, torch.erf),
    "tanh": Case("Tanh", {"x": (3, 5)}, torch.tanh),
    "sigmoid": Case("Sigmoid", {"x": (3, 5)}, torch.sigmoid),
    "leaky_relu": Case("LeakyRelu", {"x": (3, 5)}, lambda x: F.leaky_relu(x, 0.1), {"alpha": 0.1}),
    "elu": Case("Elu", {"x": (3, 5)}, F.elu),
    "hard_sigmoid": Case(
        "HardSigmoid", {"x": (3, 5)}, lambda x: torch.clamp(0.2 * x + 0.5, 0, 1), domain=(-1.5, 1.5)
    ),
    "softplus": Case("Softplus", {"x": (3, 5)}, F.softplus),
    "pow": Case("Pow", {"a": (3, 4), "b": (4,)}, torch.pow, domain=(0.5, 2.0)),
    "div": Case("Div", {"a": (3, 4), "b": (3, 1)}, torch.div, domain=(0.5, 2.0)),
    "sqrt": Case("Sqrt", {"x": (3, 4)}, torch.sqrt, domain=(0.5, 2.0)),
    "where": Case(
        "Where",
        {"a": (3, 4), "b": (4,)},
        lambda a, b, c: torch.where(c, a, b),
        constants={"c": np.array([[1, 0, 1, 0], [0, 0, 1, 1], [1, 1, 1, 0]], bool)},
        order=["c", "a", "b"],
    ),
    "expand": Case(
        "Expand",
        {"x": (3, 1)},
        lambda x, s: x.expand(2, 3, 4),
        constants={"shape": np.array([2, 3, 4])},
    ),
    "pad_reflect": Case(
        "Pad",
        {"x": (2, 3, 5)},
        lambda x, p: F.pad(x, (2, 1, 1, 2), mode="reflect"),
        {"mode": "reflect"},
        constants={"pads": np.array([0, 1, 2, 0, 2, 1])},
    ),
    "pad_edge": Case(
        "Pad",
        {"x": (2, 3, 5)},
        lambda x, p: F.pad(x, (2, 1, 1, 2), mode="replicate"),
        {"mode": "edge"},
        constants={"pads": np.array([0, 1, 2, 0, 2, 1])},
    ),
    "slice_strided": Case(
        "Slice",
        {"x": (5, 9)},
        lambda x, s, e, a, st: x[1:5:2, 0:8:3],
        constants={
            "starts": np.array([1, 0]),
            "ends": np.array([5, 8]),
            "axes": np.array([0, 1]),
            "steps": np.array([2, 3]),
        },
    ),
    "split": Case(
        "Split",
        {"x": (2, 7)},
        lambda x, s: torch.cat([p * (i + 1) for i, p in enumerate(x.split([3, 4], 1))], 1),
        {"axis": 1},
        constants={"split": np.array([3, 4])},
    ),
    "concat": Case(
        "Concat", {"a": (2, 3), "b": (2, 2)}, lambda a, b: torch.cat([a, b], 1), {"axis": 1}
    ),
    "transpose": Case(
        "Transpose", {"x": (2, 3, 4)}, lambda x: x.permute(2, 0, 1), {"perm": [2, 0, 1]}
    ),
    "reduce_mean": Case(
        "ReduceMean",
        {"x": (2, 3, 4)},
        lambda x, a: x.mean((0, 2), keepdim=True),
        constants={"axes": np.array([0, 2])},
    ),
    "reduce_max": Case(
        "ReduceMax",
        {"x": (2, 3, 4)},
        lambda x, a: x.amax(1),
        {"keepdims": 0},
        constants={"axes": np.array([1])},
    ),
    "reduce_prod": Case(
        "ReduceProd",
        {"x": (2, 3, 4)},
        lambda x, a: x.prod(2),
        {"keepdims": 0},
        constants={"axes": np.array([2])},
        domain=(0.5, 1.5),
    ),
    "cumsum": Case(
        "CumSum", {"x": (3, 4)}, lambda x, a: x.cumsum(1), constants={"axis": np.array(1)}
    ),
    "tile": Case(
        "Tile", {"x": (2, 3)}, lambda x, r: x.repeat(2, 2), constants={"r": np.array([2, 2])}
    ),
    "clip": Case(
        "Clip",
        {"x": (3, 5)},
        lambda x, lo, hi: torch.clamp(x, lo, hi),
        constants={"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)},
        opset=13,
    ),
    "nll_loss": Case(
        "NegativeLogLikelihoodLoss",
        {"x": (4, 5), "w": (5,)},
        lambda x, w, t: _nll_loss(x, w.abs() + 0.5, t, ignore_index=2),
        {"reduction": "mean", "ignore_index": 2},
        constants={"target": np.array([0, 2, 4, 1])},
        positive=("w",),
        order=["x", "target", "w"],
    ),
    "resize_linear": Case(
        "Resize",
        {"x": (1, 2, 3, 4)},
        lambda x, roi, scales: F.interpolate(x, scale_factor=2, mode="bilinear"),
        {"mode": "linear"},
        constants={"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
    ),
    "einsum": Case(
        "Einsum",
        {"a": (2, 3, 4), "b": (4, 5)},
        lambda a, b: torch.einsum("bij,jk->bki", a, b),
        {"equation": "bij,jk->bki"},
    ),
    "batch_norm_training": Case(
        "BatchNormalization",
        {"x": (4, 3, 2, 2), "scale": (3,), "bias": (3,), "mean": (3,), "var": (3,)},
        lambda x, s, b, m, v: F.batch_norm(x, None, None, s, b, training=True, eps=1e-5),
        {"epsilon": 1e-5, "training_mode": 1},
        positive=("var",),
    ),
    "prelu": Case("PRelu", {"x": (3, 4), "slope": (4,)}, F.prelu),
    "lp_normalization": Case(
        "LpNormalization", {"x": (3, 4)}, lambda x: F.normalize(x, dim=1), {"axis": 1}
    ),
    "reduce_log_sum_exp": Case(
        "ReduceLogSumExp",
        {"x": (3, 4)},
        lambda x, a: torch.logsumexp(x, 1),
        {"keepdims": 0},
        constants={"axes": np.array([1])},
    ),
    "reduce_mean_all": Case(
        "ReduceMean",
        {"x": (4, 3)},
        lambda x, a: x.mean(),
        {"keepdims": 0},
        constants={"axes": np.array([0, 1])},
    ),
    "cross_entropy": Case(
        "SoftmaxCrossEntropyLoss",
        {"x": (4, 5)},
        lambda x, t: F.cross_entropy(x, t, reduction="sum", label_smoothing=0.0),
        {"reduction": "sum"},
        constants={"target": np.array([0, 3, 4, 1])},
    ),
}


def build(case: Case):
    """The nodes and initializers of ``case`` (see the module docstring) and the values of its
    float inputs."""
    rng = np.random.default_rng(len(case.op) + sum(map(len, case.inputs)))
    low, high = case.domain or (-1.5, 1.5)
    values = {n: rng.uniform(low, high, s).astype(np.float32) for n, s in case.inputs.items()}
    nodes, inits = [], [numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    operand = {}
    for name, shape in case.inputs.items():
        inits.append(numpy_helper.from_array(values[name], name))
        inits.append(numpy_helper.from_array(np.zeros(shape, np.float32), f"d{name}"))
        nodes.append(helper.make_node("Add", [name, f"d{name}"], [f"{name}_"]))
        operand[name] = f"{name}_"
        if name in case.positive:  # |v| + 0.5, as the torch side takes it
            nodes.append(helper.make_node("Abs", [f"{name}_"], [f"{name}_abs"]))
            nodes.append(helper.make_node("Add", [f"{name}_abs", "half"], [f"{name}_pos"]))
            operand[name] = f"{name}_pos"
    for name, array in case.constants.items():
        inits.append(numpy_helper.from_array(array, name))
        operand[name] = name
    order = case.order or [*case.inputs, *case.constants]
    outputs = ["y"] if case.op != "Split" else ["y0", "y1"]
    nodes.append(helper.make_node(case.op, [operand[n] for n in order], outputs, **case.attrs))
    if case.op == "Split":  # weigh the parts differently, so that each one's gradient shows
        inits += [numpy_helper.from_array(np.array(v, np.float32), f"k{v}") for v in (1, 2)]
        nodes += [
            helper.make_node("Mul", ["y0", "k1"], ["z0"]),
            helper.make_node("Mul", ["y1", "k2"], ["z1"]),
            helper.make_node("Concat", ["z0", "z1"], ["y"], axis=1),
        ]
    return nodes, inits, values


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_torch(name, tmp_path):
    case = CASES[name]
    nodes, inits, values = build(case)
    torch_inputs = {
        n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in values.items()
    }
    constants = [torch.tensor(c) for c in case.constants.values()]
    y = case.torch_op(*torch_inputs.values(), *constants)
    probe = np.random.default_rng(1).standard_normal(tuple(y.shape)).astype(np.float32)
    (y * torch.tensor(probe, dtype=torch.float64)).sum().backward()
    nodes += [
        helper.make_node("Mul", ["y", "probe"], ["weighted"]),
        helper.make_node("ReduceSum", ["weighted"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["one"], ["ones"], keepdims=0),
        helper.make_node("Mul", ["total", "ones"], ["loss"]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("one", FLOAT, ["N"])],
        [helper.make_tensor_value_info("loss", FLOAT, [])],
        [*inits, numpy_helper.from_array(probe, "probe")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    data = {"one": np.ones((1, 1), np.float32).reshape(1)}
    result = cgc.train(
        model,
        data,
        batch_size=1,
        steps=1,
        model_dir=tmp_path,
        target="mesh8x8",
        lr=1.0,
        trainable=[f"d{n}" for n in case.inputs],
    )
    for n, t in torch_inputs.items():
        if t.grad is None:  # an input the op ignores (running statistics in training mode)
            assert not result.weights.get(f"d{n}", np.zeros(1)).any()
            continue
        got = -result.weights[f"d{n}"].astype(np.float64)
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=n)
