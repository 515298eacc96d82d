"""The files every command reads and writes, at its door: an output that is one of the
command's inputs (or another output), a FIFO, socket or device where a file belongs, a full
disk or a name too long, and contents that lie about their size or hold what YAML refuses.
Each ends in one line naming the option and the path, exit code 2, with no input lost, no
half-written file left and nothing waiting for ever."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import socket
import stat
import threading
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import numpy as np
import pytest
import test_cli_doors
from conftest import TINY
from test_cli import invoke, one_line_error
from test_cli_doors import TARGET, fifo_reader, run_args

import cgc
from cgc import files, sweep_spec, sweep_table
from cgc import sweep as sweeping
from cgc.runtime import checkpoint

static_dir = test_cli_doors.static_dir
"""test_cli_doors' fixture: a static-batch model compiled, its inputs."""
cli_models = test_cli_doors.cli_models
"""test_cli's fixture: the zoo's models saved, and training data."""

LONG = "n" * 300
"""A file name past every file system's 255 bytes."""
STATIC_RUN = ("run", "{s}/static.cgc", "--inputs", "{s}/in.npz")
T = TypeVar("T")


def expand(args: tuple, **paths: Path) -> list[str]:
    return [str(a).format(**paths) for a in args]


# -- an output over an input ----------------------------------------------------------------


@pytest.fixture
def workspace(static_dir, tmp_path) -> Path:
    """Inputs of every command, a run's model directory and a sweep's, and links to them."""
    w = tmp_path
    shutil.copy(static_dir / "static.onnx", w / "m.onnx")
    shutil.copy(static_dir / "static.cgc", w / "a.cgc")
    shutil.copy(static_dir / "in.npz", w / "in.npz")
    shutil.copy(TINY, w / "tiny.yaml")
    (w / "ir.mlir").write_text("builtin.module {}\n")
    (w / "link.onnx").symlink_to("m.onnx")
    os.link(w / "m.onnx", w / "hard.onnx")
    (w / "run" / "checkpoints" / "step-2").mkdir(parents=True)
    for name in ("metrics.jsonl", "weights.safetensors", "checkpoints/step-2/weights.safetensors"):
        (w / "run" / name).write_text(f"{name} of an earlier run\n")
    (w / "spec.yaml").write_text("models: [tiny.yaml]\n")
    (w / "out").mkdir()
    os.link(w / "tiny.yaml", w / "out" / "sweep.csv")
    (w / "out2").mkdir()
    (w / "out2" / "sweep.json").write_text("models: [zoo:cerebras-gpt-111m]\n")
    return w


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a symlink's target, a file's bytes."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            found[key] = "-> " + os.readlink(path)
        else:
            found[key] = path.read_bytes() if path.is_file() else "directory"
    return found


RUN = ("run", "{w}/a.cgc", "--inputs", "{w}/in.npz")
TRAIN = ("train", "{w}/m.onnx", "--data", "{w}/in.npz", "--steps", 1, "--model-dir", "{w}/run")


