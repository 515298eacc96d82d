"""The lowering of a ``torch.export`` program in core ATen to a ``func.func @main`` of ``wse``
ops, and the registry of op lowerings that the family modules fill.

``Lowering`` walks the FX graph in order. A placeholder is a parameter (a ``wse.weight`` named
by its ``state_dict`` key; tied parameters, one tensor under two keys, are one weight), a
buffer (a frozen ``wse.weight``: batch-norm statistics), a lifted constant, or a user input (a
block argument whose axis 0 is the batch when it was captured with a symbolic batch). A
``call_function`` node is lowered by the function registered for its ATen overload
(``aten.addmm.default``), which gets the node's arguments with every FX node replaced by what
it lowered to: an SSA value, a Python number (symbolic sizes evaluate to the batch given), or
a tuple of them. Each op carries the location of the module that ran it
(``transformer.h.0.attn.c_attn``), or of the node at the top level.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind, OutputSpec
from xdsl.dialects.builtin import TensorType
from xdsl.ir import SSAValue
from xdsl.utils.exceptions import VerifyException

from cgc.dialects import wse
from cgc.errors import CgcError, DataError
from cgc.frontends.builders import NodeError, cast, dtype_of, node_list
from cgc.frontends.emitter import DROPOUT_ADVICE, Emitter, loc, registrar
from cgc.frontends.formulas import running_average
from cgc.frontends.imported import BufferUpdate, ImportedModel, TensorSpec

Lowered = Any
"""What a node lowers to: an SSA value, a Python number, None, or a tuple of these."""

OpLowering = Callable[..., Lowered]
"""``f(lowering, *args, **kwargs)``: the node's arguments as lowered values."""

ATEN: dict[str, OpLowering] = {}
"""One lowering per supported ATen overload, by its name (``aten.addmm.default``)."""

SIZE_ARITHMETIC: dict[object, Callable[..., int]] = {
    operator.add: operator.add,
    operator.sub: operator.sub,
    operator.mul: operator.mul,
    operator.floordiv: operator.floordiv,
    operator.mod: operator.mod,
    operator.neg: operator.neg,
}
"""Python arithmetic on symbolic sizes that export leaves in the graph (``batch * 8``)."""

DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
"""The torch dtypes cgc runs, as numpy dtype names."""


register = registrar(ATEN, "lowerings")
"""``@register("aten.addmm.default")``: registers a lowering for ATen overloads."""


