"""Progress on a terminal: ``cgc compile`` shows a bar of its passes and ``cgc run`` one of its
layers (``StepsBar``), told by the compile driver's ``on_pass`` and the cluster's ``on_step``;
without a terminal, or once the bar is cleared, the output is the same as without a bar."""

from __future__ import annotations

import io
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

import cgc.cli_io
from cgc.cli import main
from cgc.compiler.driver import compile_model
from cgc.compiler.training import Training
from cgc.frontends import zoo
from cgc.machine.program.artifact import Artifact
from cgc.runtime.cluster import Cluster
from cgc.tools.progress import StepsBar

TARGET = "mesh16x16"
CLEAR = "\r\x1b[K"
"""What a cleared bar leaves: the cursor at the start of an empty line."""


class Terminal:
    """``sys.stdout`` as the CLI sees it on a terminal."""

    def __getattr__(self, name):
        return getattr(sys.stdout, name)

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The MLP as an ONNX file, its inputs (two compiled batches) and its artifact."""
    root = tmp_path_factory.mktemp("progress")
    model = zoo.MODELS["mlp"]()
    zoo.save(model, root / "mlp.onnx")
    np.savez(root / "inputs.npz", **zoo.sample_inputs(model, 8))
    compile_model(model, mode="pipelined", target=TARGET, batch_size=4).save(root / "mlp.cgc")
    return root


def invoke(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def on_a_terminal(monkeypatch, *args: object):
    """The CLI's output with ``sys.stdout`` a terminal (at a known width)."""
    monkeypatch.setenv("COLUMNS", "200")
    with monkeypatch.context() as patched:
        patched.setattr(cgc.cli_io, "sys", types.SimpleNamespace(stdout=Terminal()))
        return invoke(*args)


def frames(output: str) -> list[str]:
    """The bar's frames, before the line that clears it."""
    drawn = output[: output.rindex(CLEAR)]
    return [frame.removesuffix("\x1b[K") for frame in drawn.split("\r")[1:]]


def compilations(seen: list[tuple[int, int, str]]) -> list[list[tuple[int, int, str]]]:
    """The steps ``on_pass`` heard, one list per compilation (each counts from 1)."""
    split: list[list[tuple[int, int, str]]] = []
    for step in seen:
        if step[0] == 1:
            split.append([])
        split[-1].append(step)
    return split


