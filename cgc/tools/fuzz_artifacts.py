"""Artifact mutators for the fuzzer: a re-checksummer, and the mutations it carries through.

``unpack_artifact`` and ``pack_artifact`` take the container apart and put it together again
with fresh SHA-256 digests, so that a mutation reaches the parsers behind the checksum check;
the manifest is mutated as JSON (dropped keys, wrong types, huge numbers, deep nesting), the
weights section through its safetensors header, the container itself (sections twice, dropped
or reordered, a wrong version, count or offset), and any section as bytes
(``fuzz_mutators.mutate_bytes``).
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from typing import Any

from cgc.tools.fuzz_mutators import mutate_bytes

ARTIFACT_MAGIC = b"CGCARTF\0"
_HEADER = struct.Struct("<8sII")
_ENTRY = struct.Struct("<16sQQ32s")
Sections = list[tuple[bytes, bytes]]


def unpack_artifact(data: bytes) -> tuple[int, Sections]:
    """The format version and (name, payload) of every section of a well-formed artifact."""
    _, version, count = _HEADER.unpack_from(data)
    sections = []
    for i in range(count):
        name, offset, length, _ = _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
        sections.append((name.rstrip(b"\0"), data[offset : offset + length]))
    return version, sections


def pack_artifact(version: int, sections: Sections, magic: bytes = ARTIFACT_MAGIC) -> bytes:
    """The container around ``sections``, every offset and SHA-256 digest recomputed."""
    offset = _HEADER.size + _ENTRY.size * len(sections)
    table = b""
    for name, payload in sections:
        digest = hashlib.sha256(payload).digest()
        table += _ENTRY.pack(name[:16], offset, len(payload), digest)
        offset += len(payload)
    return _HEADER.pack(magic, version, len(sections)) + table + b"".join(p for _, p in sections)


def _json_path(value: Any, rng: random.Random) -> list[Any]:
    """A random path of keys and indices into a JSON value."""
    path: list[Any] = []
    while isinstance(value, dict | list) and value and rng.random() < 0.75:
        key = rng.choice(sorted(value)) if isinstance(value, dict) else rng.randrange(len(value))
        path.append(key)
        value = value[key]
    return path


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def mutate_manifest(text: bytes, rng: random.Random) -> tuple[bytes, str]:
    """The manifest JSON with one value dropped, of a wrong type, huge, or deeply nested."""
    manifest = json.loads(text)
    path = _json_path(manifest, rng) or [rng.choice(sorted(manifest))]
    parent = manifest
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    shown = "/".join(map(str, path))
    if isinstance(parent, dict) and rng.random() < 0.3:
        del parent[key]
        return json.dumps(manifest).encode(), f"manifest without {shown}"
    if rng.random() < 0.15:  # JSON that json.dumps cannot write: nest it by hand
        marker = "__NESTED__"
        parent[key] = marker
        depth = rng.choice([100, 5000, 200000])
        out = json.dumps(manifest).replace(f'"{marker}"', _nested(depth), 1)
        return out.encode(), f"manifest {shown} nested {depth} deep"
    new = rng.choice([None, True, "text", "", [], {}, -1, 0, 1 << 64, 1e308, float("nan"),
                      float("inf"), [1 << 40, 1 << 40], {"a": 1}, "float128", 2.5])  # fmt: skip
    parent[key] = new
    return json.dumps(manifest).encode(), f"manifest {shown} = {json.dumps(new)[:30]}"


def mutate_safetensors(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """The weights section with one tensor's header entry changed (dtype, shape, offsets)."""
    (size,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + size])
    names = sorted(k for k in header if k != "__metadata__")
    name = rng.choice(names)
    field = rng.choice(["dtype", "shape", "data_offsets"])
    value = {
        "dtype": rng.choice(["F64", "I8", "BOOL", "XX", "", 3]),
        "shape": rng.choice([[], [0], [-1], [1 << 40, 1 << 40], "a", [2, 2, 2, 2, 2, 2, 2]]),
        "data_offsets": rng.choice([[0, 0], [5, 3], [0, 1 << 50], [-1, 4], [0]]),
    }[field]
    header[name][field] = value
    encoded = json.dumps(header).encode()
    body = data[8 + size :]
    return struct.pack("<Q", len(encoded)) + encoded + body, f"weights '{name}' {field}={value}"


def mutate_artifact(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A mutated artifact whose checksums still hold (mostly): the mutation reaches the
    decoders of the sections, not just the checksum check."""
    version, sections = unpack_artifact(data)
    choice = rng.randrange(10)
    if choice == 0:  # the container itself
        return _mutate_container(version, sections, rng)
    i = rng.randrange(len(sections))
    name, payload = sections[i]
    if name == b"manifest" and choice < 5:
        payload, what = mutate_manifest(payload, rng)
    elif name == b"weights" and choice < 4:
        payload, what = mutate_safetensors(payload, rng)
    else:
        payload, what = mutate_bytes(payload, rng)
    sections[i] = (name, payload)
    return pack_artifact(version, sections), f"{name.decode()}: {what} (re-checksummed)"


def _mutate_container(version: int, sections: Sections, rng: random.Random) -> tuple[bytes, str]:
    choice = rng.randrange(6)
    if choice == 0:
        i = rng.randrange(len(sections))
        sections.insert(i, sections[i])
        return pack_artifact(version, sections), f"section {sections[i][0]!r} twice"
    if choice == 1:
        i = rng.randrange(len(sections))
        dropped = sections.pop(i)[0]
        return pack_artifact(version, sections), f"section {dropped!r} dropped"
    if choice == 2:
        rng.shuffle(sections)
        return pack_artifact(version, sections), "sections reordered"
    if choice == 3:
        new = rng.choice([0, 2, 4, 1 << 31, (1 << 32) - 1])
        return pack_artifact(new, sections), f"format version {new}"
    packed = bytearray(pack_artifact(version, sections))
    if choice == 4:  # a section count beyond the table: the reader must not trust it
        struct.pack_into("<I", packed, 12, rng.choice([0, 5, 1 << 20, (1 << 32) - 1]))
        return bytes(packed), "section count changed"
    entry = _HEADER.size + rng.randrange(len(sections)) * _ENTRY.size
    struct.pack_into("<Q", packed, entry + 16, rng.choice([0, 1 << 63, len(packed)]))
    return bytes(packed), "a section offset changed"
