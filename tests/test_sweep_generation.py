"""``cgc sweep`` with ``measure: generation``: a point's figures are ``cgc.generate``'s, its
spec's errors, its journal resumed and keyed by the generation's own parameters."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from test_sweep import counting, invoke, without_wall

import cgc
from cgc import sweep as sweeping
from cgc import sweep_spec, sweep_table
from cgc.tools.generation import Generated

MODEL = "zoo:cerebras-gpt-111m"
SPEC = f"""\
models: {MODEL}
measure: generation
mode: whole_wafer
prompt_len: 64
max_new_tokens: 8
concurrent: [1, 4]
num_csx: [1, 2]
"""
"""Four points; one sequence at a time does not fit whole_wafer mode on fewer than 4 systems."""
WALL = "compile_seconds"


def points(out: Path) -> list[dict]:
    """The rows of ``sweep.json``, as typed as the sweep wrote them."""
    return json.loads((out / "sweep.json").read_text())["points"]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[Path, str]:
    """The spec's file and the output of ``cgc sweep`` into the directory beside it."""
    directory = tmp_path_factory.mktemp("served")
    (directory / "sweep.yaml").write_text(SPEC)
    result = invoke(directory / "sweep.yaml", "-o", directory / "out", "--jobs", 1)
    assert result.exit_code == 0, result.output
    return directory / "sweep.yaml", result.output


def generated(concurrent: int, systems: int) -> Generated:
    return cgc.generate(
        MODEL,
        timing_only=True,
        prompt_len=64,
        max_new_tokens=8,
        concurrent=concurrent,
        num_csx=systems,
        mode="whole_wafer",
        target="wse2",
    )


def test_rows_are_the_figures_of_cgc_generate(served):
    spec, output = served
    rows = points(spec.parent / "out")
    assert [(r["concurrent"], r["num_csx"]) for r in rows] == [(1, 1), (1, 2), (4, 1), (4, 2)]
    assert {(r["prompt_len"], r["max_new_tokens"], r["measure"]) for r in rows} == {
        (64, 8, "generation")
    }
    for row in rows[2:]:
        alone = generated(row["concurrent"], row["num_csx"]).serving.to_json()
        assert row["ttft_seconds"] == alone["ttft_seconds"]
        assert row["tpot_seconds"] == alone["tpot_seconds"]
        assert row["tokens_per_second"] == alone["tokens_per_second"]
        assert row["tokens_per_second_per_sequence"] == alone["tokens_per_second_per_sequence"]
        assert row["kv_capacity_tokens"] == alone["kv_capacity_tokens"]
        assert row["simulated_seconds"] == alone["seconds"]
        assert (row["ran_mode"], row["decode_bound"]) == (alone["mode"], alone["decode_bound"])
        assert row[WALL] > 0 and row["error"] is None
        assert all(row[name] is None for name in set(sweep_table.STEP) - {*sweep_table.SERVING})
    one, two = rows[2:]
    assert two["speedup"] == two["tokens_per_second"] / one["tokens_per_second"]
    assert two["efficiency"] == two["speedup"] / 2
    assert all(label in output for _, label, _ in sweep_table.GENERATION_COLUMNS)
    assert re.search(r"point 3/4 \(zoo:cerebras-gpt-111m, 1 systems\): [\d.e+]+ tokens/s", output)
    assert (spec.parent / "out" / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_point_that_does_not_fit_is_a_row_with_the_error_of_cgc_generate(served):
    spec, _ = served
    failed = points(spec.parent / "out")[1]
    with pytest.raises(cgc.CgcError) as error:
        generated(1, 2)
    assert failed["error"] == str(error.value)
    assert "it fits 4 systems (num_csx)" in failed["error"]
    figures = [name for name in sweep_table.RESULTS if name != "error"]
    assert all(failed[name] is None for name in [*figures, "speedup", "efficiency"])


def test_a_context_past_the_models_positions_is_a_row_with_its_error(tmp_path):
    (tmp_path / "sweep.yaml").write_text(
        f"models: {MODEL}\nmeasure: generation\nprompt_len: [2042]\nmax_new_tokens: 8\n"
    )
    chosen = sweep_spec.load_spec(str(tmp_path / "sweep.yaml"))
    [row] = sweeping.run_sweep(chosen, tmp_path / "out", jobs=1).rows
    assert row["error"] == (
        f"{MODEL}: a prompt of 2042 tokens and 8 new tokens feed 2049 positions, past the "
        "model's 2048 (model.max_position_embeddings)"
    )
    assert not (tmp_path / "out" / "scaling.png").exists()


def test_the_journal_resumes_and_knows_a_point_by_its_generation(served, tmp_path, monkeypatch):
    spec, _ = served
    out = tmp_path / "out"
    shutil.copytree(spec.parent / "out", out)
    journal = out / sweeping.JOURNAL
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:2]))  # the points of four sequences lost
    measured = counting(monkeypatch)
    result = invoke(spec, "-o", out, "--jobs", 1)
    assert result.exit_code == 0, result.output
    assert [(p.concurrent, p.num_csx) for p in measured] == [(4, 1), (4, 2)]
    assert "2 points simulated, 2 found" in result.output
    assert without_wall(points(out)) == without_wall(points(spec.parent / "out"))
    # a generation's lengths are part of its point: 9 new tokens are other points
    measured.clear()
    (tmp_path / "longer.yaml").write_text(
        SPEC.replace("max_new_tokens: 8", "max_new_tokens: [8, 9]")
    )

    def refused(point: sweep_spec.GridPoint) -> dict:
        measured.append(point)
        return {**point.parameters(), **dict.fromkeys(sweep_table.RESULTS), "error": "a test"}

    monkeypatch.setattr(sweeping, "measure", refused)
    result = invoke(tmp_path / "longer.yaml", "-o", out, "--jobs", 1)
    assert result.exit_code == 0, result.output
    assert [(p.max_new_tokens, p.concurrent, p.num_csx) for p in measured] == [
        (9, c, k) for c in (1, 4) for k in (1, 2)
    ]


