"""Every file and directory a user hands the command line: checked before any work (one-line
errors, exit 2), outputs written without replacing devices, FIFOs or symlinks, a killed
run's temporaries cleaned, and honest figures in what the commands print."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import sys
import threading
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import test_cli
from onnx import TensorProto, helper, numpy_helper
from test_cli import invoke, one_line_error

from cgc.files import remove_stale_temporaries, write_atomically
from cgc.tools.progress import ProgressBar

TARGET = "mesh16x16"


def static_model(path: Path) -> None:
    """y = x @ W with x of the fixed shape [2, 3]: a model without a batch axis."""
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "static",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory):
    """A static-batch model compiled, its inputs, a binary file, a plain file."""
    root = tmp_path_factory.mktemp("doors")
    static_model(root / "static.onnx")
    result = invoke("compile", root / "static.onnx", "-o", root / "static.cgc", "--target", TARGET)
    assert result.exit_code == 0, result.output
    np.savez(root / "in.npz", x=np.ones((2, 3), np.float32))
    (root / "file").write_text("a file\n")
    (root / "dir").mkdir()
    return root


def run_args(static_dir, *extra):
    return ("run", static_dir / "static.cgc", "--inputs", static_dir / "in.npz", *extra)


# -- input files ---------------------------------------------------------------------------


def test_inputs_that_are_not_npz_archives(static_dir, tmp_path) -> None:
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    data = (static_dir / "in.npz").read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    with zipfile.ZipFile(tmp_path / "text.npz", "w") as archive:
        archive.writestr("x.txt", "not an array")
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    cases = {
        "x.npy": "not an .npz archive",
        "truncated.npz": "not an .npz archive",
        "text.npz": "member 'x.txt' is not a .npy array",
        "objects.npz": "need pickle",
    }
    for name, message in cases.items():
        path = tmp_path / name
        result = invoke("run", static_dir / "static.cgc", "--inputs", path)
        one_line_error(result, f"--inputs {path}", message)


def test_npz_with_a_corrupt_member(static_dir, tmp_path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", b"\x93NUMPY" + bytes(200))
    data = bytearray(buffer.getvalue())
    data[40:60] = bytes(20)  # the member's compressed bytes, not the directory at the end
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    one_line_error(invoke("run", static_dir / "static.cgc", "--inputs", tmp_path / "bad.npz"),
                   "--inputs", "bad.npz")  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (("run", "{w}/static.cgc", "--inputs", ""), "--inputs: empty path"),
        (("run", "{w}/static.cgc", "--inputs", "{w}/dir"), "--inputs {w}/dir: is a directory"),
        (("run", "", "--inputs", "{w}/in.npz"), "ARTIFACT: empty path"),
        (("inspect", ""), "ARTIFACT: empty path"),
        (("compile", "", "-o", "{w}/o.cgc"), "MODEL: empty path"),
        (("compile", "{w}/dir", "-o", "{w}/o.cgc"), "MODEL {w}/dir: is a directory"),
        (("scale", ""), "MODEL: empty path"),
        (("train", "", "--steps", "1", "--timing-only"), "MODEL: empty path"),
        (("opt", ""), "FILE: empty path"),
        (("opt", "{w}/dir"), "FILE {w}/dir: is a directory"),
        (("opt", "{w}/missing.mlir"), "FILE {w}/missing.mlir: no such file"),
    ],
)
def test_bad_input_paths(static_dir, args, message) -> None:
    w = str(static_dir)
    one_line_error(invoke(*[a.format(w=w) for a in args]), message.format(w=w))


def test_opt_on_a_binary_file(tmp_path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07\x12\xff\xfe binary")
    result = invoke("opt", tmp_path / "model.onnx")
    one_line_error(result, f"FILE {tmp_path / 'model.onnx'}: not a UTF-8 text file")


# -- outputs, checked before any work --------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (("compile", "{w}/static.onnx", "-o", ""), "-o: empty path"),
        (("compile", "{w}/static.onnx", "-o", "{w}/dir"), "{w}/dir: is a directory; -o"),
        (("compile", "{w}/static.onnx", "-o", "{w}/o.cgc", "--dump-ir", ""), "--dump-ir: empty"),
        (("compile", "{w}/static.onnx", "-o", "{w}/file/o.cgc"), "{w}/file is not a directory"),
        (("compile", "{w}/static.onnx", "-o", "{w}/file/a/o.cgc"), "{w}/file is not a directory"),
        (("compile", "{w}/static.onnx", "-o", "/proc/o.cgc"), "cannot write in /proc"),
        (("compile", "{w}/static.onnx", "-o", "{w}/no/o.cgc"), "directory {w}/no does not exist"),
        (("run", "{w}/static.cgc", "--inputs", "{w}/in.npz", "--output", ""), "--output: empty"),
        (("run", "{w}/static.cgc", "--inputs", "{w}/in.npz", "--output", "{w}/dir"), "directory"),
        (("run", "{w}/static.cgc", "--inputs", "{w}/in.npz", "--trace", ""), "--trace: empty"),
        (("run", "{w}/static.cgc", "--inputs", "{w}/in.npz", "--stats-json", ""), "--stats-json"),
        (("run", "{w}/static.cgc", "--inputs", "{w}/in.npz", "--trace", "/proc/t.json"), "/proc"),
        (("inspect", "{w}/static.cgc", "--placement", ""), "--placement: empty path"),
        (("inspect", "{w}/static.cgc", "--placement", "{w}/dir"), "is a directory"),
        (("opt", "{w}/file", "-o", ""), "-o: empty path"),
        (("opt", "{w}/file", "-o", "{w}/dir"), "is a directory; -o"),
        (("scale", "{w}/static.onnx", "--json", ""), "--json: empty path"),
        (("scale", "{w}/static.onnx", "--csv", "{w}/dir"), "is a directory; --csv"),
    ],
)
def test_bad_output_paths(static_dir, args, message) -> None:
    w = str(static_dir)
    one_line_error(invoke(*[a.format(w=w) for a in args]), message.format(w=w))
    assert not (static_dir / "o.cgc").exists()


@pytest.mark.parametrize(
    "model_dir, message",
    [
        ("", "--model-dir: empty path"),
        ("{w}/file", "--model-dir {w}/file: exists and is not a directory"),
        ("{w}/file/run", "--model-dir {w}/file/run: {w}/file is not a directory"),
        ("/proc/run", "--model-dir /proc/run: cannot write in /proc"),
    ],
)
def test_bad_model_dirs_fail_before_compiling(static_dir, monkeypatch, model_dir, message) -> None:
    import cgc

    def compiled(*args, **kwargs):
        raise AssertionError("compiled before checking --model-dir")

    monkeypatch.setattr(cgc, "prepare_training", compiled)
    w = str(static_dir)
    args = ["zoo:mlp_train", "--data", static_dir / "in.npz", "--steps", 1]
    result = invoke("train", *args, "--model-dir", model_dir.format(w=w))
    one_line_error(result, message.format(w=w))


# -- writing outputs -------------------------------------------------------------------------


def test_write_through_a_symlink_replaces_its_target(tmp_path) -> None:
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    write_atomically(tmp_path / "link.json", b"new")
    assert (tmp_path / "link.json").is_symlink()
    assert (tmp_path / "real.json").read_text() == "new"
    (tmp_path / "dangling").symlink_to("made.json")
    write_atomically(tmp_path / "dangling", b"made")
    assert (tmp_path / "dangling").is_symlink() and (tmp_path / "made.json").read_text() == "made"


def test_write_to_a_fifo_writes_into_it(tmp_path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    # a daemon: should the FIFO be replaced, the reader would wait for a writer for ever
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_atomically(fifo, [b"one ", b"two"])
    reader.join(timeout=10)
    assert received == [b"one two"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"], "no temporary left"


@contextlib.contextmanager
def fifo_reader(fifo: Path) -> Iterator[list[bytes]]:
    """A thread that reads all of ``fifo`` into the list yielded, its reader open before the
    block starts (a command's door refuses a FIFO that no process reads): a write end of our
    own waits for the reader's open, and holds the reader's input open until the block
    ends. A daemon: should the FIFO be replaced, the reader would wait for ever."""
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    held = os.open(fifo, os.O_WRONLY)
    try:
        yield received
    finally:
        os.close(held)
        reader.join(timeout=60)


def test_cli_writes_into_a_fifo_and_a_symlink(static_dir, tmp_path) -> None:
    fifo = tmp_path / "stats.fifo"
    os.mkfifo(fifo)
    (tmp_path / "out.npz").write_bytes(b"")
    (tmp_path / "link.npz").symlink_to(tmp_path / "out.npz")
    link = tmp_path / "link.npz"
    with fifo_reader(fifo) as received:
        result = invoke(*run_args(static_dir, "--stats-json", fifo, "--output", link))
    assert result.exit_code == 0, result.output
    assert json.loads(received[0])["num_csx"] == 1
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert (tmp_path / "link.npz").is_symlink()
    assert list(np.load(tmp_path / "out.npz")) == ["y"]


def character_devices(tmp_path: Path) -> list[Path]:
    """/dev/null, and a null device of our own where the system lets us make one."""
    devices = [Path("/dev/null")]
    try:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        devices.insert(0, tmp_path / "null")
    except OSError:
        pass
    return devices


def test_writing_to_a_device_keeps_the_device(static_dir, tmp_path) -> None:
    for device in character_devices(tmp_path):
        write_atomically(device, b"discarded")
        assert stat.S_ISCHR(device.stat().st_mode), device
        result = invoke(*run_args(static_dir, "--output", device, "--stats-json", device))
        assert result.exit_code == 0, result.output
        assert stat.S_ISCHR(device.stat().st_mode), device
    assert [p.name for p in tmp_path.iterdir()] in ([], ["null"]), "no temporary left"


# -- a killed run's temporaries ----------------------------------------------------------------


def test_remove_stale_temporaries(tmp_path) -> None:
    stale = [".metrics.jsonl.a1b2c3d4", ".weights.safetensors.zz_9x8y7"]
    kept = ["metrics.jsonl", ".metrics.jsonl", ".other.txt.abcdefgh", ".metrics.jsonl.short"]
    for name in stale + kept:
        (tmp_path / name).write_text("x")
    (tmp_path / ".step-4.qwertyui").mkdir()
    (tmp_path / ".step-4.qwertyui" / "weights.safetensors").write_text("half")
    removed = remove_stale_temporaries(tmp_path, ["metrics.jsonl", "weights.safetensors"])
    assert sorted(p.name for p in removed) == sorted(stale)
    assert remove_stale_temporaries(tmp_path, ["step-*"]) == [tmp_path / ".step-4.qwertyui"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    assert remove_stale_temporaries(tmp_path / "missing", ["x"]) == []


cli_models = test_cli.workdir
"""test_cli's fixture ``workdir``: the zoo's models saved, and training data."""


def train_args(root: Path, model_dir: Path, *extra, steps: int = 4):
    return ("train", root / "mlp_train.onnx", "--data", root / "data.npz", "--batch-size", 8,
            "--steps", steps, "--model-dir", model_dir, "--target", TARGET, *extra)  # fmt: skip


def test_train_removes_a_killed_runs_temporaries(cli_models, tmp_path) -> None:
    (tmp_path / "checkpoints" / ".step-2.abcdefgh").mkdir(parents=True)
    (tmp_path / ".weights.safetensors.abcdefgh").write_text("half")
    (tmp_path / ".metrics.jsonl.abcdefgh").write_text("half")
    result = invoke(*train_args(cli_models, tmp_path, "--checkpoint-every", 2))
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["checkpoints", "metrics.jsonl", "weights.safetensors"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-2", "step-4"]


# -- honest reporting -------------------------------------------------------------------------


def test_a_static_batch_model_says_it_has_no_batch_axis(static_dir) -> None:
    result = invoke("inspect", static_dir / "static.cgc")
    assert result.exit_code == 0, result.output
    assert "None" not in result.output
    assert "no batch axis" in result.output
    result = invoke(*run_args(static_dir))
    assert result.exit_code == 0, result.output
    assert "1 samples" not in result.output
    assert "simulated 1 run of the fixed input shapes (no batch axis)" in result.output
    result = invoke("run", static_dir / "static.cgc", "--timing-only")
    assert result.exit_code == 0, result.output
    assert "1 batch of the fixed input shapes (no batch axis)" in result.output


def test_progress_bar_shows_step_loss_and_time_left() -> None:
    stream = io.StringIO()
    now = [0.0]
    bar = ProgressBar(10, stream, clock=lambda: now[0])
    for step in (7, 8):  # a run resumed after 6 steps
        now[0] += 2.0
        bar({"step": step, "loss": 0.5})
    bar.close()
    frames = stream.getvalue().split("\r")[1:]
    assert "7/10" in frames[0] and "70%" in frames[0] and "loss 0.500000" in frames[0]
    assert "8/10" in frames[1] and "ETA 00:04" in frames[1], frames[1]  # 2 s a step, 2 left
    assert stream.getvalue().endswith("\n")


def test_train_on_a_terminal_resumes_the_bar_at_the_checkpoint(
    cli_models, tmp_path, monkeypatch
) -> None:
    import cgc.cli_io

    result = invoke(*train_args(cli_models, tmp_path, "--checkpoint-every", 2))
    assert result.exit_code == 0, result.output

    class Terminal:
        def __getattr__(self, name):
            return getattr(sys.stdout, name)

        def isatty(self):
            return True

    monkeypatch.setattr(cgc.cli_io, "sys", types.SimpleNamespace(stdout=Terminal()))
    result = invoke(*train_args(cli_models, tmp_path, "--checkpoint-every", 2, "--resume", steps=6))
    assert result.exit_code == 0, result.output
    frames = result.output.split("\r")[1:]
    assert "5/6" in frames[0] and "1/6" not in result.output, result.output
    assert "6/6" in frames[-1] and "100%" in frames[-1] and "loss" in frames[-1]
