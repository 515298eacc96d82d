"""The fuzzer over cgc's doors (ONNX files, artifacts, options and files, aliased paths, special
files, full disks, concurrent runs, hostile params files, factories, edge values): no case may
end in an internal error, a wrong result, a lost or half-written file, a hang or a memory-cap
hit. The harness itself is checked first, on hand-made results and on commands made to
misbehave, so that a green run means something."""

from __future__ import annotations

import errno
import json
import os
import random
import resource
import signal
import stat
import sys
import time
from pathlib import Path

import click
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from cgc.machine.program.artifact import weights_to_bytes
from cgc.tools import fuzz, fuzz_reference, fuzz_worker
from cgc.tools import fuzz_mutators as mut
from cgc.tools.fuzz_artifacts import pack_artifact, unpack_artifact
from cgc.tools.fuzz_cases import DIR, Fills, FuzzCase, SetupFiles, Step, edge_inputs, npz
from cgc.tools.fuzz_seeds import seed_models

SEED = 13
COUNTS = {
    "onnx": 120, "artifact": 150, "options": 150, "alias": 60, "special": 60, "fulldisk": 60,
    "concurrent": 5, "yaml": 40, "factory": 12, "numeric": 40,
}  # fmt: skip
"""Cases per family of the suite's run: a fixed, seeded sample (about 60 s on two idle cores,
90 s while others use them), so that its outcome does not depend on how fast the machine is."""


def _record(code: int, stderr: str, **extra) -> dict:
    return {"args": ["compile"], "exit": code, "stderr": stderr, **extra}


@pytest.mark.parametrize(
    ("results", "category"),
    [
        ([_record(0, "")], "success"),
        ([_record(2, "error: m.onnx: node 'a' (Relu): bad\n")], "clean"),
        ([_record(2, "Usage: cgc run\nTry 'cgc run --help' for help.\n\nError: bad\n")], "clean"),
        ([_record(2, "")], "internal"),
        ([_record(2, "error: one\nerror: two\n")], "internal"),
        ([_record(1, "internal error: KeyError: 'x' (rerun with --debug)\n")], "internal"),
        ([_record(1, "internal error: MemoryError: Unable to allocate\n")], "memcap"),
        ([_record(2, "error: x: too large (MemoryError)\n")], "memcap"),
        ([_record(0, "", checked=True, mismatch="output 'y' differs")], "wrong"),
        ([_record(0, "", mismatch="exit 0 without its output out.cgc")], "wrong"),
        ([_record(0, ""), {"died": "hang"}], "hang"),
        ([{"died": "signal 9"}], "memcap"),
        # what reached file descriptor 2 past click is part of the message
        ([_record(2, "error: f.py:factory: no module\n", leaked="UserWarning: careful")],
         "internal"),
        # a factory's own MemoryError, named in one line, is no memory-cap hit
        ([_record(2, "error: f.py:factory: MemoryError: no\n", planted="MemoryError")], "clean"),
        ([_record(0, ""), {"door": "compile", "lost": "input m.onnx changed"}], "lost"),
        ([_record(2, "error: x\n", lost="out.cgc changed by a command that failed")], "lost"),
        ([_record(2, "error: x\n", partial="out.cgc written by a command that failed")],
         "partial"),
        ([_record(0, ""), {"door": "train", "partial": "temporary run/.w.abcd1234 left"}],
         "partial"),
        # data loss outranks the exit code it came with
        ([_record(1, "internal error: OSError: x\n"), {"door": "run", "lost": "input"}], "lost"),
        ([_record(0, ""), _record(-9, "", background=True)], "internal"),
        ([_record(0, ""), _record(2, "error: run: locked by another run\n", background=True)],
         "clean"),
    ],
)  # fmt: skip
def test_the_oracle(results, category):
    assert fuzz.classify(results).category == category


