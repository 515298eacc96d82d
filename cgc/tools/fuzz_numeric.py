"""The fuzzer's numeric family: edge values through one-op models, against independent
references.

A case is one ONNX node (division and remainder, arg-max and top-k with their tie and
direction attributes, max and min, clipping, the unary functions, casts between float and
integer types, gathers with indices near the index type's bounds, reductions) on int8, int16,
int32, int64, uint8 or float32 inputs, or a tiny PyTorch module of the same kinds of ops
(``torch.div`` with ``rounding_mode``, ``remainder``, ``fmod``, ``argmax``, ``topk``,
``clamp``) through the PyTorch frontend. Its inputs mix the type's minimum and maximum, -1, 0,
1, NaN, the infinities, -0.0 and denormals (``fuzz_cases.edge_inputs``), and its outputs are
compared with onnxruntime's or torch eager's exactly for integers and indices
(``fuzz_reference``): a disagreement is silently wrong; an exit 2 naming an input value out
of range is fine.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cgc.tools.fuzz_cases import DIR, FuzzCase, SetupFiles, Step, edge_values

INTS = ["int8", "int16", "int32", "int64", "uint8"]
ALL = [*INTS, "float32"]
NO_INT16 = ["int8", "int32", "int64", "uint8", "float32"]
OPS: dict[str, list[str]] = {
    "Div": ALL, "Mod": ALL, "ArgMax": NO_INT16, "ArgMin": NO_INT16, "TopK": ALL,
    "Max": NO_INT16, "Min": NO_INT16, "Clip": ALL, "Relu": ["int8", "int32", "float32"],
    "Abs": ALL, "Neg": ["int8", "int16", "int32", "int64", "float32"], "Sqrt": ["float32"],
    "Reciprocal": ["float32"], "Floor": ["float32"], "Ceil": ["float32"], "Round": ["float32"],
    "Sign": ALL, "Cast": ALL, "Gather": ["int64", "int32"], "ReduceSum": ["int32", "int64",
    "float32"], "ReduceMean": ["int32", "int64", "float32"], "Sum": ["float32"],
    "Mean": ["float32"],
}  # fmt: skip
"""Each op and the input types onnxruntime's CPU kernels take (so that there is a reference)."""
BINARY = ("Div", "Mod", "Max", "Min", "Sum", "Mean")
SHAPE = [2, 6]
"""Every input's shape: a batch of two rows of six."""


