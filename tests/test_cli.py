"""The command line: every command, and every error a user can cause (exit code 2, one line
naming the culprit, nothing left half-written)."""

from __future__ import annotations

import json
import re
import sys
import types

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from ir_builders import STATS_FIELDS
from onnx import TensorProto, helper

import cgc
from cgc.cli import main
from cgc.dialects import parse_module
from cgc.frontends import zoo

TARGET = "mesh16x16"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Example models and inputs, written once."""
    root = tmp_path_factory.mktemp("cli")
    for name in ("mlp", "mlp_train"):
        model = zoo.MODELS[name]()
        zoo.save(model, root / f"{name}.onnx")
        np.savez(root / f"{name}.inputs.npz", **zoo.sample_inputs(model, 4))
    rng = np.random.default_rng(0)
    np.savez(
        root / "data.npz",
        x=rng.standard_normal((32, 64)).astype(np.float32),
        labels=rng.integers(0, 10, 32),
    )
    return root


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def artifact(workdir):
    path = workdir / "mlp.cgc"
    result = invoke(
        "compile",
        workdir / "mlp.onnx",
        "-o",
        path,
        "--batch-size",
        4,
        "--target",
        TARGET,
        "--mode",
        "pipelined",
    )
    assert result.exit_code == 0, result.output
    return path


def test_compile_prints_summary_and_writes_artifact(artifact, workdir) -> None:
    result = invoke(
        "compile",
        workdir / "mlp.onnx",
        "-o",
        workdir / "ws.cgc",
        "--batch-size",
        4,
        "--target",
        TARGET,
        "--mode",
        "weight_streaming",
        "--num-csx",
        2,
    )
    assert result.exit_code == 0, result.output
    assert "mode: weight_streaming (requested with --mode weight_streaming)" in result.output
    assert "stream schedule" in result.output and "fc1" in result.output
    assert cgc.load(workdir / "ws.cgc").manifest["num_csx"] == 2
    assert cgc.load(artifact).manifest["mode"] == "pipelined"


def test_dump_ir_and_print_ir_after_all(workdir, tmp_path) -> None:
    dumps = tmp_path / "ir"
    result = invoke(
        "compile",
        workdir / "mlp.onnx",
        "-o",
        tmp_path / "a.cgc",
        "--batch-size",
        4,
        "--target",
        TARGET,
        "--dump-ir",
        dumps,
        "--print-ir-after-all",
    )
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in dumps.iterdir())
    assert names == [
        "00-import.mlir",
        "01-fuse-rotary.mlir",
        "02-fuse-attention.mlir",
        "03-decompose.mlir",
        "04-fold-constants.mlir",
        "05-channels-last.mlir",
        "06-fold-constants.mlir",
        "07-form-layers.mlir",
        "08-fuse-epilogues.mlir",
        "09-place-layers.mlir",
        "10-route-tensors.mlir",
    ]
    for path in dumps.iterdir():
        parse_module(path.read_text(), str(path))
    assert 'loc("fc1")' in (dumps / "00-import.mlir").read_text()
    assert "// -----// IR Dump After decompose //----- //" in result.output
    opt = invoke("opt", dumps / "07-form-layers.mlir", "-p", "fuse-epilogues,place-layers")
    assert opt.exit_code == 0, opt.output
    assert opt.output == (dumps / "09-place-layers.mlir").read_text()
    routed = invoke("opt", dumps / "09-place-layers.mlir", "-p", "route-tensors")
    assert routed.exit_code == 0, routed.output
    assert routed.output == (dumps / "10-route-tensors.mlir").read_text()
    assert 'routes = [#wse.route<"fc1", color 0, lanes ' in routed.output


def test_run_writes_outputs_stats_and_trace(artifact, workdir, tmp_path) -> None:
    result = invoke(
        "run",
        artifact,
        "--inputs",
        workdir / "mlp.inputs.npz",
        "--output",
        tmp_path / "out.npz",
        "--stats-json",
        tmp_path / "stats.json",
        "--trace",
        tmp_path / "trace.json",
    )
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "out.npz") as outputs, np.load(workdir / "mlp.inputs.npz") as inputs:
        expected = cgc.run(cgc.load(artifact), dict(inputs))["logits"]
        np.testing.assert_array_equal(outputs["logits"], expected)
    stats = json.loads((tmp_path / "stats.json").read_text())
    for key in STATS_FIELDS:
        assert key in stats
    assert stats["mode"] == "pipelined" and stats["batch_size"] == 4
    trace = json.loads((tmp_path / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in spans} == {f"sample {i}" for i in range(4)}
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert tracks == {"system 0: fc1", "system 0: fc2", "system 0: fc3"}
    assert [s["name"] for s in stats["pipeline"]["stages"]] == ["fc1", "fc2", "fc3"]
    line = result.output.splitlines()[-1]
    assert re.fullmatch(
        r"pipeline: [\d.e+]+ samples/s per system in the steady state, fill [\d.]+ us, drain "
        r"[\d.]+ us; slowest stage fc[123] \(bound by (kernels|its input link)\)",
        line,
    ), line


def test_inspect(artifact) -> None:
    text = invoke("inspect", artifact, "--disasm", "--ir")
    assert text.exit_code == 0, text.output
    assert "placement (x, y, columns x rows):" in text.output
    assert 'layer 0 "fc1" at x=0 y=0' in text.output
    assert "matmul %" in text.output and "wse.layer" in text.output
    data = json.loads(invoke("inspect", artifact, "--json").output)
    assert data["mode"] == "pipelined"
    assert data["target"]["rows"] == 16 and data["target"]["sram_bytes_per_pe"] == 48 * 1024
    assert [layer["name"] for layer in data["layers"]] == ["fc1", "fc2", "fc3"]
    assert all(len(layer["region"]) == 4 for layer in data["layers"])
    for layer in data["layers"]:
        assert set(layer) >= {"sram_bytes_per_pe", "flops_per_sample", "cycles_per_sample"}
        parts = layer["cycles_by_part"]
        assert sorted(parts) == ["arrival", "compute", "movement"]
        assert sum(parts.values()) == pytest.approx(layer["cycles_per_sample"] * 4)  # batch 4
        assert parts["compute"] > 0
    assert [[r["source"] for r in layer["routes"]] for layer in data["layers"]] == [
        [],
        ["fc1"],
        ["fc2"],
    ]
    # fc1 and fc2 each compute 32 floats a sample that the next layer reads
    moved = [
        (layer["activation_in_bytes_per_sample"], layer["activation_out_bytes_per_sample"])
        for layer in data["layers"]
    ]
    assert moved == [(0, 128), (128, 128), (128, 0)]
    assert [layer["weight_bytes"] > 0 for layer in data["layers"]] == [True] * 3
    route = data["layers"][1]["routes"][0]
    assert route["lanes"] >= 1 and route["hops"] >= 1 and route["color"] == 0
    assert route["wavelets"] == 4 * 32  # the batch of 4 of fc1's 32 floats
    assert route["path"][0] != route["path"][-1] and all(len(p) == 2 for p in route["path"])
    pipeline = data["pipeline"]
    assert 0 < pipeline["samples_per_second"] <= pipeline["bound_samples_per_second"]
    assert pipeline["latency_seconds"] > 1 / pipeline["samples_per_second"]
    assert "routes: 2 tensors between layers on 1 of 24 colors" in text.output
    assert "% of the compute bound" in text.output


def test_train_prints_default_choice(workdir, tmp_path) -> None:
    result = invoke(
        "train",
        workdir / "mlp_train.onnx",
        "--data",
        workdir / "data.npz",
        "--batch-size",
        8,
        "--steps",
        3,
        "--lr",
        0.1,
        "--num-csx",
        2,
        "--model-dir",
        tmp_path,
        "--target",
        TARGET,
    )
    assert result.exit_code == 0, result.output
    assert "training 3466 parameters in 6 tensors, the model's parameters (default)" in (
        result.output
    )
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    assert (tmp_path / "weights.safetensors").exists()


def unsupported_model(path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    nodes = [
        helper.make_node("Multinomial", ["x"], ["a"], name="m1"),
        helper.make_node("RandomUniformLike", ["a"], ["b"], name="r1"),
        helper.make_node("Multinomial", ["b"], ["y"], name="m2"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def test_compile_errors(workdir, tmp_path) -> None:
    out = tmp_path / "never.cgc"
    bad = tmp_path / "bad.onnx"
    unsupported_model(bad)
    one_line_error(
        invoke("compile", bad, "-o", out, "--batch-size", 2),
        "bad.onnx: unsupported ops: Multinomial (nodes m1, m2), RandomUniformLike (node r1)",
    )
    one_line_error(invoke("compile", tmp_path / "nope.onnx", "-o", out), "nope.onnx: no such file")
    one_line_error(
        invoke("compile", workdir / "mlp.onnx", "-o", out),
        "symbolic batch dimension 'N'",
        "--batch-size",
    )
    one_line_error(
        invoke("compile", workdir / "mlp.onnx", "-o", out, "--batch-size", 6, "--num-csx", 4),
        "--batch-size 6 does not split evenly",
    )
    one_line_error(
        invoke("compile", workdir / "mlp.onnx", "-o", out, "--batch-size", 2, "--target", "tpu"),
        "unknown target 'tpu'",
    )
    one_line_error(
        invoke("compile", workdir / "mlp.onnx", "-o", out, "--batch-size", 2, "--shape", "x=8by64"),
        "--shape x=8by64",
    )
    wide = tmp_path / "wide.onnx"
    zoo.save(zoo.mlp(in_features=256, hidden=(256, 256)), wide)
    one_line_error(
        invoke(
            "compile",
            wide,
            "-o",
            out,
            "--batch-size",
            4,
            "--target",
            "mesh2x2",
            "--mode",
            "pipelined",
        ),
        "does not fit on mesh2x2 in pipelined mode",
        "its weights alone (524.0 KiB) exceed the SRAM of the whole wafer (192.0 KiB)",
        "use --mode weight_streaming",
    )
    assert invoke("compile", wide, "-o", out, "--mode", "sideways").exit_code == 2
    assert not out.exists()
    assert not list(tmp_path.glob(".never.cgc*"))


def test_compile_errors_of_broken_models(workdir, tmp_path) -> None:
    out = tmp_path / "never.cgc"
    truncated = tmp_path / "truncated.onnx"
    data = (workdir / "mlp.onnx").read_bytes()
    truncated.write_bytes(data[: len(data) // 3])
    one_line_error(
        invoke("compile", truncated, "-o", out, "--batch-size", 2),
        "truncated.onnx: not a valid ONNX model",
    )
    external = tmp_path / "external.onnx"
    onnx.save(zoo.mlp(), external, save_as_external_data=True, location="w.bin", size_threshold=0)
    (tmp_path / "w.bin").unlink()
    one_line_error(
        invoke("compile", external, "-o", out, "--batch-size", 2),
        "external.onnx: external data file 'w.bin' of tensor 'fc1.weight' is missing "
        "(--no-weights compiles the graph without them)",
    )
    attribute = tmp_path / "attribute.onnx"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    pool = helper.make_node("MaxPool", ["x"], ["y"], name="p1", kernel_shape=[2, 2],
                            auto_pad="SAME")  # fmt: skip
    graph = helper.make_graph([pool], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), attribute)
    one_line_error(
        invoke("compile", attribute, "-o", out),
        "attribute.onnx: node 'p1' (MaxPool): attribute auto_pad=SAME is not supported",
    )
    assert not out.exists()


def test_run_errors(artifact, workdir, tmp_path) -> None:
    inputs = workdir / "mlp.inputs.npz"
    one_line_error(invoke("run", tmp_path / "nope.cgc", "--inputs", inputs), "no such file")
    data = bytearray(artifact.read_bytes())
    data[-10] ^= 0xFF
    (tmp_path / "flipped.cgc").write_bytes(data)
    one_line_error(
        invoke("run", tmp_path / "flipped.cgc", "--inputs", inputs),
        "section 'weights' is corrupted",
    )
    (tmp_path / "short.cgc").write_bytes(artifact.read_bytes()[:500])
    one_line_error(invoke("run", tmp_path / "short.cgc", "--inputs", inputs), "truncated")
    (tmp_path / "notes.cgc").write_text("hello")
    one_line_error(invoke("run", tmp_path / "notes.cgc", "--inputs", inputs), "not a cgc artifact")
    np.savez(tmp_path / "wrong.npz", y=np.zeros((4, 64), np.float32))
    one_line_error(
        invoke("run", artifact, "--inputs", tmp_path / "wrong.npz"), "missing inputs ['x']"
    )
    np.savez(tmp_path / "odd.npz", x=np.zeros((6, 64), np.float32))
    one_line_error(
        invoke("run", artifact, "--inputs", tmp_path / "odd.npz"),
        "6 samples is not a multiple of the compiled per-system batch 4",
    )
    np.savez(tmp_path / "narrow.npz", x=np.zeros((4, 63), np.float32))
    one_line_error(
        invoke("run", artifact, "--inputs", tmp_path / "narrow.npz"), "input 'x' has shape (4, 63)"
    )
    one_line_error(
        invoke("run", artifact, "--inputs", inputs, "--output", tmp_path / "missing" / "out.npz"),
        "does not exist",
    )
    one_line_error(
        invoke("run", artifact, "--inputs", inputs, "--num-csx", 0), "--num-csx must be at least 1"
    )


def test_train_and_opt_errors(workdir, tmp_path) -> None:
    model, data = workdir / "mlp_train.onnx", workdir / "data.npz"
    np.savez(tmp_path / "half.npz", x=np.zeros((8, 64), np.float32))
    one_line_error(
        invoke(
            "train",
            model,
            "--data",
            tmp_path / "half.npz",
            "--batch-size",
            4,
            "--steps",
            1,
            "--model-dir",
            tmp_path,
            "--target",
            TARGET,
        ),
        "training data lacks ['labels']",
    )
    one_line_error(
        invoke(
            "train",
            model,
            "--data",
            data,
            "--batch-size",
            4,
            "--steps",
            1,
            "--model-dir",
            tmp_path,
            "--trainable",
            "fc(",
            "--target",
            TARGET,
        ),
        "--trainable fc(: not a regular expression",
    )
    one_line_error(invoke("opt", tmp_path / "none.mlir"), "none.mlir")
    (tmp_path / "broken.mlir").write_text("func.func @main( {\n")
    one_line_error(invoke("opt", tmp_path / "broken.mlir"), "broken.mlir:")
    (tmp_path / "ok.mlir").write_text(
        'builtin.module attributes {wse.target = #wse.target<"mesh4x4">} {}\n'
    )
    one_line_error(
        invoke("opt", tmp_path / "ok.mlir", "-p", "no-such-pass"),
        "no-such-pass",
        "passes: autodiff, cache-keys-values, channels-last, decompose",
    )


def test_internal_errors_exit_1_without_traceback(workdir, monkeypatch) -> None:
    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("cgc.machine.program.artifact.Artifact.load", explode)
    result = invoke("inspect", workdir / "whatever.cgc")
    assert result.exit_code == 1
    assert "internal error: RuntimeError: boom (rerun with --debug)" in result.output
    assert "Traceback" not in result.output
    debug = invoke("--debug", "inspect", workdir / "whatever.cgc")
    assert debug.exit_code == 1
    assert "Traceback" in debug.output


def train_args(workdir, tmp_path, *extra):
    return (
        "train",
        workdir / "mlp_train.onnx",
        "--data",
        workdir / "data.npz",
        "--batch-size",
        8,
        "--steps",
        4,
        "--model-dir",
        tmp_path,
        "--target",
        TARGET,
        *extra,
    )


def test_train_with_adam_a_schedule_and_clipping(workdir, tmp_path) -> None:
    extra = ["--optimizer", "adamw", "--lr", 0.01, "--betas", "0.8,0.99", "--eps", 1e-6]
    extra += ["--amsgrad", "--lr-schedule", "cosine", "--warmup-steps", 2]
    extra += ["--max-grad-norm", 0.1]
    result = invoke(*train_args(workdir, tmp_path, *extra))
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # warm-up 0.5, 1.0 of the base rate, then cosine over the remaining 2 steps: 1.0, 0.5
    assert [m["lr"] for m in lines] == pytest.approx([0.005, 0.01, 0.01, 0.005])
    assert all(m["grad_norm"] > 0.1 for m in lines), "the clipping was active"


def test_train_logs_the_held_out_loss(workdir, tmp_path) -> None:
    extra = ["--eval-data", workdir / "data.npz", "--eval-every", 2]
    result = invoke(*train_args(workdir, tmp_path, *extra))
    assert result.exit_code == 0, result.output
    assert "step 2: loss " in result.output and ", eval loss " in result.output
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert ["eval_loss" in m for m in lines] == [False, True, False, True]


def test_train_trace_has_a_track_per_resource(workdir, tmp_path) -> None:
    trace_path = tmp_path / "train.json"
    extra = ["--num-csx", 2, "--trace", trace_path]
    result = invoke(*train_args(workdir, tmp_path, *extra))
    assert result.exit_code == 0, result.output
    events = json.loads(trace_path.read_text())["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert set(tracks.values()) == {
        "systems 0-1",  # the two systems run alike: one track
        "MemoryX -> SwarmX",
        "SwarmX -> MemoryX",
        "MemoryX",
    }
    spans = [e for e in events if e["ph"] == "X"]
    updates = [e for e in spans if tracks[e["tid"]] == "MemoryX"]
    assert len(updates) == 4 * 3, "each step, MemoryX updates the 3 layers' weights"
    # the steps follow one another: the first weights of step 2 stream once updated
    fc1 = next(e for e in updates if e["name"] == "fc1 update (step 2)")
    first_stream = next(e for e in spans if e["name"] == "fc1 weights (step 2)")
    assert first_stream["ts"] >= fc1["ts"] + fc1["dur"] - 1e-6
    # the next layer's weights stream in while a layer computes
    system = next(t for t, n in tracks.items() if n == "systems 0-1")
    layers = [e for e in spans if e["tid"] == system and e["name"].endswith("(step 1)")]
    streams = [e for e in spans if tracks[e["tid"]] == "MemoryX -> SwarmX"]
    assert any(
        layer["ts"] <= s["ts"] < layer["ts"] + layer["dur"] for layer in layers for s in streams
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--optimizer", "adam", "--momentum", 0.9],
            "--momentum: not a setting of --optimizer adam",
        ),
        (["--nesterov"], "--nesterov needs --momentum > 0 and --dampening 0"),
        (["--optimizer", "adam", "--betas", "0.9"], "--betas 0.9: expected 2 numbers"),
        (["--optimizer", "adam", "--betas", "0.9,1.0"], "--betas 1: must be in [0, 1)"),
        (["--lr", -1], "--lr -1: must be >= 0"),
        (["--lr-schedule", "step", "--lr-step-size", 0], "--lr-schedule step: warm-up steps"),
        (["--max-grad-norm", 0], "--max-grad-norm 0: must be positive"),
        (["--amsgrad"], "--amsgrad: not a setting of --optimizer sgd"),
        (["--eval-every", 2], "--eval-every needs --eval-data"),
        (["--checkpoint-every", -1], "--checkpoint-every -1: must be >= 0"),
    ],
)
def test_train_option_errors(workdir, tmp_path, extra, message) -> None:
    one_line_error(invoke(*train_args(workdir, tmp_path / "run", *extra)), message)
    assert not (tmp_path / "run").exists(), "nothing written"


def test_train_on_a_terminal_shows_a_progress_bar(workdir, tmp_path, monkeypatch) -> None:
    import cgc.cli_io

    class Terminal:
        def __getattr__(self, name):
            return getattr(sys.stdout, name)

        def isatty(self):
            return True

    fake_sys = types.SimpleNamespace(stdout=Terminal())
    monkeypatch.setattr(cgc.cli_io, "sys", fake_sys)
    extra = ["--eval-data", workdir / "data.npz", "--eval-every", 2]
    result = invoke(*train_args(workdir, tmp_path, *extra))
    assert result.exit_code == 0, result.output
    assert "training" in result.output and "step 1: loss" not in result.output
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and "eval_loss" in lines[-1]


def test_train_trace_into_a_missing_directory_fails_before_training(workdir, tmp_path) -> None:
    trace_path = tmp_path / "nowhere" / "t.json"
    result = invoke(*train_args(workdir, tmp_path / "run", "--trace", trace_path))
    one_line_error(result, f"{trace_path}: directory {trace_path.parent} does not exist")
    assert not (tmp_path / "run").exists(), "nothing trained or written"


def test_outputs_get_the_usual_permissions(workdir, tmp_path) -> None:
    from cgc.files import permissions

    result = invoke(*train_args(workdir, tmp_path, "--checkpoint-every", 2))
    assert result.exit_code == 0, result.output
    for name in ("metrics.jsonl", "weights.safetensors"):
        assert ((tmp_path / name).stat().st_mode & 0o777) == permissions(directory=False)
    assert ((tmp_path / "checkpoints" / "step-2").stat().st_mode & 0o777) == permissions(True)