def test_journal_rows_with_another_measures_figures_are_named(served, tmp_path):
    spec, _ = served
    row = json.loads((spec.parent / "out" / sweeping.JOURNAL).read_text().splitlines()[2])
    for field, value in [("mfu", 0.5), ("ttft_seconds", "fast"), ("decode_bound", None)]:
        (tmp_path / sweeping.JOURNAL).write_text(json.dumps({**row, field: value}) + "\n")
        with pytest.raises(cgc.CgcError, match="line 1 is not a point's row"):
            sweeping.Journal(tmp_path)


BAD = [
    (f"models: {MODEL}\nconcurrent: [1, 2]", "concurrent: applies to measure: generation alone, "
     "not training"),
    ("models: mlp.onnx\nmeasure: inference\nprompt_len: 64",
     "prompt_len: applies to measure: generation alone, not inference"),
    ("models: mlp.onnx\nmeasure: inference\nmode: [auto, whole_wafer]",
     "mode: whole_wafer: serves a generation \\(measure: generation\\)"),
    ("models: mlp.onnx\nmode: whole_wafer", "mode: whole_wafer: a training step runs in weight_"),
    ("models: mlp.onnx\nmeasure: generation", "models: mlp.onnx: a generation reads params .yaml"),
    (f"models: {MODEL}\nmeasure: generation\nsparsity: [0, 0.5]",
     "sparsity: 0.5: a generation is timed dense"),
    (f"models: {MODEL}\nmeasure: generation\nbatch_size: [null, 8]",
     "batch_size: 8: a generation's batch is its concurrent sequences"),
    (f"models: {MODEL}\nmeasure: generation\nconcurrent: [4, 0]",
     "concurrent: 0: expected a number of sequences, 1 to 2147483647"),
    (f"models: {MODEL}\nmeasure: generation\nmax_new_tokens: true",
     "max_new_tokens: true: expected a number of tokens, 1 to 2147483647"),
    (f"models: {MODEL}\nmeasure: generation\nprompt_len: [64, 64]",
     "prompt_len: 64 is given twice"),
    (f"models: {MODEL}\nmeasure: generation\nmode: fast",
     "mode: fast: expected one of weight_streaming, pipelined, auto, whole_wafer"),
    (
        f"models: {MODEL}\nmeasure: generation\nprompt_len: [1, 2, 3, 4, 5]\n"
        f"concurrent: [{', '.join(map(str, range(1, 2002)))}]",
        "the grid has 10005 points, more than a sweep of 10000",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m[:24] for _, m in BAD])
def test_a_bad_generation_spec_is_one_line_naming_the_field(tmp_path, text, message):
    (tmp_path / "mlp.onnx").write_bytes(b"")  # found, never read: the spec is refused first
    (tmp_path / "bad.yaml").write_text(text + "\n")
    result = invoke(tmp_path / "bad.yaml", "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert re.fullmatch(f"error: {re.escape(str(tmp_path))}/bad.yaml: {message}.*\n", result.stderr)
    assert not (tmp_path / "out").exists()
