"""The checks an ONNX model passes before cgc converts its nodes.

ONNX's checker rules, run piece by piece (``onnx.checker.check_node`` node by node) so that a
violation names its culprit, and the rules onnxruntime applies on loading that the checker
leaves out: every tensor has an ONNX element type, dims that are not negative and exactly the
data its dims ask for; every declared type is an ONNX element type; every node has the number
of inputs and outputs its schema allows, only the attributes its schema declares, each of the
declared kind; no name is written twice; and no tensor is so large that cgc could not hold it
(``oversize``). Then ONNX's strict shape inference (the rest of ``full_check``) runs over the
graph, without the data of its large initializers.

Each violation is a one-line ``CgcError`` naming the file and the node (name and op type), the
initializer or the graph input or output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from math import ceil, prod

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper
from onnx.onnx_cpp2py_export import checker as cpp_checker

from cgc.errors import CgcError
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.units import human_bytes

MAX_TENSOR_BYTES = 2**40
"""The largest tensor cgc accepts (1 TiB). Bigger than any single tensor a model streamed from
MemoryX has, and far beyond what the numpy simulator can hold: a bigger one is a broken file
or a typo in ``--shape``, refused before anything is allocated for it."""

ELEMENT_TYPES = frozenset(TensorProto.DataType.values()) - {TensorProto.UNDEFINED}
"""The element types of ONNX's ``TensorProto.DataType`` enum, UNDEFINED excepted."""

PACKED_BITS: dict[int, int] = {
    TensorProto.INT4: 4,
    TensorProto.UINT4: 4,
    TensorProto.FLOAT4E2M1: 4,
    TensorProto.INT2: 2,
    TensorProto.UINT2: 2,
}
"""Bits per element of the types that ONNX packs several to a byte (and to an ``int32_data``
entry); the 6-bit float types are packed in raw data only."""

SIX_BITS = {TensorProto.DataType.Value(n) for n in ("FLOAT6E2M3", "FLOAT6E3M2")}

VALUE_FIELDS = (
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
)
"""The typed fields a ``TensorProto`` may hold its values in, besides ``raw_data``."""

UNKNOWN_DIM = -1
"""The one negative dimension cgc reads in a declared shape: the legacy mark of a dimension
not known, as some exporters write it (onnxruntime reads it so too)."""

INLINE_FOR_INFERENCE = 4096
"""Initializers of at most this many bytes keep their data for shape inference (it reads
shapes and indices); bigger ones, the weights, go without it."""


SCHEMA_KINDS = {
    getattr(onnx.defs.OpSchema.AttrType, name): name
    for name, _ in AttributeProto.AttributeType.items()
    if hasattr(onnx.defs.OpSchema.AttrType, name)
}
"""The name of each attribute kind of an op schema, as ``AttributeProto`` names it."""


class ModelError(Exception):
    """A violation; ``validate`` prefixes the file name."""


def validate(model: onnx.ModelProto, source: str, opset: int) -> None:
    """Fails with a one-line ``CgcError`` at the first rule of the file's structure that
    ``model`` breaks: run before its nodes are converted."""
    try:
        check_ir_version(model)
        for tensor, where in stored_tensors(model.graph):
            check_tensor(tensor, where)
        check_value_infos(model.graph)
        check_nodes(model, opset)
        check_names(model.graph)
    except ModelError as e:
        raise CgcError(f"{source}: {e}") from None


