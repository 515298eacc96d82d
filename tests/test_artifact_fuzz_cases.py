"""Artifacts that a tool (or a fuzzer) rewrote with their checksums recomputed: each is refused
on reading with one line naming the culprit, and ``cgc inspect`` and ``cgc run`` exit 2."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import random
import struct
from collections.abc import Callable

import numpy as np
import pytest
import test_artifact
from click.testing import CliRunner
from test_artifact import ENTRY, HEADER

import cgc
from cgc.cli import main
from cgc.errors import CgcError
from cgc.files import npz_bytes
from cgc.frontends import zoo
from cgc.machine.program.artifact import FORMAT_VERSION, MAGIC, Artifact, ArtifactError
from cgc.machine.program.bytecode import Opcode, Program
from cgc.machine.program.manifest import MAX_JSON_DEPTH, SCHEMA, json_depth, validate
from cgc.runtime.cluster import Cluster
from cgc.tools.report import inspect_json, summary_text


@pytest.fixture(scope="module")
def trained() -> Artifact:
    model = zoo.MODELS["mlp_train"]()
    return cgc.prepare_training(model, batch_size=4, target="mesh8x8", optimizer="sgd")[0]


artifact = test_artifact.artifact  # the fixtures: a small pipelined mlp, and its file
data = test_artifact.data


# -- building files ---------------------------------------------------------------------------


def payloads(data: bytes) -> list[tuple[str, bytes]]:
    """The sections of a file, in table order."""
    _, _, count = HEADER.unpack_from(data)
    out = []
    for i in range(count):
        raw, offset, length, _ = ENTRY.unpack_from(data, HEADER.size + i * ENTRY.size)
        out.append((raw.rstrip(b"\0").decode(), data[offset : offset + length]))
    return out


def assemble(sections: list[tuple[str, bytes]], offsets: list[int] | None = None) -> bytes:
    """A file of these sections with their checksums (payloads one after the other unless
    ``offsets`` says where the table claims they start)."""
    start = HEADER.size + ENTRY.size * len(sections)
    table, body = b"", b""
    for i, (name, payload) in enumerate(sections):
        offset = start + len(body) if offsets is None else offsets[i]
        digest = hashlib.sha256(payload).digest()
        table += ENTRY.pack(name.encode(), offset, len(payload), digest)
        body += payload
    return HEADER.pack(MAGIC, FORMAT_VERSION, len(sections)) + table + body


def replaced(data: bytes, section: str, payload: bytes) -> bytes:
    return assemble([(n, payload if n == section else p) for n, p in payloads(data)])


def with_manifest(art: Artifact, change: Callable[[dict], None]) -> bytes:
    manifest = copy.deepcopy(art.manifest)
    change(manifest)
    return replaced(art.to_bytes(), "manifest", json.dumps(manifest).encode())


def with_program(art: Artifact, change: Callable[[Program], Program]) -> bytes:
    program = Program(list(art.program.instructions), art.program.registers, art.program.layers)
    return replaced(art.to_bytes(), "bytecode", change(program).encode())


def refused(data: bytes) -> str:
    """The one-line message of a file refused on reading."""
    with pytest.raises(ArtifactError) as raised:
        Artifact.from_bytes(data, "x.cgc")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("x.cgc: ")
    return message


# -- the manifest -----------------------------------------------------------------------------


def test_the_schema_holds_every_manifest_the_compiler_writes(artifact, trained):
    for art in (artifact, trained):
        validate(art.manifest, SCHEMA)


def _set(path: str, value) -> Callable[[dict], None]:
    def change(manifest: dict) -> None:
        *keys, last = path.split(".")
        node = manifest
        for key in keys:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is _DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


_DELETE = object()

MANIFEST_CASES = [
    ("mode", _DELETE, "x.cgc: manifest: mode: missing"),
    ("mode", "turbo", 'x.cgc: manifest: mode: expected one of "pipelined", "weight_streaming", '),
    ("num_csx", -1, "x.cgc: manifest: num_csx: expected at least 1, got -1"),
    ("num_csx", True, "x.cgc: manifest: num_csx: expected a whole number, got true"),
    ("micro_batch", 5, "x.cgc: manifest: per_system_batch: 4 is not micro_batch 5 x "),
    ("inputs.0.shape.1", -64, "x.cgc: manifest: inputs[0].shape[1]: expected at least 0, got -64"),
    ("inputs.0.dtype", "object", 'x.cgc: manifest: inputs[0].dtype: expected one of "bool", '),
    ("outputs.0.batch_axis", 3, "x.cgc: manifest: outputs[0].batch_axis: expected at most 0"),
    ("layers.0.rect", [0, 0, 8], "x.cgc: manifest: layers[0].rect: expected 4 items, got 3"),
    ("layers.1.flops", "many", 'x.cgc: manifest: layers[1].flops: expected a number, got "many"'),
    ("layers.0.name", "other", "x.cgc: bytecode: layer 0 is not layers[0] of the manifest"),
    ("layers", [], "x.cgc: bytecode: 3 layers, the manifest lists 0"),
    ("colour", "red", "x.cgc: manifest: colour: unknown key"),
    ("declared_weights", {"fc1.bias": {"shape": [32], "dtype": "float32"}},
     "x.cgc: weights: \"fc1.bias\" is stored and also declared without data"),
    ("layers.0.weights.0", "fc9.weight",
     "x.cgc: bytecode: layer 0 is not layers[0] of the manifest"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "message"), MANIFEST_CASES)
def test_a_manifest_that_does_not_fit_its_schema(artifact, path, value, message):
    assert refused(with_manifest(artifact, _set(path, value))).startswith(message)


TRAINING_CASES = [
    ("training.optimizer.lr", "x",
     'x.cgc: manifest: training.optimizer.lr: expected a number, got "x"'),
    ("training.optimizer.lr", -1.0, "x.cgc: manifest: training.optimizer: lr -1: must be >= 0"),
    ("training.optimizer.momentum", _DELETE,
     "x.cgc: manifest: training.optimizer.momentum: missing"),
    ("training.optimizer.optimizer", "lion", 'x.cgc: manifest: training.optimizer.optimizer: '),
    ("training.loss_scale", 0, "x.cgc: manifest: training.loss_scale: expected more than 0"),
    ("training.buffers", [{"buffer": "fc1.bias", "output": 5, "momentum": 0.1}],
     "x.cgc: manifest: training.buffers[0].output: expected a string or null, got 5"),
    ("training.buffers", [{"buffer": "fc1.bias", "output": "nope", "momentum": 0.1}],
     'x.cgc: manifest: training.buffers[0].output: "nope" is not an output'),
    ("training.buffers", [{"buffer": "fc1.bias", "output": None, "momentum": 2}],
     "x.cgc: manifest: training.buffers[0].momentum: expected at most 1, got 2"),
    ("training.trainable", ["fc1.bias", "ghost"],
     'x.cgc: manifest: training.trainable: "ghost" is neither stored nor declared'),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "message"), TRAINING_CASES)
def test_a_training_manifest_that_does_not_fit_its_schema(trained, path, value, message):
    assert refused(with_manifest(trained, _set(path, value))).startswith(message)


def test_training_buffers_that_fit_are_read(trained):
    update = {"buffer": "fc1.bias", "output": None, "momentum": 0.0}
    data = with_manifest(trained, _set("training.buffers", [update]))
    assert Artifact.from_bytes(data).manifest["training"]["buffers"] == [update]


def test_a_deeply_nested_manifest_is_refused_without_recursing(artifact):
    deep = b"[" * 100_000 + b"]" * 100_000
    message = refused(replaced(artifact.to_bytes(), "manifest", deep))
    assert f"nests 100000 levels deep (at most {MAX_JSON_DEPTH})" in message


def test_json_depth_skips_strings():
    assert json_depth(b'{"a": ["[[[", {"b": "\\"]]"}]}') == 3
    assert json_depth(b"") == 0


# -- the section table ------------------------------------------------------------------------


def test_trailing_bytes(data):
    assert "7 trailing bytes after the last section" in refused(data + b"\0" * 7)


def test_a_duplicated_section(data):
    sections = payloads(data)
    message = refused(assemble([*sections, sections[2]]))
    assert message == "x.cgc: section 'ir' appears twice in the section table"


def test_an_unknown_section(data):
    message = refused(assemble([*payloads(data), ("extra", b"{}")]))
    assert message == "x.cgc: artifact has an unknown section 'extra'"


@pytest.mark.parametrize("shift", [-1, 1])
def test_overlapping_or_gapped_sections(data, shift):
    sections = payloads(data)
    start = HEADER.size + ENTRY.size * len(sections)
    offsets = [start]
    for _, payload in sections[:-1]:
        offsets.append(offsets[-1] + len(payload))
    offsets[3] += shift
    bad = assemble(sections, offsets)
    bad = bad if shift < 0 else bad + b"\0"  # the last section still inside the file
    assert "section 'weights' starts at byte" in refused(bad)


def test_an_offset_past_the_end(data):
    sections = payloads(data)
    offsets = [2**63, 0, 0, 0]
    assert "truncated artifact (section 'manifest' ends at byte" in refused(
        assemble(sections, offsets)
    )


# -- the bytecode ------------------------------------------------------------------------------


def _at(position: int, **changes) -> Callable[[Program], Program]:
    def change(program: Program) -> Program:
        program.instructions[position] = dataclasses.replace(
            program.instructions[position], **changes
        )
        return program

    return change


def _first(program: Program, opcode: Opcode) -> int:
    return next(i for i, ins in enumerate(program.instructions) if ins.opcode == opcode)


BYTECODE_CASES = [
    (lambda p: _at(1, opcode=60), "instruction 1: unknown opcode 60"),
    (lambda p: _at(1, opcode=9999), "instruction 1: unknown opcode 9999"),
    (lambda p: _at(0, opcode=Opcode.FREE), "instruction 0 (free): expected a layer instruction"),
    (lambda p: _at(1, attrs={"index": 7}), "instruction 1 (input): input 7 does not exist"),
    (lambda p: _at(1, attrs={"index": "0"}),
     'instruction 1 (input): index: expected a whole number, got "0"'),
    (lambda p: _at(1, attrs={"index": 0, "x": 1}), "instruction 1 (input): x: unknown key"),
    (lambda p: _at(0, attrs={"layer": 9}), "instruction 0 (layer): layer 9 does not exist"),
    (lambda p: _at(2, attrs={"name": "ghost"}), 'instruction 2 (weight): name: no weight "ghost"'),
    (lambda p: _at(2, attrs={"name": "fc1.bias"}),
     'instruction 2 (weight): weight "fc1.bias" of shape [32] does not fill [64, 32]'),
    (lambda p: _at(2, attrs={"name": "fc1.weight", "perm": [0, 0]}),
     "instruction 2 (weight): perm: [0, 0] does not permute the 2 axes of [64, 32]"),
    (lambda p: _at(1, results=(5,)),
     "instruction 1 (input): its register is not of the shape and type of inputs"),
    (lambda p: _at(4, operands=(0, 3)),
     "instruction 4 (fused_matmul): reads register 3, which holds "),
    (lambda p: _at(10, operands=(0,)), "instruction 10 (free): reads register 0, which holds "),
    (lambda p: _at(_first(p, Opcode.OUTPUT), operands=(9, 9)),
     "(output): expected 0 results and 1 operands, got 0 and 2"),
    (lambda p: _at(_first(p, Opcode.OUTPUT), attrs={"index": 0, "name": 3}),
     "(output): name: unknown key"),
    (lambda p: _at(1, attrs=[0]), "instruction 1 (input): attributes: expected an object, got [0]"),
    (lambda p: _at(1, location=7), "instruction 1 (input): location: expected a string, got 7"),
    (lambda p: lambda q: Program(q.instructions, q.registers, q.layers[:2]),
     "bytecode: 2 layers, the manifest lists 3"),
    (lambda p: lambda q: Program(q.instructions[:-2], q.registers, q.layers),
     'bytecode: no instruction writes output "logits"'),
    (lambda p: lambda q: Program(q.instructions, [((4, -64), "float32"), *q.registers[1:]],
                                 q.layers),
     "bytecode: register 0: shape[1]: expected at least 0, got -64"),
    (lambda p: lambda q: Program(q.instructions, [((4, 64), "object"), *q.registers[1:]],
                                 q.layers),
     'bytecode: register 0: dtype: expected one of "bool", '),
]  # fmt: skip


@pytest.mark.parametrize(("make", "message"), BYTECODE_CASES)
def test_a_bad_program(artifact, make, message):
    assert message in refused(with_program(artifact, make(artifact.program)))


def test_a_bad_optimizer_step(trained):
    def change(program: Program) -> Program:
        position = _first(program, Opcode.OPTIMIZER_STEP)
        attrs = {"optimizer": "sgd", "config": {"lr": -1.0}}
        return _at(position, attrs=attrs)(program)

    assert "(optimizer_step): lr -1: must be >= 0" in refused(with_program(trained, change))


def test_a_layer_outside_the_mesh(artifact):
    def change(program: Program) -> Program:
        layers = list(program.layers)
        layers[0] = dataclasses.replace(layers[0], rect=(6, 0, 8, 4))
        return Program(program.instructions, program.registers, layers)

    manifest_too = with_program(artifact, change)
    manifest = json.loads(dict(payloads(manifest_too))["manifest"])
    manifest["layers"][0]["rect"] = [6, 0, 8, 4]
    bad = replaced(manifest_too, "manifest", json.dumps(manifest).encode())
    assert "bytecode: layer 0 at [6, 0, 8, 4] is outside the 8x8 mesh" in refused(bad)


def test_a_deeply_nested_bytecode_table(artifact):
    code = artifact.program.encode()
    deep = b"[" * 100_000 + b"]" * 100_000
    bad = code[:8] + struct.pack("<I", len(deep)) + code[12:16] + deep
    assert "malformed artifact" in refused(replaced(artifact.to_bytes(), "bytecode", bad))


# -- the weights -------------------------------------------------------------------------------


def _weights(data: bytes, header: dict | bytes, body: bytes = b"") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return replaced(data, "weights", struct.pack("<Q", len(text)) + text + body)


def test_a_weights_header_larger_than_the_section(data):
    bad = replaced(data, "weights", struct.pack("<Q", 2**62) + b"{}")
    assert "the weights' safetensors header claims 4611686018427387904 bytes" in refused(bad)


def test_a_deeply_nested_weights_header(data):
    bad = _weights(data, b"[" * 100_000 + b"]" * 100_000)
    assert "safetensors header nests 100000 levels deep" in refused(bad)


def test_weights_the_manifest_does_not_name(artifact):
    weights = {**artifact.weights, "stowaway": np.zeros(3, np.float32)}
    other = Artifact(artifact.manifest, artifact.program, artifact.ir, weights)
    assert refused(other.to_bytes()) == (
        'x.cgc: weights: tensor "stowaway" is not a weight of the manifest'
    )


def test_weights_the_manifest_names_but_that_are_missing(artifact):
    weights = {k: v for k, v in artifact.weights.items() if k != "fc2.bias"}
    other = Artifact(artifact.manifest, artifact.program, artifact.ir, weights)
    assert refused(other.to_bytes()) == (
        'x.cgc: manifest: layers[1].weights: "fc2.bias" is neither stored nor declared'
    )


def test_a_weight_of_another_shape(artifact):
    weights = {**artifact.weights, "fc3.bias": np.zeros(11, np.float32)}
    other = Artifact(artifact.manifest, artifact.program, artifact.ir, weights)
    assert 'weight "fc3.bias" of shape [11] does not fill [10]' in refused(other.to_bytes())


def test_bad_extended_dtype_metadata(data):
    header = {"__metadata__": {"cgc.dtypes": '{"w": "object"}'},
              "w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}  # fmt: skip
    assert "cgc.dtypes metadata names 'w': 'object'" in refused(_weights(data, header, b"\0"))


# -- the command line --------------------------------------------------------------------------

BAD_FILES: dict[str, Callable[[Artifact, bytes], bytes]] = {
    "missing-target": lambda a, d: with_manifest(a, _set("target", _DELETE)),
    "missing-mode": lambda a, d: with_manifest(a, _set("mode", _DELETE)),
    "deep-json": lambda a, d: replaced(d, "manifest", b"[" * 100_000 + b"]" * 100_000),
    "trailing": lambda a, d: d + b"junk",
    "duplicated": lambda a, d: assemble([*payloads(d), payloads(d)[0]]),
    "bad-opcode": lambda a, d: with_program(a, _at(1, opcode=60)),
    "bad-magic": lambda a, d: b"PK\3\4" + d[4:],
    "impossible-target": lambda a, d: with_manifest(a, _set("target.rows", 0)),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["inspect", "run"])
def test_the_command_line_exits_2(artifact, data, tmp_path, case, command):
    path = tmp_path / "bad.cgc"
    path.write_bytes(BAD_FILES[case](artifact, data))
    inputs = tmp_path / "in.npz"
    inputs.write_bytes(npz_bytes({"x": np.zeros((4, 64), np.float32)}))
    args = [command, str(path)] + (["--inputs", str(inputs)] if command == "run" else [])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), result.stderr


# -- random mutations --------------------------------------------------------------------------


def _mutations(data: bytes, rng: random.Random) -> list[bytes]:
    """~200 sections mutated (one byte changed, cut short, or a run of bytes spliced in from
    elsewhere), with the file's checksums recomputed, and files cut or spliced as a whole."""
    sections = payloads(data)
    out = []
    for i in range(200):
        kind = i % 4
        if kind == 3:  # the whole file, checksums and all
            cut = rng.randrange(len(data))
            out.append(data[:cut] + data[rng.randrange(len(data)) :][: rng.randrange(64)])
            continue
        index = rng.randrange(len(sections))
        name, payload = sections[index]
        body = bytearray(payload)
        if kind == 0:
            body[rng.randrange(len(body))] = rng.randrange(256)
        elif kind == 1:
            del body[rng.randrange(len(body)) :]
        else:
            start = rng.randrange(len(body))
            source = rng.randrange(len(body))
            body[start : start + rng.randrange(1, 16)] = payload[source : source + 16]
        out.append(assemble([(n, bytes(body) if n == name else p) for n, p in sections]))
    return out


def test_random_mutations_raise_only_cgc_errors(artifact, data):
    """Whatever a mutated file holds, reading, inspecting and running it raises nothing but
    a CgcError (or works)."""
    accepted = 0
    x = {"x": np.zeros((4, 64), np.float32)}
    for mutated in _mutations(data, random.Random(13)):
        try:
            art = Artifact.from_bytes(mutated, "m.cgc")
        except CgcError as e:
            assert "\n" not in str(e)
            continue
        accepted += 1
        summary_text(art)
        inspect_json(art)
        art.program.disassemble()
        with contextlib.suppress(CgcError):  # e.g. a run the changed program cannot make
            Cluster(art).infer(x)
    assert accepted < 200  # most mutations are caught
