"""The ONNX frontend: an ONNX model to a ``func.func @main`` of ``wse`` ops.

``import_onnx("model.onnx", batch_size=8)`` reads the file (and its external data), binds the
symbolic batch dimension of the inputs, and builds the IR with xDSL builders: one block
argument per graph input, ``wse.weight`` ops for the initializers (their arrays go to the side
store ``ImportedModel.weights``), ``wse.constant`` ops for small constants, and one or a few
``wse`` ops per node, each carrying the node's name as its location (``loc("fc1")``).

Every problem the user can cause is a one-line ``CgcError`` that starts with the file name and
names the culprit: the input, the tensor, or the node and its op.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import (
    ExternalDataInfo,
    load_external_data_for_model,
    uses_external_data,
)
from xdsl.builder import Builder
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BytesAttr,
    DenseIntOrFPElementsAttr,
    FunctionType,
    ModuleOp,
    NameLoc,
    NoneAttr,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import VerifyException

from cgc.dialects import wse
from cgc.errors import CgcError

MIN_OPSET = 1
MAX_OPSET = onnx.defs.onnx_opset_version()
INLINE_LIMIT = 64
"""Constants of at most this many elements are written inline as ``wse.constant``."""

ONNX_DTYPES: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.DOUBLE: "float64",
    TensorProto.FLOAT16: "float16",
    TensorProto.INT64: "int64",
    TensorProto.INT32: "int32",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.BOOL: "bool",
}
"""The ONNX element types cgc imports, with their numpy dtype names."""

SUPPORTED_DTYPES = tuple(ONNX_DTYPES.values())


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: its name, static shape and numpy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    batch_axis: int | None
    """0 when axis 0 is the batch dimension bound by ``batch_size``, else None."""


@dataclass
class ImportedModel:
    """The result of an import: the IR, its side store of weights, and the graph's interface."""

    module: ModuleOp
    """A ``builtin.module`` holding one ``func.func @main``."""
    weights: dict[str, np.ndarray]
    """The side store: the initializers used as tensors and the large constants, by name."""
    inputs: list[TensorSpec]
    """The graph inputs that are not initializers, in graph order."""
    outputs: list[TensorSpec]
    """The graph outputs, in order."""
    initializers: list[str]
    """The initializers that became ``wse.weight`` ops (the trainable candidates), graph order."""
    opset: int
    """The default-domain opset of the model."""
    source: str
    """The file name, or ``"<model>"``."""


