"""The fuzzer's worker: a long-lived process that imports cgc once and runs each case's
commands in-process, and the checks that need a case's files before and after its commands.

The installed ``cgc`` command (found through its console-script entry point: the fuzzer tests
the command a user runs, and, as a tool, does not import the command-line module) is called
through ``click.testing.CliRunner``, under ``RLIMIT_AS`` and a SIGALRM per case; a step in the
background runs the console script itself as a second process, as a second user would. What
a command writes to file descriptor 2 past click (a library's log line, a C extension's
warning) is kept with its message: a user sees it too. While a case with ``fsize`` runs a
command, ``RLIMIT_FSIZE`` makes writes past that size fail with EFBIG (SIGXFSZ ignored), as on
a full disk.

The file checks, each a record of its own kind (``lost``, ``partial``) besides the exit code:

- the bytes of the case's ``inputs`` are the same after the case (a changed input is lost);
- after a command that exits 2, every plain file that was there before is unchanged (a file
  half-overwritten is lost), and none of its outputs that was not there is (a half-written
  output is partial); after an exit 0 each output is there and is what it says it is;
- an output that is a FIFO, a device, a socket (or a directory, for a file) is still one after
  the command, whatever its exit: a command that wrote into it must not have replaced it;
- no temporary (``cgc.files.TEMPORARY``) is left anywhere in the case's directory;
- a model directory two trainings wrote ends as one run left it (metrics of steps 1..n,
  weights that load, checkpoints of that run's period), a sweep's directory with its tables.

Files whose names start with a dot are cgc's bookkeeping (locks, temporaries) and are left out
of the before-and-after comparison; temporaries are checked on their own.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import multiprocessing
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable
from importlib.metadata import entry_points
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from cgc.files import TEMPORARY
from cgc.machine.program.artifact import weights_from_bytes
from cgc.tools.fuzz_cases import (
    DIR,
    Fills,
    FuzzCase,
    Step,
    edge_inputs,
    inputs_for,
    manifest_of,
    npz,
)
from cgc.tools.fuzz_reference import compare

Record = dict[str, Any]


class CaseTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so that the CLI's ``except Exception`` lets it by.
    SIGALRM also interrupts a blocking ``open`` of a FIFO no process writes."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


def cgc_command() -> Any:
    """The installed ``cgc`` console script's click command."""
    (entry,) = entry_points(group="console_scripts", name="cgc")
    return entry.load()


def cgc_script() -> Path:
    """The installed ``cgc`` console script, beside the interpreter."""
    return Path(sys.executable).with_name("cgc")


