"""``cgc sweep``: a spec's errors, the same table on every executor, resuming, failed points."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import cgc
from cgc import sweep as sweeping
from cgc import sweep_spec, sweep_table
from cgc.cli import main
from cgc.frontends import zoo
from cgc.machine.hardware.target import get_target, with_figures
from cgc.version import __version__

SPEC = """\
models: [mlp.onnx]
measure: inference
targets: [mesh4x4]
set: [[], [sram_bytes_per_pe=1024]]
mode: [pipelined, weight_streaming]
batch_size: 8
num_csx: [1, 2]
"""
"""Eight inference points of the zoo's MLP; pipelined in 1 KiB of SRAM per PE does not fit."""
MESH = get_target("mesh4x4")
WALL = "compile_seconds"
"""The one column that is a wall time, not a figure of the simulation."""


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> Path:
    """The spec, beside its models (named relative to it)."""
    directory = tmp_path_factory.mktemp("spec")
    for name in ("mlp", "mlp_train"):
        zoo.save(zoo.MODELS[name](), directory / f"{name}.onnx")
    (directory / "sweep.yaml").write_text(SPEC)
    return directory / "sweep.yaml"


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance of two CPUs for this module."""
    pytest.importorskip("ray")
    from cgc.runtime.executors import connect

    ray = connect(None, num_cpus=2)
    yield ray
    ray.shutdown()


def invoke(*args: object):
    return CliRunner().invoke(main, ["sweep", *map(str, args)])


def counting(monkeypatch: pytest.MonkeyPatch) -> list[sweep_spec.GridPoint]:
    """The points the sweep measures from now on, in the order it measures them."""
    measured: list[sweep_spec.GridPoint] = []
    original = sweeping.measure

    def counted(point: sweep_spec.GridPoint) -> dict:
        measured.append(point)
        return original(point)

    monkeypatch.setattr(sweeping, "measure", counted)
    return measured


def swept(spec: Path, out: Path, *options: str) -> list[dict]:
    """The rows of ``sweep.csv`` after ``cgc sweep spec -o out options``."""
    result = invoke(str(spec), "-o", str(out), *options)
    assert result.exit_code == 0, result.output
    return table(out)


def table(out: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))


def without_wall(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != WALL} for row in rows]


@pytest.fixture(scope="module")
def serial(spec, tmp_path_factory) -> Path:
    """The output directory of the sweep run one point after another."""
    out = tmp_path_factory.mktemp("serial") / "out"
    swept(spec, out, "--jobs", "1")
    return out


def test_rows_follow_the_grid_and_match_their_own_simulation(spec, serial):
    rows = table(serial)
    grid = [(r["set"], r["mode"], r["num_csx"]) for r in rows]
    assert grid == [
        (figures, mode, k)
        for figures in ("", "sram_bytes_per_pe=1024")
        for mode in ("pipelined", "weight_streaming")
        for k in ("1", "2")
    ]
    # as ``cgc run --timing-only`` simulates the point alone
    for row in rows[:4] + rows[6:]:
        alone = cgc.simulate(
            str(spec.parent / "mlp.onnx"),
            training=False,
            mode=row["mode"],
            target=with_figures(MESH, row["set"].split()),
            batch_size=8,
            num_csx=int(row["num_csx"]),
        ).stats
        assert float(row["simulated_seconds"]) == alone.simulated_seconds
        assert float(row["samples_per_second"]) == alone.samples_per_second
        assert int(row["peak_pe_sram_bytes"]) == alone.peak_pe_sram_bytes
        assert row["ran_mode"] == row["mode"]
    two = rows[1]
    assert float(two["efficiency"]) == float(two["speedup"]) / 2


def test_training_steps_at_each_sparsity(spec, tmp_path):
    (tmp_path / "sweep.yaml").write_text(
        f"models: {spec.parent / 'mlp_train.onnx'}\ntargets: mesh4x4\n"
        "sparsity: [0, 0.5]\nbatch_size: 8\nnum_csx: [1, 2]\n"
    )
    chosen = sweep_spec.load_spec(str(tmp_path / "sweep.yaml"))
    outcome = sweeping.run_sweep(chosen, tmp_path / "out", jobs=1)
    assert (outcome.ran, outcome.skipped) == (4, 0)
    for row in outcome.rows:
        alone = cgc.simulate(
            str(spec.parent / "mlp_train.onnx"),
            target=MESH,
            batch_size=8,
            num_csx=row["num_csx"],
            sparsity=row["sparsity"] or None,
        ).stats
        assert row["simulated_seconds"] == alone.simulated_seconds
        assert row["mfu"] == alone.mfu
    dense, sparse = outcome.rows[0], outcome.rows[2]
    assert sparse["simulated_seconds"] != dense["simulated_seconds"]


def test_a_point_that_does_not_fit_is_a_row_with_its_error(serial):
    rows = table(serial)
    failed = [r for r in rows if r["error"]]
    assert failed == rows[4:6]
    for row in failed:
        assert row["error"].startswith("model does not fit on mesh4x4 in pipelined mode")
        assert row["samples_per_second"] == row["speedup"] == row[WALL] == ""
    assert all(float(r["samples_per_second"]) > 0 for r in rows if not r["error"])
    assert (serial / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_executor_gives_the_same_table(spec, serial, tmp_path, ray_cluster):
    want = without_wall(table(serial))
    assert without_wall(swept(spec, tmp_path / "pool", "--jobs", "2")) == want
    assert without_wall(swept(spec, tmp_path / "ray", "--executor", "ray")) == want


def test_a_rerun_computes_only_the_points_missing(spec, serial, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(serial, out)
    journal = out / sweeping.JOURNAL
    lines = journal.read_text().splitlines(keepends=True)
    # three points lost, the last of them killed halfway through its line, and one
    # simulated by another version of cgc
    older = lines[0].replace(f'"cgc": "{__version__}"', '"cgc": "0.0.1"')
    assert older != lines[0]
    journal.write_text(older + "".join(lines[1:5]) + lines[5][:40])
    measured = counting(monkeypatch)
    result = invoke(str(spec), "-o", str(out), "--jobs", "1")
    assert result.exit_code == 0, result.output
    assert sorted((p.set, p.mode, p.num_csx) for p in measured) == [
        ("", "pipelined", 1),
        ("sram_bytes_per_pe=1024", "pipelined", 2),
        ("sram_bytes_per_pe=1024", "weight_streaming", 1),
        ("sram_bytes_per_pe=1024", "weight_streaming", 2),
    ]
    assert "4 points simulated, 4 found" in result.output
    assert without_wall(table(out)) == without_wall(table(serial))
    assert len(journal.read_text().splitlines()) == 9
    measured.clear()
    assert invoke(str(spec), "-o", str(out), "--jobs", "1").exit_code == 0
    assert measured == []


def test_a_model_replaced_between_runs_is_simulated_again(spec, tmp_path):
    (tmp_path / "sweep.yaml").write_text(
        "models: m.onnx\nmeasure: inference\ntargets: mesh4x4\nbatch_size: 8\n"
    )
    out = tmp_path / "out"
    for name, simulated in [("mlp", 1), ("mlp_train", 1), ("mlp_train", 0)]:
        shutil.copy(spec.parent / f"{name}.onnx", tmp_path / "m.onnx")
        result = invoke(str(tmp_path / "sweep.yaml"), "-o", str(out), "--jobs", "1")
        assert result.exit_code == 0, result.output
        assert f"{simulated} points simulated, {1 - simulated} found" in result.output
        [row] = table(out)
        alone = cgc.simulate(
            str(spec.parent / f"{name}.onnx"), training=False, target=MESH, batch_size=8
        ).stats
        assert float(row["simulated_seconds"]) == alone.simulated_seconds
        assert row["model"] == "m.onnx"


def test_a_journal_line_that_is_not_a_row_is_named(tmp_path):
    (tmp_path / sweeping.JOURNAL).write_text('{"cgc": "0.0.1"}\n[1, 2]\n')
    with pytest.raises(cgc.CgcError, match=r"points.jsonl: line 2 is not a point's row$"):
        sweeping.Journal(tmp_path)


SIZES = ", ".join(map(str, range(1, 2002)))
BAD = [
    ("models: []", "models: \\[\\]: give at least one value"),
    ("targets: [wse2]", "models: missing"),
    ("models: [absent.onnx]", "models: /.*/absent.onnx: no such file"),
    ("models: [notes.txt]", "models: notes.txt: expected an .onnx file, a params .yaml file"),
    ("models: [gpt.yaml]", "models: gpt.yaml: "),
    ("models: [zoo:nope]", "models: zoo:nope: no built-in model of that name"),
    ("models: [mlp.onnx, mlp.onnx]", "models: mlp.onnx is given twice"),
    ("models: mlp.onnx\nnum_csx: [0]", "num_csx: 0: expected a number of systems, 1 to 4096"),
    ("models: mlp.onnx\nnum_csx: [true]", "num_csx: true: expected a number of systems"),
    ("models: mlp.onnx\nnum_csx: 8192", "num_csx: 8192: expected a number of systems, 1 to 4096"),
    ("models: mlp.onnx\ntargets: [wse9]", "targets: unknown target 'wse9'"),
    ("models: mlp.onnx\nset: [[bogus=1]]", "set: bogus=1: expected FIGURE=VALUE"),
    ("models: mlp.onnx\nset: [rows=x]", "set: rows=x: 'x' is not a number"),
    ("models: mlp.onnx\nset: [rows]", "set: rows: expected a list of FIGURE=VALUE"),
    ("models: mlp.onnx\nset: [rows=4, rows = 4]", "set: rows=4 is given twice"),
    ("models: mlp.onnx\nset: [[rows=4, cols=8], [cols=8, rows=4]]", "set: cols=8 rows=4 is given"),
    ("models: mlp.onnx\nset: [[rows=4, cols=8, rows=8]]", "set: rows is given twice in one list"),
    ("models: mlp.onnx\nsparsity: [0.5, 1]", "sparsity: 1: expected a fraction of zeros"),
    (
        "models: mlp.onnx\nbatch_size: [8, -8]",
        "batch_size: -8: expected a batch of 1 to 1099511627776",
    ),
    (
        "models: mlp.onnx\nbatch_size: 12345678901234567890123",
        "batch_size: 12345678901234567890123: expected a batch of 1 to 1099511627776, or null",
    ),
    ("models: mlp.onnx\nmode: fast", "mode: fast: expected one of weight_streaming"),
    ("models: mlp.onnx\nmode: pipelined", "mode: pipelined: a training step runs in weight_"),
    ("models: mlp.onnx\nmeasure: eval", "measure: eval: expected one of training, inference"),
    ("models: mlp.onnx\ncolour: red", "colour: not a field of a sweep"),
    ("- mlp.onnx", "expected a mapping of the fields models, measure"),
    ("models: [mlp.onnx", "not YAML"),
    (
        f"models: mlp.onnx\nsparsity: [0, 0.1, 0.2, 0.3, 0.4]\nnum_csx: [{SIZES}]",
        "the grid has 10005 points, more than a sweep of 10000",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m[:24] for _, m in BAD])
def test_a_bad_spec_is_one_line_naming_the_field_and_value(spec, tmp_path, text, message):
    shutil.copy(spec.parent / "mlp.onnx", tmp_path / "mlp.onnx")
    (tmp_path / "gpt.yaml").write_text("model: {hidden_size: 32}\n")
    (tmp_path / "bad.yaml").write_text(text + "\n")
    result = invoke(str(tmp_path / "bad.yaml"), "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1
    assert re.fullmatch(f"error: {re.escape(str(tmp_path))}/bad.yaml: {message}.*\n", result.stderr)
    assert not (tmp_path / "out").exists()


def test_bad_options_are_one_line(spec, tmp_path):
    for args, message in [
        ([str(tmp_path / "none.yaml")], "SPEC .*none.yaml: no such file"),
        ([str(spec), "--ray-address", "auto"], "--ray-address needs --executor ray"),
        ([str(spec), "--jobs", "0"], "--jobs 0: must be at least 1"),
        (
            [str(spec), "--executor", "ray", "--ray-address", "auto", "--jobs", "2"],
            "--jobs sets nothing with --ray-address",
        ),
    ]:
        result = invoke(*args, "-o", str(tmp_path / "out"))
        assert result.exit_code == 2
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert re.search(message, result.stderr), result.stderr
    assert not (tmp_path / "out").exists()


def test_a_sweep_that_fails_before_any_point_leaves_its_directory_as_it_was(
    spec, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    result = invoke(str(spec), "-o", str(tmp_path / "out"), "--executor", "ray")
    assert result.exit_code == 2
    assert result.stderr == "error: --executor ray needs Ray: pip install 'cgc[ray]'\n"
    assert not (tmp_path / "out").exists()


MEASURE = sweeping.measure
"""``measure`` itself: in a worker of the pool, the test's patch is not there."""