def test_the_signature_groups_equal_defects():
    a = fuzz.classify([_record(1, "internal error: KeyError: 'w1' at /tmp/a/b 12\n")])
    b = fuzz.classify([_record(1, "internal error: KeyError: 'fc2' at /tmp/c/d 7\n")])
    assert a.signature == b.signature and a.signature.startswith("KeyError")


# -- the worker's checks, on commands made to misbehave ----------------------------------------


@click.group()
def fake() -> None:
    """Commands that do to their files what a faulty cgc might."""


@fake.command()
@click.argument("path")
def overwrite(path: str) -> None:
    Path(path).write_bytes(b"clobbered")


@fake.command()
@click.argument("path")
def fail_writing(path: str) -> None:
    Path(path).write_bytes(b"half")
    click.echo("error: disk full", err=True)
    sys.exit(2)


@fake.command()
@click.argument("path")
def litter(path: str) -> None:
    Path(path).mkdir(exist_ok=True)
    (Path(path) / ".weights.safetensors.a1b2c3d4").write_bytes(b"part")


@fake.command()
@click.argument("path")
def read(path: str) -> None:
    Path(path).read_bytes()


@fake.command()
@click.argument("path")
@click.argument("size", type=int)
def write(path: str, size: int) -> None:
    Path(path).write_bytes(bytes(size))


@fake.command()
@click.argument("path")
def replace(path: str) -> None:
    Path(path + ".new").write_bytes(b"data")
    os.replace(path + ".new", path)


@fake.command()
def leak() -> None:
    os.write(2, b"W1128 torch/_export: a guard failed\n")
    click.echo("error: the model cannot be captured", err=True)
    sys.exit(2)


def _run(tmp_path: Path, case: FuzzCase, timeout: float = 20.0) -> list[dict]:
    case.write(tmp_path / "case")
    return fuzz_worker.run_case(CliRunner(), fake, tmp_path / "case", case, timeout)


def test_a_changed_input_is_lost_whatever_the_exit(tmp_path):
    case = FuzzCase(0, "t", "", [Step(["overwrite", f"{DIR}/m.onnx"])], {"m.onnx": b"model"},
                inputs=["m.onnx"])  # fmt: skip
    results = _run(tmp_path, case)
    assert results[0]["exit"] == 0
    assert fuzz.classify(results).category == "lost"


def test_a_file_changed_or_written_by_a_command_that_failed(tmp_path):
    old = FuzzCase(0, "t", "", [Step(["fail-writing", f"{DIR}/out.cgc"])], {"out.cgc": b"old"})
    assert fuzz.classify(_run(tmp_path / "old", old)).category == "lost"
    step = Step(["fail-writing", f"{DIR}/out.cgc"], outputs=[("out.cgc", "artifact")])
    assert fuzz.classify(_run(tmp_path / "new", FuzzCase(0, "t", "", [step]))).category == "partial"


def test_an_output_missing_or_of_another_kind_after_exit_0_is_wrong(tmp_path):
    missing = Step(["read", f"{DIR}/in"], outputs=[("out.cgc", "artifact")])
    results = _run(tmp_path / "a", FuzzCase(0, "t", "", [missing], {"in": b""}))
    assert fuzz.classify(results).signature == "silently wrong: exit N without its output out.cgc"
    other = Step(["overwrite", f"{DIR}/out.npz"], outputs=[("out.npz", "npz")])
    assert fuzz.classify(_run(tmp_path / "b", FuzzCase(0, "t", "", [other]))).category == "wrong"


def test_a_special_file_an_output_replaced_is_lost_even_after_exit_0(tmp_path):
    step = Step(["replace", f"{DIR}/out.npz"], outputs=[("out.npz", "npz")])
    case = FuzzCase(0, "t", "", [step], specials={"out.npz": ("device", "/dev/null")})
    results = _run(tmp_path, case)
    assert results[0]["exit"] == 0
    assert fuzz.classify(results).message == "out.npz, a device replaced or removed (exit 0)"


