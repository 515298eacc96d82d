"""The compiled artifact: one file holding everything a run needs.

Layout, little-endian::

    b"CGCARTF\\0"  u32 format version  u32 section count
    section table: per section, name (16 bytes, NUL padded), u64 offset, u64 length,
                   SHA-256 of the payload (32 bytes)
    payloads, in table order
 Sections: ``manifest`` (JSON), ``bytecode`` (``cgc.machine.program.bytecode``), ``ir`` (the final
MLIR text) and ``weights`` (safetensors), each once, the payloads back to back up to the end of the
file; a generation's artifact adds its decode step's program (``decode``) and final IR
(``decode_ir``), which share the weights and the key-value caches of the prompts' program (the
artifact's own), their manifest entries under ``generation``. Reading checks the magic, the
version, the section table and every checksum before decoding anything; then the manifest
against its schema (``cgc.machine.program.manifest``), every instruction of the programs, and
the weights against what the manifest names. A file that a compiler would not
have written is a CgcError naming the file and the culprit; reading never executes code from the
file.

A weight may be *declared* instead of stored: its name, shape and dtype, without data (a model
compiled from a params file, or an ONNX graph compiled with ``--no-weights``). The manifest
lists them (``declared_weights``); such an artifact runs timing-only, and a run with numbers
is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from cgc.errors import CgcError
from cgc.files import special_kind, write_atomically
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target, checked
from cgc.machine.program.bytecode import (
    KERNEL_BASE,
    PRIMITIVES,
    Instruction,
    Opcode,
    Program,
    opcode_name,
)
from cgc.machine.program.manifest import DTYPES, Schema, check_manifest, parse_json, shown, validate
from cgc.machine.program.mode import Mode
from cgc.machine.sparse.tiles import SparseWeight, sparse_weights
from cgc.machine.training import optimizers

MAGIC = b"CGCARTF\0"
FORMAT_VERSION = 3
SECTIONS = ("manifest", "bytecode", "ir", "weights")
GENERATION_SECTIONS = ("decode", "decode_ir")
"""The sections a generation's artifact adds (both, or neither)."""
_HEADER = struct.Struct("<8sII")
_ENTRY = struct.Struct("<16sQQ32s")


class ArtifactError(CgcError):
    """An artifact file that cannot be read: missing, truncated, corrupted or of another
    format version."""


def _json_bytes(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, indent=1).encode()


@dataclass(frozen=True)
class WeightSpec:
    """A weight known by its shape and element type only."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        """Elements."""
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of its data."""
        return self.size * dtypes.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        """``{"shape": [...], "dtype": name}``."""
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def of(cls, array: np.ndarray) -> WeightSpec:
        """The spec of an array."""
        return cls(tuple(array.shape), dtypes.name(array.dtype))


DECLARED = "declared_weights"
"""The manifest's key for the weights an artifact declares without data."""


