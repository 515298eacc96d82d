"""The bytecode: a register program for one system, and its binary encoding.

A program is a list of instructions over numbered registers. Each register holds one tensor of
a fixed shape and dtype (the register table). ``LAYER`` switches the rectangle that the
following kernels run on; kernel instructions name a primitive of the WSE dialect; the rest
move data between the host, MemoryX, SwarmX and the wafer.

Binary layout, little-endian::

    "CGBC"  u16 version  u16 0  u32 table_bytes  u32 instruction_count
    table: JSON {"attrs": [...], "layers": [...], "locations": [...], "registers": [...]}
    instructions: u16 opcode, u16 result count, u16 operand count, u16 0,
                  u32 attrs index, u32 location index (0xFFFFFFFF: none),
                  u32 results..., u32 operands...
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from math import prod
from typing import Any

from cgc.machine.hardware import dtypes
from cgc.machine.sparse.tiles import SparseView, SparseWeight

MAGIC = b"CGBC"
VERSION = 2
NONE = 0xFFFFFFFF
_HEADER = struct.Struct("<4sHHII")
_INSTRUCTION = struct.Struct("<HHHHII")


class Opcode(IntEnum):
    """Instructions other than kernels."""

    LAYER = 1
    """Following kernels run on layer ``attrs["layer"]``'s rectangle."""
    INPUT = 2
    """Result: graph input ``attrs["index"]``, arriving from the host through the edge."""
    OUTPUT = 3
    """Operand: graph output ``attrs["index"]``, leaving for the host."""
    WEIGHT = 4
    """Result: weight ``attrs["name"]`` (viewed by ``attrs.get("perm")``), resident on the
    wafer since the program was loaded."""
    CONSTANT = 5
    """Result: the small constant ``attrs["value"]`` (a flat list), part of the program."""
    STREAM_WEIGHT = 6
    """Result: weight ``attrs["name"]`` streamed from MemoryX through SwarmX."""
    STREAM_GRADIENT = 7
    """Operand: the gradient of weight ``attrs["name"]``, streamed out and summed by SwarmX."""
    OPTIMIZER_STEP = 8
    """MemoryX applies ``attrs["optimizer"]`` with ``attrs["config"]``."""
    FREE = 9
    """Operands are dead: their SRAM is released."""
    CACHE = 10
    """Result: the key-value cache ``attrs["name"]`` of ``attrs["capacity"]`` tokens per
    sequence, kept on the wafer from one run to the next and shared by the programs of an
    artifact (generation's prefill and decode)."""


PRIMITIVES: tuple[str, ...] = (
    "neg", "exp", "log", "sqrt", "reciprocal", "abs", "relu", "sigmoid", "tanh", "erf",
    "add", "sub", "mul", "div", "pow", "max", "min", "greater", "equal", "select", "cast",
    "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "matmul", "max_pool", "avg_pool",
    "im2col", "reshape", "broadcast_to", "transpose", "concat", "slice", "pad", "one_hot",
    "sign", "floor", "ceil", "round", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "asinh", "acosh", "atanh", "not", "bitwise_not", "is_nan", "is_inf", "greater_equal", "mod",
    "fmod", "and", "or", "xor", "bitwise_and", "bitwise_or", "bitwise_xor", "shift_left",
    "shift_right", "reduce_prod", "argmax_pool", "gather", "gather_elements", "gather_nd",
    "scatter_elements", "scatter_nd", "cumsum", "topk", "reverse", "tile", "bitcast",
    "cumprod", "col2im", "attention", "attention_grad", "rotary",
    "matmul_transpose_a", "cached_attention", "fused_matmul",
)  # fmt: skip
"""Kernel mnemonics; a kernel's opcode is ``KERNEL_BASE`` plus its index. Append only."""
KERNEL_BASE = 64


def kernel_opcode(mnemonic: str) -> int:
    """The opcode of kernel ``mnemonic``."""
    return KERNEL_BASE + PRIMITIVES.index(mnemonic)