def test_a_temporary_left_behind_is_partial(tmp_path):
    results = _run(tmp_path, FuzzCase(0, "t", "", [Step(["litter", f"{DIR}/run"])]))
    verdict = fuzz.classify(results)
    assert verdict.category == "partial" and "run/.weights.safetensors" in verdict.message


def test_a_line_past_click_on_descriptor_2_counts(tmp_path):
    results = _run(tmp_path, FuzzCase(0, "t", "", [Step(["leak"])]))
    assert "a guard failed" in results[0]["leaked"]
    assert fuzz.classify(results).signature.startswith("exit 2 with 2-line message")


def test_a_fifo_no_one_writes_is_a_hang_not_a_wedged_worker(tmp_path):
    """SIGALRM interrupts the blocking open of a FIFO in the main thread."""
    case = FuzzCase(0, "t", "", [Step(["read", f"{DIR}/pipe"])], specials={"pipe": ("fifo", "")},
                timeout=1.0)  # fmt: skip
    start = time.monotonic()
    results = _run(tmp_path, case)
    assert results == [{"died": "hang", "door": "read"}] and time.monotonic() - start < 10
    assert signal.getsignal(signal.SIGALRM) is not fuzz_worker._on_alarm


def test_a_write_past_the_size_limit_fails_and_the_limit_is_restored(tmp_path):
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as the worker does
    try:
        case = FuzzCase(0, "t", "", [Step(["write", f"{DIR}/big", "10000"])], fsize=1024)
        results = _run(tmp_path, case)
    finally:
        signal.signal(signal.SIGXFSZ, previous)
    assert results[0]["exit"] == 1 and os.strerror(errno.EFBIG) in results[0]["escaped"]
    assert (tmp_path / "case" / "big").stat().st_size == 1024
    assert resource.getrlimit(resource.RLIMIT_FSIZE) == before