def validate_shapes(model: onnx.ModelProto, source: str) -> None:
    """Fails with a one-line ``CgcError`` where ONNX's strict shape and type inference finds
    ``model`` inconsistent: run after its nodes are converted, so that cgc's own finding about
    a node, which tells more, comes first."""
    try:
        infer_shapes(model)
    except ModelError as e:
        raise CgcError(f"{source}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------------------------


def oversize(shape: Sequence[int], dtype: np.dtype | str) -> str | None:
    """Why a tensor of ``shape`` and ``dtype`` is too large for cgc, or None if it is not:
    e.g. ``[1000000, 1000000] float32 takes 3.6 TiB (4000000000000 bytes), more than ...``."""
    dtype = dtypes.dtype(dtype)
    size = prod(int(d) for d in shape) * dtype.itemsize  # Python ints: no overflow
    if size <= MAX_TENSOR_BYTES:
        return None
    return (
        f"{list(shape)} {dtype.name} takes {human_bytes(size)} ({size} bytes), over cgc's "
        f"{human_bytes(MAX_TENSOR_BYTES)} limit"
    )


def element_name(code: int) -> str:
    """The name of an ONNX element type code, or the code when it names none."""
    if code in ELEMENT_TYPES:
        return TensorProto.DataType.Name(code).lower()
    return "UNDEFINED" if code == TensorProto.UNDEFINED else str(code)


def _storage_dtype(code: int) -> np.dtype:
    """The numpy dtype ONNX reads elements of ``code`` as (one byte per packed element)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(code))


# ---------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------


def stored_tensors(graph: onnx.GraphProto) -> Iterator[tuple[TensorProto, str]]:
    """The tensors stored in the file, each with a phrase naming it: the initializers and the
    tensors of the nodes' attributes."""
    for tensor in graph.initializer:
        yield tensor, f"initializer '{tensor.name}'"
    for index, node in enumerate(graph.node):
        for attr in node.attribute:
            where = f"{node_label(node, index)}: attribute '{attr.name}'"
            if attr.HasField("t"):
                yield attr.t, where
            for tensor in attr.tensors:
                yield tensor, where
            if attr.HasField("sparse_tensor"):
                yield from _sparse_parts(attr.sparse_tensor, where)


def _sparse_parts(sparse: onnx.SparseTensorProto, where: str) -> Iterator[tuple[TensorProto, str]]:
    """The values and indices of a sparse tensor; its dense dims are checked as a tensor's."""
    dense = TensorProto(dims=sparse.dims, data_type=sparse.values.data_type)
    check_dims(dense, where)
    yield sparse.values, f"{where} (values)"
    yield sparse.indices, f"{where} (indices)"


def check_tensor(tensor: TensorProto, where: str) -> None:
    """An ONNX element type, dims that are not negative, a size cgc can hold, and exactly the
    data the dims ask for."""
    code = tensor.data_type
    if code not in ELEMENT_TYPES:
        raise ModelError(f"{where} has data type {element_name(code)}, not an ONNX element type")
    check_dims(tensor, where)
    if tensor.data_location == TensorProto.EXTERNAL:
        return  # its data is read from its file, then checked (``load_model``)
    check_data(tensor, where)


def check_dims(tensor: TensorProto, where: str) -> None:
    """Dims that are not negative, of a size cgc can hold."""
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise ModelError(f"{where} has negative dims {dims}")
    if tensor.data_type not in ELEMENT_TYPES:
        return
    if why := oversize(dims, _storage_dtype(tensor.data_type)):
        raise ModelError(f"{where}: {why}")


def check_data(tensor: TensorProto, where: str) -> None:
    """The data sits in one field, the one of its element type, with one entry per element
    (or per packed group of elements)."""
    code, count = tensor.data_type, prod(tensor.dims)
    fields = [f for f in VALUE_FIELDS if len(getattr(tensor, f))]
    if tensor.HasField("raw_data"):
        fields.insert(0, "raw_data")
    if len(fields) > 1:
        raise ModelError(f"{where} holds its values in both {fields[0]} and {fields[1]}")
    if not fields:
        if count:
            raise ModelError(f"{where} has dims {list(tensor.dims)} but no values")
        return
    field, typed = fields[0], helper.tensor_dtype_to_field(code)
    if field not in ("raw_data", typed) or (field == "raw_data" and code == TensorProto.STRING):
        raise ModelError(f"{where} holds {element_name(code)} values in {field}, not in {typed}")
    have = len(getattr(tensor, field))
    need = raw_length(code, count) if field == "raw_data" else field_length(code, count)
    if have != need:
        unit = "bytes" if field == "raw_data" else "entries"
        raise ModelError(
            f"{where} has {have} {unit} of {field}, but its dims {list(tensor.dims)} of "
            f"{element_name(code)} need {need}"
        )


def raw_length(code: int, count: int) -> int:
    """The bytes of ``count`` elements of type ``code`` in ``raw_data``."""
    bits = 6 if code in SIX_BITS else PACKED_BITS.get(code)
    return ceil(count * bits / 8) if bits else count * _storage_dtype(code).itemsize


def field_length(code: int, count: int) -> int:
    """The entries of ``count`` elements of type ``code`` in their typed field."""
    if code in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        return 2 * count  # real and imaginary parts
    return ceil(count * PACKED_BITS.get(code, 32) / 32) if code in PACKED_BITS else count


# ---------------------------------------------------------------------------------------------
# Declared types
# ---------------------------------------------------------------------------------------------


def check_value_infos(graph: onnx.GraphProto) -> None:
    """Every declared tensor type of the graph's inputs, outputs and values has an ONNX
    element type (UNDEFINED allowed but for inputs: cgc infers the others) and no negative
    dimension but the mark of an unknown one."""
    kinds = (("input", graph.input), ("output", graph.output), ("value_info", graph.value_info))
    for kind, infos in kinds:
        for vi in infos:
            if vi.type.HasField("tensor_type"):
                check_tensor_type(vi.type.tensor_type, f"{kind} '{vi.name}'", kind != "input")


def check_tensor_type(tt: onnx.TypeProto.Tensor, where: str, inferred: bool) -> None:
    """An element type from the enum (or UNDEFINED, if cgc infers it) and no dimension
    below -1."""
    allowed = ELEMENT_TYPES | {TensorProto.UNDEFINED} if inferred else ELEMENT_TYPES
    if tt.HasField("elem_type") and tt.elem_type not in allowed:
        raise ModelError(
            f"{where} has element type {element_name(tt.elem_type)}, not an ONNX element type"
        )
    dims = [d.dim_value for d in tt.shape.dim if d.HasField("dim_value")]
    if any(d < UNKNOWN_DIM for d in dims):
        raise ModelError(f"{where} has negative dims {dims}")


# ---------------------------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------------------------


def node_name(node: onnx.NodeProto, index: int) -> str:
    """A node's name, or ``OpType_index`` for a node without one (its IR location too)."""
    return node.name or f"{node.op_type}_{index}"


def node_label(node: onnx.NodeProto, index: int) -> str:
    """``node 'fc1' (Gemm)``: how errors name a node."""
    return f"node '{node_name(node, index)}' ({node.op_type})"


def check_ir_version(model: onnx.ModelProto) -> None:
    """An IR version this ONNX release reads (onnxruntime refuses a model without one)."""
    if not 1 <= model.ir_version <= onnx.IR_VERSION:
        raise ModelError(
            f"IR version {model.ir_version} is not supported (this onnx reads IR versions 1 "
            f"to {onnx.IR_VERSION})"
        )


def check_nodes(model: onnx.ModelProto, opset: int) -> None:
    """Each node against its schema at ``opset``, then its attributes against ONNX's checker
    (not the whole node: the op importers name a missing input or attribute better, and read
    some ops that ONNX has deprecated)."""
    ctx = cpp_checker.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    for index, node in enumerate(model.graph.node):
        label = node_label(node, index)
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        except onnx.defs.SchemaError:
            raise ModelError(f"{label}: {node.op_type} is not an op of opset {opset}") from None
        problem = arity_problem(node, schema) or attribute_problem(node, schema)
        if problem is None:
            problem = checker_problem(node, ctx)
        if problem is not None:
            raise ModelError(f"{label}: {problem}")


def arity_problem(node: onnx.NodeProto, schema: onnx.defs.OpSchema) -> str | None:
    """More inputs or outputs than the schema has. (A missing input is the op importer's to
    name; it reads some left out by older opsets, such as Gemm's C.)"""
    for what, count, high in (
        ("inputs", len(node.input), schema.max_input),
        ("outputs", len(node.output), schema.max_output),
    ):
        if count > high:
            return f"has {count} {what}; {node.op_type}-{schema.since_version} takes at most {high}"
    return None


def attribute_problem(node: onnx.NodeProto, schema: onnx.defs.OpSchema) -> str | None:
    """An attribute the schema does not declare, or of another kind than declared."""
    for attr in node.attribute:
        declared = schema.attributes.get(attr.name)
        if declared is None:
            known = ", ".join(sorted(schema.attributes))
            told = f"known: {known}" if known else f"{node.op_type} has no attributes"
            return f"unknown attribute '{attr.name}' ({told})"
        kinds = AttributeProto.AttributeType
        kind = kinds.Name(attr.type) if attr.type in kinds.values() else str(attr.type)
        want = SCHEMA_KINDS.get(declared.type, "?")
        if kind != want:
            return f"attribute '{attr.name}' is of kind {kind}, but {node.op_type} takes {want}"
    return None


def checker_problem(node: onnx.NodeProto, ctx: cpp_checker.CheckerContext) -> str | None:
    """The first line of what ONNX's checker says about an attribute of ``node``, if anything
    (e.g. a value in another field than its kind's)."""
    for attr in node.attribute:
        try:
            onnx.checker.check_attribute(attr, ctx)
        except onnx.checker.ValidationError as e:
            return f"attribute '{attr.name}': {short_reason(e, 200)}"
    return None


def check_names(graph: onnx.GraphProto) -> None:
    """Each name written once (static single assignment): no two initializers or graph inputs
    share one, and no node writes a graph input, an initializer or another node's output."""
    writers: dict[str, str] = {}
    for tensor in graph.initializer:
        _claim(writers, tensor.name, f"initializer '{tensor.name}'", f"initializer '{tensor.name}'")
    initializers = set(writers)
    for vi in graph.input:
        if vi.name not in initializers:  # an initializer may be listed as an input too
            _claim(writers, vi.name, f"input '{vi.name}'", f"input '{vi.name}'")
    for index, node in enumerate(graph.node):
        label = node_label(node, index)
        for name in node.output:
            if name:
                _claim(writers, name, f"{label}: output '{name}'", f"an output of {label}")


def _claim(writers: dict[str, str], name: str, what: str, writer: str) -> None:
    if name in writers:
        raise ModelError(f"{what} has the name of {writers[name]} (each name is assigned once)")
    writers[name] = writer


# ---------------------------------------------------------------------------------------------
# Shape inference
# ---------------------------------------------------------------------------------------------


UNSOUND_INFERENCE = (
    "existing shape differ",
    "existing elem type",
    "has unsupported type",
    "Inference error(s): (op_type:",
    "Ellipsis for input",
)
"""Findings of ONNX's strict inference that do not make a model invalid for cgc (nor, but
the last two, for onnxruntime): a declared shape or type that disagrees with the inferred one
(onnxruntime merges them leniently; cgc uses its own), a type that an op's schema leaves out
but cgc computes in (e.g. float16 Celu), an error inside the function body of an op that cgc
imports whole, and Einsum's ellipses of different ranks, which broadcast."""


def infer_shapes(model: onnx.ModelProto) -> None:
    """ONNX's strict shape inference over the graph (as ``full_check`` runs it), without the
    data of the large initializers (it reads shapes and indices only); of its findings, those
    in ``UNSOUND_INFERENCE`` are let pass."""
    try:
        onnx.shape_inference.infer_shapes(light_copy(model), strict_mode=True)
    except (onnx.shape_inference.InferenceError, ValueError) as e:
        # a ValueError: an element type code that names no type, found outside a node
        reason = inference_reason(e)
        if not any(phrase in reason for phrase in UNSOUND_INFERENCE):
            raise ModelError(reason) from None


def light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each initializer over ``INLINE_FOR_INFERENCE`` bytes replaced by its
    header (marked external, so that nothing reads its data)."""
    graph = onnx.GraphProto(name=model.graph.name)
    for field in ("node", "input", "output", "value_info"):
        getattr(graph, field).extend(getattr(model.graph, field))
    for tensor in model.graph.initializer:
        if tensor.ByteSize() <= INLINE_FOR_INFERENCE:
            graph.initializer.append(tensor)
            continue
        header = graph.initializer.add(name=tensor.name, dims=tensor.dims)
        header.data_type = tensor.data_type
        header.data_location = TensorProto.EXTERNAL
        header.external_data.add(key="location", value="(not read)")
    light = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    light.opset_import.extend(model.opset_import)
    return light


def inference_reason(error: Exception) -> str:
    """The node and reason of an inference error, e.g. ``node 'mm' (MatMul): Incompatible
    dimensions for matrix multiplication``."""
    text = short_reason(error, 200)
    _, _, rest = text.partition("(op_type:")
    op_type, _, rest = rest.partition(", node name: ")
    name, _, reason = rest.partition("): ")
    if not reason:
        return f"shape inference fails: {text.removeprefix('[ShapeInferenceError] ')}"
    reason = reason.split("] ", 1)[-1] if reason.startswith("[") else reason
    return f"node '{name or op_type}' ({op_type}): {reason.strip()} (ONNX shape inference)"


def short_reason(error: Exception, limit: int = 120) -> str:
    """The first line of an error's text, cut to ``limit`` characters."""
    text = str(error).strip().splitlines()
    reason = text[0] if text else type(error).__name__
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."
