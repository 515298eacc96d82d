"""Training checkpoints and resuming: a resumed run ends exactly as an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import mlp_training_fixtures

import cgc
from cgc import files
from cgc.errors import CgcError
from cgc.frontends import zoo
from cgc.machine.training.optimizers import Schedule
from cgc.runtime import checkpoint
from cgc.runtime.trainer import sample_indices

TARGET = "mesh16x16"
SAMPLES, BATCH = 20, 8


model, data = mlp_training_fixtures(SAMPLES, seed=2)


def train(model, data, directory, steps, **options):
    settings = {"optimizer": "adam", "lr": 0.01, "shuffle": True, "seed": 7}
    return cgc.train(
        model,
        data,
        batch_size=BATCH,
        steps=steps,
        model_dir=directory,
        target=TARGET,
        **(settings | options),
    )


def losses(directory):
    lines = (directory / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def same_run(a, b):
    """Two model directories hold the same metrics and bit-identical final weights."""
    assert (a / "metrics.jsonl").read_text() == (b / "metrics.jsonl").read_text()
    assert (a / "weights.safetensors").read_bytes() == (b / "weights.safetensors").read_bytes()


@pytest.fixture(scope="module")
def uninterrupted(model, data, tmp_path_factory):
    directory = tmp_path_factory.mktemp("whole")
    train(model, data, directory, 6, checkpoint_every=2)
    return directory


def test_checkpoints_are_written_every_n_steps(uninterrupted):
    root = uninterrupted / "checkpoints"
    assert checkpoint.saved_steps(root) == [6, 4, 2]
    assert sorted(p.name for p in root.iterdir()) == ["step-2", "step-4", "step-6"], "no leftovers"
    saved = checkpoint.load(root / "step-4")
    assert saved.step == 4 and saved.updates == 4
    assert saved.data == {"global_batch": 8, "shuffle": True, "seed": 7, "next_sample": 32}
    state = saved.optimizer_state["fc1.weight"]
    assert sorted(state) == ["exp_avg", "exp_avg_sq", "step"] and float(state["step"]) == 4


def test_resume_ends_as_an_uninterrupted_run(model, data, uninterrupted, tmp_path):
    train(model, data, tmp_path, 3, checkpoint_every=2)  # stops after step 3; last checkpoint: 2
    result = train(model, data, tmp_path, 6, checkpoint_every=2, resume=True)
    same_run(tmp_path, uninterrupted)
    assert [m["step"] for m in result.metrics] == [1, 2, 3, 4, 5, 6]


def test_a_damaged_checkpoint_is_skipped_for_the_one_before(model, data, uninterrupted, tmp_path):
    train(model, data, tmp_path, 4, checkpoint_every=2)
    damaged = tmp_path / "checkpoints" / "step-4" / "optimizer.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-8] + b"garbage!")
    with pytest.warns(UserWarning) as heard:
        train(model, data, tmp_path, 6, checkpoint_every=2, resume=True)
    assert [str(w.message) for w in heard] == [
        "checkpoint step-4 is damaged (optimizer.safetensors does not match its checksum); "
        "trying an earlier one"
    ]
    same_run(tmp_path, uninterrupted)


def test_resume_without_an_intact_checkpoint(model, data, tmp_path):
    train(model, data, tmp_path, 2, checkpoint_every=2)
    (tmp_path / "checkpoints" / "step-2" / "state.json").write_text("{")
    with (
        pytest.warns(UserWarning, match="checkpoint step-2 is damaged"),
        pytest.raises(CgcError, match=r"resume: no checkpoint in .* is intact"),
    ):
        train(model, data, tmp_path, 4, resume=True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seed": 8}, "was written with seed 7, this run has 8"),
        ({"shuffle": False}, "was written with shuffle True, this run has False"),
    ],
)
def test_resume_needs_the_same_order_of_samples(model, data, tmp_path, options, message):
    train(model, data, tmp_path, 2, checkpoint_every=2)
    with pytest.raises(CgcError, match=f"resume: checkpoint step-2 {message}"):
        train(model, data, tmp_path, 4, resume=True, **options)


def test_resume_with_no_checkpoint_starts_afresh(model, data, uninterrupted, tmp_path):
    train(model, data, tmp_path, 6, checkpoint_every=2, resume=True)
    same_run(tmp_path, uninterrupted)


def test_shuffled_order_covers_every_sample_each_epoch():
    steps = [sample_indices(s, 4, 10, True, 3) for s in range(5)]
    flat = np.concatenate(steps)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert not np.array_equal(flat[:10], flat[10:20]), "each epoch has its own order"
    np.testing.assert_array_equal(steps[3], sample_indices(3, 4, 10, True, 3))
    np.testing.assert_array_equal(sample_indices(2, 4, 10, False, 3), [8, 9, 0, 1])


def test_checkpoint_round_trip_and_damage(tmp_path):
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    state = {"w": {"momentum_buffer": np.ones((2, 3), np.float32)}}
    order = {"global_batch": 4, "shuffle": False, "seed": 0, "next_sample": 12}
    settings = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9}
    where = checkpoint.save(tmp_path, checkpoint.Checkpoint(3, weights, state, 3, order, settings))
    loaded = checkpoint.load(where)
    np.testing.assert_array_equal(loaded.weights["w"], weights["w"])
    np.testing.assert_array_equal(loaded.optimizer_state["w"]["momentum_buffer"], 1)
    assert loaded.data == order and loaded.optimizer == settings
    assert (where.stat().st_mode & 0o777) == files.permissions(directory=True)
    (where / "weights.safetensors").unlink()
    with pytest.raises(checkpoint.CorruptCheckpoint, match="FileNotFoundError"):
        checkpoint.load(where)


def cli_train(directory, data_path, model_path, *extra):
    command = [str(Path(sys.executable).parent / "cgc"), "train", str(model_path)]
    command += ["--data", str(data_path)]
    command += ["--batch-size", str(BATCH), "--steps", "40", "--model-dir", str(directory)]
    command += ["--target", TARGET, "--optimizer", "adam", "--lr", "0.01", "--shuffle"]
    command += ["--checkpoint-every", "1", *extra]
    return command


def test_a_run_killed_mid_way_resumes_to_the_same_end(model, data, tmp_path):
    """SIGKILL at an arbitrary moment after the third checkpoint, then --resume."""
    model_path, data_path = tmp_path / "m.onnx", tmp_path / "d.npz"
    zoo.save(model, model_path)
    np.savez(data_path, **data)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(cli_train(whole, data_path, model_path), check=True, capture_output=True)
    process = subprocess.Popen(cli_train(killed, data_path, model_path), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (killed / "checkpoints" / "step-3").exists():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert len(losses(killed)) < 40, "killed before the end"
    resumed = subprocess.run(
        cli_train(killed, data_path, model_path, "--resume"), capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    same_run(killed, whole)


def test_a_new_run_clears_the_checkpoints_of_an_earlier_one(model, data, tmp_path):
    """Else a later --resume would continue the earlier run."""
    train(model, data, tmp_path / "old", 6, checkpoint_every=2)
    (tmp_path / "old").rename(tmp_path / "run")
    train(model, data, tmp_path / "run", 3, checkpoint_every=2, lr=0.05)
    assert checkpoint.saved_steps(tmp_path / "run" / "checkpoints") == [2]
    train(model, data, tmp_path / "run", 4, checkpoint_every=2, lr=0.05, resume=True)
    train(model, data, tmp_path / "whole", 4, checkpoint_every=2, lr=0.05)
    same_run(tmp_path / "run", tmp_path / "whole")


def test_resume_refuses_other_settings_or_fewer_steps(model, data, tmp_path):
    train(model, data, tmp_path, 4, checkpoint_every=4)
    with pytest.raises(CgcError, match=r"^resume: checkpoint step-4 is beyond steps 2"):
        train(model, data, tmp_path, 2, resume=True)
    with pytest.raises(CgcError, match=r"written with other optimizer settings \(amsgrad\)"):
        train(model, data, tmp_path, 6, resume=True, amsgrad=True)
    with pytest.raises(CgcError, match=r"other optimizer settings \(.*momentum.*optimizer"):
        train(model, data, tmp_path, 6, resume=True, optimizer="sgd", momentum=0.9)


def test_loop_option_errors(model, data, tmp_path):
    with pytest.raises(CgcError, match=r"^seed -1: must be >= 0"):
        train(model, data, tmp_path, 2, seed=-1)
    with pytest.raises(CgcError, match=r"^eval_every 0: must be at least 1"):
        train(model, data, tmp_path, 2, eval_data=data, eval_every=0)
    small = {name: array[:4] for name, array in data.items()}
    with pytest.raises(CgcError, match=r"^eval_data has 4 samples, fewer than one batch of 8"):
        train(model, data, tmp_path / "small", 2, eval_data=small)
    assert not (tmp_path / "small" / "metrics.jsonl").exists(), "refused before any step"


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        ({"lr_schedule": "cosine"}, {}, "lr_schedule cosine, this run has constant"),
        (
            {"lr_schedule": "cosine"},
            {"lr_schedule": "cosine", "steps": 8},
            "steps 4, this run has 8",
        ),
        ({"warmup_steps": 3}, {"warmup_steps": 1}, "warmup_steps 3, this run has 1"),
        (
            {"lr_schedule": "step", "lr_gamma": 0.5},
            {"lr_schedule": "step", "lr_gamma": 0.9},
            "lr_gamma 0.5, this run has 0.9",
        ),
        (
            {"lr_schedule": "step", "lr_step_size": 1},
            {"lr_schedule": "step", "lr_step_size": 2},
            "lr_step_size 1, this run has 2",
        ),
        ({"max_grad_norm": 1.0}, {}, "max_grad_norm 1, this run has none"),
        ({}, {"max_grad_norm": 0.5}, "max_grad_norm none, this run has 0.5"),
        (
            {"trainable": ["fc3.*"]},
            {"trainable": ["fc[23].*"]},
            "trainable fc3.bias,fc3.weight, this run has fc2.bias,fc2.weight,fc3.bias,",
        ),
    ],
)
def test_resume_refuses_a_loop_setting_that_changes_the_steps_taken(
    model, data, tmp_path, before, after, message
):
    train(model, data, tmp_path, 4, checkpoint_every=2, **before)
    (tmp_path / "checkpoints" / "step-4").rename(tmp_path / "gone")  # resume from step-2
    options = {"steps": 4} | after
    with pytest.raises(CgcError, match=f"^resume: checkpoint step-2 was written with {message}"):
        train(model, data, tmp_path, resume=True, **options)


def test_extending_a_constant_schedule_resumes_as_an_uninterrupted_run(
    model, data, uninterrupted, tmp_path
):
    """More --steps leave a constant schedule's steps alone; the held-out loss only looks."""
    train(model, data, tmp_path, 4, checkpoint_every=2)
    result = train(model, data, tmp_path, 6, checkpoint_every=2, resume=True, eval_data=data)
    assert [m["loss"] for m in result.metrics] == losses(uninterrupted)
    assert (tmp_path / "weights.safetensors").read_bytes() == (
        uninterrupted / "weights.safetensors"
    ).read_bytes()


