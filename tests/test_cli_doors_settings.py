"""Settings and runs a user can get wrong: batches past any machine's, lists with holes,
optimizer settings that divide by zero, factories that exit, two runs into one directory.
Each ends in a result or one line naming the culprit (exit 2), and nothing of another run's
is lost."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mlp_train_data
from test_cli import invoke, one_line_error

import cgc
from cgc.files import LOCK
from cgc.frontends import zoo
from cgc.machine.hardware.target import MAX_BATCH

TARGET = "mesh8x8"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """The zoo's MLP and its training model, training data, and a factory file."""
    root = tmp_path_factory.mktemp("settings")
    zoo.save(zoo.MODELS["mlp"](), root / "mlp.onnx")
    zoo.save(zoo.MODELS["mlp_train"](), root / "mlp_train.onnx")
    np.savez(root / "data.npz", **mlp_train_data(32, seed=0))
    return root


def train_args(models: Path, model_dir: Path, *extra) -> tuple:
    return (
        "train", models / "mlp_train.onnx", "--data", models / "data.npz", "--batch-size", 8,
        "--steps", 2, "--target", TARGET, "--model-dir", model_dir, *extra,
    )  # fmt: skip


# -- batches ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ("0", "--batch-size must be at least 1, got 0"),
        ("-8", "--batch-size must be at least 1, got -8"),
        (str(MAX_BATCH + 1), f"--batch-size must be at most 2^40 ({MAX_BATCH})"),
        ("12345678901234567890123", "--batch-size must be at most 2^40"),
    ],
)
@pytest.mark.parametrize("model", ["zoo:cerebras-gpt-111m", "mlp.onnx"])
def test_a_batch_out_of_range_is_named_at_once(models, tmp_path, model, batch, message):
    """Every kind of model: params files and ``zoo:`` ones too, where a batch of 10^12 used to
    run for minutes in the memory plan."""
    source = model if model.startswith("zoo:") else models / model
    result = invoke("compile", source, "-o", tmp_path / "m.cgc", "--batch-size", batch)
    one_line_error(result, message)
    assert not (tmp_path / "m.cgc").exists()


def test_the_api_names_a_batch_out_of_range_too():
    with pytest.raises(cgc.CgcError, match=r"^batch_size must be at most"):
        cgc.compile("zoo:cerebras-gpt-111m", batch_size=10**13)


# -- lists -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--num-csx", "0,1", "--num-csx must be at least 1, got 0"),
        ("--num-csx", "1,,2", "--num-csx 1,,2: expected sizes such as 1,2,4,8, got ''"),
        ("--num-csx", "1,2,", "got ''"),
        ("--num-csx", "1,x", "--num-csx 1,x: expected sizes such as 1,2,4,8, got 'x'"),
        ("--num-csx", "2,1,2", "--num-csx 2,1,2: 2 is given twice"),
        ("--num-csx", "4097", "--num-csx must be at most 4096, got 4097"),
        ("--sparsity", "0,1", "--sparsity 0,1: expected fractions of zeros in [0, 1)"),
        ("--sparsity", "nan", "got 'nan'"),
        ("--sparsity", "0.5,,0.9", "got ''"),
    ],
)
def test_a_list_with_a_hole_or_a_value_out_of_range_is_named(option, value, message):
    one_line_error(invoke("scale", "zoo:cerebras-gpt-111m", option, value), message)


# -- optimizer settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--optimizer", "adam", "--eps", "0"), "--eps 0: must be > 0"),
        (("--optimizer", "adamw", "--eps", "-1e-8"), "--eps -1e-08: must be > 0"),
        (("--optimizer", "sgd", "--lr", "inf"), "--lr inf: must be >= 0"),
    ],
)
def test_optimizer_settings_that_cannot_train_are_refused(models, tmp_path, options, message):
    result = invoke(*train_args(models, tmp_path / "run", *options))
    one_line_error(result, message)
    assert not (tmp_path / "run").exists()


# -- factories --------------------------------------------------------------------------------

