"""The fuzzer over cgc's three doors (ONNX files, artifacts, options and files), on a bounded
budget: no case may end in an internal error, a hang or a memory-cap hit. The harness itself
is checked first on hand-made results, so that a green run means something."""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cgc.tools import fuzz
from cgc.tools import fuzz_mutators as mut

SEED = 13
CASES = 3000
BUDGET = 75.0  # seconds: the run stops there, whatever number of cases it reached


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
        ([_record(0, "", checked=True, mismatch="output 'y' differs")], "internal"),
        ([_record(0, ""), {"died": "hang"}], "hang"),
        ([{"died": "signal 9"}], "memcap"),
    ],
)
def test_the_oracle(results, category):
    assert fuzz.classify(results).category == category


def test_the_signature_groups_equal_defects():
    a = fuzz.classify([_record(1, "internal error: KeyError: 'w1' at /tmp/a/b 12\n")])
    b = fuzz.classify([_record(1, "internal error: KeyError: 'fc2' at /tmp/c/d 7\n")])
    assert a.signature == b.signature and a.signature.startswith("KeyError")


def test_the_rechecksummed_artifact_passes_the_checksums():
    from cgc.machine.artifact import Artifact, ArtifactError

    version, sections = 3, [(b"manifest", b"{}"), (b"bytecode", b"x"), (b"ir", b""),
                            (b"weights", b"")]  # fmt: skip
    data = mut.pack_artifact(version, sections)
    assert mut.unpack_artifact(data) == (version, sections)
    with pytest.raises(ArtifactError) as error:  # gets past the checksums to the decoders
        Artifact.from_bytes(data)
    assert "checksum" not in str(error.value)


def test_cases_are_deterministic():
    first = [mut.mutate_model(m, random.Random(1))[1] for m in mut.seed_models().values()]
    again = [mut.mutate_model(m, random.Random(1))[1] for m in mut.seed_models().values()]
    assert first == again


@pytest.mark.slow
def test_no_case_fails_the_oracle(tmp_path):
    report = fuzz.run_fuzz(CASES, seed=SEED, time_budget=BUDGET, keep=str(tmp_path / "cases"))
    print("\n".join(fuzz.describe(report)))
    assert report.cases >= 300, "the fuzzer ran too few cases to mean anything"
    assert all(sum(counts.values()) for counts in report.counts.values())
    assert report.checked > 0, "no ONNX case was compared with onnxruntime"
    bad = [
        f"case {c['id']} [{c['family']}/{c['door']}] {c['category']}: {c['signature']}\n"
        f"    {c['description']}\n    " + "\n    ".join(c["commands"])
        for c in report.bad
    ]
    kept = f"(files and replay.sh of each in {tmp_path / 'cases'}; DIR = a case's directory)"
    assert not bad, f"{len(bad)} cases failed the oracle {kept}:\n" + "\n".join(bad[:50])


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
    exact = fuzz._in_float64(tmp_path / "m.onnx", {"x": x}, "y")
    assert exact is not None
    np.savez(tmp_path / "outputs.npz", y=exact.astype(np.float32))
    assert fuzz.compare(tmp_path, "m.onnx") == (True, None)
    np.savez(tmp_path / "outputs.npz", y=(1.5 * exact).astype(np.float32))
    checked, mismatch = fuzz.compare(tmp_path, "m.onnx")
    assert checked and mismatch is not None and "differs" in mismatch