def import_onnx(
    path: str | os.PathLike,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> ImportedModel:
    """Reads an ``.onnx`` file (with its external data) and imports it."""
    source = os.path.basename(os.fspath(path))
    model = _load(Path(path), source)
    return import_model(model, batch_size=batch_size, shapes=shapes, source=source)


def import_model(
    model: onnx.ModelProto,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    source: str = "<model>",
) -> ImportedModel:
    """Imports an in-memory ONNX model.

    ``batch_size`` binds the symbolic axis 0 of the inputs; ``shapes`` gives whole input shapes
    by input name and wins over the declared ones.
    """
    return _Importer(model, source, batch_size, dict(shapes or {})).run()


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _load(path: Path, source: str) -> onnx.ModelProto:
    if not path.is_file():
        raise CgcError(f"{source}: no such file")
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as e:
        raise CgcError(f"{source}: not a valid ONNX model ({_short(e)})") from None
    if not model.HasField("graph"):
        raise CgcError(f"{source}: not a valid ONNX model (no graph)")
    base = path.parent
    for tensor in _stored_tensors(model):
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            if not (base / location).is_file():
                raise CgcError(f"{source}: external data file '{location}' is missing")
    try:
        load_external_data_for_model(model, os.fspath(base))
    except Exception as e:
        raise CgcError(f"{source}: not a valid ONNX model (external data: {_short(e)})") from None
    return model


def _stored_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    """The initializers and the tensors of the top-level nodes' attributes."""
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                tensors.append(attr.t)
            tensors.extend(attr.tensors)
    return tensors


def _short(error: Exception) -> str:
    text = str(error).strip().splitlines()
    reason = text[0] if text else type(error).__name__
    return reason if len(reason) <= 120 else reason[:117] + "..."


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


class _NodeError(Exception):
    """A problem with one node; the importer prefixes the file, node and op."""


def _bad_attr(name: str, value: Any, why: str = "") -> _NodeError:
    if isinstance(value, list | tuple):
        value = "[" + ", ".join(str(v) for v in value) + "]"
    return _NodeError(f"attribute {name}={value} is not supported{why}")


def _loc(name: str) -> NameLoc:
    return NameLoc(StringAttr(name), NoneAttr())


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise _NodeError(f"attribute {what}={axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _attribute_value(attr: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    return value


def _dense(array: np.ndarray, element: Attribute) -> DenseIntOrFPElementsAttr:
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return DenseIntOrFPElementsAttr(TensorType(element, array.shape), BytesAttr(data.tobytes()))


def _inlinable(array: np.ndarray) -> bool:
    if array.size > INLINE_LIMIT:
        return False
    # xDSL prints non-finite floats as hex bit patterns that it cannot read back correctly.
    return array.dtype.kind != "f" or bool(np.isfinite(array).all())


@dataclass
class _Node:
    proto: onnx.NodeProto
    name: str
    attrs: dict[str, Any]

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def attr(self, key: str, default: Any) -> Any:
        return self.attrs.get(key, default)

    def ints(self, key: str, count: int, default: int) -> list[int]:
        """An ints attribute of exactly ``count`` values, or ``count`` copies of ``default``."""
        value = self.attrs.get(key)
        if value is None:
            return [default] * count
        if len(value) != count:
            raise _bad_attr(key, value, f" (expected {count} values)")
        return [int(v) for v in value]

    def has_input(self, index: int) -> bool:
        return index < len(self.proto.input) and bool(self.proto.input[index])


@dataclass
class _Lazy:
    """An initializer or a Constant node's value; becomes an op the first time it is used."""

    array: np.ndarray
    name: str
    initializer: bool
    loc: NameLoc | None = None
    value: SSAValue | None = None


_Entry = SSAValue | _Lazy


# ---------------------------------------------------------------------------------------------
# The importer
# ---------------------------------------------------------------------------------------------


class _Importer:
    def __init__(
        self,
        model: onnx.ModelProto,
        source: str,
        batch_size: int | None,
        shapes: dict[str, Sequence[int]],
    ):
        self.model = model
        self.graph = model.graph
        self.source = source
        self.batch_size = batch_size
        self.shapes = shapes
        self.opset = 0
        self.env: dict[str, _Entry] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.used_initializers: set[str] = set()
        self.used = {name for node in self.graph.node for name in node.input if name}
        self.used |= {vi.name for vi in self.graph.output}
        self.loc = _loc("main")
        self.builder: Builder | None = None

    def error(self, message: str) -> CgcError:
        return CgcError(f"{self.source}: {message}")

    # -- driver ---------------------------------------------------------------------------

    def run(self) -> ImportedModel:
        self.opset = self._check_opset()
        self._check_ops()
        initializer_names = self._load_initializers()
        inputs = self._input_specs(initializer_names)
        module = ModuleOp([])
        in_types = [TensorType(wse.element_of_numpy(s.dtype), s.shape) for s in inputs]
        fn = func.FuncOp("main", (in_types, []))
        module.body.block.add_op(fn)
        block = fn.body.block
        for spec, arg in zip(inputs, block.args, strict=True):
            arg.location = _loc(spec.name)
            self.env[spec.name] = arg
        self.builder = Builder(InsertPoint.at_end(block))
        for index, node in enumerate(self.graph.node):
            self._import_node(index, node)
        results = [self._output_value(vi.name) for vi in self.graph.output]
        self.builder.insert(func.ReturnOp(*results))
        fn.function_type = FunctionType.from_lists(in_types, [r.type for r in results])
        module.verify()
        return ImportedModel(
            module=module,
            weights=self.weights,
            inputs=inputs,
            outputs=self._output_specs(inputs, results),
            initializers=[n for n in initializer_names if n in self.used_initializers],
            opset=self.opset,
            source=self.source,
        )

    def _check_opset(self) -> int:
        versions = {o.domain: o.version for o in self.model.opset_import}
        version = versions.get("", versions.get("ai.onnx"))
        if version is None:
            raise self.error("the model imports no default-domain opset")
        if not MIN_OPSET <= version <= MAX_OPSET:
            raise self.error(
                f"opset {version} is not supported (cgc supports opsets {MIN_OPSET} to "
                f"{MAX_OPSET} of the default domain)"
            )
        return version

    def _check_ops(self) -> None:
        """Fails with every unsupported op type and its nodes, sorted by op type."""
        problems: dict[str, list[str]] = {}
        for index, node in enumerate(self.graph.node):
            default = node.domain in ("", "ai.onnx")
            if default and node.op_type in _IMPORTERS:
                continue
            key = node.op_type if default else f"{node.domain}.{node.op_type}"
            problems.setdefault(key, []).append(node.name or f"{node.op_type}_{index}")
        if problems:
            parts = [
                f"{op} (node{'s' if len(names) > 1 else ''} {', '.join(names)})"
                for op, names in sorted(problems.items())
            ]
            raise self.error(f"unsupported ops: {', '.join(parts)}")

    def _load_initializers(self) -> list[str]:
        if len(self.graph.sparse_initializer):
            raise self.error(
                f"sparse initializer '{self.graph.sparse_initializer[0].values.name}' "
                "is not supported"
            )
        names = []
        for tensor in self.graph.initializer:
            if uses_external_data(tensor):
                raise self.error(
                    f"initializer '{tensor.name}' keeps its data in an external file; "
                    "import the model from its file"
                )
            self.env[tensor.name] = _Lazy(numpy_helper.to_array(tensor), tensor.name, True)
            names.append(tensor.name)
        return names

    def _dtype(self, elem_type: int, what: str) -> str:
        if elem_type in ONNX_DTYPES:
            return ONNX_DTYPES[elem_type]
        name = TensorProto.DataType.Name(elem_type).lower() if elem_type else "undefined"
        raise self.error(
            f"{what} has unsupported dtype {name} (supported: {', '.join(SUPPORTED_DTYPES)})"
        )

    # -- inputs and outputs ---------------------------------------------------------------

    def _input_specs(self, initializer_names: list[str]) -> list[TensorSpec]:
        skip = set(initializer_names)
        graph_inputs = [vi for vi in self.graph.input if vi.name not in skip]
        names = [vi.name for vi in graph_inputs]
        for name in self.shapes:
            if name not in names:
                raise self.error(
                    f"--shape names '{name}', which is not a graph input "
                    f"(inputs: {', '.join(names) or 'none'})"
                )
        if self.batch_size is not None and self.batch_size < 1:
            raise self.error(f"--batch-size must be positive, got {self.batch_size}")
        specs = [self._input_spec(vi) for vi in graph_inputs]
        self._check_static_batch(specs)
        return specs

    def _input_spec(self, vi: onnx.ValueInfoProto) -> TensorSpec:
        name = vi.name
        if not vi.type.HasField("tensor_type"):
            raise self.error(f"input '{name}' is not a tensor")
        tt = vi.type.tensor_type
        dtype = self._dtype(tt.elem_type, f"input '{name}'")
        dims = list(tt.shape.dim) if tt.HasField("shape") else None
        batched = bool(dims) and _symbolic(dims[0])
        if name in self.shapes:
            return TensorSpec(name, self._override(name, dims), dtype, 0 if batched else None)
        if dims is None:
            raise self.error(f"input '{name}' has no declared shape; pass --shape {name}=D0xD1...")
        shape = []
        for axis, dim in enumerate(dims):
            if not _symbolic(dim):
                shape.append(dim.dim_value)
            elif axis > 0:
                raise self.error(
                    f"input '{name}' has symbolic dimension '{_dim_label(dim)}' at axis {axis}; "
                    f"pass --shape {name}=D0xD1..."
                )
            elif self.batch_size is None:
                raise self.error(
                    f"input '{name}' has a symbolic batch dimension '{_dim_label(dim)}'; "
                    "pass --batch-size"
                )
            else:
                shape.append(self.batch_size)
        return TensorSpec(name, tuple(shape), dtype, 0 if batched else None)

    def _override(self, name: str, dims: list | None) -> tuple[int, ...]:
        shape = tuple(int(d) for d in self.shapes[name])
        if dims is not None and len(shape) != len(dims):
            raise self.error(
                f"input '{name}' has rank {len(dims)} but --shape gives {len(shape)} dimensions"
            )
        if any(d < 1 for d in shape):
            raise self.error(f"--shape {name}: dimensions must be positive, got {shape}")
        batched = bool(dims) and _symbolic(dims[0])
        if batched and self.batch_size is not None and shape[0] != self.batch_size:
            raise self.error(
                f"input '{name}': --shape gives batch {shape[0]} but --batch-size is "
                f"{self.batch_size}"
            )
        return shape

    def _check_static_batch(self, specs: list[TensorSpec]) -> None:
        """With --batch-size and no symbolic batch dimension, axis 0 must already match."""
        if self.batch_size is None or any(s.batch_axis == 0 for s in specs):
            return
        for spec in specs:
            if spec.name in self.shapes or not spec.shape:
                continue
            if spec.shape[0] != self.batch_size:
                raise self.error(
                    f"input '{spec.name}' has a static batch dimension {spec.shape[0]}, not "
                    f"{self.batch_size}; the model must be exported with a dynamic batch "
                    "dimension to use --batch-size"
                )

    def _output_value(self, name: str) -> SSAValue:
        if name not in self.env:
            raise self.error(f"output '{name}' is not produced by any node")
        self.loc = _loc(name)
        return self.materialize(self.env[name])

    def _output_specs(self, inputs: list[TensorSpec], results: list[SSAValue]) -> list[TensorSpec]:
        batch_params = set()
        for vi in self.graph.input:
            dims = vi.type.tensor_type.shape.dim
            if dims and dims[0].dim_param and any(s.name == vi.name for s in inputs):
                batch_params.add(dims[0].dim_param)
        batched = any(s.batch_axis == 0 for s in inputs)
        specs = []
        for vi, value in zip(self.graph.output, results, strict=True):
            shape = wse.tensor_shape(value)
            dtype = wse.numpy_dtype(wse.element_type(value))
            tt = vi.type.tensor_type
            dims = list(tt.shape.dim) if tt.HasField("shape") else None
            if dims and dims[0].dim_param:
                axis = 0 if dims[0].dim_param in batch_params else None
            elif dims is None or (dims and not dims[0].HasField("dim_value")):
                leading = bool(shape) and shape[0] == self.batch_size
                axis = 0 if batched and leading else None
            else:
                axis = None
            specs.append(TensorSpec(vi.name, shape, dtype, axis))
        return specs

    # -- nodes ----------------------------------------------------------------------------

    def _import_node(self, index: int, proto: onnx.NodeProto) -> None:
        name = proto.name or f"{proto.op_type}_{index}"
        node = _Node(proto, name, {a.name: _attribute_value(a) for a in proto.attribute})
        self.loc = _loc(name)
        try:
            results = _IMPORTERS[proto.op_type](self, node)
            for i, out in enumerate(proto.output):
                if not out:
                    continue
                if i < len(results) and results[i] is not None:
                    self.env[out] = results[i]
                elif out in self.used:
                    raise _NodeError(f"output '{self._label(node, i, False)}' is not supported")
        except (_NodeError, VerifyException) as e:
            raise self.error(f"node '{name}' ({proto.op_type}): {_short(e)}") from None

    def _label(self, node: _Node, index: int, is_input: bool = True) -> str:
        """The schema name of a node's input or output, e.g. ``shape`` for Reshape's second."""
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset)
        except Exception:
            return str(index)
        params = schema.inputs if is_input else schema.outputs
        if not params:
            return str(index)
        return params[min(index, len(params) - 1)].name

    def entry(self, node: _Node, index: int) -> _Entry:
        """The value of input ``index`` as it is: an SSA value or a not yet used constant."""
        if not node.has_input(index):
            raise _NodeError(f"input '{self._label(node, index)}' is required")
        name = node.proto.input[index]
        if name not in self.env:
            raise _NodeError(f"input '{name}' is not defined before the node")
        return self.env[name]

    def value(self, node: _Node, index: int) -> SSAValue:
        """The SSA value of input ``index``."""
        return self.materialize(self.entry(node, index))

    def optional(self, node: _Node, index: int) -> SSAValue | None:
        return self.value(node, index) if node.has_input(index) else None

    def static(self, node: _Node, index: int) -> np.ndarray:
        """The array of an input that must be a constant (an initializer or a Constant node)."""
        entry = self.entry(node, index)
        if not isinstance(entry, _Lazy):
            raise _NodeError(f"input '{self._label(node, index)}' must be a constant")
        return entry.array

    def optional_static(self, node: _Node, index: int) -> np.ndarray | None:
        return self.static(node, index) if node.has_input(index) else None

    def materialize(self, entry: _Entry) -> SSAValue:
        if isinstance(entry, SSAValue):
            return entry
        if entry.value is None:
            entry.value = self._source(entry)
        return entry.value

    def _source(self, lazy: _Lazy) -> SSAValue:
        array = lazy.array
        if array.dtype.name not in SUPPORTED_DTYPES:
            raise self.error(
                f"tensor '{lazy.name}' has unsupported dtype {array.dtype.name} "
                f"(supported: {', '.join(SUPPORTED_DTYPES)})"
            )
        element = wse.element_of_numpy(array.dtype)
        ty = TensorType(element, array.shape)
        if lazy.initializer:
            self.weights[lazy.name] = array
            self.used_initializers.add(lazy.name)
            return self.emit(wse.WeightOp(lazy.name, ty))
        if _inlinable(array):
            op: Operation = wse.ConstantOp(_dense(array, element))
        else:
            self.weights[lazy.name] = array
            op = wse.WeightOp(lazy.name, ty, frozen=True)
        return self.emit(op, lazy.loc)

    def emit(self, op: Operation, loc: NameLoc | None = None) -> SSAValue:
        """Inserts ``op`` at the end of ``@main`` with the current node's location."""
        assert self.builder is not None
        op.location = loc or self.loc
        op.verify()
        self.builder.insert(op)
        return op.results[0]

    def constant(self, array: np.ndarray) -> SSAValue:
        """An inline constant (small arrays only)."""
        element = wse.element_of_numpy(array.dtype)
        return self.emit(wse.ConstantOp(_dense(array, element)))

    def scalar(self, value: float, like: SSAValue) -> SSAValue:
        """A rank-0 constant of ``like``'s element type."""
        dtype = wse.numpy_dtype(wse.element_type(like))
        return self.constant(np.array(value, dtype=dtype))


def _symbolic(dim: onnx.TensorShapeProto.Dimension) -> bool:
    return not dim.HasField("dim_value") or dim.dim_value <= 0


def _dim_label(dim: onnx.TensorShapeProto.Dimension) -> str:
    return dim.dim_param or "?"


def _shape(value: SSAValue) -> tuple[int, ...]:
    return wse.tensor_shape(value)


# ---------------------------------------------------------------------------------------------
# Op importers: (importer, node) -> one entry per supported output
# ---------------------------------------------------------------------------------------------

OpImporter = Callable[[_Importer, _Node], list]


def _unary(cls: type[wse.UnaryOp]) -> OpImporter:
    def run(im: _Importer, node: _Node) -> list:
        return [im.emit(cls(im.value(node, 0)))]

    return run


def _binary(cls: type[wse.BinaryOp]) -> OpImporter:
    def run(im: _Importer, node: _Node) -> list:
        return [im.emit(cls(im.value(node, 0), im.value(node, 1)))]

    return run


def _identity(im: _Importer, node: _Node) -> list:
    return [im.entry(node, 0)]


def _dropout(im: _Importer, node: _Node) -> list:
    if im.opset >= 12:
        training = im.optional_static(node, 2)
        if training is not None and bool(np.ravel(training)[0]):
            raise _NodeError("input training_mode=true is not supported (inference only)")
    return [im.entry(node, 0)]


def _constant(im: _Importer, node: _Node) -> list:
    attrs = node.attrs
    if "value" in attrs:
        array = numpy_helper.to_array(attrs["value"])
    elif "value_float" in attrs:
        array = np.array(attrs["value_float"], dtype=np.float32)
    elif "value_floats" in attrs:
        array = np.array(attrs["value_floats"], dtype=np.float32)
    elif "value_int" in attrs:
        array = np.array(attrs["value_int"], dtype=np.int64)
    elif "value_ints" in attrs:
        array = np.array(attrs["value_ints"], dtype=np.int64)
    else:
        key = next(iter(sorted(attrs)), None)
        if key is None:
            raise _NodeError("the node has no value attribute")
        raise _NodeError(f"attribute {key} is not supported")
    return [_Lazy(array, node.proto.output[0], False, im.loc)]


def _gemm(im: _Importer, node: _Node) -> list:
    a, b = im.value(node, 0), im.value(node, 1)
    if node.attr("transA", 0):
        a = im.emit(wse.TransposeOp(a, (1, 0)))
    if node.attr("transB", 0):
        b = im.emit(wse.TransposeOp(b, (1, 0)))
    y = im.emit(wse.MatmulOp(a, b))
    alpha = float(node.attr("alpha", 1.0))
    if alpha != 1.0:
        y = im.emit(wse.MulOp(y, im.scalar(alpha, y)))
    c = im.optional(node, 2)
    if c is not None:
        beta = float(node.attr("beta", 1.0))
        if beta != 1.0:
            c = im.emit(wse.MulOp(c, im.scalar(beta, c)))
        y = im.emit(wse.AddOp(y, c))
    return [y]


def _matmul(im: _Importer, node: _Node) -> list:
    a, b = im.value(node, 0), im.value(node, 1)
    sa, sb = _shape(a), _shape(b)
    if not sa or not sb:
        raise _NodeError(f"operands of shapes {sa} and {sb} need rank >= 1")
    if len(sa) >= 2 and len(sb) >= 2:
        return [im.emit(wse.MatmulOp(a, b))]
    if len(sa) == 1:
        a = im.emit(wse.ReshapeOp(a, (1, sa[0])))
    if len(sb) == 1:
        b = im.emit(wse.ReshapeOp(b, (sb[0], 1)))
    y = im.emit(wse.MatmulOp(a, b))
    *batch, rows, cols = _shape(y)
    shape = [*batch]
    if len(sa) > 1:
        shape.append(rows)
    if len(sb) > 1:
        shape.append(cols)
    return [im.emit(wse.ReshapeOp(y, shape))]


def _softmax_like(cls: type[wse.SoftmaxOp | wse.LogSoftmaxOp]) -> OpImporter:
    def run(im: _Importer, node: _Node) -> list:
        x = im.value(node, 0)
        shape = _shape(x)
        if not shape:
            raise _NodeError("the input must have rank >= 1")
        default = -1 if im.opset >= 13 else 1
        axis = _axis(int(node.attr("axis", default)), len(shape))
        if im.opset >= 13 or axis == len(shape) - 1:
            return [im.emit(cls(x, axis))]
        # Before opset 13 the input is coerced to 2-D at ``axis``.
        flat = im.emit(wse.ReshapeOp(x, (prod(shape[:axis]), prod(shape[axis:]))))
        y = im.emit(cls(flat, 1))
        return [im.emit(wse.ReshapeOp(y, shape))]

    return run


def _auto_pads(
    node: _Node,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """Begin then end padding of every spatial axis, from ``pads`` or ``auto_pad``."""
    spatial = len(sizes)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = node.ints("pads", 2 * spatial, 0)
        if min(pads, default=0) < 0:
            raise _bad_attr("pads", pads)
        return pads
    if auto_pad == "VALID":
        return [0] * (2 * spatial)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise _bad_attr("auto_pad", auto_pad)
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _conv(im: _Importer, node: _Node) -> list:
    x, w = im.value(node, 0), im.value(node, 1)
    xs, ws = _shape(x), _shape(w)
    spatial = len(xs) - 2
    if spatial < 1 or len(ws) != len(xs):
        raise _NodeError(f"input {xs} and filter {ws} need the same rank >= 3")
    kernel = ws[2:]
    declared = node.attr("kernel_shape", None)
    if declared is not None and tuple(declared) != kernel:
        raise _bad_attr("kernel_shape", declared, f" (the filter has kernel {list(kernel)})")
    strides = node.ints("strides", spatial, 1)
    dilations = node.ints("dilations", spatial, 1)
    pads = _auto_pads(node, xs[2:], kernel, strides, dilations)
    group = int(node.attr("group", 1))
    y = im.emit(wse.ConvOp(x, w, strides, pads, dilations, group))
    bias = im.optional(node, 2)
    if bias is not None:
        bias = im.emit(wse.ReshapeOp(bias, (1, ws[0], *([1] * spatial))))
        y = im.emit(wse.AddOp(y, bias))
    return [y]


def _ceil_extra(
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
) -> list[int]:
    """The end padding ceil_mode adds per axis; the last window must start inside the input
    or its begin padding (as in onnxruntime and PyTorch)."""
    spatial = len(sizes)
    extra = []
    for i, (size, k, s, d) in enumerate(zip(sizes, kernel, strides, dilations, strict=True)):
        span = (k - 1) * d + 1
        padded = size + pads[i] + pads[spatial + i]
        out = -(-(padded - span) // s) + 1
        if (out - 1) * s >= size + pads[i]:
            out -= 1
        extra.append(max(0, (out - 1) * s + span - padded))
    return extra


def _pool_window(node: _Node, xs: Sequence[int]) -> tuple[list, list, list, list, list]:
    """kernel, strides, pads, dilations, and the extra end padding that ceil_mode adds."""
    kernel = node.attr("kernel_shape", None)
    if kernel is None:
        raise _NodeError("attribute kernel_shape is required")
    kernel = [int(k) for k in kernel]
    spatial = len(kernel)
    if len(xs) != spatial + 2:
        raise _bad_attr("kernel_shape", kernel, f" for an input of shape {tuple(xs)}")
    strides = node.ints("strides", spatial, 1)
    dilations = node.ints("dilations", spatial, 1)
    pads = _auto_pads(node, xs[2:], kernel, strides, dilations)
    auto_pad = node.attr("auto_pad", "NOTSET")
    extra = [0] * spatial
    if node.attr("ceil_mode", 0) and auto_pad in ("NOTSET", "VALID"):
        extra = _ceil_extra(xs[2:], kernel, strides, pads, dilations)
        if auto_pad == "VALID" and any(extra):
            # The ONNX specification and onnxruntime disagree on this output shape.
            raise _bad_attr("ceil_mode", 1, " with auto_pad=VALID")
        pads = pads[:spatial] + [p + e for p, e in zip(pads[spatial:], extra, strict=True)]
    return kernel, strides, pads, dilations, extra


def _max_pool(im: _Importer, node: _Node) -> list:
    storage_order = int(node.attr("storage_order", 0))
    if storage_order != 0:
        raise _bad_attr("storage_order", storage_order)
    x = im.value(node, 0)
    kernel, strides, pads, dilations, _ = _pool_window(node, _shape(x))
    return [im.emit(wse.MaxPoolOp(x, kernel, strides, pads, dilations))]


def _average_pool(im: _Importer, node: _Node) -> list:
    x = im.value(node, 0)
    kernel, strides, pads, dilations, extra = _pool_window(node, _shape(x))
    include_pad = bool(node.attr("count_include_pad", 0))
    if include_pad and any(extra):
        raise _bad_attr(
            "ceil_mode", 1, " with count_include_pad=1 when the last window overhangs the padding"
        )
    return [im.emit(wse.AvgPoolOp(x, kernel, strides, pads, dilations, include_pad))]


def _global_average_pool(im: _Importer, node: _Node) -> list:
    x = im.value(node, 0)
    rank = len(_shape(x))
    if rank < 3:
        raise _NodeError(f"the input needs rank >= 3, got {rank}")
    return [im.emit(wse.ReduceMeanOp(x, tuple(range(2, rank)), True))]


# The opset from which a reduction takes its axes as an input instead of an attribute.
_AXES_AS_INPUT = {"ReduceSum": 13}


def _reduce(im: _Importer, node: _Node) -> list:
    """ReduceMean, ReduceSum, ReduceMax and ReduceMin."""
    x = im.value(node, 0)
    rank = len(_shape(x))
    keepdims = bool(node.attr("keepdims", 1))
    if im.opset >= _AXES_AS_INPUT.get(node.op_type, 18):
        given = im.optional_static(node, 1)
        noop = bool(node.attr("noop_with_empty_axes", 0))
    else:
        given = node.attr("axes", None)
        noop = False
    axes = [] if given is None else [int(a) for a in np.ravel(given)]
    if not axes:
        if noop:
            return [x]
        axes = list(range(rank))
    normalized = sorted({_axis(a, rank, "axes") for a in axes})
    return [im.emit(_REDUCTIONS[node.op_type](x, normalized, keepdims))]


_REDUCTIONS = {
    "ReduceMean": wse.ReduceMeanOp,
    "ReduceSum": wse.ReduceSumOp,
    "ReduceMax": wse.ReduceMaxOp,
    "ReduceMin": wse.ReduceMinOp,
}


def _flatten(im: _Importer, node: _Node) -> list:
    x = im.value(node, 0)
    shape = _shape(x)
    axis = int(node.attr("axis", 1))
    if not -len(shape) <= axis <= len(shape):
        raise _NodeError(f"attribute axis={axis} is out of range for rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    return [im.emit(wse.ReshapeOp(x, (prod(shape[:axis]), prod(shape[axis:]))))]


def _reshape_target(src: Sequence[int], spec: Sequence[int], allowzero: bool) -> tuple:
    dims = []
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= len(src):
                raise _NodeError(f"shape {list(spec)} copies axis {i} of a rank-{len(src)} input")
            dims.append(src[i])
        elif d < -1:
            raise _NodeError(f"shape {list(spec)} has the negative dimension {d}")
        else:
            dims.append(d)
    if dims.count(-1) > 1:
        raise _NodeError(f"shape {list(spec)} has more than one -1")
    if -1 in dims:
        known = prod(d for d in dims if d != -1)
        if known == 0 or prod(src) % known:
            raise _NodeError(f"cannot reshape {tuple(src)} into shape {list(spec)}")
        dims[dims.index(-1)] = prod(src) // known
    if prod(dims) != prod(src):
        raise _NodeError(f"cannot reshape {tuple(src)} into shape {list(spec)}")
    return tuple(dims)


def _reshape(im: _Importer, node: _Node) -> list:
    x = im.value(node, 0)
    spec = [int(d) for d in np.ravel(im.static(node, 1))]
    allowzero = bool(node.attr("allowzero", 0))
    return [im.emit(wse.ReshapeOp(x, _reshape_target(_shape(x), spec, allowzero)))]


def _transpose(im: _Importer, node: _Node) -> list:
    x = im.value(node, 0)
    rank = len(_shape(x))
    perm = node.attr("perm", None)
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(p % rank if rank else p for p in perm) != list(range(rank)):
        raise _bad_attr("perm", perm, f" for rank {rank}")
    return [im.emit(wse.TransposeOp(x, [p % rank for p in perm]))]


def _concat(im: _Importer, node: _Node) -> list:
    values = [im.value(node, i) for i in range(len(node.proto.input)) if node.has_input(i)]
    if not values:
        raise _NodeError("there are no inputs")
    axis = _axis(int(node.attr("axis", 0)), len(_shape(values[0])))
    return [im.emit(wse.ConcatOp(values, axis))]


def _batch_norm(im: _Importer, node: _Node) -> list:
    training = int(node.attr("training_mode", 0))
    if training:
        raise _bad_attr("training_mode", training, " (inference only)")
    x, scale, bias, mean, var = (im.value(node, i) for i in range(5))
    epsilon = float(node.attr("epsilon", 1e-5))
    return [im.emit(wse.BatchNormOp(x, scale, bias, mean, var, epsilon))]


def _layer_norm(im: _Importer, node: _Node) -> list:
    x, scale = im.value(node, 0), im.value(node, 1)
    bias = im.optional(node, 2)
    axis = _axis(int(node.attr("axis", -1)), len(_shape(x)))
    epsilon = float(node.attr("epsilon", 1e-5))
    return [im.emit(wse.LayerNormOp(x, scale, bias, axis, epsilon))]


def _softmax_cross_entropy(im: _Importer, node: _Node) -> list:
    reduction = node.attr("reduction", "mean")
    if reduction not in wse.SoftmaxCrossEntropyOp.REDUCTIONS:
        raise _bad_attr("reduction", reduction)
    ignore_index = node.attr("ignore_index", None)
    scores, labels = im.value(node, 0), im.value(node, 1)
    weights = im.optional(node, 2)
    loss = im.emit(
        wse.SoftmaxCrossEntropyOp(
            scores,
            labels,
            weights,
            reduction,
            None if ignore_index is None else int(ignore_index),
        )
    )
    outputs = node.proto.output
    if len(outputs) > 1 and outputs[1] in im.used:
        return [loss, im.emit(wse.LogSoftmaxOp(scores, 1))]
    return [loss]


_IMPORTERS: dict[str, OpImporter] = {
    "Add": _binary(wse.AddOp),
    "AveragePool": _average_pool,
    "BatchNormalization": _batch_norm,
    "Concat": _concat,
    "Constant": _constant,
    "Conv": _conv,
    "Div": _binary(wse.DivOp),
    "Dropout": _dropout,
    "Erf": _unary(wse.ErfOp),
    "Flatten": _flatten,
    "Gemm": _gemm,
    "GlobalAveragePool": _global_average_pool,
    "Identity": _identity,
    "LayerNormalization": _layer_norm,
    "LogSoftmax": _softmax_like(wse.LogSoftmaxOp),
    "MatMul": _matmul,
    "MaxPool": _max_pool,
    "Mul": _binary(wse.MulOp),
    **dict.fromkeys(_REDUCTIONS, _reduce),
    "Relu": _unary(wse.ReluOp),
    "Reshape": _reshape,
    "Sigmoid": _unary(wse.SigmoidOp),
    "Softmax": _softmax_like(wse.SoftmaxOp),
    "SoftmaxCrossEntropyLoss": _softmax_cross_entropy,
    "Sub": _binary(wse.SubOp),
    "Tanh": _unary(wse.TanhOp),
    "Transpose": _transpose,
}
"""One importer per supported ONNX op type."""

SUPPORTED_OPS = tuple(sorted(_IMPORTERS))