@pytest.mark.parametrize(
    "args, message",
    [
        (("compile", "{w}/m.onnx", "-o", "{w}/m.onnx"), "-o {w}/m.onnx: the same file as MODEL"),
        (("compile", "{w}/m.onnx", "-o", "{w}/link.onnx"), "-o {w}/link.onnx: the same file"),
        (("compile", "{w}/link.onnx", "-o", "{w}/hard.onnx"), "MODEL {w}/link.onnx"),
        (("compile", "{w}/ir.mlir.py:f", "-o", "{w}/ir.mlir.py"), "MODEL {w}/ir.mlir.py"),
        (("compile", "zoo:cerebras-gpt-111m", "-o", "{w}/run/weights.safetensors", "--weights",
          "{w}/run/weights.safetensors"), "-o {w}/run/weights.safetensors: the same file as "
         "--weights {w}/run/weights.safetensors"),
        ((*RUN, "--output", "{w}/a.cgc"), "--output {w}/a.cgc: the same file as ARTIFACT"),
        ((*RUN, "--trace", "{w}/a.cgc"), "--trace {w}/a.cgc: the same file as ARTIFACT"),
        ((*RUN, "--output", "{w}/in.npz"), "--output {w}/in.npz: the same file as --inputs"),
        ((*RUN, "--stats-json", "{w}/in.npz"), "--stats-json {w}/in.npz: the same file as"),
        ((*RUN, "--stats-json", "{w}/s.json", "--trace", "{w}/s.json"),
         "--trace {w}/s.json: the same file as --stats-json {w}/s.json"),
        ((*RUN, "--output", "{w}/o.npz", "--trace", "{w}/o.npz"), "--trace {w}/o.npz: the same"),
        (("inspect", "{w}/a.cgc", "--placement", "{w}/a.cgc"), "--placement {w}/a.cgc: the same"),
        (("inspect", "{w}/tiny.yaml", "--placement", "{w}/tiny.yaml"), "as ARTIFACT {w}/tiny"),
        (("scale", "{w}/tiny.yaml", "--png", "{w}/tiny.yaml"), "--png {w}/tiny.yaml: the same"),
        (("scale", "{w}/m.onnx", "--json", "{w}/t", "--csv", "{w}/t"), "--csv {w}/t: the same"),
        (("opt", "{w}/ir.mlir", "-o", "{w}/ir.mlir"), "-o {w}/ir.mlir: the same file as FILE"),
        ((*TRAIN, "--trace", "{w}/in.npz"), "--trace {w}/in.npz: the same file as --data"),
        (("train", "{w}/m.onnx", "--data", "{w}/run/metrics.jsonl", "--steps", 1,
          "--model-dir", "{w}/run"),
         "--model-dir {w}/run/metrics.jsonl: the same file as --data {w}/run/metrics.jsonl"),
        ((*TRAIN, "--eval-data", "{w}/run/metrics.jsonl"), "as --eval-data {w}/run/metrics"),
        ((*TRAIN, "--weights", "{w}/run/weights.safetensors"),
         "--model-dir {w}/run/weights.safetensors: the same file as --weights"),
        ((*TRAIN, "--weights", "{w}/run/checkpoints/step-2/weights.safetensors"),
         "--weights {w}/run/checkpoints/step-2/weights.safetensors: inside --model-dir "
         "{w}/run/checkpoints"),
        ((*TRAIN, "--trace", "{w}/run/metrics.jsonl"),
         "--model-dir {w}/run/metrics.jsonl: the same file as --trace"),
        (("train", "zoo:cerebras-gpt-111m", "--timing-only", "--steps", 1, "--model-dir",
          "{w}/run", "--stats-json", "{w}/run/timing.jsonl"), "--model-dir {w}/run/timing"),
        (("sweep", "{w}/spec.yaml", "-o", "{w}/out"),
         "-o {w}/out/sweep.csv: the same file as models: {w}/tiny.yaml"),
        (("sweep", "{w}/out2/sweep.json", "-o", "{w}/out2"),
         "-o {w}/out2/sweep.json: the same file as SPEC {w}/out2/sweep.json"),
    ],
)  # fmt: skip
def test_an_output_over_an_input_is_refused_before_any_work(workspace, args, message) -> None:
    (workspace / "ir.mlir.py").write_text("def f(): ...\n")
    before = snapshot(workspace)
    result = invoke(*expand(args, w=workspace))
    one_line_error(result, message.format(w=workspace))
    assert snapshot(workspace) == before


