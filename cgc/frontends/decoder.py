"""Decoders brought as graphs (ONNX files, PyTorch modules through ``torch.export``), made
into a generation's programs.

A causal language model exported without its cache (``use_cache=False``: cgc keeps the keys
and values itself) takes token ids ``[batch, sequence]`` and gives logits ``[batch,
sequence, vocab]``, both axes symbolic. A PyTorch module is captured at each program's
shapes, called with its ids and positions by their names (``cgc.frontends.torch.causal``).
An ONNX graph's positions are an input (``position_ids``, as a model exported with them
takes), or else the row the graph builds from ``Range(0, S)``
and unsqueezes (``cache_position.unsqueeze(0)``, transformers' default position ids), which
becomes the input ``position_ids``; an attention mask input is held at ones (the positions
say which keys each query sees). Anything else among the inputs (``past_key_values``) is
refused, named.

``GraphDecoder.program`` imports the graph at the shapes of one program of a generation
(``cgc.frontends.transformer.Generation``) and gives it the interface of the params-file
frontend's programs: ``input_ids`` and the positions ``[B, tokens]`` (marked
``wse.every_layer``), for the prompts' program ``last`` ``[B]``, and ``logits`` ``[B, V]``
(the prompts' program's at each sequence's ``last`` row). Its attention gets its caches in
the compile (``cache-keys-values``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FunctionType,
    UnitAttr,
)
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from cgc.dialects import wse
from cgc.dialects.ir import main_function
from cgc.dialects.lowering import EVERY_LAYER
from cgc.errors import CgcError
from cgc.frontends.imported import ImportedModel, TensorSpec
from cgc.frontends.onnx import import_model
from cgc.frontends.onnx.model import load_model
from cgc.frontends.transformer import Generation

POSITIONS_INPUT = "position_ids"
"""The input a graph's implied positions become."""


@dataclass(frozen=True)
class DecoderInputs:
    """Which graph inputs are the token ids, their positions and the masks held at ones."""

    ids: str
    positions: str
    masks: tuple[str, ...]


@dataclass(frozen=True)
class GraphDecoder:
    """A decoder graph (see the module's doc) and what one probe of it found: its
    vocabulary, the positions its learned position table has (None: rotary, unbounded), and
    the width of its residual stream."""

    source: str
    vocab_size: int
    positions: int | None
    width: int
    dtype: str
    importer: Callable[[int, int], ImportedModel] = field(compare=False, repr=False)
    """The graph imported for ``batch`` sequences of ``tokens``."""

    @classmethod
    def from_onnx(cls, path: str | os.PathLike) -> GraphDecoder:
        """The decoder of an ``.onnx`` file with its weights; a CgcError naming the file and
        the input or output that is not a decoder's."""
        source = os.path.basename(os.fspath(path))
        model, inputs = with_positions(load_model(Path(path), source), source)
        importer = functools.partial(_imported, model, inputs, source)
        try:
            probe = importer(1, 1)
        except CgcError as e:
            if type(e) is not CgcError:
                raise
            # most often a length the exporter wrote into the graph
            raise CgcError(f"{e} (importing the decoder for one token: is its sequence axis "
                           "symbolic?)") from None  # fmt: skip
        return cls.probed(source, importer, probe)

    @classmethod
    def probed(
        cls,
        source: str,
        importer: Callable[[int, int], ImportedModel],
        probe: ImportedModel | None = None,
    ) -> GraphDecoder:
        """The decoder ``importer`` imports, as its ``probe`` of one token (imported if not
        given) finds it."""
        probe = importer(1, 1) if probe is None else probe
        fn = main_function(probe.module)
        outputs = probe.outputs
        if len(outputs) < 1 or len(outputs[0].shape) != 3 or outputs[0].shape[:2] != (1, 1):
            shape = list(outputs[0].shape) if outputs else None
            raise CgcError(
                f"{source}: a decoder's first output is logits [batch, sequence, vocab], "
                f"got {shape} for one token"
            )
        ids = fn.body.block.args[0]
        width = _embedding_width(ids, source)
        return cls(source, outputs[0].shape[2], _position_rows(fn), width, outputs[0].dtype,
                   importer)  # fmt: skip

    def program(self, batch: int, generation: Generation) -> ImportedModel:
        """The graph as one program of a generation of ``batch`` sequences."""
        return _generation_interface(self.importer(batch, generation.tokens), generation)


