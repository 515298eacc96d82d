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
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue
from xdsl.rewriter import InsertPoint
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from cgc.dialects import wse
from cgc.errors import CgcError, NeedsInputValuesError
from cgc.machine import dtypes, reference
from cgc.machine.bytecode import PRIMITIVES

MIN_OPSET = 1
MAX_OPSET = onnx.defs.onnx_opset_version()
INLINE_LIMIT = 64
"""Constants of at most this many elements are written inline as ``wse.constant``."""

ONNX_DTYPES: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.DOUBLE: "float64",
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    TensorProto.FLOAT8E5M2: "float8_e5m2",
    TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    TensorProto.FLOAT8E8M0: "float8_e8m0fnu",
    TensorProto.FLOAT4E2M1: "float4_e2m1fn",
    TensorProto.INT64: "int64",
    TensorProto.INT32: "int32",
    TensorProto.INT16: "int16",
    TensorProto.INT8: "int8",
    TensorProto.INT4: "int4",
    TensorProto.INT2: "int2",
    TensorProto.UINT64: "uint64",
    TensorProto.UINT32: "uint32",
    TensorProto.UINT16: "uint16",
    TensorProto.UINT8: "uint8",
    TensorProto.UINT4: "uint4",
    TensorProto.UINT2: "uint2",
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
    values: Mapping[str, np.ndarray] | None = None,
) -> ImportedModel:
    """Reads an ``.onnx`` file (with its external data) and imports it."""
    source = os.path.basename(os.fspath(path))
    model = _load(Path(path), source)
    return import_model(model, batch_size, shapes, source, values)


def import_model(
    model: onnx.ModelProto,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    source: str = "<model>",
    values: Mapping[str, np.ndarray] | None = None,
) -> ImportedModel:
    """Imports an in-memory ONNX model.

    ``batch_size`` binds the symbolic axis 0 of the inputs; ``shapes`` gives whole input shapes
    by input name and wins over the declared ones; ``values`` fixes graph inputs to arrays
    known at compile time, as if they were initializers (for inputs that decide shapes, such
    as a Reshape's target shape fed at run time): they leave the compiled model's inputs.
    """
    return Importer(model, source, batch_size, dict(shapes or {}), dict(values or {})).run()


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


class NodeError(Exception):
    """A problem with one node; the importer prefixes the file, node and op."""


class NotConstantError(NodeError):
    """An operand that must be known at compile time is computed at run time from the graph
    inputs ``inputs``."""

    def __init__(self, message: str, inputs: tuple[str, ...]):
        super().__init__(message)
        self.inputs = inputs


def bad_attr(name: str, value: Any, why: str = "") -> NodeError:
    if isinstance(value, list | tuple):
        value = "[" + ", ".join(str(v) for v in value) + "]"
    return NodeError(f"attribute {name}={value} is not supported{why}")


def dtype_attribute(name: str, code: int, allowed: Sequence[str] | None = None) -> np.dtype:
    """The dtype that the element-type attribute ``name`` (an ONNX ``TensorProto`` code)
    names, one of ``allowed`` (default: any type cgc supports)."""
    dtype = ONNX_DTYPES.get(int(code))
    if dtype is None or (allowed is not None and dtype not in allowed):
        label = TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else code
        expected = "a type cgc supports" if allowed is None else "one of " + ", ".join(allowed)
        raise bad_attr(name, label, f" (expected {expected})")
    return dtypes.dtype(dtype)


def loc(name: str) -> NameLoc:
    return NameLoc(StringAttr(name), NoneAttr())