FACTORIES = """\
import sys
import torch

class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a branch on data: torch.export cannot capture it
            return x * 2
        return x

def branchy():
    return Branchy(), (torch.ones(2, 3),)

def exits():
    raise SystemExit(3)

def exits_cleanly():
    sys.exit(0)

def interrupted():
    raise KeyboardInterrupt
"""


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("exits", "factories.py:exits: it called sys.exit(3) instead of returning a module"),
        ("exits_cleanly", "factories.py:exits_cleanly: it called sys.exit(0) instead of"),
        ("interrupted", "it was interrupted (KeyboardInterrupt) before returning a module"),
        ("branchy", "torch.export cannot capture Branchy: Could not guard on data-dependent"),
    ],
)
def test_a_factory_that_exits_or_fails_is_one_line_and_no_artifact(tmp_path, factory, message):
    """Not exit 0 with nothing written, nor exit 1, nor torch's guards and partial graphs
    printed before the one line."""
    pytest.importorskip("torch")
    (tmp_path / "factories.py").write_text(FACTORIES)
    spec = f"{tmp_path / 'factories.py'}:{factory}"
    result = invoke("compile", spec, "-o", tmp_path / "m.cgc")
    one_line_error(result, message)
    assert not (tmp_path / "m.cgc").exists()


def test_a_module_that_exits_as_it_is_loaded_is_named(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "exits.py").write_text("raise SystemExit('no')\n")
    result = invoke("compile", f"{tmp_path / 'exits.py'}:factory", "-o", tmp_path / "m.cgc")
    one_line_error(result, "exits.py: running it failed: it called sys.exit('no')")


# -- warnings ---------------------------------------------------------------------------------


def test_other_packages_warnings_are_not_printed_but_cgcs_are(models, tmp_path, monkeypatch):
    """A diverging run's numpy overflow warnings are noise around cgc's lines; a CgcWarning is
    one ``warning:`` line."""
    import warnings

    from cgc.errors import CgcWarning
    from cgc.runtime import trainer

    original = trainer.train

    def noisy(*args, **kwargs):
        warnings.warn("overflow encountered in multiply", RuntimeWarning, stacklevel=1)
        warnings.warn("a damaged checkpoint was skipped", CgcWarning, stacklevel=1)
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer, "train", noisy)
    result = invoke(*train_args(models, tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert "warning: a damaged checkpoint was skipped\n" in result.stderr
    assert "overflow" not in result.output


# -- one directory, two runs ------------------------------------------------------------------


HOLDER = """\
import sys, time
from cgc.files import DirectoryLock
DirectoryLock(sys.argv[1], "the other run").acquire()
print("locked", flush=True)
time.sleep(600)
"""
"""Another process that takes a directory's lock and keeps it until it is killed."""


@pytest.fixture
def holder():
    """Starts ``HOLDER`` on a directory; its process, killed at the end."""
    started = []

    def hold(directory: Path) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True
        )
        started.append(process)
        assert process.stdout is not None and process.stdout.readline() == "locked\n"
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()
        process.stdout.close()  # type: ignore[union-attr]


def test_a_second_run_into_a_model_directory_in_use_is_refused(models, tmp_path, holder):
    """Two trainings into one --model-dir would leave one's weights beside a mix of both
    runs' checkpoints; the second is refused before any work and the first's files stay."""
    run = tmp_path / "run"
    assert invoke(*train_args(models, run)).exit_code == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    other = holder(run)
    refused = f"--model-dir {run}: another cgc run (process {other.pid}) is writing there"
    one_line_error(invoke(*train_args(models, run, "--steps", 4)), refused)
    timing = invoke(
        "train", "zoo:cerebras-gpt-111m", "--timing-only", "--steps", 1, "--model-dir", run
    )
    one_line_error(timing, refused)
    with pytest.raises(cgc.CgcError, match=f"model directory {run}: another cgc run"):
        cgc.train(models / "mlp_train.onnx", mlp_train_data(8, seed=0), batch_size=8, steps=1,
                  model_dir=run, target=TARGET)  # fmt: skip
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != LOCK} == before