def with_positions(model: onnx.ModelProto, source: str) -> tuple[onnx.ModelProto, DecoderInputs]:
    """``model`` with its tokens' positions an input (made one if the graph builds them), and
    its inputs' roles; a CgcError naming an input that has none."""
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    if not names:
        raise CgcError(f"{source}: a decoder takes token ids; the graph has no input")
    ids = "input_ids" if "input_ids" in names else names[0]
    positions = position_names(names, ids)
    masks = tuple(n for n in names if "mask" in n)
    for name in names:
        if name != ids and name not in positions and name not in masks:
            raise CgcError(
                f"{source}: input '{name}' is neither the token ids, their positions nor an "
                "attention mask; export the decoder without its cache (use_cache=False): "
                "cgc keeps the keys and values itself"
            )
    if len(positions) > 1:
        raise CgcError(f"{source}: inputs {positions} both look like positions")
    if positions:
        return model, DecoderInputs(ids, positions[0], masks)
    return _positions_made_input(model, source), DecoderInputs(ids, POSITIONS_INPUT, masks)


def position_names(names: list[str], ids: str) -> list[str]:
    """Those of ``names`` that give the tokens' positions: ``position_ids``, else any other
    that names positions but a cache's (transformers' ``cache_position`` counts the cache's
    rows, one row of positions for every sequence)."""
    if POSITIONS_INPUT in names:
        return [POSITIONS_INPUT]
    return [n for n in names if "position" in n and "cache" not in n and n != ids]