def test_outputs_may_share_a_character_device_and_a_resumed_run_its_checkpoints(
    cli_models, static_dir, tmp_path
) -> None:
    null = "/dev/null"
    result = invoke(*run_args(static_dir, "--output", null, "--stats-json", null, "--trace", null))
    assert result.exit_code == 0, result.output
    args = test_cli_doors.train_args(cli_models, tmp_path, "--checkpoint-every", 2, steps=2)
    assert invoke(*args).exit_code == 0
    kept = tmp_path / "kept.safetensors"
    shutil.copy(tmp_path / "checkpoints" / "step-2" / "weights.safetensors", kept)
    weights = tmp_path / "checkpoints" / "step-2" / "weights.safetensors"
    result = invoke(*test_cli_doors.train_args(cli_models, tmp_path, "--resume", "--weights",
                                               weights, steps=3))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert weights.read_bytes() == kept.read_bytes()


# -- FIFOs, sockets and devices ---------------------------------------------------------------


def guarded(fifo: Path, call: Callable[[], T]) -> T:
    """``call()`` on a thread, its result or its exception: should it wait on ``fifo`` (a
    regression), the test fails instead of hanging, and the FIFO's other end is opened to
    let the thread go (it may hold CliRunner's stand-ins for ``sys.stdout``)."""
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as error:
            outcome.append((False, error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=120)
    if thread.is_alive():
        with contextlib.suppress(OSError):  # a reader waiting for a writer: one comes and goes
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        threading.Thread(target=fifo.read_bytes, daemon=True).start()  # a writer: one reads
        thread.join(timeout=30)
        pytest.fail(f"waits on {fifo}")
    returned, value = outcome[0]
    if not returned:
        assert isinstance(value, BaseException)
        raise value
    return cast(T, value)


def guarded_invoke(fifo: Path, *args):
    return guarded(fifo, lambda: invoke(*args))


@pytest.fixture
def pipes(tmp_path) -> Path:
    """``pipes/p.SUFFIX``: a FIFO for every kind of file a command reads; ``pipes/out``: a
    FIFO nobody reads; ``pipes/socket``: a Unix socket."""
    for suffix in ("onnx", "yaml", "py", "cgc", "npz", "safetensors", "mlir"):
        os.mkfifo(tmp_path / f"p.{suffix}")
    os.mkfifo(tmp_path / "out")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "socket"))
    yield tmp_path
    server.close()


@pytest.mark.parametrize(
    "args, culprit",
    [
        (("compile", "{p}/p.onnx", "-o", "{p}/o.cgc"), "MODEL {p}/p.onnx"),
        (("compile", "{p}/p.yaml", "-o", "{p}/o.cgc"), "MODEL {p}/p.yaml"),
        (("compile", "{p}/p.py:make", "-o", "{p}/o.cgc"), "MODEL {p}/p.py"),
        (("compile", "{s}/static.onnx", "-o", "{p}/o.cgc", "--weights", "{p}/p.safetensors"),
         "--weights {p}/p.safetensors"),
        (("run", "{p}/p.cgc", "--inputs", "{s}/in.npz"), "ARTIFACT {p}/p.cgc"),
        (("run", "{s}/static.cgc", "--inputs", "{p}/p.npz"), "--inputs {p}/p.npz"),
        (("inspect", "{p}/p.cgc"), "ARTIFACT {p}/p.cgc"),
        (("inspect", "{p}/p.yaml"), "ARTIFACT {p}/p.yaml"),
        (("scale", "{p}/p.yaml"), "MODEL {p}/p.yaml"),
        (("train", "{s}/static.onnx", "--data", "{p}/p.npz", "--steps", 1, "--model-dir",
          "{p}/run"), "--data {p}/p.npz"),
        (("train", "{s}/static.onnx", "--data", "{s}/in.npz", "--eval-data", "{p}/p.npz",
          "--steps", 1, "--model-dir", "{p}/run"), "--eval-data {p}/p.npz"),
        (("sweep", "{p}/p.yaml", "-o", "{p}/sweep"), "SPEC {p}/p.yaml"),
        (("opt", "{p}/p.mlir"), "FILE {p}/p.mlir"),
    ],
)  # fmt: skip
def test_a_fifo_is_no_input(static_dir, pipes, args, culprit) -> None:
    fifo = Path(culprit.split()[-1].format(p=pipes))
    result = guarded_invoke(fifo, *expand(args, p=pipes, s=static_dir))
    one_line_error(result, f"{culprit.format(p=pipes)}: is a named pipe, not a regular file")