def test_a_killed_runs_lock_does_not_block_its_resume(models, tmp_path, holder):
    """The lock is the kernel's: it goes with the process that held it."""
    run = tmp_path / "run"
    other = holder(run)
    one_line_error(invoke(*train_args(models, run)), f"process {other.pid}")
    other.send_signal(signal.SIGKILL)
    other.wait()
    assert (run / LOCK).exists()  # left behind by the killed holder
    result = invoke(*train_args(models, run, "--checkpoint-every", 1))
    assert result.exit_code == 0, result.output
    resumed = invoke(*train_args(models, run, "--steps", 3, "--resume"))
    assert resumed.exit_code == 0, resumed.output
    assert not (run / LOCK).exists()


def test_a_run_that_fails_leaves_no_directory_it_made(models, tmp_path):
    result = invoke(*train_args(models, tmp_path / "run", "--lr", "-1"))
    one_line_error(result, "--lr -1: must be >= 0")
    assert not (tmp_path / "run").exists()


def test_two_sweeps_into_one_directory_do_not_interleave(models, tmp_path, holder):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"models: [{models / 'mlp.onnx'}]\nmeasure: inference\ntargets: {TARGET}\n"
                    "batch_size: 8\n")  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    other = holder(out)
    one_line_error(invoke("sweep", spec, "-o", out), f"-o {out}: another cgc run")
    other.kill()
    other.wait()
    assert invoke("sweep", spec, "-o", out, "--jobs", "1").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "points.jsonl",
        "scaling.png",
        "sweep.csv",
        "sweep.json",
    ]


# -- losses and gradients that are not finite -------------------------------------------------


def test_a_diverging_run_stops_at_the_step_with_its_last_checkpoint_intact(models, tmp_path):
    """A learning rate of 1e30 makes step 2's loss and gradients NaN: the run stops there,
    naming the step and the first weight whose gradient is not finite, and leaves the
    checkpoint of step 1 as it was written."""
    run = tmp_path / "run"
    result = invoke(*train_args(models, run, "--steps", 4, "--lr", "1e30", "--checkpoint-every", 1))
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: step 2: the loss is nan, the first gradient not finite is fc1.bias's (nan); "
        "stopped with the weights of step 1"
    )
    assert result.stderr.count("\n") == 1  # the steps before are on stdout
    assert [
        json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ] == [1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]
    assert not (run / "weights.safetensors").exists()
    assert "overflow" not in result.output  # numpy's warnings stay out of the way


def test_allow_nonfinite_trains_on_and_logs_strict_json(models, tmp_path):
    run = tmp_path / "run"
    options = ("--steps", 3, "--lr", "1e30", "--allow-nonfinite")
    assert invoke(*train_args(models, run, *options)).exit_code == 0

    def refuse(constant: str) -> None:
        raise ValueError(f"bare {constant} in metrics.jsonl")

    lines = [
        json.loads(line, parse_constant=refuse)
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    assert [(m["loss"] is None, m["grad_norm"] is None) for m in lines] == [
        (False, False),
        (True, True),
        (True, True),
    ]


def test_the_api_stops_too(models, tmp_path):
    with pytest.raises(cgc.CgcError, match=r"^step 2: the loss is nan"):
        cgc.train(models / "mlp_train.onnx", mlp_train_data(16, seed=0), batch_size=8, steps=3,
                  model_dir=tmp_path / "run", target=TARGET, lr=1e30)  # fmt: skip


def test_a_pipelined_model_whose_weights_alone_exceed_the_wafer_says_so(tmp_path):
    """No placement is searched for 13 billion parameters on 40 GB of SRAM: the error gives
    both sizes."""
    result = invoke("compile", "zoo:cerebras-gpt-13b", "--mode", "pipelined", "-o", tmp_path / "m")
    one_line_error(
        result,
        "model does not fit on wse2 in pipelined mode: its weights alone (47.9 GiB) exceed the "
        "SRAM of the whole wafer (34.1 GiB); use --mode weight_streaming",
    )