def _elem(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


@dataclass
class OneOpModel:
    """The one-op model being built: its node's inputs, outputs, constants and attributes."""

    op: str
    dtype: str
    rng: random.Random
    names: list[str] = field(default_factory=lambda: ["x"])
    outputs: list[tuple[str, int]] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source: str = ""
    """The type of input ``x`` if not ``dtype``: a cast to ``dtype`` comes first."""

    def constant(self, name: str, value: Any, dtype: str) -> None:
        """An input of the node that is an initializer."""
        self.inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        self.names.append(name)


def _binary(node: OneOpModel) -> None:
    node.names.append("b")
    if node.op == "Mod":
        node.attrs["fmod"] = 1 if node.dtype == "float32" else node.rng.choice([0, 1])


def _arg(node: OneOpModel) -> None:
    rng = node.rng
    node.attrs = {"axis": rng.choice([1, -1, 0]), "keepdims": rng.choice([0, 1]),
                  "select_last_index": rng.choice([0, 1])}  # fmt: skip
    node.outputs = [("y", TensorProto.INT64)]


def _topk(node: OneOpModel) -> None:
    rng = node.rng
    node.constant("k", [rng.randint(1, 6)], "int64")
    node.attrs = {"axis": rng.choice([1, -1]), "largest": rng.choice([0, 1]), "sorted": 1}
    node.outputs.append(("i", TensorProto.INT64))
    node.notes.append(f"k={numpy_helper.to_array(node.inits[-1])[0]}")


def _clip(node: OneOpModel) -> None:
    """Bounds of edge values (a NaN one too), the lower above the upper sometimes, each left
    out sometimes."""
    rng = node.rng
    low, high = sorted(rng.sample(edge_values(np.dtype(node.dtype)), 2), key=_order)
    if rng.random() < 0.15:
        low, high = high, low
    for name, value in (("lo", low), ("hi", high)):
        if rng.random() < 0.8:
            node.constant(name, value, node.dtype)
            node.notes.append(f"{name}={value}")
        else:
            node.names.append("")
    while node.names[-1] == "":
        node.names.pop()


def _cast(node: OneOpModel) -> None:
    to = node.rng.choice([d for d in ALL if d != node.dtype])
    node.attrs["to"] = _elem(to)
    node.outputs = [("y", _elem(to))]
    node.notes.append(f"to {to}")


def _reduce(node: OneOpModel) -> None:
    """Over one axis, the other or both. An integer sum of edge values overflows, where ONNX
    says nothing and onnxruntime saturates: integers are reduced after a cast from a type
    half as wide, whose sums fit."""
    rng = node.rng
    axes = rng.choice([[1], [-1], [0], [0, 1]])
    node.attrs["keepdims"] = rng.choice([0, 1])
    if node.op == "ReduceSum":
        node.constant("axes", axes, "int64")
    else:
        node.attrs["axes"] = axes
    node.notes.append(f"axes={axes}")
    if node.dtype != "float32":
        node.source = {"int32": "int16", "int64": "int32"}[node.dtype]
        node.notes.append(f"of a cast from {node.source}")


BUILDERS: dict[str, Callable[[OneOpModel], None]] = {
    **{op: _binary for op in BINARY}, "ArgMax": _arg, "ArgMin": _arg, "TopK": _topk,
    "Clip": _clip, "Cast": _cast, "ReduceSum": _reduce, "ReduceMean": _reduce,
}  # fmt: skip
"""What each op needs besides input ``x``: a second input, constants, attributes."""


def onnx_edge_model(op: str, dtype: str, rng: random.Random) -> tuple[onnx.ModelProto, str]:
    """A model of one ``op`` node on ``dtype`` inputs of ``SHAPE``, with random attributes,
    and its description."""
    if op == "Gather":
        return _gather(dtype, rng)
    node = OneOpModel(op, dtype, rng, outputs=[("y", _elem(dtype))])
    BUILDERS.get(op, lambda node: None)(node)
    nodes = []
    if node.source:
        nodes.append(helper.make_node("Cast", ["x"], ["wide"], name="widen", to=_elem(dtype)))
        node.names[0] = "wide"
    inputs = [helper.make_tensor_value_info("x", _elem(node.source or dtype), SHAPE)]
    if "b" in node.names:
        inputs.append(helper.make_tensor_value_info("b", _elem(dtype), SHAPE))
    outputs = [n for n, _ in node.outputs]
    nodes.append(helper.make_node(op, node.names, outputs, name=op.lower(), **node.attrs))
    typed = [helper.make_tensor_value_info(n, t, None) for n, t in node.outputs]
    shown = [f"{k}={v}" for k, v in node.attrs.items() if k != "to"] + node.notes
    return _model(nodes, inputs, typed, node.inits), ", ".join([f"{op} on {dtype}", *shown])


def _order(value: object) -> float:
    number = float(value)  # type: ignore[arg-type]
    return -np.inf if np.isnan(number) else number


def _gather(dtype: str, rng: random.Random) -> tuple[onnx.ModelProto, str]:
    """A gather with ``dtype`` indices: an input into a table (the indices edge values, most
    out of range), or a table input gathered by constant indices near the type's bounds."""
    elem = _elem(dtype)
    if rng.random() < 0.5:
        table = np.arange(15, dtype=np.float32).reshape(5, 3)
        inputs = [helper.make_tensor_value_info("ids", elem, SHAPE)]
        inits = [numpy_helper.from_array(table, "table")]
        node = helper.make_node("Gather", ["table", "ids"], ["y"], name="gather", axis=0)
        what = f"Gather of a [5, 3] table by {dtype} input indices"
    else:
        pool = edge_values(np.dtype(dtype))
        ids = np.array([rng.choice([*pool, 0, 1, 5, -6]) for _ in range(3)], dtype=dtype)
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)]
        inits = [numpy_helper.from_array(ids, "ids")]
        node = helper.make_node("Gather", ["x", "ids"], ["y"], name="gather", axis=1)
        what = f"Gather of a float input by {dtype} indices {ids.tolist()}"
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    return _model([node], inputs, out, inits), what


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "edge", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    # checks types and attributes (the checker wants output shapes, left to inference here)
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