def serve(conn: Connection, mem_cap: int, timeout: float) -> None:
    """The worker's loop: run each case received, send back its records."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if mem_cap:
        resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))
    from click.testing import CliRunner

    command = cgc_command()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails instead
    conn.send("ready")
    while (job := conn.recv()) is not None:
        case_dir, case = job
        conn.send(run_case(CliRunner(), command, Path(case_dir), case, timeout))


def run_case(runner: Any, command: Any, root: Path, case: FuzzCase, timeout: float) -> list[Record]:
    """The records of one case's commands and checks, under a SIGALRM after its timeout:
    a last ``{"died": "hang"}`` when it went off."""
    results: list[Record] = []
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, case.timeout or timeout)
    run = CaseRun(runner, command, root, case)
    try:
        run.run(results)
    except CaseTimeout:
        results.append({"died": "hang", "door": run.door})
    except MemoryError as e:
        results.append({"died": f"memory: {e}", "door": run.door})
    except Exception:  # the fuzzer's own bug: stop the run and say where
        results.append({"fuzzer": traceback.format_exc()})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return results


class CaseRun:
    """One case's commands in the worker, and the checks of its files."""

    def __init__(self, runner: Any, command: Any, root: Path, case: FuzzCase) -> None:
        self.runner, self.command, self.root, self.case = runner, command, root, case
        self.watch = not any(step.background for step in case.steps)
        """Compare the files before and after each command (not while another runs)."""
        self.done: list[tuple[Step, Record]] = []
        self.initial: dict[str, str | None] = {}
        """The plain files before the first command."""
        self.door = "?"
        """The command that runs (or ran last)."""

    def run(self, results: list[Record]) -> None:
        """Runs the steps (waiting for those in the background), then checks the files."""
        self.initial = _files(self.root)
        inputs = {name: _digest(self.root / name) for name in self.case.inputs}
        with contextlib.ExitStack() as stack:  # kills what is still running on a timeout
            background: list[tuple[Step, subprocess.Popen[bytes], IO[bytes]]] = []
            previous = 0
            for step in self.case.steps:
                if step.after_success and previous != 0:
                    break
                self.door = step.args[0]
                if step.wait_for:
                    _wait_for(self.root / step.wait_for, [p for _, p, _ in background])
                time.sleep(step.delay)
                if step.background:
                    log: IO[bytes] = stack.enter_context(tempfile.TemporaryFile())
                    background.append((step, self._start(step, log, stack), log))
                    continue
                if step.make_inputs and not write_inputs(
                    self.root, step.make_inputs, step.edge_seed
                ):
                    break  # inputs too large or of a dtype numpy lacks: nothing to compare
                record = self._foreground(step)
                previous = record["exit"]
                self._add(step, record, results)
            for step, process, log in background:
                code = process.wait()
                log.seek(0)
                text = log.read().decode(errors="replace")
                record = {"args": step.args, "exit": code, "stderr": text[:2000],
                          "background": True}  # fmt: skip
                self._add(step, record, results)
        results.extend(self._checks(inputs))

    def _written(self, path: Path) -> bool:
        """Whether a command wrote the file at ``path`` (it is new or changed)."""
        name = os.path.relpath(path, self.root)
        digest = _digest(path)
        return digest is not None and (name not in self.initial or self.initial[name] != digest)

    def _add(self, step: Step, record: Record, results: list[Record]) -> None:
        self.done.append((step, record))
        results.append(record)

    def _start(
        self, step: Step, stderr: IO[bytes], stack: contextlib.ExitStack
    ) -> subprocess.Popen[bytes]:
        """The installed command of ``step`` started as a process, killed when ``stack``
        closes if it still runs."""
        args = [a.replace(DIR, str(self.root)) for a in step.args]
        process = subprocess.Popen(
            [str(cgc_script()), *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=stderr,
        )  # fmt: skip
        stack.callback(_stop, process)
        return process

    def _foreground(self, step: Step) -> Record:
        before = _files(self.root) if self.watch else None
        kinds = {name: _kind(self.root / name) for name, _ in step.outputs}
        args = [a.replace(DIR, str(self.root)) for a in step.args]
        record = {"args": step.args, **self._invoke(args)}
        replaced = [
            f"{name}, a {kinds[name]}"
            for name, kind in step.outputs
            if kinds[name] in ("fifo", "device", "socket", "directory")
            and kind != "dir"
            and _kind(self.root / name) != kinds[name]
        ]
        if replaced:  # as root, /dev/null itself
            record["lost"] = f"{_list(replaced)} replaced or removed"
        if step.planted:
            record["planted"] = step.planted
        if step.user_lines:
            record["user_lines"] = step.user_lines
        if record["exit"] == 0:
            wrong = _outputs_wrong(self.root, step.outputs)
            if wrong:
                record["mismatch"] = wrong
            elif step.compare_with:
                record["checked"], record["mismatch"] = compare(
                    self.root, step.compare_with, step.exact
                )
        if before is not None and record["exit"] == 2 and "lost" not in record:
            existed = {name: kind is not None for name, kind in kinds.items()}
            if step.fills is not None and step.fills.kind == "train":
                # a training that failed part-way leaves its own steps, as --resume wants
                # them: its directory is judged as one run's (_train_dir_problem) instead
                inside = os.path.join(step.fills.dir, "")
                before = {n: d for n, d in before.items() if not n.startswith(inside)}
                existed = {n: e for n, e in existed.items() if not n.startswith(inside)}
            record |= _failed_cleanly(self.root, before, existed)
        return record

    def _invoke(self, args: list[str]) -> Record:
        """Runs the command in-process: its exit code and stderr, what reached file
        descriptor 2 past click, and an exception that escaped click."""
        sys.stderr.flush()
        saved = os.dup(2)
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        with tempfile.TemporaryFile() as leaked:
            os.dup2(leaked.fileno(), 2)
            try:
                if self.case.fsize is not None:
                    resource.setrlimit(resource.RLIMIT_FSIZE, (self.case.fsize, limit[1]))
                result = self.runner.invoke(self.command, args)
                record: Record = {"exit": result.exit_code, "stderr": result.stderr[:2000]}
                if result.exception is not None and not isinstance(result.exception, SystemExit):
                    record["escaped"] = f"{type(result.exception).__name__}: {result.exception}"
                if result.exit_code not in (0, 2):  # (sys.exit("why") prints to stdout here)
                    record["stdout"] = result.stdout[-300:]
            except CaseTimeout:
                raise
            except BaseException as e:  # past click's handlers: what a user sees as a crash
                record = {"exit": 1, "stderr": "", "escaped": f"{type(e).__name__}: {e}"}
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, limit)
                os.dup2(saved, 2)
                os.close(saved)
            leaked.seek(0)
            text = leaked.read().decode(errors="replace").strip()
        if text:
            record["leaked"] = text[:2000]
        return record

    def _checks(self, inputs: dict[str, str | None]) -> list[Record]:
        """The case's file checks once every command has ended."""
        door = "+".join(dict.fromkeys(step.args[0] for step, _ in self.done)) or "?"
        records = []
        changed = [n for n, digest in inputs.items() if _digest(self.root / n) != digest]
        if changed:
            records.append({"door": door, "lost": f"input {_list(changed)} changed"})
        left = [
            str(Path(where, name).relative_to(self.root))
            for where, dirs, names in os.walk(self.root)
            for name in (*dirs, *names)
            if TEMPORARY.fullmatch(name)
        ]
        if left:
            records.append({"door": door, "partial": f"temporary {_list(left)} left"})
        runs: dict[tuple[str, str], list[tuple[Fills, int]]] = {}
        for step, record in self.done:
            if step.fills:
                key = (step.fills.kind, step.fills.dir)
                runs.setdefault(key, []).append((step.fills, record["exit"]))
        for (kind, directory), made in runs.items():
            check = _train_dir_problem if kind == "train" else _sweep_dir_problem
            problem = check(self.root / directory, made, self._written)
            if problem:
                records.append({"door": door, "lost": f"{kind} dir: {problem}"})
        return records