def _positions_made_input(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """``model`` with the positions it builds an input ``[batch, sequence]``: the row it
    makes of ``Range(0, S, 1)`` by ``Unsqueeze(axes=[0])`` (transformers'
    ``cache_position.unsqueeze(0)``), else by ``Expand`` (``arange(S).expand_as(ids)``)."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    known = _constant_values(graph)

    def from_range(node: onnx.NodeProto) -> bool:
        made = producer.get(node.input[0])
        if made is None or made.op_type != "Range":
            return False
        start, step = known.get(made.input[0]), known.get(made.input[2])
        if start is None or step is None or start.dtype.kind != "i":
            return False
        return start.item() == 0 and step.item() == 1

    def rows(node: onnx.NodeProto) -> bool:
        axes = known.get(node.input[1]) if len(node.input) > 1 else _axes_attribute(node)
        return axes is not None and list(np.ravel(axes)) == [0]

    unsqueezed = [n for n in graph.node if n.op_type == "Unsqueeze" and from_range(n) and rows(n)]
    expanded = [n for n in graph.node if n.op_type == "Expand" and from_range(n)]
    found = unsqueezed or expanded
    if len(found) != 1:
        why = "neither an input nor built from a Range" if not found else "built more than once"
        raise CgcError(f"{source}: the decoder's positions are {why} over the sequence; "
                       "export it with position_ids as an input")  # fmt: skip
    made = found[0]
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    kept = [n for n in edited.graph.node if n.output[:] != made.output[:]]
    del edited.graph.node[:]
    edited.graph.node.extend(kept)
    edited.graph.input.append(
        helper.make_tensor_value_info(
            POSITIONS_INPUT, onnx.TensorProto.INT64, ["batch", "sequence"]
        )
    )
    _rename_uses(edited.graph, made.output[0], POSITIONS_INPUT)
    return edited


def _constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The values of ``graph``'s initializers and ``Constant`` nodes, by name."""
    known = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1:
            value = helper.get_attribute_value(node.attribute[0])
            if isinstance(value, onnx.TensorProto):
                known[node.output[0]] = numpy_helper.to_array(value)
            elif isinstance(value, int | float | list):
                known[node.output[0]] = np.asarray(value)
    return known


def _axes_attribute(node: onnx.NodeProto) -> np.ndarray | None:
    for attribute in node.attribute:
        if attribute.name == "axes":
            return np.array(attribute.ints)
    return None


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new


def _imported(
    model: onnx.ModelProto, inputs: DecoderInputs, source: str, batch: int, tokens: int
) -> ImportedModel:
    """The graph imported for ``batch`` sequences of ``tokens``, its masks at ones."""
    shape = (batch, tokens)
    shapes = {inputs.ids: shape, inputs.positions: shape}
    values: dict[str, np.ndarray] = {
        name: np.ones(shape, _mask_dtype(model, name)) for name in inputs.masks
    }
    return import_model(model, shapes=shapes, source=source, values=values)


def _mask_dtype(model: onnx.ModelProto, name: str) -> np.dtype:
    given = next(i for i in model.graph.input if i.name == name)
    return helper.tensor_dtype_to_np_dtype(given.type.tensor_type.elem_type)


def _embedding_width(ids: SSAValue, source: str) -> int:
    """The width of the rows the token ids gather."""
    table = _gathered_table(ids)
    if table is None:
        raise CgcError(f"{source}: the token ids are not gathered from an embedding table")
    return wse.tensor_shape(table)[-1]


def _position_rows(fn: func.FuncOp) -> int | None:
    """The rows of the weight the positions gather (a learned position table), if any."""
    table = _gathered_table(fn.body.block.args[1])
    return None if table is None else wse.tensor_shape(table)[0]


def _gathered_table(index: SSAValue) -> SSAValue | None:
    """The weight whose rows ``index`` (reshaped or cast at most) gathers, if any."""
    pending = [index]
    while pending:
        value = pending.pop()
        for use in value.uses:
            op = use.operation
            if isinstance(op, wse.GatherOp) and use.index == 1:
                if isinstance(op.operands[0].owner, wse.WeightOp):
                    return op.operands[0]
            elif isinstance(op, wse.ReshapeOp | wse.CastOp):
                pending.append(op.results[0])
    return None


def _generation_interface(imported: ImportedModel, generation: Generation) -> ImportedModel:
    """``imported`` with the interface of a generation's program: the positions marked
    ``EVERY_LAYER``, for the prompts ``last`` ``[B]`` and the logits at it, else the
    logits of each sequence's token."""
    fn = main_function(imported.module)
    block = fn.body.block
    names = [spec.name for spec in imported.inputs]
    if len(names) != 2 or "position" in names[0]:
        raise CgcError(f"{imported.source}: a decoder takes its token ids, then their "
                       f"positions; its inputs are {names}")  # fmt: skip
    ids, positions = imported.inputs
    batch, tokens = ids.shape
    inputs = [ids, positions]
    returned = block.last_op
    assert isinstance(returned, func.ReturnOp)
    logits = returned.operands[0]
    vocab = wse.tensor_shape(logits)[-1]
    if wse.tensor_shape(logits) != (batch, tokens, vocab):
        raise CgcError(f"{imported.source}: a decoder's logits are [batch, sequence, vocab], "
                       f"got {list(wse.tensor_shape(logits))} for {batch} x {tokens} "
                       "tokens")  # fmt: skip
    rows = wse.ReshapeOp(logits, (batch * tokens, vocab))
    picked: list[Operation] = [rows]
    if generation.prefill:
        last = TensorSpec("last", (batch,), ids.dtype, 0)
        inputs.append(last)
        at = block.insert_arg(last.tensor_type, len(block.args))
        picked.append(wse.GatherOp(rows.result, at, 0))
    Rewriter.insert_op(picked, InsertPoint.before(returned))
    producer = logits.owner
    for op in picked:
        op.location = producer.location if isinstance(producer, Operation) else returned.location
    returned.operands = (picked[-1].results[0],)
    marks = [DictionaryAttr({EVERY_LAYER: UnitAttr()} if arg is block.args[1] else {})
             for arg in block.args]  # fmt: skip
    fn.arg_attrs = ArrayAttr(marks)
    fn.function_type = FunctionType.from_lists([a.type for a in block.args],
                                               [picked[-1].results[0].type])  # fmt: skip
    outputs = [TensorSpec(imported.outputs[0].name, (batch, vocab), imported.outputs[0].dtype, 0)]
    return dataclasses.replace(imported, inputs=inputs, outputs=outputs, tokens_per_sample=tokens)