def numpy_dtype(dtype: torch.dtype) -> str:
    """The numpy name of a torch dtype cgc runs."""
    if dtype not in DTYPES:
        raise NodeError(f"dtype {str(dtype).removeprefix('torch.')} is not supported")
    return DTYPES[dtype]


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array of the same dtype (bfloat16 as ml_dtypes')."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return tensor.numpy().copy()


def op_name(node: torch.fx.Node) -> str:
    """The registry key of a ``call_function`` node's target."""
    return str(node.target)


class Lowering(Emitter):
    """Lowers one exported program at one batch size; ``training`` keeps the buffers the
    program updates (``BufferUpdate``), inference drops their new values as torch's module
    call does."""

    def __init__(
        self, program: ExportedProgram, batch: int | None, source: str, training: bool = False
    ):
        super().__init__()
        self.program = program
        self.batch = batch
        self.source = source
        self.training = training
        self.averages: dict[SSAValue, tuple[SSAValue, float]] = {}
        """A running average's new value -> the batch's value it folds in, and the momentum."""
        self.buffer_updates: list[BufferUpdate] = []
        self.env: dict[torch.fx.Node, Lowered] = {}
        self.node: torch.fx.Node | None = None
        """The node being lowered."""
        self.weight_names = _weight_names(program)
        self.initializers: list[str] = []

    def error(self, message: str) -> CgcError:
        return CgcError(f"{self.source}: {message}")

    # -- driver ---------------------------------------------------------------------------

    def run(self) -> ImportedModel:
        graph = self.program.graph
        self._check_ops(graph)
        inputs = self._input_specs(graph)
        module, fn = self.open_main(inputs)
        arguments = iter(fn.body.block.args)
        results: list[tuple[SSAValue, TensorSpec]] = []
        for node in graph.nodes:
            self.node = node
            self.loc = loc(_location(node))
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, arguments)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                results = self._outputs(node)
        self.close_main(fn, [value for value, _ in results])
        return ImportedModel(
            module=module,
            weights=self.weights,
            inputs=inputs,
            outputs=[spec for _, spec in results],
            initializers=self.initializers,
            opset=0,
            source=self.source,
            buffer_updates=self.buffer_updates,
        )

    def _check_ops(self, graph: torch.fx.Graph) -> None:
        """Fails with every unsupported op and its nodes, sorted by op."""
        problems: dict[str, list[str]] = {}
        for node in graph.nodes:
            if node.op != "call_function" or node.target in SIZE_ARITHMETIC:
                continue
            if node.target is not operator.getitem and op_name(node) not in ATEN:
                problems.setdefault(op_name(node), []).append(node.name)
        if problems:
            parts = [f"{op} ({node_list(names)})" for op, names in sorted(problems.items())]
            advice = f"; {DROPOUT_ADVICE}" if any("dropout" in op for op in problems) else ""
            raise self.error(f"unsupported ops: {', '.join(parts)}{advice}")

    # -- placeholders ---------------------------------------------------------------------

    def _input_specs(self, graph: torch.fx.Graph) -> list[TensorSpec]:
        """The user inputs, in order, at the batch given."""
        user = {s.arg.name for s in self.program.graph_signature.input_specs
                if s.kind == InputKind.USER_INPUT}  # fmt: skip
        specs = []
        for node in graph.nodes:
            if node.op != "placeholder" or node.name not in user:
                continue
            value = node.meta["val"]
            if not isinstance(value, torch.Tensor):
                raise self.error(f"input '{node.name}' is not a tensor ({type(value).__name__})")
            symbolic = _symbolic_batch(value)
            shape = [int(d) if isinstance(d, int) else 0 for d in value.shape]
            if symbolic:
                shape[0] = (
                    self.batch if self.batch is not None else (size_hint(value.shape[0]) or 1)
                )
            if any(not isinstance(d, int) for d in value.shape[1:]):
                raise self.error(f"input '{node.name}': only axis 0 (the batch) may be symbolic")
            try:
                dtype = numpy_dtype(value.dtype)
            except NodeError as e:
                raise self.error(f"input '{node.name}': {e}") from None
            specs.append(TensorSpec(node.name, tuple(shape), dtype, 0 if symbolic else None))
        return specs

    def _placeholder(self, node: torch.fx.Node, arguments) -> Lowered:
        spec = self._input_spec(node.name)
        if spec is None:
            return next(arguments)
        kind, target = spec
        self.loc = loc(target)
        if kind == InputKind.PARAMETER:
            name = self.weight_names[target]
            tensor = self.program.state_dict[target]
            return self._weight(name, tensor, frozen=False)
        if kind == InputKind.BUFFER:
            tensor = self.program.state_dict.get(target, self.program.constants.get(target))
            return self._weight(target, tensor, frozen=True)
        tensor = self.program.constants[target]
        return self.const(to_numpy(tensor), target)

    def _input_spec(self, name: str) -> tuple[InputKind, str] | None:
        """The kind and target of a placeholder that is not a user input."""
        for spec in self.program.graph_signature.input_specs:
            if spec.arg.name == name and spec.kind != InputKind.USER_INPUT:
                if spec.target is None:
                    raise self.error(f"input '{name}' ({spec.kind.name}) has no target")
                return spec.kind, spec.target
        return None

    def _weight(self, name: str, tensor: torch.Tensor, frozen: bool) -> SSAValue:
        """A parameter (trainable) or a buffer (frozen) as a ``wse.weight``, once per name."""
        array = to_numpy(tensor)
        if not np.issubdtype(array.dtype, np.floating) and array.dtype != ml_dtypes.bfloat16:
            return self.const(array, name)
        if name not in self.weights:
            self.weights[name] = array
            if not frozen:
                self.initializers.append(name)
        ty = TensorType(wse.element_of_numpy(array.dtype), array.shape)
        return self.emit(wse.WeightOp(name, ty, frozen=frozen))

    # -- nodes ----------------------------------------------------------------------------

    def _call(self, node: torch.fx.Node) -> Lowered:
        args = [self.lowered(a) for a in node.args]
        kwargs = {k: self.lowered(v) for k, v in node.kwargs.items()}
        if node.target in SIZE_ARITHMETIC:
            return SIZE_ARITHMETIC[node.target](*args)
        if node.target is operator.getitem:
            return args[0][args[1]]
        try:
            return ATEN[op_name(node)](self, *args, **kwargs)
        except (NodeError, VerifyException, TypeError, DataError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise self.error(f"node '{node.name}' ({op_name(node)}): {reason}") from None

    def lowered(self, arg: Any) -> Lowered:
        """An FX argument with its nodes replaced by their lowered values."""
        if isinstance(arg, torch.fx.Node):
            return self.env[arg]
        if isinstance(arg, list | tuple):
            return type(arg)(self.lowered(a) for a in arg)
        return arg

    # -- what op lowerings ask ------------------------------------------------------------

    def result_dtype(self, index: int = 0) -> str:
        """The numpy dtype name of the current node's result (``index``: of a tuple)."""
        assert self.node is not None
        value = self.node.meta["val"]
        if isinstance(value, list | tuple):
            value = value[index]
        return numpy_dtype(value.dtype)

    def tensor(self, value: SSAValue | float | bool, dtype: str | None = None) -> SSAValue:
        """``value`` as a tensor of ``dtype`` (default: the current node's result type): a
        tensor cast to it, a Python number as a rank-0 constant."""
        dtype = dtype or self.result_dtype()
        if isinstance(value, SSAValue):
            return cast(self, value, dtype)
        return self.constant(np.array(value, dtype=dtype))

    # -- outputs --------------------------------------------------------------------------

    def moving_average(self, running: SSAValue, batch: SSAValue, momentum: float) -> SSAValue:
        """``(1 - momentum) * running + momentum * batch``, the new value of a running
        statistic, remembered as folding ``batch`` in: a training step folds in each run's."""
        new = running_average(self, running, batch, 1 - momentum)
        self.averages[new] = (batch, momentum)
        return new

    # -- outputs --------------------------------------------------------------------------

    def _outputs(self, node: torch.fx.Node) -> list[tuple[SSAValue, TensorSpec]]:
        """The user outputs, then in training the batch values the buffer updates fold in."""
        specs = self.program.graph_signature.output_specs
        args = list(node.args[0])  # type: ignore[arg-type]  # the output node's tuple
        user = [
            (arg, spec)
            for arg, spec in zip(args, specs, strict=True)
            if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)
        ]
        results = []
        for i, (arg, _) in enumerate(user):
            value = self.lowered(arg)
            if not isinstance(value, SSAValue):
                raise self.error(f"output {i} is not a tensor ({type(value).__name__})")
            name = "output" if len(user) == 1 else f"output_{i}"
            results.append((value, _output_spec(name, arg, value)))
        for arg, spec in zip(args, specs, strict=True):
            if spec.kind == OutputKind.BUFFER_MUTATION:
                results += self._buffer_update(arg, spec)
            elif spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
                raise self.error(f"output '{spec.arg.name}' ({spec.kind.name}) is not supported")
        return results

    def _buffer_update(self, arg: Any, spec: OutputSpec) -> list[tuple[SSAValue, TensorSpec]]:
        """What updating buffer ``spec.target`` to ``arg`` takes: in training a running
        average's batch value as an output, or a counter; nothing in inference."""
        buffer = spec.target
        assert buffer is not None
        value = self.lowered(arg)
        if not self.training or _is_weight(value, buffer):
            return []
        if value in self.averages:
            batch, momentum = self.averages[value]
            self.buffer_updates.append(BufferUpdate(buffer, buffer, momentum))
            output = TensorSpec(buffer, wse.tensor_shape(batch), dtype_of(batch).name, None)
            return [(batch, output)]
        if _is_count(arg, buffer, self.program):
            self.weights[buffer] = to_numpy(self.program.state_dict[buffer])
            self.buffer_updates.append(BufferUpdate(buffer, None))
            return []
        raise self.error(
            f"the module updates buffer '{buffer}' as it trains in a way a training step "
            "cannot split over micro-batches and systems: only running averages (batch norm) "
            "and counters are supported"
        )


