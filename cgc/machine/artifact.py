"""The compiled artifact: one file holding everything a run needs.

Layout, little-endian::

    b"CGCARTF\\0"  u32 format version  u32 section count
    section table: per section, name (16 bytes, NUL padded), u64 offset, u64 length,
                   SHA-256 of the payload (32 bytes)
    payloads, in table order

Sections: ``manifest`` (JSON), ``bytecode`` (``cgc.machine.bytecode``), ``ir`` (the final MLIR
text) and ``weights`` (safetensors). Reading checks the magic, the version, every offset and
every checksum before decoding anything, and never executes code from the file.

A weight may be *declared* instead of stored: its name, shape and dtype, without data (a model
compiled from a params file, or an ONNX graph compiled with ``--no-weights``). The manifest
lists them (``declared_weights``); such an artifact runs timing-only, and a run with numbers
is refused.
"""

from __future__ import annotations

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
from cgc.machine import dtypes
from cgc.machine.bytecode import Program
from cgc.machine.files import write_atomically
from cgc.machine.target import Target, checked

MAGIC = b"CGCARTF\0"
FORMAT_VERSION = 3
SECTIONS = ("manifest", "bytecode", "ir", "weights")
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
        return cls(tuple(array.shape), array.dtype.name)


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
    def mode(self) -> str:
        """``pipelined`` or ``weight_streaming``."""
        mode: str = self.manifest["mode"]
        return mode

    def to_bytes(self) -> bytes:
        """The file contents; equal artifacts give equal bytes."""
        payloads = {
            "manifest": _json_bytes(self.manifest),
            "bytecode": self.program.encode(),
            "ir": self.ir.encode(),
            "weights": weights_to_bytes(self.weights),
        }
        offset = _HEADER.size + _ENTRY.size * len(SECTIONS)
        table = b""
        for name in SECTIONS:
            data = payloads[name]
            table += _ENTRY.pack(name.encode(), offset, len(data), hashlib.sha256(data).digest())
            offset += len(data)
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(SECTIONS))
        return header + table + b"".join(payloads[name] for name in SECTIONS)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the file atomically: a reader sees the old file or the whole new one."""
        write_atomically(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Artifact:
        """Reads and checks an artifact file."""
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise ArtifactError(f"{path}: is a directory, not an artifact") from None
        return cls.from_bytes(data, str(path))

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<artifact>") -> Artifact:
        """Checks and decodes the file contents."""
        sections = _sections(data, source)
        try:
            manifest = json.loads(sections["manifest"])
            program = Program.decode(sections["bytecode"])
            ir = sections["ir"].decode()
            weights = weights_from_bytes(sections["weights"])
        except (ValueError, UnicodeDecodeError, SafetensorError) as e:
            raise ArtifactError(f"{source}: malformed artifact ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(f"{source}: manifest of an unknown format version")
        target = manifest.get("target")
        if not isinstance(target, dict):
            raise ArtifactError(f"{source}: the manifest has no target")
        try:
            checked(Target.from_json(target))
        except CgcError as e:
            raise ArtifactError(f"{source}: manifest: {e}") from None
        return cls(manifest, program, ir, weights)


_DTYPES_KEY = "cgc.dtypes"


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


def weights_from_bytes(data: bytes) -> dict[str, np.ndarray]:
    """The inverse of ``weights_to_bytes``."""
    tensors = load_safetensors(data)
    (size,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + size])
    extended = json.loads(header.get("__metadata__", {}).get(_DTYPES_KEY, "{}"))
    for name, dtype_name in extended.items():
        tensors[name] = tensors[name].view(dtypes.dtype(dtype_name))
    return tensors


def _sections(data: bytes, source: str) -> dict[str, bytes]:
    """The verified payload of every section."""
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
    for i in range(count):
        raw, offset, length, digest = _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
        name = raw.rstrip(b"\0").decode(errors="replace")
        if offset + length > len(data):
            raise ArtifactError(
                f"{source}: truncated artifact (section '{name}' ends at byte "
                f"{offset + length}, the file has {len(data)})"
            )
        payload = data[offset : offset + length]
        if hashlib.sha256(payload).digest() != digest:
            raise ArtifactError(f"{source}: section '{name}' is corrupted (checksum mismatch)")
        out[name] = payload
    missing = [s for s in SECTIONS if s not in out]
    if missing:
        raise ArtifactError(f"{source}: artifact lacks sections {missing}")
    return out