@pytest.mark.parametrize(
    "args",
    [
        ("compile", "{s}/static.onnx", "-o", "{p}/out", "--target", TARGET),
        ("run", "{s}/static.cgc", "--inputs", "{s}/in.npz", "--output", "{p}/out"),
        ("run", "{s}/static.cgc", "--inputs", "{s}/in.npz", "--stats-json", "{p}/out"),
        ("run", "{s}/static.cgc", "--timing-only", "--trace", "{p}/out"),
        ("scale", "{s}/static.onnx", "--csv", "{p}/out"),
        ("opt", "{s}/file", "-o", "{p}/out"),
    ],
)
def test_a_fifo_nobody_reads_is_no_output(static_dir, pipes, args) -> None:
    option = args[args.index("{p}/out") - 1]
    result = guarded_invoke(pipes / "out", *expand(args, p=pipes, s=static_dir))
    one_line_error(result, f"{option} {pipes}/out: a named pipe that no process reads")


def test_a_fifo_that_is_read_takes_the_output_and_is_closed_on_an_error(static_dir, pipes):
    fifo, model = pipes / "out", static_dir / "static.onnx"
    with fifo_reader(fifo) as received:
        result = guarded_invoke(fifo, "compile", model, "-o", fifo, "--target", TARGET)
        assert result.exit_code == 0, result.output
    assert received == [cgc.compile(model, target=TARGET).to_bytes()]
    with fifo_reader(fifo) as received:
        result = guarded_invoke(fifo, *run_args(static_dir, "--output", fifo, "--trace", fifo))
        one_line_error(result, f"--trace {fifo}: the same file as --output {fifo}")
        assert files._PIPES == {}, "the end the door opened is closed again"
    assert received == [b""]


@pytest.mark.parametrize(
    "args, culprit",
    [
        (("run", "/dev/zero", "--inputs", "{s}/in.npz"), "ARTIFACT /dev/zero"),
        (("run", "/dev/urandom", "--inputs", "{s}/in.npz"), "ARTIFACT /dev/urandom"),
        (("inspect", "/dev/zero"), "ARTIFACT /dev/zero"),
        (("compile", "/dev/zero", "-o", "{s}/o.cgc"), "MODEL /dev/zero"),
        (("scale", "/dev/urandom"), "MODEL /dev/urandom"),
        (("compile", "{s}/static.onnx", "-o", "{s}/o.cgc", "--weights", "/dev/zero"),
         "--weights /dev/zero"),
        (("run", "{s}/static.cgc", "--inputs", "/dev/zero"), "--inputs /dev/zero"),
        (("train", "{s}/static.onnx", "--data", "/dev/zero", "--steps", 1, "--model-dir",
          "{t}/run"), "--data /dev/zero"),
        (("sweep", "/dev/zero", "-o", "{t}/sweep"), "SPEC /dev/zero"),
        (("opt", "/dev/urandom"), "FILE /dev/urandom"),
    ],
)  # fmt: skip
def test_a_character_device_is_no_input(static_dir, tmp_path, args, culprit) -> None:
    result = invoke(*expand(args, s=static_dir, t=tmp_path))
    one_line_error(result, f"{culprit}: is a character device, not a regular file")
    assert not (static_dir / "o.cgc").exists()


def test_a_socket_is_no_input_nor_output(static_dir, pipes) -> None:
    result = invoke("run", static_dir / "static.cgc", "--inputs", pipes / "socket")
    one_line_error(result, f"--inputs {pipes}/socket: is a socket, not a regular file")
    result = invoke(*run_args(static_dir, "--output", pipes / "socket"))
    one_line_error(result, f"--output {pipes}/socket: is a socket; --output names a file")