def dies_on_overrides(point: sweep_spec.GridPoint) -> dict:
    """``measure``, but a point with target overrides kills the worker that runs it."""
    if point.set:
        os.kill(os.getpid(), signal.SIGKILL)
    return MEASURE(point)


def test_a_worker_that_dies_stops_the_sweep_with_its_points_kept(
    spec, serial, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    monkeypatch.setattr(sweeping, "measure", dies_on_overrides)  # the pool's workers run it
    result = invoke(str(spec), "-o", str(out), "--jobs", "2")
    assert result.exit_code == 2
    kept = re.fullmatch(
        f"error: a worker process of the pool died; (\\d) of 8 points are kept in "
        f"{re.escape(str(out))}, and a re-run into it resumes from them\n",
        result.stderr,
    )
    assert kept is not None, result.stderr
    journal = out / sweeping.JOURNAL
    lines = journal.read_text().splitlines() if journal.exists() else []
    assert int(kept[1]) == len(lines) <= 4
    monkeypatch.undo()
    result = invoke(str(spec), "-o", str(out), "--jobs", "2")
    assert result.exit_code == 0, result.output
    assert f"{8 - int(kept[1])} points simulated, {kept[1]} found" in result.output
    assert without_wall(table(out)) == without_wall(table(serial))


def test_the_bar_counts_points_from_where_a_resumed_sweep_starts():
    seconds = iter([0.0, 10.0])
    bar = sweep_table.SweepBar(8, io.StringIO(), clock=lambda: next(seconds))
    bar({"step": 6, "errors": 1})  # five found in the journal, one run in 10 s
    assert bar.stream.getvalue() == (
        "\rsweep [##################------] 6/8  75%  1 failed  ETA 00:20\x1b[K"
    )


def test_journal_rows_with_bad_figures_are_named_before_the_table(spec, serial, tmp_path):
    """A row whose figures are not those a point writes (edited, or from a broken disk) is
    named by its line, never carried into the table's arithmetic."""
    lines = (serial / sweeping.JOURNAL).read_text().splitlines()
    row = json.loads(lines[0])
    edits = [("samples_per_second", [1]), ("mfu", "fast"), ("error", [1]), ("bound", 3)]
    for field, value in [*edits, ("simulated_seconds", None)]:
        out = tmp_path / field
        out.mkdir()
        (out / sweeping.JOURNAL).write_text(
            "\n".join([json.dumps({**row, field: value}), *lines[1:]]) + "\n"
        )
        result = invoke(str(spec), "-o", str(out))
        assert (result.exit_code, result.output) == (
            2,
            f"error: {out / sweeping.JOURNAL}: line 1 is not a point's row\n",
        ), field
    del row["samples_per_second"]
    (out / sweeping.JOURNAL).write_text(json.dumps(row) + "\n")
    assert invoke(str(spec), "-o", str(out)).exit_code == 2


@pytest.mark.parametrize("name", [sweeping.JOURNAL, *sweep_table.OUTPUTS])
def test_a_file_of_the_sweep_that_is_a_directory_is_named_before_any_point(spec, tmp_path, name):
    (tmp_path / "out" / name).mkdir(parents=True)
    result = invoke(str(spec), "-o", str(tmp_path / "out"), "--jobs", "1")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and f"{tmp_path / 'out' / name}" in result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [name]
