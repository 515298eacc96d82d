"""Unit tests of cgc.runtime.artifact: the file format, its checks, and atomic saving."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import struct

import numpy as np
import pytest

import cgc
from cgc.errors import CgcError
from cgc.files import npz_bytes
from cgc.frontends import zoo
from cgc.machine.program.artifact import (
    FORMAT_VERSION,
    MAGIC,
    SECTIONS,
    Artifact,
    ArtifactError,
    weights_from_bytes,
    weights_to_bytes,
)
from cgc.machine.program.manifest import check_manifest

HEADER = struct.Struct("<8sII")
ENTRY = struct.Struct("<16sQQ32s")


@pytest.fixture(scope="module")
def artifact() -> Artifact:
    return cgc.compile(zoo.MODELS["mlp"](), target="mesh8x8", batch_size=4)


@pytest.fixture(scope="module")
def data(artifact) -> bytes:
    return artifact.to_bytes()


def section_table(data: bytes) -> dict[str, tuple[int, int, bytes]]:
    _, _, count = HEADER.unpack_from(data)
    table = {}
    for i in range(count):
        raw, offset, length, digest = ENTRY.unpack_from(data, HEADER.size + i * ENTRY.size)
        table[raw.rstrip(b"\0").decode()] = (offset, length, digest)
    return table


def assert_same(a: Artifact, b: Artifact) -> None:
    # a freshly compiled manifest may hold tuples where the loaded one has JSON lists
    assert json.loads(json.dumps(a.manifest)) == b.manifest
    assert a.ir == b.ir
    assert sorted(a.weights) == sorted(b.weights)
    for name, value in a.weights.items():
        assert b.weights[name].dtype == value.dtype
        assert b.weights[name].shape == value.shape
        np.testing.assert_array_equal(b.weights[name], value)
    assert a.program.instructions == b.program.instructions
    assert a.program.registers == b.program.registers
    assert a.program.layers == b.program.layers


def test_save_load_round_trip(artifact, tmp_path):
    path = tmp_path / "model.cgc"
    artifact.save(path)
    loaded = cgc.load(path)
    assert_same(artifact, loaded)
    assert loaded.mode == artifact.mode == artifact.manifest["mode"]
    assert loaded.to_bytes() == path.read_bytes()
    assert isinstance(loaded.weights["fc1.weight"], np.ndarray)
    assert loaded.weights["fc1.weight"].shape == (32, 64)


def test_file_layout(artifact, data):
    magic, version, count = HEADER.unpack_from(data)
    assert (magic, version, count) == (MAGIC, FORMAT_VERSION, len(SECTIONS))
    table = section_table(data)
    assert list(table) == list(SECTIONS)
    end = HEADER.size + ENTRY.size * len(SECTIONS)
    for offset, length, digest in table.values():
        assert offset == end  # payloads follow each other in table order
        assert hashlib.sha256(data[offset : offset + length]).digest() == digest
        end += length
    assert end == len(data)
    offset, length, _ = table["ir"]
    assert data[offset : offset + length].decode() == artifact.ir
    offset, length, _ = table["bytecode"]
    assert data[offset : offset + length] == artifact.program.encode()


def test_to_bytes_is_deterministic(artifact, data):
    assert artifact.to_bytes() == data
    shuffled = Artifact(
        dict(reversed(list(artifact.manifest.items()))),
        artifact.program,
        artifact.ir,
        dict(reversed(list(artifact.weights.items()))),
    )
    assert shuffled.to_bytes() == data


def test_compiling_twice_gives_identical_bytes(data):
    again = cgc.compile(zoo.MODELS["mlp"](), target="mesh8x8", batch_size=4)
    assert again.to_bytes() == data


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_corrupted_section_is_named(data, section, where):
    offset, length, _ = section_table(data)[section]
    pos = {"first": offset, "middle": offset + length // 2, "last": offset + length - 1}[where]
    bad = bytearray(data)
    bad[pos] ^= 0x01
    with pytest.raises(ArtifactError, match=f"section '{section}' is corrupted"):
        Artifact.from_bytes(bytes(bad), "x.cgc")


def test_corrupted_checksum_itself(data):
    bad = bytearray(data)
    bad[HEADER.size + 16 + 8 + 8] ^= 0xFF  # first byte of the manifest's digest
    with pytest.raises(ArtifactError, match="section 'manifest'"):
        Artifact.from_bytes(bytes(bad))


@pytest.mark.parametrize("keep", [0, 5, HEADER.size, HEADER.size + ENTRY.size + 3, -1, -100])
def test_truncated(data, keep):
    with pytest.raises(ArtifactError) as info:
        Artifact.from_bytes(data[:keep], "cut.cgc")
    assert "cut.cgc" in str(info.value)
    assert isinstance(info.value, CgcError)


def test_truncated_payload_message_names_the_section(data):
    offset, length, _ = section_table(data)["weights"]
    with pytest.raises(ArtifactError, match=r"truncated.*'weights'"):
        Artifact.from_bytes(data[: offset + length // 2])


def test_bad_magic(data):
    with pytest.raises(ArtifactError, match="magic"):
        Artifact.from_bytes(b"PK\3\4" + data[4:])


def test_unknown_format_version(data):
    bad = bytearray(data)
    struct.pack_into("<I", bad, 8, FORMAT_VERSION + 1)
    with pytest.raises(ArtifactError, match=f"version {FORMAT_VERSION + 1}"):
        Artifact.from_bytes(bytes(bad))


def test_unknown_manifest_format_version(artifact):
    manifest = copy.deepcopy(artifact.manifest)
    manifest["format_version"] = FORMAT_VERSION + 1
    other = Artifact(manifest, artifact.program, artifact.ir, artifact.weights)
    with pytest.raises(ArtifactError, match="format version"):
        Artifact.from_bytes(other.to_bytes())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"clock_hz": 0.0}, "x.cgc: manifest: target 'mesh8x8': clock_hz must be positive"),
        ({"rows": 10**6}, "x.cgc: manifest: target 'mesh8x8': rows 1000000 is outside its "),
        ({"colours": 24}, "x.cgc: manifest: a target has an unknown key 'colours'"),
        ({"colors": None}, "x.cgc: manifest: target 'mesh8x8': colors must be a number, got None"),
    ],
)
def test_a_manifest_with_an_impossible_target(artifact, change, message):
    """A target no machine has (a tool that rewrote the manifest and its checksum) is refused
    on reading, naming the file and the figure, before any run divides by it."""
    manifest = copy.deepcopy(artifact.manifest)
    manifest["target"].update(change)
    other = Artifact(manifest, artifact.program, artifact.ir, artifact.weights)
    with pytest.raises(ArtifactError) as raised:
        Artifact.from_bytes(other.to_bytes(), "x.cgc")
    assert str(raised.value).startswith(message)


def test_a_manifest_without_a_target(artifact):
    manifest = {k: v for k, v in artifact.manifest.items() if k != "target"}
    other = Artifact(manifest, artifact.program, artifact.ir, artifact.weights)
    with pytest.raises(ArtifactError, match=r"^x\.cgc: the manifest has no target$"):
        Artifact.from_bytes(other.to_bytes(), "x.cgc")


def test_missing_section(data):
    # rename the 'ir' section: checksums still hold, but a section is missing
    bad = bytearray(data)
    pos = HEADER.size + 2 * ENTRY.size
    assert bad[pos : pos + 2] == b"ir"
    bad[pos : pos + 2] = b"IR"
    with pytest.raises(ArtifactError, match="lacks sections"):
        Artifact.from_bytes(bytes(bad))


def with_payload(data: bytes, section: str, payload: bytes) -> bytes:
    """The file with one section's payload replaced and its checksum recomputed."""
    table = section_table(data)
    payloads = {name: data[o : o + n] for name, (o, n, _) in table.items()}
    payloads[section] = payload
    offset = HEADER.size + ENTRY.size * len(table)
    out = HEADER.pack(MAGIC, FORMAT_VERSION, len(table))
    for name, body in payloads.items():
        out += ENTRY.pack(name.encode(), offset, len(body), hashlib.sha256(body).digest())
        offset += len(body)
    return out + b"".join(payloads.values())