@dataclass
class Artifact:
    """A compiled program with its manifest, final IR and weights.

    ``ir`` is the final IR's text, or a function that prints it: printing the IR of a large
    model costs as much as a pass, so a compile that is only simulated never does it.
    """

    manifest: dict[str, Any]
    program: Program
    ir_text: str | Callable[[], str]
    weights: dict[str, np.ndarray]
    decode: Program | None = None
    """A generation's decode step (the artifact's own program is its prompts')."""
    decode_ir: str = ""

    @property
    def ir(self) -> str:
        """The final IR."""
        if callable(self.ir_text):
            self.ir_text = self.ir_text()
        return self.ir_text

    @property
    def declared(self) -> dict[str, WeightSpec]:
        """The weights the artifact declares without data, by name."""
        listed = self.manifest.get(DECLARED) or {}
        return {
            name: WeightSpec(tuple(spec["shape"]), spec["dtype"]) for name, spec in listed.items()
        }

    @property
    def weight_specs(self) -> dict[str, WeightSpec]:
        """Every weight's shape and dtype, stored or declared, by name (sorted)."""
        specs = {name: WeightSpec.of(array) for name, array in self.weights.items()}
        return dict(sorted({**specs, **self.declared}.items()))

    def sparse_weights(self) -> dict[str, SparseWeight]:
        """The sparse weights of the manifest's sparsity record, their masks from the seed or
        the stored values (``cgc.machine.sparse.tiles``)."""
        shapes = {name: spec.shape for name, spec in self.weight_specs.items()}
        return sparse_weights(self.manifest.get("sparsity"), shapes, self.weights)

    def require_weights(self, source: str) -> None:
        """Raises a CgcError if some weight has no data (a run with numbers needs them all)."""
        missing = sorted(self.declared)
        if missing:
            shown = ", ".join(f"'{n}'" for n in missing[:3])
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise CgcError(
                f"{source} declares {len(missing)} weights without data ({shown}{more}): it was "
                "compiled from a params file or with --no-weights, so it runs only timing-only "
                "(--timing-only)"
            )

    @property
    def mode(self) -> Mode:
        """How the program runs (``pipelined`` or ``weight_streaming``)."""
        return Mode(self.manifest["mode"])

    def to_bytes(self) -> bytes:
        """The file contents; equal artifacts give equal bytes."""
        payloads = {
            "manifest": _json_bytes(self.manifest),
            "bytecode": self.program.encode(),
            "ir": self.ir.encode(),
            "weights": weights_to_bytes(self.weights),
        }
        if self.decode is not None:
            payloads["decode"] = self.decode.encode()
            payloads["decode_ir"] = self.decode_ir.encode()
        offset = _HEADER.size + _ENTRY.size * len(payloads)
        table = b""
        for name, data in payloads.items():
            table += _ENTRY.pack(name.encode(), offset, len(data), hashlib.sha256(data).digest())
            offset += len(data)
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payloads))
        return header + table + b"".join(payloads.values())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the file atomically: a reader sees the old file or the whole new one."""
        write_atomically(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Artifact:
        """Reads and checks an artifact file."""
        kind = special_kind(path)
        if kind is not None:
            raise ArtifactError(f"{path}: is {kind}, not an artifact")
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise ArtifactError(f"{path}: is a directory, not an artifact") from None
        return cls.from_bytes(data, str(path))

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<artifact>") -> Artifact:
        """Checks and decodes the file contents: a CgcError naming the file and the culprit
        for anything a compiler would not have written."""
        sections = _sections(data, source)
        try:
            manifest = _manifest(sections["manifest"])
            program = _program(sections["bytecode"])
            ir = sections["ir"].decode()
            weights = weights_from_bytes(sections["weights"])
            decode = _program(sections["decode"]) if "decode" in sections else None
            decode_ir = sections["decode_ir"].decode() if "decode_ir" in sections else ""
        except (ValueError, UnicodeDecodeError) as e:
            raise ArtifactError(f"{source}: malformed artifact ({e})") from None
        except CgcError as e:
            raise ArtifactError(f"{source}: {e}") from None
        program.source = source
        if decode is not None:
            decode.source = source
        artifact = cls(manifest, program, ir, weights, decode, decode_ir)
        try:
            check_contents(artifact)
            artifact.program = dataclasses.replace(program, sparse=artifact.sparse_weights())
        except CgcError as e:
            raise ArtifactError(f"{source}: {e}") from None
        return artifact


def _manifest(payload: bytes) -> dict[str, Any]:
    """The manifest of a file, checked against its schema (``cgc.machine.program.manifest``)."""
    manifest = parse_json(payload, "the manifest")
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        raise CgcError("manifest of an unknown format version")
    target = manifest.get("target")
    if not isinstance(target, dict):
        raise CgcError("the manifest has no target")
    try:
        checked(Target.from_json(target))
    except CgcError as e:
        raise CgcError(f"manifest: {e}") from None
    return check_manifest(manifest)


def _program(payload: bytes) -> Program:
    """The decoded bytecode; Program.decode parses its JSON table unbounded, so a table
    nested past the recursion limit is refused here."""
    try:
        return Program.decode(payload)
    except RecursionError:
        raise ValueError("the bytecode's table is nested too deeply") from None


_DTYPES_KEY = "cgc.dtypes"
_EXTENDED = (*dtypes.EXTENDED_FLOATS, *dtypes.EXTENDED_INTS)


def weights_to_bytes(weights: dict[str, np.ndarray]) -> bytes:
    """safetensors bytes; ml_dtypes arrays (bfloat16, float8, int4, ...), which safetensors
    cannot store, go in as raw unsigned views with their dtype in the file's metadata."""
    extended = {k: v.dtype.name for k, v in weights.items() if dtypes.is_extended(v.dtype)}
    # np.require keeps a 0-d array 0-d (np.ascontiguousarray would make it 1-d)
    tensors = {
        k: np.require(v, requirements="C").view(dtypes.storage(v.dtype)) if k in extended
        else np.require(v, requirements="C")
        for k, v in sorted(weights.items())
    }  # fmt: skip
    metadata = {_DTYPES_KEY: json.dumps(extended, sort_keys=True)} if extended else None
    return save_safetensors(tensors, metadata=metadata)


