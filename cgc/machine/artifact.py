"""The compiled artifact: one file holding everything a run needs.

Layout, little-endian::

    b"CGCARTF\\0"  u32 format version  u32 section count
    section table: per section, name (16 bytes, NUL padded), u64 offset, u64 length,
                   SHA-256 of the payload (32 bytes)
    payloads, in table order

Sections: ``manifest`` (JSON), ``bytecode`` (``cgc.machine.bytecode``), ``ir`` (the final MLIR
text) and ``weights`` (safetensors). Reading checks the magic, the version, every offset and
every checksum before decoding anything, and never executes code from the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
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

MAGIC = b"CGCARTF\0"
FORMAT_VERSION = 2
SECTIONS = ("manifest", "bytecode", "ir", "weights")
_HEADER = struct.Struct("<8sII")
_ENTRY = struct.Struct("<16sQQ32s")


class ArtifactError(CgcError):
    """An artifact file that cannot be read: missing, truncated, corrupted or of another
    format version."""


def _json_bytes(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, indent=1).encode()


@dataclass
class Artifact:
    """A compiled program with its manifest, final IR and weights."""

    manifest: dict[str, Any]
    program: Program
    ir: str
    weights: dict[str, np.ndarray]

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