def _wait_for(path: Path, running: list[subprocess.Popen[bytes]]) -> None:
    """Returns when ``path`` exists or none of ``running`` runs any more (the case's SIGALRM
    ends a wait for ever)."""
    while not path.exists() and any(process.poll() is None for process in running):
        time.sleep(0.01)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def _list(names: list[str]) -> str:
    return names[0] + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")


def _digest(path: Path) -> str | None:
    """The SHA-256 of a plain file's bytes; None for anything else."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _kind(path: Path) -> str | None:
    """What is at ``path`` (not through a symlink): ``file``, ``directory``, ``fifo``,
    ``device``, ``socket``, ``symlink``; None for nothing."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    kinds = {stat.S_ISREG: "file", stat.S_ISDIR: "directory", stat.S_ISFIFO: "fifo",
             stat.S_ISCHR: "device", stat.S_ISSOCK: "socket", stat.S_ISLNK: "symlink"}  # fmt: skip
    return next((kind for test, kind in kinds.items() if test(mode)), "other")


def _files(root: Path) -> dict[str, str | None]:
    """The digests of the plain files under ``root`` (not through symlinks), by relative
    path, but for cgc's bookkeeping (names that start with a dot)."""
    return {
        os.path.relpath(os.path.join(where, name), root): _digest(Path(where, name))
        for where, dirs, names in os.walk(root)
        for name in names
        if not name.startswith(".")
    }