def test_a_schedule_change_after_the_steps_taken_resumes(model, data, tmp_path):
    """A step decay every 3 steps instead of 4 gives steps 1-2 the same rate: allowed."""
    step_decay = {"lr_schedule": "step", "lr_gamma": 0.5, "checkpoint_every": 2}
    train(model, data, tmp_path / "run", 3, lr_step_size=4, **step_decay)
    train(model, data, tmp_path / "run", 6, lr_step_size=3, resume=True, **step_decay)
    train(model, data, tmp_path / "whole", 6, lr_step_size=3, **step_decay)
    same_run(tmp_path / "run", tmp_path / "whole")


def test_a_checkpoint_without_the_loop_record_still_resumes(model, data, tmp_path):
    """Written before the loop's settings were recorded: they are unknown, so unchecked."""
    train(model, data, tmp_path, 2, checkpoint_every=2, lr_schedule="cosine")
    state_path = tmp_path / "checkpoints" / "step-2" / "state.json"
    state = json.loads(state_path.read_text())
    del state["loop"]
    state_path.write_text(json.dumps(state))
    assert checkpoint.load(state_path.parent).loop is None
    result = train(model, data, tmp_path, 4, resume=True)
    assert [m["step"] for m in result.metrics] == [1, 2, 3, 4]