def test_a_block_device_is_no_output(static_dir, tmp_path) -> None:
    try:
        os.mknod(tmp_path / "disk", 0o666 | stat.S_IFBLK, os.makedev(7, 0))
    except OSError:
        pytest.skip("the system lets us make no block device")
    result = invoke(*run_args(static_dir, "--output", tmp_path / "disk"))
    one_line_error(result, f"--output {tmp_path}/disk: is a block device; --output names a file")
    with pytest.raises(cgc.CgcError, match="is a block device, not a file to write"):
        files.write_atomically(tmp_path / "disk", b"over a disk")


def test_the_python_api_names_what_a_model_or_artifact_is(pipes) -> None:
    artifact, params, model = pipes / "p.cgc", pipes / "p.yaml", pipes / "p.onnx"
    with pytest.raises(cgc.CgcError, match=r"p\.cgc: is a named pipe, not an artifact"):
        guarded(artifact, lambda: cgc.load(artifact))
    with pytest.raises(cgc.CgcError, match=r"p\.yaml: is a named pipe, not a params file"):
        guarded(params, lambda: cgc.compile(params))
    with pytest.raises(cgc.CgcError, match=r"p\.onnx: is a named pipe"):
        guarded(model, lambda: cgc.compile(model))


# -- a full disk, a name too long --------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("compile", "{s}/static.onnx", "-o", "/dev/full", "--target", TARGET),
        (*STATIC_RUN, "--output", "/dev/full"),
        (*STATIC_RUN, "--stats-json", "/dev/full"),
        ("run", "{s}/static.cgc", "--timing-only", "--trace", "/dev/full"),
        ("opt", "{t}/empty.mlir", "-o", "/dev/full"),
    ],
)
def test_a_full_device_is_one_line(static_dir, tmp_path, args) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    (tmp_path / "empty.mlir").write_text("builtin.module {\n}\n")
    result = invoke(*expand(args, s=static_dir, t=tmp_path))
    one_line_error(result, "/dev/full: cannot write (No space left on device)")


def failing_write(code: int):
    """``files._write`` on a disk that takes part of the data, then fails with ``code``."""

    def write(file, data) -> None:
        file.write(b"part of the data")
        file.flush()
        raise OSError(code, os.strerror(code))

    return write


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    static_dir, tmp_path, monkeypatch, code
) -> None:
    (tmp_path / "out.npz").write_bytes(b"the old file")
    monkeypatch.setattr(files, "_write", failing_write(code))
    result = invoke(*run_args(static_dir, "--output", tmp_path / "out.npz"))
    one_line_error(result, f"{tmp_path}/out.npz: cannot write ({os.strerror(code)})")
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]
    assert (tmp_path / "out.npz").read_bytes() == b"the old file"


def full_disk_after(name: str, whole: int) -> types.SimpleNamespace:
    """``os`` as the file ``name`` sees it on a disk that takes ``whole`` writes, half of the
    next one, and then no more (ENOSPC)."""
    calls = {"count": 0}

    def write(fd: int, data) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(name):
            return os.write(fd, data)
        calls["count"] += 1
        if calls["count"] <= whole:
            return os.write(fd, data)
        if calls["count"] == whole + 1:
            return os.write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return types.SimpleNamespace(**{**vars(os), "write": write})


def test_a_full_disk_in_training_keeps_whole_metric_lines(cli_models, tmp_path, monkeypatch):
    monkeypatch.setattr(files, "os", full_disk_after("metrics.jsonl", 1))
    result = invoke(*test_cli_doors.train_args(cli_models, tmp_path, steps=3))
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        f"error: {tmp_path}/metrics.jsonl: cannot write (No space left on device)"
    )
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 1 and lines[0].startswith('{"step": 1,') and lines[0].endswith("}\n")


