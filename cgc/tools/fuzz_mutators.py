"""The fuzzer's mutators: what breaks its seeds (``fuzz_seeds``), one kind per door.

- ONNX models, structurally (inputs, outputs, attributes, dims, element types, raw data,
  opsets, external data, edges) and at the byte level of the serialized proto, or validly
  (attributes retuned, unary ops swapped, the batch changed);
- params files (a value replaced, a key dropped or duplicated, a junk line);
- plain bytes (flips, truncation, splices, duplicated ranges), used by every door, and by the
  artifact mutators (``fuzz_artifacts``) on the sections they re-checksum.

Every mutator takes a ``random.Random`` and returns a one-line description of what it did:
a case's description is the reproducer's summary.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mutate_params(text: str, rng: random.Random) -> tuple[str, str]:
    """A params file with one value replaced, one key dropped or duplicated, or junk added."""
    lines = text.splitlines()
    valued = [i for i, line in enumerate(lines) if line.startswith("  ")]
    i = rng.choice(valued)
    key = lines[i].split(":")[0]
    choice = rng.randrange(4)
    if choice == 0:
        value = rng.choice(["0", "-1", "1.5", "true", "''", "[]", "{}", "99999999999999999999",
                            "1e400", ".nan", "abc", "null"])  # fmt: skip
        lines[i] = f"{key}: {value}"
        what = f"params {key.strip()} = {value}"
    elif choice == 1:
        del lines[i]
        what = f"params without {key.strip()}"
    elif choice == 2:
        lines.insert(i, lines[i])
        what = f"params with {key.strip()} twice"
    else:
        lines.insert(
            i, rng.choice(["  bogus_key: 1", "\t: :", "  - [", "*alias", "!!python/int 3"])
        )
        what = "params with a junk line"
    return "\n".join(lines) + "\n", what


# ------------------------------------------------------------------------------- bytes


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """``data`` with bits flipped, cut short, a range duplicated, zeroed or spliced in."""
    if not data:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16))), "junk for empty"
    out = bytearray(data)
    choice = rng.randrange(6)
    at = rng.randrange(len(out))
    if choice == 0:
        flips = rng.randint(1, 8)
        for _ in range(flips):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out), f"{flips} bit flips"
    if choice == 1:
        return bytes(out[:at]), f"truncated to {at} of {len(out)} bytes"
    end = min(len(out), at + rng.randint(1, 64))
    if choice == 2:
        return bytes(out[:end] + out[at:]), f"bytes {at}:{end} duplicated"
    if choice == 3:
        out[at:end] = bytes(end - at)
        return bytes(out), f"bytes {at}:{end} zeroed"
    if choice == 4:
        src = rng.randrange(len(out))
        out[at:end] = data[src : src + end - at]
        return bytes(out), f"bytes {src}.. spliced over {at}:{end}"
    junk = bytes(rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)]) for _ in range(end - at))
    return bytes(out[:at] + junk + out[at:]), f"{end - at} junk bytes inserted at {at}"


# ------------------------------------------------------------------------------- ONNX

HUGE = [0, -1, -7, 1 << 31, 99999999999, 1 << 62]
ELEM_TYPES = [0, 99, -3, TensorProto.INT64, TensorProto.FLOAT16, TensorProto.DOUBLE,
              TensorProto.BOOL, TensorProto.STRING, TensorProto.BFLOAT16, TensorProto.INT8,
              TensorProto.COMPLEX64, TensorProto.FLOAT8E4M3FN, TensorProto.UINT64]  # fmt: skip
Mutator = Callable[[onnx.ModelProto, random.Random], str]


def _pick(rng: random.Random, items: Any) -> Any:
    if not len(items):
        raise LookupError("nothing to pick")
    return items[rng.randrange(len(items))]


def _tensors(model: onnx.ModelProto) -> list[str]:
    names = [v.name for v in model.graph.input] + [i.name for i in model.graph.initializer]
    return names + [o for n in model.graph.node for o in n.output]


def _io_list(model: onnx.ModelProto, rng: random.Random) -> tuple[str, Any]:
    side = rng.choice(["input", "output"])
    return side, getattr(model.graph, side)


def drop_io(model: onnx.ModelProto, rng: random.Random) -> str:
    side, values = _io_list(model, rng)
    i = rng.randrange(len(values))
    name = values[i].name
    del values[i]
    return f"graph {side} '{name}' dropped"


def duplicate_io(model: onnx.ModelProto, rng: random.Random) -> str:
    side, values = _io_list(model, rng)
    value = _pick(rng, values)
    values.append(copy.deepcopy(value))
    return f"graph {side} '{value.name}' listed twice"


def rename_io(model: onnx.ModelProto, rng: random.Random) -> str:
    side, values = _io_list(model, rng)
    value = _pick(rng, values)
    new = rng.choice(["", "ghost", value.name + "\n", "x" * 300, "../etc", "w1", "y", "é/ü"])
    old, value.name = value.name, new
    return f"graph {side} '{old}' renamed {new[:20]!r}"


def change_dim(model: onnx.ModelProto, rng: random.Random) -> str:
    if rng.random() < 0.3 and model.graph.initializer:
        init = _pick(rng, model.graph.initializer)
        if init.dims:
            k = rng.randrange(len(init.dims))
            init.dims[k] = rng.choice(HUGE)
            return f"initializer '{init.name}' dim {k} = {init.dims[k]}"
    side, values = _io_list(model, rng)
    value = _pick(rng, values)
    dims = value.type.tensor_type.shape.dim
    if not dims or rng.random() < 0.1:
        value.type.tensor_type.ClearField("shape")
        return f"graph {side} '{value.name}' without a shape"
    k = rng.randrange(len(dims))
    if rng.random() < 0.25:
        dims[k].dim_param = rng.choice(["N", "", "batch"])
        return f"graph {side} '{value.name}' dim {k} = '{dims[k].dim_param}'"
    dims[k].dim_value = rng.choice(HUGE)
    return f"graph {side} '{value.name}' dim {k} = {dims[k].dim_value}"


def change_elem_type(model: onnx.ModelProto, rng: random.Random) -> str:
    elem = rng.choice(ELEM_TYPES)
    if rng.random() < 0.4 and model.graph.initializer:
        init = _pick(rng, model.graph.initializer)
        init.data_type = elem
        return f"initializer '{init.name}' data_type = {elem}"
    side, values = _io_list(model, rng)
    value = _pick(rng, values)
    value.type.tensor_type.elem_type = elem
    return f"graph {side} '{value.name}' elem_type = {elem}"


def corrupt_raw_data(model: onnx.ModelProto, rng: random.Random) -> str:
    init = _pick(rng, model.graph.initializer)
    raw = init.raw_data
    choice = rng.randrange(3)
    if choice == 0:
        cut = rng.randrange(len(raw) + 1)
        init.raw_data = raw[:cut]
        return f"initializer '{init.name}' raw_data cut to {cut} of {len(raw)} bytes"
    if choice == 1:
        init.raw_data = raw + bytes(rng.randint(1, 9))
        return f"initializer '{init.name}' raw_data lengthened"
    init.ClearField("raw_data")
    init.float_data.extend([1.0, 2.0])
    return f"initializer '{init.name}' with 2 float_data values instead of raw_data"


def _attributed(model: onnx.ModelProto, rng: random.Random) -> onnx.NodeProto:
    nodes = [n for n in model.graph.node if n.attribute] or list(model.graph.node)
    return _pick(rng, nodes)


def change_attribute(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _attributed(model, rng)
    if not node.attribute:
        return add_unknown_attribute(model, rng)
    attr = _pick(rng, node.attribute)
    if attr.type == onnx.AttributeProto.INT:
        attr.i = rng.choice([-1, 0, 1, 2, 3, 5, -(1 << 31), 1 << 40, 1 << 62])
        value: Any = attr.i
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e38])
        value = attr.f
    elif attr.type == onnx.AttributeProto.INTS:
        new = rng.choice([[], [0], [-1, -1], [1 << 40, 1], [3, 3, 3, 3, 3, 3], [0, 0, 0, 0]])
        del attr.ints[:]
        attr.ints.extend(new)
        value = new
    else:
        attr.s = b"bogus"
        value = "bogus"
    return f"node '{node.name}' attribute {attr.name} = {value}"


def change_attribute_kind(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _attributed(model, rng)
    if not node.attribute:
        return add_unknown_attribute(model, rng)
    i = rng.randrange(len(node.attribute))
    name = node.attribute[i].name
    value = rng.choice(["text", 1.5, [1.0, 2.0], ["a", "b"], 3, [1, 2, 3],
                        numpy_helper.from_array(np.zeros(2, np.float32))])  # fmt: skip
    node.attribute[i].CopyFrom(helper.make_attribute(name, value))
    return f"node '{node.name}' attribute {name} of another kind ({type(value).__name__})"


def add_unknown_attribute(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _pick(rng, model.graph.node)
    node.attribute.append(helper.make_attribute(rng.choice(["bogus", "axis", "alpha"]), 7))
    return f"node '{node.name}' gets attribute {node.attribute[-1].name}=7"


def extra_node_input(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _pick(rng, model.graph.node)
    extra = rng.choice(["", "nowhere", *_tensors(model)])
    node.input.append(extra)
    return f"node '{node.name}' gets an extra input '{extra}'"


def drop_node_input(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _pick(rng, model.graph.node)
    if not node.input:
        return extra_node_input(model, rng)
    i = rng.randrange(len(node.input))
    name = node.input[i]
    del node.input[i]
    return f"node '{node.name}' loses input '{name}'"


def duplicate_node_output(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _pick(rng, model.graph.node)
    other = rng.choice([*_tensors(model), ""])
    if rng.random() < 0.5:
        node.output.append(other)
        return f"node '{node.name}' gets a second output '{other}'"
    node.output[0] = other
    return f"node '{node.name}' writes '{other}'"


def cycle_edge(model: onnx.ModelProto, rng: random.Random) -> str:
    nodes = model.graph.node
    i = rng.randrange(len(nodes))
    j = rng.randrange(i, len(nodes))
    if not nodes[i].input:
        return extra_node_input(model, rng)
    k = rng.randrange(len(nodes[i].input))
    nodes[i].input[k] = nodes[j].output[0]
    return f"node '{nodes[i].name}' input {k} = output of '{nodes[j].name}' (a cycle)"


def change_op(model: onnx.ModelProto, rng: random.Random) -> str:
    node = _pick(rng, model.graph.node)
    old = node.op_type
    if rng.random() < 0.2:
        node.domain = rng.choice(["com.example", "ai.onnx.ml", "com.microsoft"])
        return f"node '{node.name}' in domain {node.domain}"
    node.op_type = rng.choice(["Sigmoid", "Tanh", "Identity", "FooBar", "", "Conv", "MatMul",
                               "Softmax", "Gather", "Loop", "Reshape", "Transpose"])  # fmt: skip
    return f"node '{node.name}' {old} -> {node.op_type or 'empty op type'}"


def drop_or_duplicate_node(model: onnx.ModelProto, rng: random.Random) -> str:
    nodes = model.graph.node
    i = rng.randrange(len(nodes))
    name = nodes[i].name
    if rng.random() < 0.5:
        del nodes[i]
        return f"node '{name}' dropped"
    nodes.append(copy.deepcopy(nodes[i]))
    return f"node '{name}' duplicated"


def change_opset(model: onnx.ModelProto, rng: random.Random) -> str:
    choice = rng.randrange(4)
    if choice == 0:
        del model.opset_import[:]
        return "no opset import"
    if choice == 1:
        model.opset_import.append(helper.make_opsetid("", 13))
        return "default opset imported twice"
    if choice == 2:
        model.ir_version = rng.choice([0, 1, 3, 99, -1])
        return f"ir_version {model.ir_version}"
    version = rng.choice([0, 1, 6, 7, 11, 13, 21, 25, 999, -1])
    model.opset_import[0].version = version
    return f"opset {version}"


def external_data(model: onnx.ModelProto, rng: random.Random) -> str:
    init = _pick(rng, model.graph.initializer)
    size = len(init.raw_data)
    init.ClearField("raw_data")
    init.data_location = TensorProto.EXTERNAL
    location = rng.choice(["w.bin", "w.bin", "missing.bin", "../w.bin", "/etc/hostname",
                           "/proc/self/status", "", "sub"])  # fmt: skip
    offset = rng.choice([0, 0, 3, -1, size * 2, 1 << 40])
    length = rng.choice([size, size, 0, size - 1, size + 4, -5, 1 << 40])
    entries = {"location": location, "offset": str(offset), "length": str(length)}
    if rng.random() < 0.2:
        entries = {"location": location, "offset": "abc", "checksum": "x"}
    for key, value in entries.items():
        entry = init.external_data.add()
        entry.key, entry.value = key, value
    return f"initializer '{init.name}' external: {entries}"


ONNX_MUTATORS: list[Mutator] = [
    drop_io, duplicate_io, rename_io, change_dim, change_elem_type, corrupt_raw_data,
    change_attribute, change_attribute_kind, add_unknown_attribute, extra_node_input,
    drop_node_input, duplicate_node_output, cycle_edge, change_op, drop_or_duplicate_node,
    change_opset, external_data,
]  # fmt: skip


def mutate_model(model: onnx.ModelProto, rng: random.Random) -> tuple[bytes, str]:
    """Serialized bytes of a mutated copy of ``model``: one to three structural mutations,
    and, one time in four, a byte-level one on top."""
    mutant = copy.deepcopy(model)
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        mutator = rng.choice(ONNX_MUTATORS)
        try:
            done.append(mutator(mutant, rng))
        except (LookupError, ValueError, TypeError) as e:  # nothing of that kind left
            done.append(f"{mutator.__name__} skipped ({type(e).__name__})")
    data = mutant.SerializeToString()
    if rng.random() < 0.25:
        data, what = mutate_bytes(data, rng)
        done.append(f"proto: {what}")
    return data, "; ".join(done)


PLAUSIBLE: dict[tuple[str, str], list[Any]] = {
    ("Softmax", "axis"): [-1, 0, 1, -2],
    ("Gemm", "alpha"): [0.5, 2.0, -1.0],
    ("Gemm", "beta"): [0.0, 0.5, 3.0],
    ("Gemm", "transA"): [0, 1],
    ("LayerNormalization", "epsilon"): [1e-3, 1.0, 0.0],
    ("LayerNormalization", "axis"): [-1, -2, 1, 0],
    ("Conv", "strides"): [[2, 2], [1, 2], [3, 3]],
    ("Conv", "dilations"): [[2, 2], [1, 1]],
    ("Conv", "pads"): [[0, 0, 0, 0], [2, 2, 2, 2], [1, 0, 1, 0]],
    ("MaxPool", "kernel_shape"): [[3, 3], [1, 1], [2, 1]],
    ("MaxPool", "strides"): [[1, 1], [2, 1]],
    ("Concat", "axis"): [0, 1, -1, -3],
    ("Gather", "axis"): [0, 1, -1],
    ("Flatten", "axis"): [0, 2, -1],
}
"""Attribute values an op accepts, so that a mutant stays a valid model (checked numerically)."""

UNARY = ["Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Elu", "LeakyRelu", "Softplus", "Erf", "Sqrt",
         "Identity", "Relu", "Floor", "Sign", "Reciprocal"]  # fmt: skip


def retune_attribute(model: onnx.ModelProto, rng: random.Random) -> str:
    """A plausible new value of an attribute the op knows."""
    options = [(n, key) for n in model.graph.node for key in PLAUSIBLE if key[0] == n.op_type]
    node, key = _pick(rng, options)
    value = rng.choice(PLAUSIBLE[key])
    kept = [a for a in node.attribute if a.name != key[1]]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(key[1], value)])
    return f"node '{node.name}' {key[1]} = {value}"


def swap_unary(model: onnx.ModelProto, rng: random.Random) -> str:
    """Another elementwise function in place of a unary one, or one added after an output."""
    unary = [n for n in model.graph.node if n.op_type in UNARY]
    if unary and rng.random() < 0.6:
        node = _pick(rng, unary)
        old, node.op_type = node.op_type, rng.choice(UNARY)
        return f"node '{node.name}' {old} -> {node.op_type}"
    out = _pick(rng, model.graph.output)
    op = rng.choice(UNARY)
    for node in model.graph.node:
        node.output[:] = [o + "_pre" if o == out.name else o for o in node.output]
        node.input[:] = [i + "_pre" if i == out.name else i for i in node.input]
    model.graph.node.append(helper.make_node(op, [out.name + "_pre"], [out.name], name="extra"))
    return f"{op} appended to output '{out.name}'"


def set_batch(model: onnx.ModelProto, rng: random.Random) -> str:
    """A new leading dim for every graph input and output."""
    batch = rng.choice([1, 3, 4, 7])
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_value = batch
    return f"batch {batch}"


VALID_MUTATORS: list[Mutator] = [retune_attribute, swap_unary, set_batch]


def mutate_model_valid(model: onnx.ModelProto, rng: random.Random) -> tuple[bytes, str]:
    """A mutant that is likely still a valid model (then cgc's numbers are checked): plausible
    attribute values, other elementwise functions, another batch; output shapes are left to
    inference."""
    mutant = copy.deepcopy(model)
    done = []
    for _ in range(rng.choice([1, 1, 2])):
        mutator = rng.choice(VALID_MUTATORS)
        try:
            done.append(mutator(mutant, rng))
        except LookupError:
            done.append(f"{mutator.__name__} skipped")
    for value in mutant.graph.output:
        value.type.tensor_type.ClearField("shape")
    return mutant.SerializeToString(), "; ".join(done) + " (output shapes inferred)"
