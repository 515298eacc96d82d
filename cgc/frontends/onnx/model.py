"""The ONNX model as cgc reads it: the opsets and element types it supports (and the reader of
element-type attributes), the reading of a file with its external data, and the graph's
interface.

``ModelInterface`` is the part of the ``Importer`` that checks the model's opset and binds the
graph's interface before the nodes are converted: the initializers and the values fixed at
compile time become ``Lazy`` constants, the inputs get their element types and shapes (a
symbolic batch dimension bound by ``batch_size``, whole shapes given by ``shapes``); after, the
outputs get theirs. Each input and output is described by a ``TensorSpec`` of the
``ImportedModel``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.errors import CgcError
from cgc.files import special_kind
from cgc.frontends.imported import TensorSpec
from cgc.frontends.onnx.nodes import Entry, Lazy, bad_attr
from cgc.frontends.onnx.validation import element_name, oversize, short_reason
from cgc.machine.hardware import dtypes

MIN_OPSET = 1
MAX_OPSET = onnx.defs.onnx_opset_version()

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


def dtype_attribute(name: str, code: int, allowed: Sequence[str] | None = None) -> np.dtype:
    """The dtype that the element-type attribute ``name`` (an ONNX ``TensorProto`` code)
    names, one of ``allowed`` (default: any type cgc supports)."""
    dtype = ONNX_DTYPES.get(int(code))
    if dtype is None or (allowed is not None and dtype not in allowed):
        label = TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else code
        expected = "a type cgc supports" if allowed is None else "one of " + ", ".join(allowed)
        raise bad_attr(name, label, f" (expected {expected})")
    return dtypes.dtype(dtype)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_model(path: Path, source: str, no_weights: bool = False) -> onnx.ModelProto:
    """Reads an ONNX file and the external data of its tensors; with ``no_weights``, not the
    external data of its float initializers (the weights), which may then be absent."""
    if not path.is_file():
        kind = special_kind(path)
        raise CgcError(f"{source}: {'no such file' if kind is None else f'is {kind}'}")
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as e:
        raise CgcError(f"{source}: not a valid ONNX model ({short_reason(e)})") from None
    if not model.HasField("graph"):
        raise CgcError(f"{source}: not a valid ONNX model (no graph)")
    base = path.parent
    external = [tensor for tensor in _stored_tensors(model) if uses_external_data(tensor)]
    places = [(tensor, external_place(tensor, source)) for tensor in external]
    for tensor, place in places:
        if not (no_weights and _is_weight(tensor)):
            _check_external_file(tensor, place, base, source)
    try:
        for tensor, _ in places:
            if not (no_weights and _is_weight(tensor)):
                load_external_data_for_tensor(tensor, os.fspath(base))
    except Exception as e:
        raise CgcError(
            f"{source}: not a valid ONNX model (external data: {short_reason(e)})"
        ) from None
    return model


@dataclass(frozen=True)
class ExternalPlace:
    """Where a tensor's external data is: ``length`` bytes (None: to the end of the file)
    from ``offset`` of the file at ``location``, relative to the model's directory."""

    location: str
    offset: int
    length: int | None


def external_place(tensor: TensorProto, source: str) -> ExternalPlace:
    """The place of ``tensor``'s external data, checked: a relative location that stays in
    the model's directory, and an offset and length that are whole numbers, not negative."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    what = f"{source}: external data of tensor '{tensor.name}'"
    location = entries.get("location", "")
    path = PurePosixPath(location.replace("\\", "/"))
    if not location or path.is_absolute() or ".." in path.parts:
        raise CgcError(
            f"{what}: location '{location}' is not a relative path inside the model's directory"
        )
    numbers = {}
    for key in ("offset", "length"):
        text = entries.get(key)
        if text is None:
            continue
        if not text.strip().isdigit():
            raise CgcError(f"{what}: {key} '{text}' is not a whole number of bytes, 0 or more")
        numbers[key] = int(text)
    return ExternalPlace(location, numbers.get("offset", 0), numbers.get("length"))


def _check_external_file(
    tensor: TensorProto, place: ExternalPlace, base: Path, source: str
) -> None:
    """The file of ``tensor``'s external data is there and holds the bytes ``place`` names."""
    file = base / place.location
    if not file.is_file():
        hint = " (--no-weights compiles the graph without them)" if _is_weight(tensor) else ""
        raise CgcError(
            f"{source}: external data file '{place.location}' of tensor '{tensor.name}' is "
            f"missing{hint}"
        )
    if not file.resolve().is_relative_to(base.resolve()):  # a link that leads out
        raise CgcError(
            f"{source}: external data file '{place.location}' of tensor '{tensor.name}' is "
            "outside the model's directory"
        )
    size = file.stat().st_size
    if place.offset + (place.length or 0) > size:
        raise CgcError(
            f"{source}: external data file '{place.location}' of tensor '{tensor.name}' has "
            f"{size} bytes, fewer than offset {place.offset} + length {place.length or 0}"
        )