def opcode_name(opcode: int) -> str:
    """The mnemonic of any opcode, as the disassembler prints it."""
    if opcode >= KERNEL_BASE:
        return PRIMITIVES[opcode - KERNEL_BASE]
    return Opcode(opcode).name.lower()


NAMING_ATTRS = frozenset({"name", "layer", "index"})
"""Attributes of the non-kernel instructions that name things and do not change the cost."""


def canonical_json(value: Any) -> str:
    """One JSON text per value: keys sorted, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Instruction:
    """One instruction; ``attrs`` holds plain JSON values."""

    opcode: int
    results: tuple[int, ...] = ()
    operands: tuple[int, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict[str, Any], hash=False)
    location: str | None = None

    @property
    def name(self) -> str:
        """The mnemonic."""
        return opcode_name(self.opcode)

    @property
    def is_kernel(self) -> bool:
        """Whether the instruction runs a mesh kernel."""
        return self.opcode >= KERNEL_BASE


@dataclass(frozen=True)
class Route:
    """How one tensor reaches a layer from the layer ``source`` that computes it (pipelined
    mode; see ``wse.RouteAttr``)."""

    source: int
    color: int
    lanes: int
    wavelets: int
    """Wavelets per run of the per-system batch."""
    busiest: int
    """Wavelets per run on the busiest link the route uses, every route on it counted."""
    hops: int
    path: tuple[int, ...]
    """``x, y`` of the PEs where the first lane starts, turns and ends."""

    def to_json(self) -> list[int | list[int]]:
        """A JSON list that ``from_json`` reads back."""
        fields = (self.source, self.color, self.lanes, self.wavelets, self.busiest, self.hops)
        return [*fields, list(self.path)]

    @classmethod
    def from_json(cls, data: list[Any]) -> Route:
        """Inverse of ``to_json``."""
        source, color, lanes, wavelets, busiest, hops, path = data
        return cls(
            int(source), int(color), int(lanes), int(wavelets), int(busiest), int(hops),
            tuple(int(v) for v in path),
        )  # fmt: skip


GRADIENT_SUFFIX = ".grad"
"""A backward layer's name: its forward layer's name with this suffix (autodiff)."""
RECOMPUTED_SUFFIX = ".recompute"
"""A layer run again in the backward pass: its name with this suffix
(recompute-activations); its FLOPs are not the model's."""


@dataclass(frozen=True)
class LayerInfo:
    """A layer: its name, rectangle ``(x, y, w, h)``, the weights it uses and the routes of
    its inputs from other layers."""

    name: str
    rect: tuple[int, int, int, int]
    weights: tuple[str, ...] = ()
    routes: tuple[Route, ...] = ()