def bytecode_with_bad_attrs_index(artifact) -> bytes:
    code = bytearray(artifact.program.encode())
    table_end = 16 + struct.unpack_from("<I", code, 8)[0]
    struct.pack_into("<I", code, table_end + 8, 10**6)  # the first instruction's attrs index
    return bytes(code)


def test_with_payload_is_faithful(artifact, data):
    assert with_payload(data, "ir", artifact.ir.encode()) == data


@pytest.mark.parametrize(
    ("section", "payload"),
    [
        ("manifest", b"{not json"),
        ("bytecode", b"XXXX" + b"\0" * 12),
        ("ir", b"\xff\xfe"),
    ],
)
def test_malformed_payload_with_valid_checksum(data, section, payload):
    with pytest.raises(ArtifactError, match="malformed"):
        Artifact.from_bytes(with_payload(data, section, payload))


@pytest.mark.parametrize("case", ["weights", "manifest", "bytecode"])
def test_malformed_payload_with_valid_checksum_other_errors(artifact, data, case):
    payload = {
        "weights": b"garbage-not-safetensors",
        "manifest": b"[]",
        "bytecode": bytecode_with_bad_attrs_index(artifact),
    }[case]
    with pytest.raises(ArtifactError):
        Artifact.from_bytes(with_payload(data, case, payload))