def test_a_full_disk_at_a_checkpoint_leaves_no_staging_directory(
    cli_models, tmp_path, monkeypatch
) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "os", types.SimpleNamespace(**{**vars(os), "fsync": fsync}))
    args = test_cli_doors.train_args(cli_models, tmp_path, "--checkpoint-every", 1, steps=2)
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        f"error: {tmp_path}/checkpoints/step-1: cannot write (No space left on device)"
    )
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_full_disk_in_a_sweep_keeps_its_journal_whole(tmp_path, monkeypatch) -> None:
    (tmp_path / "spec.yaml").write_text("models: [zoo:cerebras-gpt-111m]\nnum_csx: [1, 2]\n")

    def failed(point: sweep_spec.GridPoint) -> dict:
        return {**point.parameters(), **dict.fromkeys(sweep_table.RESULTS), "error": "a test"}

    monkeypatch.setattr(sweeping, "measure", failed)
    monkeypatch.setattr(files, "os", full_disk_after(sweeping.JOURNAL, 1))
    result = invoke("sweep", tmp_path / "spec.yaml", "-o", tmp_path / "out", "--jobs", 1)
    assert result.exit_code == 2, result.output
    journal = tmp_path / "out" / sweeping.JOURNAL
    assert result.output.splitlines()[-1] == (
        f"error: {journal}: cannot write (No space left on device)"
    )
    assert len(journal.read_text().splitlines()) == 1
    assert journal.read_text().endswith("}\n")


@pytest.mark.parametrize(
    "args, culprit",
    [
        (("compile", "{s}/static.onnx", "-o", "{t}/{n}.cgc"), "-o {t}/{n}.cgc"),
        (("compile", "{t}/{n}.onnx", "-o", "{t}/o.cgc"), "MODEL {t}/{n}.onnx"),
        (("compile", "{s}/static.onnx", "-o", "{t}/o.cgc", "--dump-ir", "{t}/{n}"),
         "--dump-ir {t}/{n}"),
        (("run", "{s}/static.cgc", "--inputs", "{t}/{n}.npz"), "--inputs {t}/{n}.npz"),
        ((*STATIC_RUN, "--output", "{t}/{n}"), "--output {t}/{n}"),
        ((*STATIC_RUN, "--stats-json", "{t}/{n}/s.json"), "--stats-json {t}/{n}/s.json"),
        (("inspect", "{s}/static.cgc", "--placement", "{t}/{n}.png"), "--placement {t}/{n}.png"),
        (("train", "zoo:cerebras-gpt-111m", "--timing-only", "--steps", 1, "--model-dir",
          "{t}/new/{n}/run"), "--model-dir {t}/new/{n}/run"),
        (("sweep", "{s}/file", "-o", "{t}/{n}"), "-o {t}/{n}"),
        (("opt", "{s}/file", "-o", "{t}/{n}.mlir"), "-o {t}/{n}.mlir"),
    ],
)  # fmt: skip
def test_a_name_too_long_is_one_line(static_dir, tmp_path, args, culprit) -> None:
    paths = {"s": static_dir, "t": tmp_path, "n": LONG}
    result = invoke(*expand(args, **paths))
    one_line_error(result, f"{culprit.format(**paths)}: file name too long")
    assert list(tmp_path.iterdir()) == []


def test_a_path_too_long_is_one_line_and_a_long_name_is_written(static_dir, tmp_path) -> None:
    deep = tmp_path.joinpath(*["d" * 200] * 25)
    result = invoke(*run_args(static_dir, "--output", deep))
    one_line_error(result, f"--output {deep}: file name too long")
    result = invoke("train", "zoo:cerebras-gpt-111m", "--timing-only", "--steps", 1,
                    "--model-dir", deep)  # fmt: skip
    one_line_error(result, f"--model-dir {deep}: file name too long")
    longest = tmp_path / ("n" * 250)  # legal, though its temporary's name would not be
    result = invoke(*run_args(static_dir, "--output", longest))
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir()] == [longest.name]
    assert list(np.load(longest)) == ["y"]


# -- contents that lie or that YAML refuses ---------------------------------------------------