MAX_WEIGHTS_HEADER = 100 * 2**20
"""The largest safetensors header read (the bound of the safetensors library itself)."""


def weights_from_bytes(data: bytes) -> dict[str, np.ndarray]:
    """The inverse of ``weights_to_bytes``; a ValueError if ``data`` is not such a file."""
    if len(data) < 8:
        raise ValueError("the weights are not a safetensors file (no header)")
    (size,) = struct.unpack_from("<Q", data)
    if size > min(len(data) - 8, MAX_WEIGHTS_HEADER):
        raise ValueError(f"the weights' safetensors header claims {size} bytes")
    header = parse_json(data[8 : 8 + size], "the weights' safetensors header")
    try:
        tensors = load_safetensors(data)
    except SafetensorError as e:
        raise ValueError(f"the weights are not a safetensors file ({e})") from None
    for name, dtype_name in _extended(header, tensors).items():
        tensors[name] = tensors[name].view(dtypes.dtype(dtype_name))
    return tensors


def _extended(header: Any, tensors: dict[str, np.ndarray]) -> dict[str, str]:
    """The ml_dtypes type of every tensor stored as raw unsigned bits, from the metadata."""
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    text = metadata.get(_DTYPES_KEY, "{}") if isinstance(metadata, dict) else "{}"
    extended = parse_json(text.encode(), f"the weights' {_DTYPES_KEY} metadata")
    if not isinstance(extended, dict):
        raise ValueError(f"the weights' {_DTYPES_KEY} metadata is not an object")
    for name, dtype_name in extended.items():
        if name not in tensors or dtype_name not in _EXTENDED:
            raise ValueError(f"the weights' {_DTYPES_KEY} metadata names {name!r}: {dtype_name!r}")
        if tensors[name].dtype != dtypes.storage(dtype_name):
            raise ValueError(
                f"weight {name!r} is stored as {tensors[name].dtype}, not as {dtype_name}"
            )
    return extended


def _sections(data: bytes, source: str) -> dict[str, bytes]:
    """The verified payload of every section: each named once, the payloads in table order
    one after the other up to the end of the file, each matching its checksum."""
    if len(data) < _HEADER.size or data[:8] != MAGIC:
        raise ArtifactError(f"{source}: not a cgc artifact (bad magic number)")
    _, version, count = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise ArtifactError(
            f"{source}: artifact format version {version} is not supported "
            f"(this cgc reads version {FORMAT_VERSION}); recompile the model"
        )
    if len(data) < _HEADER.size + count * _ENTRY.size:
        raise ArtifactError(f"{source}: truncated artifact (section table cut off)")
    out = {}
    end = _HEADER.size + count * _ENTRY.size
    for i in range(count):
        raw, offset, length, digest = _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
        name = raw.rstrip(b"\0").decode(errors="replace")
        if offset + length > len(data):
            raise ArtifactError(
                f"{source}: truncated artifact (section '{name}' ends at byte "
                f"{offset + length}, the file has {len(data)})"
            )
        if name in out:
            raise ArtifactError(f"{source}: section '{name}' appears twice in the section table")
        if offset != end:
            raise ArtifactError(
                f"{source}: section '{name}' starts at byte {offset}, not at byte {end} where "
                "the previous one ends (sections overlap or leave a gap)"
            )
        payload = data[offset : offset + length]
        if hashlib.sha256(payload).digest() != digest:
            raise ArtifactError(f"{source}: section '{name}' is corrupted (checksum mismatch)")
        out[name] = payload
        end = offset + length
    _check_names(out, source)
    if end != len(data):
        raise ArtifactError(
            f"{source}: {len(data) - end} trailing bytes after the last section (byte {end})"
        )
    return out