def _is_weight(tensor: TensorProto) -> bool:
    """Whether an initializer holds floats: a parameter, not data such as a shape."""
    name = ONNX_DTYPES.get(tensor.data_type)
    return name is not None and dtypes.is_float(name)


SMALL_ELEMENTS = 64
"""Float initializers of at most this many elements are read even without weights: scalars
and the like, which an exporter lifts out of the graph (attention's scale, a mask's fill)."""


def _small(tensor: TensorProto) -> bool:
    """Whether ``tensor``'s data is small and in the file itself."""
    return math.prod(tensor.dims) <= SMALL_ELEMENTS and not uses_external_data(tensor)


def declared_array(tensor: TensorProto) -> np.ndarray:
    """A stand-in of ``tensor``'s shape and type that takes no memory (its values unknown)."""
    dtype = dtypes.dtype(ONNX_DTYPES[tensor.data_type])
    return np.broadcast_to(np.zeros((), dtype), tuple(tensor.dims))


def _stored_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    """The initializers and the tensors of the top-level nodes' attributes."""
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                tensors.append(attr.t)
            tensors.extend(attr.tensors)
    return tensors


# ---------------------------------------------------------------------------------------------
# The graph's interface
# ---------------------------------------------------------------------------------------------


class ModelInterface:
    """The checks of the model and the binding of its initializers, inputs and outputs; the
    ``Importer`` sets the attributes."""

    model: onnx.ModelProto
    graph: onnx.GraphProto
    source: str
    batch_size: int | None
    shapes: dict[str, Sequence[int]]
    values: dict[str, np.ndarray]
    env: dict[str, Entry]
    no_weights: bool

    def error(self, message: str, *fields: str) -> CgcError:
        """The error of ``message`` about this model, naming the options ``fields``."""
        return CgcError(f"{self.source}: {message}", *fields)

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

    def _dtype(self, elem_type: int, what: str) -> str:
        if elem_type in ONNX_DTYPES:
            return ONNX_DTYPES[elem_type]
        name = element_name(elem_type).lower()
        raise self.error(
            f"{what} has unsupported dtype {name} (supported: {', '.join(SUPPORTED_DTYPES)})"
        )

    def _load_initializers(self) -> list[str]:
        if len(self.graph.sparse_initializer):
            raise self.error(
                f"sparse initializer '{self.graph.sparse_initializer[0].values.name}' "
                "is not supported"
            )
        names = []
        for tensor in self.graph.initializer:
            names.append(tensor.name)
            if self.no_weights and _is_weight(tensor) and not _small(tensor):
                lazy = Lazy(declared_array(tensor), tensor.name, True, declared=True)
                self.env[tensor.name] = lazy
                continue
            if uses_external_data(tensor):
                raise self.error(
                    f"initializer '{tensor.name}' keeps its data in an external file; "
                    "import the model from its file"
                )
            self.env[tensor.name] = Lazy(numpy_helper.to_array(tensor), tensor.name, True)
        return names

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
        for spec in specs:
            if why := oversize(spec.shape, spec.dtype):
                raise self.error(f"input '{spec.name}' of {why}")
        self._check_static_batch(specs)
        return specs

    def _input_spec(self, vi: onnx.ValueInfoProto) -> TensorSpec:
        name = vi.name
        if not vi.type.HasField("tensor_type"):
            raise self.error(f"input '{name}' is not a tensor")
        tt = vi.type.tensor_type
        dtype = self._dtype(tt.elem_type, f"input '{name}'")
        dims = list(tt.shape.dim) if tt.HasField("shape") else None
        batched = bool(dims and _symbolic(dims[0]))
        if name in self.shapes:
            return TensorSpec(name, self._override(name, dims), dtype, 0 if batched else None)
        if dims is None:
            raise self.error(
                f"input '{name}' has no declared shape; pass shapes {name}=D0xD1...", "shapes"
            )
        shape = []
        for axis, dim in enumerate(dims):
            if not _symbolic(dim):
                shape.append(dim.dim_value)
            elif axis > 0:
                raise self.error(
                    f"input '{name}' has symbolic dimension '{_dim_label(dim)}' at axis {axis}; "
                    f"pass shapes {name}=D0xD1...",
                    "shapes",
                )
            elif self.batch_size is None:
                raise self.error(
                    f"input '{name}' has a symbolic batch dimension '{_dim_label(dim)}'; "
                    "pass batch_size",
                    "batch_size",
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
        batched = bool(dims and _symbolic(dims[0]))
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
                    f"each system runs {self.batch_size} samples (batch_size over "
                    "num_csx); export the model with a dynamic batch dimension",
                    "batch_size",
                    "num_csx",
                )

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


def _symbolic(dim: onnx.TensorShapeProto.Dimension) -> bool:
    return not dim.HasField("dim_value") or dim.dim_value < 0


def _dim_label(dim: onnx.TensorShapeProto.Dimension) -> str:
    return dim.dim_param or "?"