def _train_dir(root: Path, steps: list[int], checkpoints: list[int], weights: bool = True):
    root.mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in steps]
    (root / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    if weights:
        (root / "weights.safetensors").write_bytes(weights_to_bytes({"w": np.ones(2, "f4")}))
    for k in checkpoints:
        (root / "checkpoints" / f"step-{k}").mkdir(parents=True)


@pytest.mark.parametrize(
    ("steps", "checkpoints", "weights", "problem"),
    [
        ([1, 2, 3, 4], [2, 4], True, None),
        ([1, 2, 1, 2], [2, 4], True, "are not 1..n"),
        ([1, 2, 3], [], True, "metrics.jsonl of 3 steps with weights is no one run's"),
        ([1, 2, 3, 4], [2, 3, 4], True, "checkpoints [2, 3, 4] are not of the run"),
        # without weights, the run that failed part-way left it: its period, 3
        ([1, 2, 3], [3], False, None),
        ([1, 2, 3, 4], [2, 4], False, "checkpoints [2, 4] are not of the run"),
        ([1, 2, 3, 4, 5, 6, 7], [3, 6], False, "metrics.jsonl of 7 steps without weights"),
    ],
)
def test_a_model_dir_two_runs_wrote_ends_as_one_run_left_it(tmp_path, steps, checkpoints,
                                                           weights, problem):  # fmt: skip
    _train_dir(tmp_path / "run", steps, checkpoints, weights)
    runs = [(Fills("train", "run", 4, 2), 0), (Fills("train", "run", 6, 3), 2)]
    found = fuzz_worker._train_dir_problem(tmp_path / "run", runs, lambda p: p.is_file())
    assert (found is None) if problem is None else (problem in found)


# -- cases, inputs, references -----------------------------------------------------------------


def test_a_case_makes_its_special_files_and_its_replay_makes_them_again(tmp_path):
    case = FuzzCase(0, "special", "d", [Step(["run", f"{DIR}/a"], background=True),
                                    Step(["run", f"{DIR}/b"], delay=0.5)],
                files={"in.npz": b"x"}, fsize=1000,
                specials={"p": ("fifo", ""), "s": ("socket", ""), "n": ("device", "/dev/null"),
                          "l": ("symlink", "in.npz"), "h": ("hardlink", "in.npz")})  # fmt: skip
    case.write(tmp_path / "c")
    modes = {n: os.lstat(tmp_path / "c" / n).st_mode for n in "psnlh"}
    assert stat.S_ISFIFO(modes["p"]) and stat.S_ISSOCK(modes["s"]) and stat.S_ISLNK(modes["l"])
    assert stat.S_ISCHR(os.stat(tmp_path / "c" / "n").st_mode)
    assert os.stat(tmp_path / "c" / "h").st_ino == os.stat(tmp_path / "c" / "in.npz").st_ino
    script = case.replay()
    assert 'mkfifo "$D"/p' in script and 'ln -f "$D"/in.npz "$D"/h' in script
    assert "ulimit -f 2" in script and script.splitlines()[-1] == "wait"
    assert "(trap '' XFSZ; ulimit -f 2; cgc run \"$D\"/a) &" in script


def test_edge_inputs_mix_the_types_extremes_deterministically():
    manifest = {"inputs": [{"name": "i", "shape": [64], "dtype": "int8"},
                           {"name": "f", "shape": [64], "dtype": "float32"}]}  # fmt: skip
    drawn = [edge_inputs(manifest, seed) for seed in range(6)]
    ints = np.concatenate([d["i"] for d in drawn])
    floats = np.concatenate([d["f"] for d in drawn])
    assert ints.dtype == np.int8 and {-128, 127, -1, 0, 1} <= set(ints.tolist())
    assert np.isnan(floats).any() and np.isposinf(floats).any() and np.isneginf(floats).any()
    assert (np.signbit(floats) & (floats == 0)).any() and (np.abs(floats) < 1e-38).any()
    again = edge_inputs(manifest, 3)
    assert all(np.array_equal(again[k], drawn[3][k], equal_nan=True) for k in again)


def test_a_reference_that_dies_is_no_reference():
    assert fuzz_reference.isolated(lambda: {"y": np.ones(2)})[0] == "ok"
    assert fuzz_reference.isolated(lambda: os.kill(os.getpid(), signal.SIGFPE))[0] == "crashed"

    def rejects() -> dict:
        raise fuzz_reference.Rejected("index 9 out of range")

    assert fuzz_reference.isolated(rejects) == ("rejected", "index 9 out of range")


def _gather_model(path: Path) -> None:
    node = helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [3])],
        [numpy_helper.from_array(np.arange(5, dtype=np.int64) * 10, "table")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_integers_are_compared_exactly_and_rejected_inputs_must_not_give_outputs(tmp_path):
    _gather_model(tmp_path / "m.onnx")
    np.savez(tmp_path / "inputs.npz", ids=np.array([0, 4, 1]))
    np.savez(tmp_path / "outputs.npz", y=np.array([0, 40, 10]))
    assert fuzz_reference.compare(tmp_path, "m.onnx", exact=True) == (True, None)
    np.savez(tmp_path / "outputs.npz", y=np.array([0, 40, 11]))
    assert "differs at (2,): 11 != 10" in fuzz_reference.compare(tmp_path, "m.onnx", True)[1]
    np.savez(tmp_path / "inputs.npz", ids=np.array([0, 9, 1]))  # out of range
    checked, mismatch = fuzz_reference.compare(tmp_path, "m.onnx", exact=True)
    assert checked and "cgc ran inputs the reference rejects" in mismatch
    assert fuzz_reference.compare(tmp_path, "m.onnx", exact=False) == (False, None)


def test_an_ill_conditioned_output_is_judged_against_float64(tmp_path):
    """x @ w minus nearly all of it, then its reciprocal: onnxruntime's float32 is far from the
    exact value. Outputs nearer the exact value than onnxruntime's pass; farther ones fail."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 4)) * 100).astype(np.float32)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    almost = (x.astype(np.float64) @ w.astype(np.float64) - 1e-3).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Sub", ["m", "c"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(almost, "c")],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx"
    )
    np.savez(tmp_path / "inputs.npz", x=x)
    exact = fuzz_reference._in_float64(tmp_path / "m.onnx", {"x": x}, "y")
    assert exact is not None
    np.savez(tmp_path / "outputs.npz", y=exact.astype(np.float32))
    assert fuzz_reference.compare(tmp_path, "m.onnx") == (True, None)
    np.savez(tmp_path / "outputs.npz", y=(1.5 * exact).astype(np.float32))
    checked, mismatch = fuzz_reference.compare(tmp_path, "m.onnx")
    assert checked and mismatch is not None and "differs" in mismatch


def test_the_rechecksummed_artifact_passes_the_checksums():
    from cgc.machine.program.artifact import Artifact, ArtifactError

    version, sections = 3, [(b"manifest", b"{}"), (b"bytecode", b"x"), (b"ir", b""),
                            (b"weights", b"")]  # fmt: skip
    data = pack_artifact(version, sections)
    assert unpack_artifact(data) == (version, sections)
    with pytest.raises(ArtifactError) as error:  # gets past the checksums to the decoders
        Artifact.from_bytes(data)
    assert "checksum" not in str(error.value)


def _fake_setup() -> SetupFiles:
    """Setup files good enough to make cases from (none is run)."""
    models = seed_models()
    arrays = {"x": np.zeros((4, 8), np.float32), "labels": np.zeros(4, np.int64)}
    manifest = {"mode": "pipelined", "inputs": [{"name": "x", "shape": [2, 8], "dtype": "f4"}]}
    artifact = pack_artifact(3, [
        (b"manifest", json.dumps(manifest).encode()), (b"bytecode", b"code" * 4),
        (b"ir", b"module {}"), (b"weights", weights_to_bytes({"w": np.ones(4, "f4")})),
    ])  # fmt: skip
    artifacts = dict.fromkeys(("mlp", "conv_ws", "conv_sparse"), artifact)
    inputs = {n: npz(arrays) for n in artifacts}
    run = {"metrics.jsonl": b"{}\n", "weights.safetensors": b"w"}
    return SetupFiles(models, artifacts, inputs, b"train", arrays, b"module {}", run)


def test_cases_are_deterministic():
    first = [mut.mutate_model(m, random.Random(1))[1] for m in seed_models().values()]
    again = [mut.mutate_model(m, random.Random(1))[1] for m in seed_models().values()]
    assert first == again
    setup = _fake_setup()
    for family in fuzz.FAMILIES:
        for index in range(60):
            a, b = (fuzz.make_case(family, index, SEED, setup) for _ in range(2))
            assert (a.description, a.files, a.specials, a.commands("D")) == (
                b.description, b.files, b.specials, b.commands("D")
            )  # fmt: skip


@pytest.mark.slow
def test_no_case_fails_the_oracle(tmp_path):
    counts = {family: n for family, n in COUNTS.items() if family in fuzz.FAMILIES}
    report = fuzz.run_fuzz(counts, seed=SEED, keep=str(tmp_path / "cases"))
    print("\n".join(fuzz.describe(report)))
    assert report.cases == sum(counts.values())
    assert report.checked > 0, "no case was compared with a reference"
    bad = [
        f"case {c['id']} [{c['family']}/{c['door']}] {c['category']}: {c['signature']}\n"
        f"    {c['description']}\n    " + "\n    ".join(c["commands"])
        for c in report.bad
    ]
    kept = f"(files and replay.sh of each in {tmp_path / 'cases'}; DIR = a case's directory)"
    assert not bad, f"{len(bad)} cases failed the oracle {kept}:\n" + "\n".join(bad[:50])