def _check_names(sections: dict[str, bytes], source: str) -> None:
    """Every section an artifact has (a generation's both or neither), no other."""
    missing = [s for s in SECTIONS if s not in sections]
    if any(s in sections for s in GENERATION_SECTIONS):
        missing += [s for s in GENERATION_SECTIONS if s not in sections]
    if missing:
        raise ArtifactError(f"{source}: artifact lacks sections {missing}")
    unknown = [s for s in sections if s not in (*SECTIONS, *GENERATION_SECTIONS)]
    if unknown:
        raise ArtifactError(f"{source}: artifact has an unknown section '{unknown[0]}'")


# ---------------------------------------------------------------------------------------------
# The sections agree: the program is well formed, and names what the manifest and weights hold
# ---------------------------------------------------------------------------------------------

_INDEX: Schema = {"type": "integer", "minimum": 0}


def _object(**properties: Schema) -> Schema:
    """The schema of an object with exactly these keys."""
    return {"type": "object", "required": list(properties), "properties": properties}


_NAMED: Schema = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "perm": {"type": "array", "items": _INDEX}},
}
INSTRUCTIONS: dict[int, tuple[int, int | None, Schema]] = {
    Opcode.LAYER: (0, 0, _object(layer=_INDEX)),
    Opcode.INPUT: (1, 0, _object(index=_INDEX)),
    Opcode.OUTPUT: (0, 1, _object(index=_INDEX)),
    Opcode.WEIGHT: (1, 0, _NAMED),
    Opcode.CONSTANT: (1, 0, _object(value={"type": "array"})),
    Opcode.STREAM_WEIGHT: (1, 0, _NAMED),
    Opcode.STREAM_GRADIENT: (0, 1, _NAMED),
    Opcode.OPTIMIZER_STEP: (
        0,
        0,
        _object(
            optimizer={"type": "string"},
            config={"type": "object", "additionalProperties": {"type": ["number", "boolean"]}},
        ),
    ),
    Opcode.FREE: (0, None, _object()),
    Opcode.CACHE: (1, 0, _object(name={"type": "string"}, capacity=_INDEX)),
}
"""Per instruction other than a kernel: its results, its operands (None: any number) and the
schema of its attributes (``cgc.machine.program.manifest``'s subset of JSON Schema)."""


def check_contents(artifact: Artifact) -> None:
    """A CgcError naming the section and the culprit if the weights or the programs do not
    agree with the manifest, or a program is not well formed."""
    manifest = artifact.manifest
    _check_registers(artifact.program)
    _check_layers(artifact.program, manifest, "bytecode")
    _check_weights(artifact)
    _check_instructions(artifact.program, manifest, artifact.weight_specs, "bytecode")
    generation = manifest.get("generation")
    if (generation is None) != (artifact.decode is None):
        raise CgcError("the manifest's generation and the decode section come together")
    if artifact.decode is not None:
        assert generation is not None
        step = {**manifest, **generation["decode"]}
        _check_registers(artifact.decode)
        _check_layers(artifact.decode, step, "decode")
        _check_instructions(artifact.decode, step, artifact.weight_specs, "decode")