@dataclass
class Program:
    """A register program for one system."""

    instructions: list[Instruction]
    registers: list[tuple[tuple[int, ...], str]]
    """Shape and numpy dtype name of every register."""
    layers: list[LayerInfo]
    source: str | None = field(default=None, compare=False)
    """The artifact file the program was read from; None for one compiled in this process."""
    sparse: Mapping[str, SparseWeight] = field(default_factory=dict, compare=False)
    """The sparse weights by name (``cgc.machine.sparse.tiles``): what they stream and cost
    depends on their masks, which the manifest's sparsity record gives."""

    @cached_property
    def digest(self) -> str:
        """A name of this program's instructions: what a system that runs several programs
        (a generation's) keeps one program's pinned constants apart from another's by."""
        text = repr([(i.opcode, i.results, i.operands, i.attrs) for i in self.instructions])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @cached_property
    def layer_spans(self) -> list[range]:
        """The instruction indices of every layer, from its LAYER to the next one."""
        starts = [i for i, ins in enumerate(self.instructions) if ins.opcode == Opcode.LAYER]
        ends = [*starts[1:], len(self.instructions)] if starts else []
        return [range(a, b) for a, b in zip(starts, ends, strict=True)]

    @cached_property
    def layer_inputs(self) -> list[dict[int, int | None]]:
        """Per layer, the registers it reads that another layer defined, each mapped to that
        layer: the tensors that flow between layers (in pipelined mode, along routes). A
        register that nothing in the program defines (the program is one layer's work, see
        ``cgc.machine.timing.cost``) maps to None: it arrives from outside."""
        owner: dict[int, int] = {}
        inputs: list[dict[int, int | None]] = []
        for index, span in enumerate(self.layer_spans):
            reads: dict[int, int | None] = {}
            for position in span:
                ins = self.instructions[position]
                if ins.opcode == Opcode.FREE:
                    continue
                for register in ins.operands:
                    if owner.get(register) != index:
                        reads.setdefault(register, owner.get(register))
                for register in ins.results:
                    owner[register] = index
            inputs.append(dict(sorted(reads.items())))
        return inputs

    @cached_property
    def sparse_gradients(self) -> dict[int, SparseView]:
        """The registers that stream out as the gradient of a view of a sparse weight whose
        dense gradient MemoryX does not need: their kernel forms the live values only."""
        found = {}
        for ins in self.instructions:
            weight = self.sparse.get(ins.attrs.get("name", ""))
            if (
                ins.opcode == Opcode.STREAM_GRADIENT
                and weight is not None
                and not weight.dense_gradient
            ):
                perm = ins.attrs.get("perm")
                found[ins.operands[0]] = SparseView(weight, None if perm is None else tuple(perm))
        return found

    @cached_property
    def layer_signatures(self) -> list[tuple[object, ...]]:
        """Per layer, what its cost depends on: its instructions with registers renumbered in
        order of appearance, with their shapes, dtypes and attributes, names left out. Layers
        of equal signature cost the same on the same rectangle."""
        return [self._signature(span) for span in self.layer_spans]

    def _signature(self, span: range) -> tuple[object, ...]:
        numbering: dict[int, int] = {}
        parts: list[object] = []
        for position in span[1:]:
            ins = self.instructions[position]
            attrs = ins.attrs
            if not ins.is_kernel:
                weight = self.sparse.get(attrs.get("name", ""))
                attrs = {k: v for k, v in attrs.items() if k not in NAMING_ATTRS}
                if weight is not None:  # its mask, not its name, sets its cost
                    attrs["sparse"] = [weight.live, weight.seed, weight.digest]
            registers = tuple(
                (numbering.setdefault(r, len(numbering)), self.registers[r])
                for r in (*ins.operands, *ins.results)
            )
            parts.append((ins.opcode, len(ins.operands), registers, canonical_json(attrs)))
        return tuple(parts)

    @cached_property
    def compute_dtype(self) -> str:
        """The element type of the program's matmuls, what its peak FLOP rate is counted in;
        float32 for a program without any."""
        matmuls = {kernel_opcode("matmul"), kernel_opcode("fused_matmul")}
        for ins in self.instructions:
            if ins.opcode in matmuls:
                return self.registers[ins.results[0]][1]
        return "float32"

    def tensor_bytes(self, register: int) -> int:
        """The bytes of the tensor in ``register``."""
        shape, dtype = self.registers[register]
        return prod(shape) * dtypes.dtype(dtype).itemsize

    def activation_bytes(self, index: int) -> tuple[int, int]:
        """Bytes layer ``index`` reads from other layers, and bytes of its results that other
        layers read."""
        read = sum(self.tensor_bytes(r) for r in self.layer_inputs[index])
        sent = {r for reads in self.layer_inputs for r, source in reads.items() if source == index}
        return read, sum(self.tensor_bytes(r) for r in sent)

    def encode(self) -> bytes:
        """The binary form; equal programs give equal bytes."""
        attrs: dict[str, int] = {}
        locations: dict[str, int] = {}
        records = []
        for ins in self.instructions:
            a = attrs.setdefault(canonical_json(ins.attrs), len(attrs)) if ins.attrs else NONE
            loc = (
                NONE if ins.location is None else locations.setdefault(ins.location, len(locations))
            )
            records.append(
                _INSTRUCTION.pack(ins.opcode, len(ins.results), len(ins.operands), 0, a, loc)
                + struct.pack(
                    f"<{len(ins.results) + len(ins.operands)}I", *ins.results, *ins.operands
                )
            )
        table = {
            "attrs": [json.loads(k) for k in attrs],
            "layers": [
                {
                    "name": x.name,
                    "rect": list(x.rect),
                    "weights": list(x.weights),
                    "routes": [r.to_json() for r in x.routes],
                }
                for x in self.layers
            ],
            "locations": list(locations),
            "registers": [[list(shape), dtype] for shape, dtype in self.registers],
        }
        blob = canonical_json(table).encode()
        header = _HEADER.pack(MAGIC, VERSION, 0, len(blob), len(self.instructions))
        return header + blob + b"".join(records)

    @classmethod
    def decode(cls, data: bytes) -> Program:
        """Parses the binary form; raises ValueError on anything malformed."""
        try:
            return cls._decode(data)
        except (struct.error, IndexError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise ValueError(f"bytecode is malformed ({type(e).__name__}: {e})") from None

    @classmethod
    def _decode(cls, data: bytes) -> Program:
        if len(data) < _HEADER.size:
            raise ValueError("bytecode is truncated")
        magic, version, _, table_bytes, count = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ValueError("bytecode has a bad magic number")
        if version != VERSION:
            raise ValueError(f"bytecode version {version} is not supported (expected {VERSION})")
        pos = _HEADER.size + table_bytes
        table = json.loads(data[_HEADER.size : pos])
        registers = [(tuple(s), d) for s, d in table["registers"]]
        instructions = []
        for _ in range(count):
            opcode, nres, nops, _, a, loc = _INSTRUCTION.unpack_from(data, pos)
            pos += _INSTRUCTION.size
            regs = struct.unpack_from(f"<{nres + nops}I", data, pos)
            pos += 4 * (nres + nops)
            if any(r >= len(registers) for r in regs):
                raise ValueError("bytecode names a register that does not exist")
            instructions.append(
                Instruction(
                    opcode,
                    tuple(regs[:nres]),
                    tuple(regs[nres:]),
                    table["attrs"][a] if a != NONE else {},
                    table["locations"][loc] if loc != NONE else None,
                )
            )
        if pos != len(data):
            raise ValueError("bytecode has trailing bytes")
        layers = [
            LayerInfo(
                x["name"],
                tuple(x["rect"]),
                tuple(x["weights"]),
                tuple(Route.from_json(r) for r in x["routes"]),
            )
            for x in table["layers"]
        ]
        return cls(instructions, registers, layers)

    def disassemble(self) -> str:
        """A readable listing, one instruction per line."""
        lines = []
        for ins in self.instructions:
            if ins.opcode == Opcode.LAYER:
                layer = self.layers[ins.attrs["layer"]]
                x, y, w, h = layer.rect
                lines.append(f'layer {ins.attrs["layer"]} "{layer.name}" at x={x} y={y} {w}x{h}')
                continue
            lines.append("  " + self._format(ins))
        return "\n".join(lines) + "\n"

    def _format(self, ins: Instruction) -> str:
        lhs = ", ".join(f"%{r}" for r in ins.results)
        rhs = ", ".join(f"%{r}" for r in ins.operands)
        text = (f"{lhs} = " if lhs else "") + ins.name + (f" {rhs}" if rhs else "")
        shown = {k: v for k, v in ins.attrs.items() if k != "layer"}
        if shown:
            text += " " + canonical_json(shown)
        if ins.results:
            text += " : " + ", ".join(_type_text(*self.registers[r]) for r in ins.results)
        if ins.location:
            text += f'  loc("{ins.location}")'
        return text


def _type_text(shape: tuple[int, ...], dtype: str) -> str:
    return "x".join([*map(str, shape), dtype])