def test_the_loop_record_round_trips_and_a_bad_one_is_damage(tmp_path):
    schedule = Schedule("cosine", 1, 10, 1, 0.1)
    record = checkpoint.loop_record(schedule, 2.0, ["b", "a"])
    order = {"global_batch": 4, "shuffle": False, "seed": 0, "next_sample": 12}
    saved = checkpoint.Checkpoint(3, {}, {}, 3, order, {"optimizer": "sgd"}, record)
    where = checkpoint.save(tmp_path, saved)
    assert checkpoint.load(where).loop == record and record["trainable"] == ["a", "b"]
    state = json.loads((where / "state.json").read_text())
    state["loop"]["schedule"]["kind"] = "linear"
    (where / "state.json").write_text(json.dumps(state))
    with pytest.raises(checkpoint.CorruptCheckpoint, match="unknown schedule 'linear'"):
        checkpoint.load(where)


def test_changed_setting_compares_the_steps_taken_only():
    def found_after(step: int, schedule: Schedule) -> checkpoint.Checkpoint:
        record = checkpoint.loop_record(schedule, None, ["w"])
        return checkpoint.Checkpoint(step, {}, {}, step, {}, {}, record)

    def change(step: int, then: Schedule, now: Schedule):
        return checkpoint.changed_setting(found_after(step, then), found_after(0, now).loop or {})

    cosine = Schedule("cosine", 0, 10)
    assert change(1, cosine, Schedule("cosine", 0, 20)) is None, "step 1's factor is 1 in both"
    assert change(2, cosine, Schedule("cosine", 0, 20)) == ("steps", "10", "20")
    assert change(5, Schedule("constant", 0, 10), Schedule("constant", 0, 20)) is None
    warm = Schedule("cosine", 4, 10)
    assert change(5, warm, Schedule("constant", 4, 10)) is None, "warm-up, then a full rate"
    assert change(6, warm, Schedule("constant", 4, 10)) == ("lr_schedule", "cosine", "constant")
    assert change(3, Schedule("step", 0, 10, 4), Schedule("step", 0, 20, 5)) is None
    assert change(6, Schedule("step", 0, 10, 4), Schedule("step", 0, 20, 5)) == (
        "lr_step_size", "4", "5"
    )  # fmt: skip