def test_steps_bar_names_each_step_and_clears_its_line(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    stream, now = io.StringIO(), [0.0]
    bar = StepsBar("compile", stream, estimates=False, clock=lambda: now[0])
    bar.step(1, 0, "import")
    now[0] += 3.0
    bar.step(7, 15, "place-layers")
    bar.close()
    shown = stream.getvalue().split("\r")[1:]
    assert shown[0] == "compile import\x1b[K", "no count while the total is not known"
    assert "7/15" in shown[1] and "47%" in shown[1] and "place-layers" in shown[1]
    assert "  00:03  place-layers" in shown[1], "the time taken: passes differ too much to guess"
    assert stream.getvalue().endswith(CLEAR), "cleared, not left on its own line"


def test_steps_bar_fits_the_terminal_and_estimates_time_left(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    stream, now = io.StringIO(), [0.0]
    bar = StepsBar("run", stream, clock=lambda: now[0])
    bar.step(1, 4, "fc1")
    now[0] += 2.0
    bar.step(2, 4, "a layer with a long name (batch 1/2)")
    first, second = stream.getvalue().split("\r")[1:]
    assert "1/4" in first and "fc1" in first
    assert len(second.removesuffix("\x1b[K")) == 59, "a wrapped line would not redraw in place"
    monkeypatch.setenv("COLUMNS", "200")
    assert bar.line(2, {"name": "fc2"}).endswith("ETA 00:02  fc2")  # 1 s a step, 2 left


def test_every_compilation_counts_its_steps_to_its_total(models) -> None:
    """Pipelined, weight streaming (the memory plan's compilations each counted anew) and
    training: every compilation's steps run from the import to the lowering, numbered 1 to
    the total told from the first pass on."""
    model = zoo.MODELS["mlp"]()
    for mode in ("pipelined", "weight_streaming", "auto"):
        heard: list[tuple[int, int, str]] = []
        compile_model(
            model, mode=mode, target=TARGET, batch_size=4, on_pass=lambda *s, h=heard: h.append(s)
        )
        check_compilations(heard, mode)
    seen: list[tuple[int, int, str]] = []
    train = zoo.MODELS["mlp_train"]()
    training = Training(lr=0.1)
    compile_model(
        train, target=TARGET, batch_size=8, training=training, on_pass=lambda *s: seen.append(s)
    )
    check_compilations(seen, "training")
    names = [name.split(" (")[0] for _, _, name in seen]
    assert names[-5:] == ["form-layers", "autodiff", "fold-constants", "schedule-streams", "lower"]


def check_compilations(seen: list[tuple[int, int, str]], mode: str) -> None:
    """Each compilation's steps numbered 1 to its total, from the import to the lowering."""
    assert seen, mode
    for steps in compilations(seen):
        total = steps[-1][1]
        assert steps[0][1:] == (0, steps[0][2]) and steps[0][2].startswith("import"), steps
        assert [n for n, _, _ in steps] == list(range(1, total + 1)), (mode, steps)
        assert all(t == total for _, t, _ in steps[1:]), (mode, steps)
        assert steps[-1][2].startswith("lower"), (mode, steps)
    if mode == "pipelined":
        names = [name for _, _, name in seen]
        assert names[-3:] == ["place-layers", "route-tensors", "lower"], names
    if mode == "weight_streaming":
        assert any("(weight streaming, micro-batch" in name for _, _, name in seen), seen


def test_progress_changes_no_artifact(models) -> None:
    model = zoo.MODELS["mlp"]()
    plain = compile_model(model, mode="weight_streaming", target=TARGET, batch_size=4)
    told = compile_model(
        model, mode="weight_streaming", target=TARGET, batch_size=4, on_pass=lambda *s: None
    )
    assert told.to_bytes() == plain.to_bytes()


def test_compile_on_a_terminal_shows_its_passes(models, monkeypatch) -> None:
    args: tuple[object, ...] = ("compile", models / "mlp.onnx", "-o", models / "out.cgc")
    args += ("--batch-size", 4, "--target", TARGET, "--mode", "pipelined")
    plain = invoke(*args)
    assert plain.exit_code == 0, plain.output
    assert "\r" not in plain.output and "compile [" not in plain.output, "no bar in a pipe"
    shown = on_a_terminal(monkeypatch, *args)
    assert shown.exit_code == 0, shown.output
    drawn = frames(shown.output)
    assert drawn[0] == "compile import"
    total = len(drawn)
    assert f"2/{total}" in drawn[1] and "fuse-rotary" in drawn[1], drawn
    assert any("form-layers" in frame for frame in drawn), drawn
    assert f"{total}/{total} 100%" in drawn[-1] and "lower" in drawn[-1], drawn
    after = shown.output[shown.output.rindex(CLEAR) + len(CLEAR) :]
    assert after == plain.output, "once cleared, the output is the same as in a pipe"


def test_compile_printing_the_ir_draws_no_bar(models, monkeypatch) -> None:
    args = ("compile", models / "mlp.onnx", "-o", models / "ir.cgc", "--batch-size", 4)
    shown = on_a_terminal(monkeypatch, *args, "--target", TARGET, "--print-ir-after-all")
    assert shown.exit_code == 0, shown.output
    assert "IR Dump After form-layers" in shown.output and "compile [" not in shown.output


@pytest.mark.parametrize("timing_only", [False, True])
def test_run_on_a_terminal_shows_its_layers(models, monkeypatch, timing_only) -> None:
    args: tuple[object, ...] = ("run", models / "mlp.cgc")
    args += ("--timing-only",) if timing_only else ("--inputs", models / "inputs.npz")
    plain = invoke(*args)
    assert plain.exit_code == 0, plain.output
    assert "\r" not in plain.output and "run [" not in plain.output, "no bar in a pipe"
    shown = on_a_terminal(monkeypatch, *args)
    assert shown.exit_code == 0, shown.output
    layers = [layer.name for layer in Artifact.load(models / "mlp.cgc").program.layers]
    drawn = frames(shown.output)
    runs = len(drawn) // len(layers)
    assert runs == (1 if timing_only else 2), drawn  # two compiled batches of 4 samples
    total = runs * len(layers)
    for number, (frame, layer) in enumerate(zip(drawn, layers * runs, strict=True), 1):
        assert frame.startswith("run [") and f" {number}/{total} " in frame, frame
        assert frame.split("  ")[-1].startswith(layer), (frame, layer)
    if not timing_only:
        assert "(batch 2/2)" in drawn[-1], drawn
    after = shown.output[shown.output.rindex(CLEAR) + len(CLEAR) :]
    assert after == plain.output


def test_cluster_tells_every_layer_of_every_batch(models) -> None:
    artifact = Artifact.load(models / "mlp.cgc")
    inputs = dict(np.load(models / "inputs.npz"))
    seen: list[tuple[int, int, str]] = []
    outputs, _ = Cluster(artifact).infer(inputs, lambda *step: seen.append(step))
    plain, _ = Cluster(artifact).infer(inputs)
    assert all(np.array_equal(outputs[k], plain[k]) for k in plain)
    count = len(artifact.program.layers)
    assert [n for n, _, _ in seen] == list(range(1, 2 * count + 1))
    assert {t for _, t, _ in seen} == {2 * count}
    assert seen[count][2] == f"{artifact.program.layers[0].name} (batch 2/2)"