# ------------------------------------------------------------------------------- torch

TORCH_OPS: dict[str, str] = {
    "div trunc": "torch.div(x, y, rounding_mode='trunc')",
    "div floor": "torch.div(x, y, rounding_mode='floor')",
    "remainder": "torch.remainder(x, y)",
    "fmod": "torch.fmod(x, y)",
    "argmax": "torch.argmax(x, dim={dim}, keepdim={keep})",
    "topk": "torch.topk(x, {k}, dim=-1, largest={largest}).values",
    "clamp": "torch.clamp(x, min={low}, max={high})",
}
"""PyTorch ops by name: the expression of ``forward(x, y)`` (topk's values alone: torch
leaves the order of equal values' indices open)."""
TORCH_DTYPES = ["int32", "int64", "float32"]

TORCH_MODULE = """\
import torch


class Edge(torch.nn.Module):
    def forward(self, {params}):
        return {expression}


def factory():
    example = torch.ones(2, 6, dtype=torch.{dtype})
    return Edge(), ({examples})
"""


def torch_edge_module(op: str, dtype: str, rng: random.Random) -> tuple[str, str]:
    """The source of a factory file of a one-op module, and its description."""
    template = TORCH_OPS[op]
    binary = "y" in template
    pool = [v for v in edge_values(np.dtype(dtype)) if not isinstance(v, float) or np.isfinite(v)]
    low, high = sorted(rng.sample(pool, 2))
    expression = template.format(
        dim=rng.choice([1, -1]), keep=rng.choice([True, False]), k=rng.randint(1, 6),
        largest=rng.choice([True, False]), low=repr(low), high=repr(high),
    )  # fmt: skip
    source = TORCH_MODULE.format(
        params="x, y" if binary else "x", expression=expression, dtype=dtype,
        examples="example, example" if binary else "example,",
    )  # fmt: skip
    return source, f"torch: {expression} on {dtype}"


def numeric_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """One op on edge values, compiled and run, and compared with its reference."""
    edge_seed = rng.randrange(1 << 30)
    if importlib.util.find_spec("torch") is not None and rng.random() < 0.25:
        op = rng.choice(sorted(TORCH_OPS))
        source, what = torch_edge_module(op, rng.choice(TORCH_DTYPES), rng)
        files = {"f.py": source.encode()}
        model, reference = f"{DIR}/f.py:factory", "f.py:factory"
        target = ["--target", "mesh8x8"]
    else:
        op = rng.choice(sorted(OPS))
        built, what = onnx_edge_model(op, rng.choice(OPS[op]), rng)
        files = {"model.onnx": built.SerializeToString()}
        model, reference, target = f"{DIR}/model.onnx", "model.onnx", []
    run = ["run", f"{DIR}/model.cgc", "--inputs", f"{DIR}/inputs.npz", "--output",
           f"{DIR}/outputs.npz"]  # fmt: skip
    steps = [
        Step(["compile", model, "-o", f"{DIR}/model.cgc", *target]),
        Step(run, make_inputs="model.cgc", edge_seed=edge_seed, compare_with=reference,
             exact=True),
    ]  # fmt: skip
    return FuzzCase(index, "numeric", f"{what} (edge inputs {edge_seed})", steps, files)