def npz_of(path: Path, member: bytes, compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr("x.npy", member)
    return path


def npy_header(shape: tuple[int, ...], version: tuple[int, int] = (1, 0)) -> bytes:
    stream = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    write = getattr(np.lib.format, f"write_array_header_{version[0]}_{version[1]}")
    write(stream, header)
    return stream.getvalue()


def test_an_npz_member_that_claims_more_than_it_holds(static_dir, cli_models, tmp_path) -> None:
    huge = npz_of(tmp_path / "huge.npz", npy_header((2**22, 2**22)) + bytes(64))
    huge2 = npz_of(tmp_path / "huge2.npz", npy_header((2**40,), (2, 0)), zipfile.ZIP_DEFLATED)
    whole = io.BytesIO()
    np.save(whole, np.ones((100, 3), np.float32))
    cut = npz_of(tmp_path / "cut.npz", whole.getvalue()[:-40], zipfile.ZIP_DEFLATED)
    artifact = static_dir / "static.cgc"
    cases = [
        (("run", artifact, "--inputs", huge), f"--inputs {huge}"),
        (("run", artifact, "--inputs", huge2), f"--inputs {huge2}"),
        (("run", artifact, "--inputs", cut), f"--inputs {cut}"),
        (("train", cli_models / "mlp_train.onnx", "--data", huge, "--steps", 1, "--model-dir",
          tmp_path / "run"), f"--data {huge}"),
        (("train", cli_models / "mlp_train.onnx", "--data", cli_models / "data.npz",
          "--eval-data", cut, "--steps", 1, "--model-dir", tmp_path / "run"),
         f"--eval-data {cut}"),
    ]  # fmt: skip
    for args, culprit in cases:
        one_line_error(invoke(*args), f"{culprit}: member 'x.npy' claims a float32 array of",
                       "(a truncated or forged header)")  # fmt: skip
    one_line_error(invoke(*cases[2][0]), "(100, 3) (1200 bytes) but holds 1160 bytes")


BAD_TEXT = {
    "control.yaml": (b"model:\n  hidden_size: 64\x01\n", "character 24 is U+0001"),
    "latin1.yaml": (b"model:\n  name: caf\xe9\n", "UTF-8 text (byte 18 is 0xe9)"),
    "nul.yaml": (b"model: {}\n" + b"# padding\n" * 600 + b"\x00", "character 6010 is U+0000"),
}
"""Params files YAML refuses, and where: a control character (also past the first 4 KiB,
which PyYAML checks later), a byte that is not UTF-8."""


@pytest.mark.parametrize("name", list(BAD_TEXT))
def test_a_params_file_that_yaml_refuses_is_one_line(tmp_path, name) -> None:
    data, where = BAD_TEXT[name]
    path = tmp_path / name
    path.write_bytes(data)
    (tmp_path / "spec.yaml").write_text(f"models: [{name}]\n")
    for args in (
        ("compile", path, "-o", tmp_path / "o.cgc"),
        ("train", path, "--timing-only", "--steps", 1),
        ("scale", path),
        ("inspect", path),
        ("sweep", tmp_path / "spec.yaml", "-o", tmp_path / "out"),
    ):
        one_line_error(invoke(*args), f"{name}: not valid", where)
    with pytest.raises(cgc.CgcError, match=f"{name}: not valid .*{re.escape(where)}"):
        cgc.compile(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, "spec.yaml"]


def test_a_sweep_spec_that_yaml_refuses_is_one_line(tmp_path) -> None:
    (tmp_path / "control.yaml").write_bytes(b"models: [zoo:cerebras-gpt-111m]\x01\n")
    (tmp_path / "latin1.yaml").write_bytes(b"models: [caf\xe9.yaml]\n")
    result = invoke("sweep", tmp_path / "control.yaml", "-o", tmp_path / "out")
    one_line_error(result, "control.yaml: not YAML", "#x0001", "position 31")
    result = invoke("sweep", tmp_path / "latin1.yaml", "-o", tmp_path / "out")
    one_line_error(result, f"SPEC {tmp_path}/latin1.yaml: not a UTF-8 text file (byte 12 is 0xe9)")