def axis_of(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise NodeError(f"attribute {what}={axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _attribute_value(attr: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    return value


def dense(array: np.ndarray, element: Attribute) -> DenseIntOrFPElementsAttr:
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return DenseIntOrFPElementsAttr(TensorType(element, array.shape), BytesAttr(data.tobytes()))


def inlinable(array: np.ndarray) -> bool:
    """Whether a constant can be written in the IR text and read back exactly."""
    if array.size > INLINE_LIMIT or dtypes.is_extended(array.dtype):
        return False
    # xDSL prints non-finite floats as hex bit patterns that it cannot read back correctly.
    return array.dtype.kind != "f" or bool(np.isfinite(array).all())


@dataclass
class Node:
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
            raise bad_attr(key, value, f" (expected {count} values)")
        return [int(v) for v in value]

    def has_input(self, index: int) -> bool:
        return index < len(self.proto.input) and bool(self.proto.input[index])


@dataclass
class Lazy:
    """An initializer or a Constant node's value; becomes an op the first time it is used."""

    array: np.ndarray
    name: str
    initializer: bool
    loc: NameLoc | None = None
    value: SSAValue | None = None


Entry = SSAValue | Lazy


# ---------------------------------------------------------------------------------------------
# The importer
# ---------------------------------------------------------------------------------------------


class Importer:
    def __init__(
        self,
        model: onnx.ModelProto,
        source: str,
        batch_size: int | None,
        shapes: dict[str, Sequence[int]],
        values: dict[str, np.ndarray] | None = None,
    ):
        self.model = model
        self.graph = model.graph
        self.source = source
        self.batch_size = batch_size
        self.shapes = shapes
        self.values = values or {}
        self.opset = 0
        self.env: dict[str, Entry] = {}
        self.input_names: list[str] = []
        """The graph inputs fed at run time, in the order of the function's arguments."""
        self.weights: dict[str, np.ndarray] = {}
        self.used_initializers: set[str] = set()
        self.used = {name for node in self.graph.node for name in node.input if name}
        self.used |= {vi.name for vi in self.graph.output}
        self.loc = loc("main")
        self.builder: Builder | None = None
        self.known: dict[SSAValue, np.ndarray] = {}
        """Values known at compile time: constants, folded results, integer initializers."""
        self.folded = 0

    def error(self, message: str) -> CgcError:
        return CgcError(f"{self.source}: {message}")

    # -- driver ---------------------------------------------------------------------------

    def run(self) -> ImportedModel:
        self.opset = self._check_opset()
        self._check_ops()
        initializer_names = self._load_initializers()
        self._bind_values(set(initializer_names))
        inputs = self._input_specs(initializer_names)
        module = ModuleOp([])
        in_types = [TensorType(wse.element_of_numpy(s.dtype), s.shape) for s in inputs]
        fn = func.FuncOp("main", (in_types, []))
        module.body.block.add_op(fn)
        block = fn.body.block
        self.input_names = [spec.name for spec in inputs]
        for spec, arg in zip(inputs, block.args, strict=True):
            arg.location = loc(spec.name)
            self.env[spec.name] = arg
        self.builder = Builder(InsertPoint.at_end(block))
        for index, node in enumerate(self.graph.node):
            self._import_node(index, node)
        results = [self._output_value(vi.name) for vi in self.graph.output]
        self.builder.insert(func.ReturnOp(*results))
        _erase_unused(block)
        fn.function_type = FunctionType.from_lists(in_types, [r.type for r in results])
        # every op was verified as it was inserted; what is left is the function itself
        fn.verify(verify_nested_ops=False)
        block.last_op.verify()  # type: ignore[union-attr]
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
            if default and node.op_type in OPS:
                continue
            key = node.op_type if default else f"{node.domain}.{node.op_type}"
            problems.setdefault(key, []).append(node.name or f"{node.op_type}_{index}")
        if problems:
            parts = [f"{op} ({_node_list(names)})" for op, names in sorted(problems.items())]
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
            self.env[tensor.name] = Lazy(numpy_helper.to_array(tensor), tensor.name, True)
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

    def _bind_values(self, initializer_names: set[str]) -> None:
        """Makes the graph inputs in ``values`` compile-time constants."""
        declared = {vi.name: vi for vi in self.graph.input if vi.name not in initializer_names}
        for name, array in self.values.items():
            if name not in declared:
                raise self.error(
                    f"a value is given for '{name}', which is not a graph input "
                    f"(inputs: {', '.join(declared) or 'none'})"
                )
            array = np.asarray(array)
            elem_type = declared[name].type.tensor_type.elem_type
            want = self._dtype(elem_type, f"input '{name}'") if elem_type else array.dtype.name
            if array.dtype.name != want:
                raise self.error(f"the value of input '{name}' is {array.dtype.name}, not {want}")
            self._check_value_shape(declared[name], array.shape)
            self.env[name] = Lazy(array, name, False)

    def _check_value_shape(self, vi: onnx.ValueInfoProto, shape: tuple[int, ...]) -> None:
        """A fixed value has the declared rank and every declared (non-symbolic) dimension."""
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            return
        dims = list(tt.shape.dim)
        declared = ["?" if _symbolic(d) else d.dim_value for d in dims]
        fits = len(dims) == len(shape) and all(
            d in ("?", size) for d, size in zip(declared, shape, strict=True)
        )
        if not fits:
            raise self.error(
                f"the value of input '{vi.name}' has shape {list(shape)}, but the input is "
                f"declared as [{', '.join(map(str, declared))}]"
            )

    def _input_specs(self, initializer_names: list[str]) -> list[TensorSpec]:
        skip = set(initializer_names) | set(self.values)
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
        if any(d < 0 for d in shape):
            raise self.error(f"--shape {name}: dimensions must not be negative, got {shape}")
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
                    f"input '{spec.name}' has a static batch dimension {spec.shape[0]}, but "
                    f"each system runs {self.batch_size} samples (--batch-size over "
                    "--num-csx); export the model with a dynamic batch dimension"
                )

    def _output_value(self, name: str) -> SSAValue:
        if name not in self.env:
            raise self.error(f"output '{name}' is not produced by any node")
        self.loc = loc(name)
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
        node = Node(proto, name, {a.name: _attribute_value(a) for a in proto.attribute})
        self.loc = loc(name)
        try:
            results = OPS[proto.op_type](self, node)
            for i, out in enumerate(proto.output):
                if not out:
                    continue
                if i < len(results) and results[i] is not None:
                    self.env[out] = results[i]
                elif out in self.used:
                    raise NodeError(f"output '{self._label(node, i, False)}' is not supported")
        except NotConstantError as e:
            message = f"{self.source}: node '{name}' ({proto.op_type}): {_short(e)}"
            raise NeedsInputValuesError(message, e.inputs) from None
        except (NodeError, VerifyException) as e:
            raise self.error(f"node '{name}' ({proto.op_type}): {_short(e)}") from None

    def _label(self, node: Node, index: int, is_input: bool = True) -> str:
        """The schema name of a node's input or output, e.g. ``shape`` for Reshape's second."""
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opset)
        except Exception:
            return str(index)
        params = schema.inputs if is_input else schema.outputs
        if not params:
            return str(index)
        return params[min(index, len(params) - 1)].name

    def entry(self, node: Node, index: int) -> Entry:
        """The value of input ``index`` as it is: an SSA value or a not yet used constant."""
        if not node.has_input(index):
            raise NodeError(f"input '{self._label(node, index)}' is required")
        name = node.proto.input[index]
        if name not in self.env:
            raise NodeError(f"input '{name}' is not defined before the node")
        return self.env[name]

    def value(self, node: Node, index: int) -> SSAValue:
        """The SSA value of input ``index``."""
        return self.materialize(self.entry(node, index))

    def optional(self, node: Node, index: int) -> SSAValue | None:
        return self.value(node, index) if node.has_input(index) else None

    def static(self, node: Node, index: int) -> np.ndarray:
        """The array of an input that must be known at compile time: an initializer, a
        Constant node, or anything computed from those (shape arithmetic folds away)."""
        entry = self.entry(node, index)
        if isinstance(entry, Lazy):
            return entry.array
        if entry in self.known:
            return self.known[entry]
        raise self.not_constant(node, index)

    def not_constant(self, node: Node, index: int, why: str = "") -> NotConstantError:
        """The error for input ``index`` of ``node`` not being known at compile time, naming
        the graph inputs it is computed from."""
        entry = self.entry(node, index)
        assert isinstance(entry, SSAValue)
        inputs = self._graph_inputs_of(entry)
        if _is_graph_input(entry):
            source = f" (graph input '{inputs[0]}')"
        elif inputs:
            source = f" (computed from graph input {', '.join(repr(n) for n in inputs)})"
        else:
            source = ""
        label = self._label(node, index)
        return NotConstantError(f"input '{label}'{source} must be a constant{why}", inputs)

    def _graph_inputs_of(self, value: SSAValue) -> tuple[str, ...]:
        """The graph inputs ``value`` is computed from, in graph order."""
        seen: set[SSAValue] = set()
        stack = [value]
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if isinstance(v.owner, Operation):
                stack.extend(v.owner.operands)
        args = [v for v in seen if _is_graph_input(v)]
        return tuple(self.input_names[a.index] for a in sorted(args, key=lambda a: a.index))

    def known_value(self, node: Node, index: int) -> np.ndarray | None:
        """The compile-time array of an input, if it has one."""
        entry = self.entry(node, index)
        if isinstance(entry, Lazy):
            return entry.array
        return self.known.get(entry)

    def optional_static(self, node: Node, index: int) -> np.ndarray | None:
        return self.static(node, index) if node.has_input(index) else None

    def materialize(self, entry: Entry) -> SSAValue:
        if isinstance(entry, SSAValue):
            return entry
        if entry.value is None:
            entry.value = self._source(entry)
        return entry.value

    def _source(self, lazy: Lazy) -> SSAValue:
        array = lazy.array
        if array.dtype.name not in SUPPORTED_DTYPES:
            raise self.error(
                f"tensor '{lazy.name}' has unsupported dtype {array.dtype.name} "
                f"(supported: {', '.join(SUPPORTED_DTYPES)})"
            )
        if lazy.initializer and dtypes.is_float(array.dtype):
            # float initializers are the parameters; integer ones (shapes, indices) are data
            self.weights[lazy.name] = array
            self.used_initializers.add(lazy.name)
            ty = TensorType(wse.element_of_numpy(array.dtype), array.shape)
            return self.emit(wse.WeightOp(lazy.name, ty))
        return self.const(array, lazy.name, lazy.loc)

    def const(self, array: np.ndarray, name: str | None = None, at: NameLoc | None = None):
        """A value known at compile time: inline when small, else a frozen weight."""
        array = np.asarray(array)
        element = wse.element_of_numpy(array.dtype)
        if inlinable(array):
            op: Operation = wse.ConstantOp(dense(array, element))
        else:
            if name is None or name in self.weights:
                self.folded += 1
                name = f"{self.loc.desc.data}:{self.folded}"
            self.weights[name] = array
            op = wse.WeightOp(name, TensorType(element, array.shape), frozen=True)
        value = self._insert(op, at)[0]
        self.known[value] = array
        return value

    def _insert(self, op: Operation, at: NameLoc | None = None) -> list[SSAValue]:
        assert self.builder is not None
        op.location = at or self.loc
        op.verify()
        self.builder.insert(op)
        return list(op.results)

    def emit_all(self, op: Operation) -> list[SSAValue]:
        """Adds ``op`` to ``@main`` with the current node's location and returns its results;
        a primitive whose operands are all known at compile time is evaluated instead, so
        shape arithmetic leaves only constants behind."""
        arrays = [self.known.get(v) for v in op.operands]
        if op.operands and all(a is not None for a in arrays) and _foldable(op):
            op.verify()
            results = [(wse.tensor_shape(r), wse.numpy_dtype(wse.element_type(r)))
                       for r in op.results]  # fmt: skip
            values = reference.evaluate_all(
                wse.mnemonic(op), wse.properties_as_python(op), arrays, results
            )
            return [self.const(v) for v in values]
        return self._insert(op)

    def emit(self, op: Operation) -> SSAValue:
        """``emit_all`` for an op of one result."""
        return self.emit_all(op)[0]

    def constant(self, array: np.ndarray) -> SSAValue:
        """A compile-time constant."""
        return self.const(array)

    def scalar(self, value: float, like: SSAValue) -> SSAValue:
        """A rank-0 constant of ``like``'s element type."""
        dtype = wse.numpy_dtype(wse.element_type(like))
        return self.constant(np.array(value, dtype=dtype))