def _check_instructions(
    program: Program, manifest: dict[str, Any], specs: dict[str, WeightSpec], section: str
) -> None:
    """Every instruction of ``program`` (of the artifact's ``section``) is well formed, names
    the inputs, outputs and weights of ``manifest`` and ``specs``, and reads only registers
    written before; every output is written."""
    live: set[int] = set()
    for position, ins in enumerate(program.instructions):
        try:
            if position == 0 and ins.opcode != Opcode.LAYER:
                raise CgcError("expected a layer instruction first")
            _check_instruction(ins, program, manifest, specs)
            _check_liveness(ins, live)
        except CgcError as e:
            name = _mnemonic(ins.opcode)
            where = f"{position} ({name})" if name else str(position)
            raise CgcError(f"{section}: instruction {where}: {e}") from None
    written = {i.attrs["index"] for i in program.instructions if i.opcode == Opcode.OUTPUT}
    unwritten = [s["name"] for i, s in enumerate(manifest["outputs"]) if i not in written]
    if unwritten:
        raise CgcError(f"{section}: no instruction writes output {shown(unwritten[0])}")


def _check_weights(artifact: Artifact) -> None:
    """The stored tensors are the weights the manifest's layers and buffers name that it does
    not declare without data, each of a known element type."""
    manifest, stored = artifact.manifest, artifact.weights
    declared = manifest.get(DECLARED) or {}
    training = manifest["training"] or {}
    named = {
        **{
            n: f"layers[{i}].weights"
            for i, x in enumerate(manifest["layers"])
            for n in x["weights"]
        },
        **{u["buffer"]: "training.buffers" for u in training.get("buffers", [])},
        **{n: "training.trainable" for n in training.get("trainable", [])},
        **{n: "sparsity.weights" for n in (manifest.get("sparsity") or {}).get("weights", [])},
    }
    for name, array in stored.items():
        if name not in named:
            raise CgcError(f"weights: tensor {shown(name)} is not a weight of the manifest")
        if name in declared:
            raise CgcError(f"weights: {shown(name)} is stored and also declared without data")
        if array.dtype.name not in DTYPES:
            raise CgcError(f"weights: tensor {shown(name)} has element type {array.dtype.name}")
    for name, where in named.items():
        if name not in stored and name not in declared:
            raise CgcError(f"manifest: {where}: {shown(name)} is neither stored nor declared")


def _check_registers(program: Program) -> None:
    for index, (shape, dtype) in enumerate(program.registers):
        try:
            validate(list(shape), {"type": "array", "items": _INDEX}, "shape")
            validate(dtype, {"type": "string", "enum": list(DTYPES)}, "dtype")
        except CgcError as e:
            raise CgcError(f"bytecode: register {index}: {e}") from None


def _check_layers(program: Program, manifest: dict[str, Any], section: str) -> None:
    """The program's layers are the manifest's, on rectangles inside the mesh."""
    listed = manifest["layers"]
    if len(listed) != len(program.layers):
        raise CgcError(f"{section}: {len(program.layers)} layers, the manifest lists {len(listed)}")
    rows, cols = manifest["target"]["rows"], manifest["target"]["cols"]
    for index, (layer, entry) in enumerate(zip(program.layers, listed, strict=True)):
        rect, weights = list(layer.rect), list(layer.weights)
        if (layer.name, rect, weights) != (entry["name"], entry["rect"], entry["weights"]):
            raise CgcError(f"{section}: layer {index} is not layers[{index}] of the manifest")
        x, y, w, h = rect
        if w < 1 or h < 1 or x + w > cols or y + h > rows:
            raise CgcError(f"{section}: layer {index} at {rect} is outside the {rows}x{cols} mesh")
        for route in layer.routes:
            figures = (route.color, route.lanes, route.wavelets, route.busiest, route.hops)
            bad = (
                not 0 <= route.source < len(program.layers)
                or min((*figures, *route.path), default=0) < 0
                or len(route.path) % 2
            )
            if bad:
                raise CgcError(f"{section}: layer {index} has a bad route {route.to_json()}")


