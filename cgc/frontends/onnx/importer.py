"""The ONNX frontend: an ONNX model to a ``func.func @main`` of ``wse`` ops.

``import_onnx("model.onnx", batch_size=8)`` reads the file (and its external data), binds the
symbolic batch dimension of the inputs, and builds the IR with xDSL builders: one block
argument per graph input, ``wse.weight`` ops for the initializers (their arrays go to the side
store ``ImportedModel.weights``), ``wse.constant`` ops for small constants, and one or a few
``wse`` ops per node, each carrying the node's name as its location (``loc("fc1")``).

Every problem the user can cause is a one-line ``CgcError`` that starts with the file name and
names the culprit: the input, the tensor, or the node and its op.

This module holds the ``Importer`` (the conversion loop, the values known at compile time and
their folding) and the registry of op importers; ``model`` reads the file and binds the
graph's interface, ``nodes`` holds what op importers read and raise about a node.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeGuard

import numpy as np
import onnx
from xdsl.dialects.builtin import (
    TensorType,
)
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from cgc.dialects import wse
from cgc.errors import DataError, NeedsInputValuesError
from cgc.frontends.builders import NodeError, node_list
from cgc.frontends.emitter import Emitter, loc, registrar
from cgc.frontends.imported import ImportedModel
from cgc.frontends.onnx.model import SUPPORTED_DTYPES, ModelInterface, load_model
from cgc.frontends.onnx.nodes import (
    Entry,
    Lazy,
    Node,
    NotConstantError,
    attribute_value,
    check_size,
)
from cgc.frontends.onnx.validation import node_name, short_reason, validate, validate_shapes
from cgc.machine.hardware import dtypes
from cgc.machine.program.artifact import WeightSpec


def import_onnx(
    path: str | os.PathLike,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    values: Mapping[str, np.ndarray] | None = None,
    no_weights: bool = False,
) -> ImportedModel:
    """Reads an ``.onnx`` file (with its external data: with ``no_weights``, without that of
    the float initializers, which may be absent) and imports it."""
    source = os.path.basename(os.fspath(path))
    model = load_model(Path(path), source, no_weights)
    return import_model(model, batch_size, shapes, source, values, no_weights)


def import_model(
    model: onnx.ModelProto,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    source: str = "<model>",
    values: Mapping[str, np.ndarray] | None = None,
    no_weights: bool = False,
) -> ImportedModel:
    """Imports an in-memory ONNX model.

    ``batch_size`` binds the symbolic axis 0 of the inputs; ``shapes`` gives whole input shapes
    by input name and wins over the declared ones; ``values`` fixes graph inputs to arrays
    known at compile time, as if they were initializers (for inputs that decide shapes, such
    as a Reshape's target shape fed at run time): they leave the compiled model's inputs.
    With ``no_weights`` the float initializers of more than ``SMALL_ELEMENTS`` are declared by
    shape and type, without their data (``ImportedModel.declared``).
    """
    return Importer(
        model, source, batch_size, dict(shapes or {}), dict(values or {}), no_weights
    ).run()


# ---------------------------------------------------------------------------------------------
# The importer
# ---------------------------------------------------------------------------------------------


class Importer(Emitter, ModelInterface):
    def __init__(
        self,
        model: onnx.ModelProto,
        source: str,
        batch_size: int | None,
        shapes: dict[str, Sequence[int]],
        values: dict[str, np.ndarray] | None = None,
        no_weights: bool = False,
    ):
        super().__init__()
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
        self.declared: dict[str, WeightSpec] = {}
        self.no_weights = no_weights
        self.used_initializers: set[str] = set()
        self.used = {name for node in self.graph.node for name in node.input if name}
        self.used |= {vi.name for vi in self.graph.output}

    # -- driver ---------------------------------------------------------------------------

    def run(self) -> ImportedModel:
        self.opset = self._check_opset()
        self._check_ops()
        validate(self.model, self.source, self.opset)
        initializer_names = self._load_initializers()
        self._bind_values(set(initializer_names))
        inputs = self._input_specs(initializer_names)
        module, fn = self.open_main(inputs)
        self.input_names = [spec.name for spec in inputs]
        for spec, arg in zip(inputs, fn.body.block.args, strict=True):
            self.env[spec.name] = arg
        for index, node in enumerate(self.graph.node):
            self._import_node(index, node)
        results = [self._output_value(vi.name) for vi in self.graph.output]
        validate_shapes(self.model, self.source)
        self.close_main(fn, results)
        return ImportedModel(
            module=module,
            weights=self.weights,
            inputs=inputs,
            outputs=self._output_specs(inputs, results),
            initializers=[n for n in initializer_names if n in self.used_initializers],
            opset=self.opset,
            source=self.source,
            declared=self.declared,
        )

    def _check_ops(self) -> None:
        """Fails with every unsupported op type and its nodes, sorted by op type."""
        problems: dict[str, list[str]] = {}
        for index, node in enumerate(self.graph.node):
            default = node.domain in ("", "ai.onnx")
            if default and node.op_type in OPS:
                continue
            key = node.op_type if default else f"{node.domain}.{node.op_type}"
            problems.setdefault(key, []).append(node_name(node, index))
        if problems:
            parts = [f"{op} ({node_list(names)})" for op, names in sorted(problems.items())]
            raise self.error(f"unsupported ops: {', '.join(parts)}")

    def _output_value(self, name: str) -> SSAValue:
        if name not in self.env:
            raise self.error(f"output '{name}' is not produced by any node")
        self.loc = loc(name)
        return self.materialize(self.env[name])

    # -- nodes ----------------------------------------------------------------------------

    def _import_node(self, index: int, proto: onnx.NodeProto) -> None:
        name = node_name(proto, index)
        node = Node(proto, name, {a.name: attribute_value(a) for a in proto.attribute})
        self.loc = loc(name)
        try:
            results = OPS[proto.op_type](self, node)
            for i, out in enumerate(proto.output):
                if not out:
                    continue
                if i < len(results) and results[i] is not None:
                    self.env[out] = results[i]
                    if isinstance(results[i], Lazy):  # a value op results are checked as emitted
                        array = results[i].array
                        check_size(f"output '{out}'", array.shape, array.dtype)
                elif out in self.used:
                    raise NodeError(f"output '{self._label(node, i, False)}' is not supported")
        except NotConstantError as e:
            message = f"{self.source}: node '{name}' ({proto.op_type}): {short_reason(e)}"
            raise NeedsInputValuesError(message, e.inputs) from None
        except (NodeError, VerifyException, DataError) as e:  # DataError: in known values
            raise self.error(f"node '{name}' ({proto.op_type}): {short_reason(e)}") from None

    def emit_all(self, op: Operation) -> list[SSAValue]:
        """``Emitter.emit_all``, once no result of ``op`` is too large to hold: before a folded
        result is computed, or a run-time one planned."""
        for index, result in enumerate(op.results):
            if isinstance(result.type, TensorType):
                dtype = wse.numpy_dtype(wse.element_type(result))
                check_size(f"result {index} of {op.name}", wse.tensor_shape(result), dtype)
        return super().emit_all(op)

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
            if entry.declared:
                raise NodeError(
                    f"input '{self._label(node, index)}' must be known at compile time, but "
                    f"initializer '{entry.name}' was read without its data (--no-weights)"
                )
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
            return None if entry.declared else entry.array
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
            if lazy.declared:
                self.declared[lazy.name] = WeightSpec.of(array)
            else:
                self.weights[lazy.name] = array
            self.used_initializers.add(lazy.name)
            ty = TensorType(wse.element_of_numpy(array.dtype), array.shape)
            return self.emit(wse.WeightOp(lazy.name, ty))
        return self.const(array, lazy.name, lazy.loc)


def _is_graph_input(value: SSAValue) -> TypeGuard[BlockArgument]:
    return isinstance(value, BlockArgument)


# ---------------------------------------------------------------------------------------------
# The registry of op importers
# ---------------------------------------------------------------------------------------------

OpImporter = Callable[[Importer, Node], list]
"""``(importer, node) -> one entry per output`` (None for an output it does not produce)."""

OPS: dict[str, OpImporter] = {}
"""One importer per supported ONNX op type; the family modules fill it."""


register = registrar(OPS, "importers")
"""``@register("Gemm")``: registers an importer for ONNX op types."""