def _erase_unused(block) -> None:
    """Drops the pure ops whose results nothing uses (constants that folding left behind)."""
    for op in reversed(list(block.ops)):
        if op.has_trait(Pure) and not any(r.uses for r in op.results):
            op.detach()
            op.erase()


def _foldable(op: Operation) -> bool:
    """Whether the importer may evaluate ``op`` when its operands are known."""
    return op.name.startswith("wse.") and wse.mnemonic(op) in PRIMITIVES


NAMES_LISTED = 6
"""How many nodes of one unsupported op an error names before it counts the rest."""


def _node_list(names: list[str]) -> str:
    """``node a``, ``nodes a, b`` or ``nodes a, b, ... and 12 more``."""
    shown = ", ".join(names[:NAMES_LISTED])
    more = f" and {len(names) - NAMES_LISTED} more" if len(names) > NAMES_LISTED else ""
    return f"node{'s' if len(names) > 1 else ''} {shown}{more}"


def _is_graph_input(value: SSAValue) -> bool:
    return isinstance(value, BlockArgument)


def _symbolic(dim: onnx.TensorShapeProto.Dimension) -> bool:
    return not dim.HasField("dim_value") or dim.dim_value < 0


def _dim_label(dim: onnx.TensorShapeProto.Dimension) -> str:
    return dim.dim_param or "?"


def shape_of(value: SSAValue) -> tuple[int, ...]:
    return wse.tensor_shape(value)


# ---------------------------------------------------------------------------------------------
# The registry of op importers
# ---------------------------------------------------------------------------------------------

OpImporter = Callable[[Importer, Node], list]
"""``(importer, node) -> one entry per output`` (None for an output it does not produce)."""

OPS: dict[str, OpImporter] = {}
"""One importer per supported ONNX op type; the family modules fill it."""


def register(*op_types: str) -> Callable[[OpImporter], OpImporter]:
    """Registers an importer for ``op_types``."""

    def add(function: OpImporter) -> OpImporter:
        for op_type in op_types:
            if op_type in OPS:
                raise ValueError(f"two importers for {op_type}")
            OPS[op_type] = function
        return function

    return add