def _check_instruction(
    ins: Instruction, program: Program, manifest: dict[str, Any], specs: dict[str, WeightSpec]
) -> None:
    """One instruction: a known opcode with its operands and attributes, naming layers,
    inputs, outputs and weights that exist, in the registers' shapes."""
    if _mnemonic(ins.opcode) is None:
        raise CgcError(f"unknown opcode {ins.opcode}")
    if not isinstance(ins.attrs, dict):
        raise CgcError(f"attributes: expected an object, got {shown(ins.attrs)}")
    if ins.location is not None and not isinstance(ins.location, str):
        raise CgcError(f"location: expected a string, got {shown(ins.location)}")
    if ins.is_kernel:
        return
    results, operands, schema = INSTRUCTIONS[ins.opcode]
    if len(ins.results) != results or (operands is not None and len(ins.operands) != operands):
        raise CgcError(
            f"expected {results} results and {operands} operands, got "
            f"{len(ins.results)} and {len(ins.operands)}"
        )
    validate(ins.attrs, schema)
    _check_attrs(ins, program, manifest, specs)


def _check_attrs(
    ins: Instruction, program: Program, manifest: dict[str, Any], specs: dict[str, WeightSpec]
) -> None:
    """The layer, input, output, weight or optimizer an instruction other than a kernel
    names exists, and fits its register."""
    registers = [program.registers[r] for r in (*ins.results, *ins.operands)]
    if ins.opcode == Opcode.LAYER:
        _check_index(ins.attrs["layer"], len(program.layers), "layer")
    elif ins.opcode in (Opcode.INPUT, Opcode.OUTPUT):
        key = "inputs" if ins.opcode == Opcode.INPUT else "outputs"
        spec = manifest[key][_check_index(ins.attrs["index"], len(manifest[key]), key[:-1])]
        if registers[0] != (tuple(spec["shape"]), spec["dtype"]):
            raise CgcError(f"its register is not of the shape and type of {key} {shown(spec)}")
    elif ins.opcode == Opcode.CONSTANT:
        _check_constant(ins.attrs["value"], registers[0][0])
    elif ins.opcode == Opcode.CACHE:
        shape, capacity = registers[0][0], ins.attrs["capacity"]
        if len(shape) != 2 or capacity < 1 or shape[0] % capacity:
            raise CgcError(f"a cache of {shape} is not of sequences of {capacity} tokens")
    elif ins.opcode == Opcode.OPTIMIZER_STEP:
        try:
            optimizers.settings(ins.attrs["optimizer"], ins.attrs["config"])
        except (ValueError, TypeError) as e:
            raise CgcError(str(e)) from None
    elif ins.opcode != Opcode.FREE:
        _check_view(ins.attrs, registers[0][0], specs)


def _check_index(index: int, count: int, what: str) -> int:
    if index >= count:
        raise CgcError(f"{what} {index} does not exist (there are {count})")
    return index


def _check_constant(value: list[Any], shape: tuple[int, ...]) -> None:
    if len(value) != prod(shape) or not all(isinstance(v, int | float) for v in value):
        raise CgcError(f"value: expected {prod(shape)} numbers for its {list(shape)} register")


def _check_view(
    attrs: dict[str, Any], shape: tuple[int, ...], specs: dict[str, WeightSpec]
) -> None:
    """A weight named by an instruction exists, with as many elements as its register, and
    its ``perm`` permutes the register's axes."""
    name = attrs["name"]
    if name not in specs:
        raise CgcError(f"name: no weight {shown(name)}")
    if specs[name].size != prod(shape):
        raise CgcError(
            f"weight {shown(name)} of shape {list(specs[name].shape)} does not fill {list(shape)}"
        )
    perm = attrs.get("perm")
    if perm is not None and sorted(perm) != list(range(len(shape))):
        raise CgcError(f"perm: {perm} does not permute the {len(shape)} axes of {list(shape)}")


def _check_liveness(ins: Instruction, live: set[int]) -> None:
    """Every operand holds a value: written before, and not freed since."""
    for register in ins.operands:
        if register not in live:
            raise CgcError(f"reads register {register}, which holds nothing (unwritten or freed)")
    if ins.opcode == Opcode.FREE:
        live.difference_update(ins.operands)
    live.update(ins.results)


def _mnemonic(opcode: int) -> str | None:
    """The mnemonic of a known opcode, else None."""
    known = opcode in set(Opcode) or KERNEL_BASE <= opcode < KERNEL_BASE + len(PRIMITIVES)
    return opcode_name(opcode) if known else None