def _failed_cleanly(root: Path, before: dict[str, str | None], existed: dict[str, bool]) -> Record:
    """After an exit 2: a ``lost`` record for a file that was there and changed, a
    ``partial`` one for an output that was not there and is."""
    after = _files(root)
    changed = [name for name, digest in before.items() if after.get(name) != digest]
    if changed:
        return {"lost": f"{_list(changed)} changed by a command that failed"}
    left = [name for name, was in existed.items() if not was and os.path.lexists(root / name)]
    if left:
        return {"partial": f"{_list(left)} written by a command that failed"}
    return {}


def _is_json(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
    except ValueError:
        return False
    return True


def _is_text(path: Path) -> bool:
    try:
        path.read_bytes().decode()
    except UnicodeDecodeError:
        return False
    return True


OUTPUT_KINDS: dict[str, Callable[[Path], bool]] = {
    "artifact": lambda p: p.read_bytes()[:8] == b"CGCARTF\0",
    "npz": zipfile.is_zipfile,
    "json": _is_json,
    "png": lambda p: p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n",
    "text": _is_text,
    "dir": lambda p: p.is_dir(),
    "any": lambda p: True,
}
"""What an output of each kind must be after an exit 0 (a plain file, or ``dir``): another
output written over it would not be."""


def _outputs_wrong(root: Path, outputs: list[tuple[str, str]]) -> str | None:
    """After an exit 0: why an output is not there or not of its kind, or None."""
    for name, kind in outputs:
        path = root / name
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return f"exit 0 without its output {name}"
        if kind != "dir" and not stat.S_ISREG(mode):
            continue  # a device or a FIFO: nothing to read back
        try:
            whole = OUTPUT_KINDS[kind](path)
        except OSError:
            whole = False
        if not whole:
            return f"exit 0 but its output {name} is no {kind} (another output over it?)"
    return None


Written = Callable[[Path], bool]
"""Whether a command of the case wrote a file (files it did not are no run's)."""


def _train_dir_problem(
    directory: Path, runs: list[tuple[Fills, int]], written: Written
) -> str | None:
    """Why a model directory is not as one of ``runs`` (``--steps``, ``--checkpoint-every``
    and exit code) left it: ``metrics.jsonl`` steps 1..n of a run that took n steps and wrote
    weights that load, or of one that failed after n steps or fewer and wrote none (a new run
    removes an earlier one's); checkpoints ``step-K`` of that run's period; or None."""
    succeeded = [fills for fills, code in runs if code == 0]
    if not os.path.isdir(directory):  # (a name too long for the file system, say)
        return "no model directory after a training that succeeded" if succeeded else None
    metrics = directory / "metrics.jsonl"
    if not written(metrics):
        return "no metrics.jsonl after a training that succeeded" if succeeded else None
    try:
        steps = [json.loads(line)["step"] for line in metrics.read_bytes().splitlines()]
    except (ValueError, KeyError, TypeError):
        return "metrics.jsonl holds a broken line"
    if steps != list(range(1, len(steps) + 1)):
        return f"metrics.jsonl steps {steps[:6]}... are not 1..n"
    weights = directory / "weights.safetensors"
    finished = written(weights)
    if finished:
        try:
            weights_from_bytes(weights.read_bytes())
        except Exception as e:
            return f"weights.safetensors does not load ({type(e).__name__})"
    owners = [
        f
        for f, code in runs
        if (code == 0 and finished and f.count == len(steps))
        or (code != 0 and not finished and len(steps) <= f.count)
    ]
    if not owners:
        ended = "with" if finished else "without"
        return f"metrics.jsonl of {len(steps)} steps {ended} weights is no one run's"
    found = directory / "checkpoints"
    names = sorted(p.name for p in found.iterdir()) if found.is_dir() else []
    checkpoints = [int(m[1]) for n in names if (m := re.fullmatch(r"step-(\d+)", n))]
    if not any(
        all(f.every and k % f.every == 0 and k <= f.count for k in checkpoints) for f in owners
    ):
        return f"checkpoints {checkpoints} are not of the run whose metrics are there"
    return None


def _sweep_dir_problem(
    directory: Path, runs: list[tuple[Fills, int]], written: Written
) -> str | None:
    """Why a sweep's directory, after a sweep that succeeded, lacks its whole tables:
    ``sweep.json`` and ``sweep.csv`` with every point of the grid, a journal of whole JSON
    lines; or None."""
    succeeded = [fills for fills, code in runs if code == 0]
    if not succeeded or not written(directory / "sweep.json"):
        return None if not succeeded else "no sweep.json after a sweep that succeeded"
    points = succeeded[0].count
    try:
        table = json.loads((directory / "sweep.json").read_bytes())
        rows = list(csv.DictReader((directory / "sweep.csv").read_text().splitlines()))
        for line in (directory / "points.jsonl").read_bytes().splitlines():
            json.loads(line)
    except (OSError, ValueError) as e:
        return f"a table or the journal is missing or broken ({type(e).__name__})"
    listed = table.get("points") if isinstance(table, dict) else None
    if not isinstance(listed, list) or len(listed) != points or len(rows) != points:
        return f"the tables do not list the grid's {points} points"
    return None


def write_inputs(case_dir: Path, artifact: str, edge_seed: int | None = None) -> bool:
    """Writes ``inputs.npz`` for the artifact (edge values if ``edge_seed`` is given); False
    when there are none to give."""
    try:
        manifest = manifest_of((case_dir / artifact).read_bytes())
        seed = len(manifest["inputs"])
        if edge_seed is not None:
            arrays = edge_inputs(manifest, edge_seed)
        else:
            arrays = inputs_for(manifest, seed)
    except (TypeError, ValueError, KeyError):
        return False
    if arrays is None:
        return False
    (case_dir / "inputs.npz").write_bytes(npz(arrays))
    return True


class Worker:
    """The parent's handle on the worker process; restarts it after a death or a hang."""

    def __init__(self, mem_cap: int, timeout: float) -> None:
        self.mem_cap, self.timeout = mem_cap, timeout
        self.restarts = -1
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=serve, args=(child, self.mem_cap, self.timeout), daemon=True
        )
        self.process.start()
        child.close()
        self.restarts += 1
        if not self.conn.poll(300) or self.conn.recv() != "ready":
            raise RuntimeError("the fuzz worker did not start")

    def run(self, case_dir: str, case: FuzzCase) -> list[Record]:
        """The records; a last ``{"died": ...}`` when the case killed or hung the worker."""
        self.conn.send((case_dir, case))
        try:
            if not self.conn.poll((case.timeout or self.timeout) + 30):  # SIGALRM stuck
                self.process.kill()
                died = "hang (SIGALRM did not get through; the worker killed)"
                results = [{"died": died, "door": "+".join(s.args[0] for s in case.steps)}]
            else:
                results = self.conn.recv()
        except EOFError:
            self.process.join()
            results = [{"died": f"signal {-(self.process.exitcode or 0)}"}]
        if results and "fuzzer" in results[-1]:
            raise RuntimeError(f"the fuzzer failed on case {case.id}:\n{results[-1]['fuzzer']}")
        if results and "died" in results[-1]:
            self.close()
            self._start()
        return results

    def close(self) -> None:
        """Stops the worker."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