def test_missing_file(tmp_path):
    with pytest.raises(ArtifactError, match="no such file"):
        cgc.load(tmp_path / "nope.cgc")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ArtifactError, match="directory"):
        cgc.load(tmp_path)


def test_save_leaves_no_temporary_files(artifact, tmp_path):
    path = tmp_path / "a.cgc"
    artifact.save(path)
    artifact.save(str(path))
    assert os.listdir(tmp_path) == ["a.cgc"]


def test_save_replaces_an_existing_file_whole(artifact, data, tmp_path):
    path = tmp_path / "a.cgc"
    path.write_bytes(b"\xff" * (len(data) + 4096))  # longer than the artifact
    artifact.save(path)
    assert path.read_bytes() == data
    assert os.listdir(tmp_path) == ["a.cgc"]


def test_failed_save_cleans_up(artifact, tmp_path):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        artifact.save(target)  # os.replace cannot put a file over a directory
    assert sorted(os.listdir(tmp_path)) == ["taken"]
    assert os.listdir(target) == ["keep"]


def test_weights_keep_their_shape_through_safetensors():
    """0-d tensors stay 0-d; extended types keep their dtype."""
    import ml_dtypes

    weights = {
        "scalar": np.array(2.5, np.float32),
        "bf16": np.ones((2, 1), ml_dtypes.bfloat16),
        "int4": np.zeros((), ml_dtypes.int4),
    }
    back = weights_from_bytes(weights_to_bytes(weights))
    for name, value in weights.items():
        assert back[name].shape == value.shape and back[name].dtype == value.dtype, name
        np.testing.assert_array_equal(back[name].astype(np.float32), value.astype(np.float32))


def test_npz_bytes_takes_any_array_name():
    """Outputs named like np.savez's own keywords (``file``, ``allow_pickle``) are kept."""
    arrays = {"file": np.arange(3), "allow_pickle": np.ones((2, 2), np.float32), "x.y": 1.5}
    with np.load(io.BytesIO(npz_bytes(arrays)), allow_pickle=False) as archive:
        assert sorted(archive.files) == sorted(arrays)
        for name, value in arrays.items():
            np.testing.assert_array_equal(archive[name], value)


def test_a_program_without_a_batch_axis_runs_once(artifact):
    """A manifest that says it runs a program without a batch axis more than once is
    refused: nothing would tell the runs apart (a fuzzed count of 2**64 once overflowed)."""
    manifest = copy.deepcopy(artifact.manifest)
    manifest.update(micro_batches=2**64, per_system_batch=None, micro_batch=None)
    for spec in (*manifest["inputs"], *manifest["outputs"]):
        spec["batch_axis"] = None
    with pytest.raises(CgcError, match="micro_batches: 18446744073709551616 runs of a program"):
        check_manifest(manifest)