def _output_spec(name: str, arg: Any, value: SSAValue) -> TensorSpec:
    """The spec of a user output: batched when torch's value has a symbolic axis 0."""
    meta = arg.meta["val"] if isinstance(arg, torch.fx.Node) else None
    symbolic = isinstance(meta, torch.Tensor) and _symbolic_batch(meta)
    return TensorSpec(name, wse.tensor_shape(value), dtype_of(value).name, 0 if symbolic else None)


def _is_weight(value: Any, name: str) -> bool:
    """Whether ``value`` is the ``wse.weight`` named ``name`` (a buffer left as it was)."""
    owner = value.owner if isinstance(value, SSAValue) else None
    return isinstance(owner, wse.WeightOp) and owner.weight_name.data == name


def _is_count(arg: Any, buffer: str, program: ExportedProgram) -> bool:
    """Whether ``arg`` is ``buffer + 1`` (a counter such as ``num_batches_tracked``)."""
    if not isinstance(arg, torch.fx.Node) or str(arg.target) != "aten.add.Tensor":
        return False
    base, step = arg.args[0], arg.args[1]
    inputs = {s.arg.name: s.target for s in program.graph_signature.input_specs}
    return isinstance(base, torch.fx.Node) and inputs.get(base.name) == buffer and bool(step == 1)


def _weight_names(program: ExportedProgram) -> dict[str, str]:
    """The weight name of every parameter: its ``state_dict`` key, or for a tensor held under
    several keys (tied parameters), the first of them."""
    first: dict[int, str] = {}
    names = {}
    for key, tensor in program.state_dict.items():
        names[key] = first.setdefault(id(tensor), key)
    return names


def _location(node: torch.fx.Node) -> str:
    """The module path that ran ``node`` (``h.0.attn.c_attn``), else the node's name."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in reversed(list(stack.values())):
        if path and not path.startswith("_"):
            return str(path).removeprefix("L['self'].")
    return node.name


def _symbolic_batch(value: torch.Tensor) -> bool:
    """Whether axis 0 of a captured tensor is the symbolic batch."""
    return value.dim() > 0 and not isinstance(value.shape[0], int)


def size_hint(size: Any) -> int | None:
    """The example value of a symbolic size, if torch kept one."""
    return int(size.node.hint) if size.node.hint is not None else None
