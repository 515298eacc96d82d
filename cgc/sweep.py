"""A design study (``cgc sweep SPEC.yaml``): a grid of independent timing-only simulations.

The spec, a YAML mapping, lists the values of each axis of the grid: ``models`` (ONNX files,
params files or ``zoo:NAME``; relative paths from the spec's directory), ``targets``, ``set``
(lists of ``FIGURE=VALUE`` target overrides, as ``--set`` takes them; ``[]`` is none),
``mode``, ``sparsity`` (fractions of zeros), ``batch_size`` (global; ``null`` is the model's)
and ``num_csx``, and ``measure``: a ``training`` step, an ``inference`` run or a
``generation``. A point of the grid is compiled and simulated on shapes alone: a design study
compares times, and nothing in a run's time depends on the values it computes
(``cgc.runtime.simulation``), so no weights or inputs are read and the cost of a point grows
with the model's layers, not its tensors.

A generation's point is a language model (a params file or ``zoo:NAME``) serving
``concurrent`` sequences at once, each a prompt of ``prompt_len`` tokens and then
``max_new_tokens`` new ones, timed as ``cgc generate --timing-only`` times it (``mode``
pipelined, whole_wafer, weight_streaming or auto); its row has the time to the first token,
the time per output token, tokens a second in all and per sequence, the tokens the key-value
caches hold, the mode it ran in and what bounds a decode step (``cgc.sweep_table``). Its
three axes are parameters like the others: columns of the table (empty in another
measure's rows) and part of a point's identity. Sweeping ``num_csx``, ``concurrent`` and
``prompt_len`` maps how many systems serve how many sequences of what context, how fast.

Every point is its own task, sharing nothing with the others (each compiles from scratch), so
they run in any order on any executor: here one after another (``jobs=1``), in a local
process pool, or as Ray tasks. Whatever the executor, the table lists the points in the grid's
order with the same figures; only ``compile_seconds``, a wall time, varies between runs.

A point whose model does not fit, or that is otherwise impossible (a batch that does not split
over the systems, a generation longer than the model's positions), is a row with its error: a
design study maps where a design stops working. Any other exception is a bug and stops the
sweep.

The output directory keeps ``points.jsonl``, one line per finished point, appended and synced
as each point finishes: a killed sweep loses only the points in flight, and a re-run computes
only the points the journal lacks (found by their parameters, the model by its file and the
SHA-256 of its bytes, so a model replaced or edited is simulated again). A worker that dies
stops the sweep with the points finished kept. From the journal come ``sweep.csv``,
``sweep.json`` and ``scaling.png`` (throughput, samples or a generation's tokens a second,
and efficiency against the systems, a line per series of points that differ only in
``num_csx``, as ``cgc scale`` draws one model's). Rows that another version of cgc simulated
are not taken: their points are simulated again.

A pool's workers start from a fresh server process, as ``multiprocessing`` does outside Linux:
a script that calls ``run_sweep`` with ``jobs`` above 1 needs the ``if __name__ ==
"__main__":`` guard. Ray's workers need cgc installed, and the models' files, where they run.

The spec and its grid are ``cgc.sweep_spec``'s; the table and the files written from it
``cgc.sweep_table``'s; this module runs the points and keeps the journal.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from math import isfinite
from pathlib import Path

from cgc.errors import CgcError
from cgc.files import DirectoryLock, append_whole, permissions, remove_stale_temporaries, writing
from cgc.machine.hardware.target import Target, get_target, with_figures
from cgc.machine.program.artifact import Artifact
from cgc.options import CompileOptions, SparsityOptions
from cgc.runtime.executors import LOCAL, RAY, checked_executor, connect
from cgc.sweep_spec import GENERATION, IDENTITY, GridPoint, Row, Spec, key
from cgc.sweep_table import OUTPUTS, RESULTS, SERVING, STEP, with_speedups, write_outputs
from cgc.tools.paths import input_file
from cgc.version import __version__

JOURNAL = "points.jsonl"


def measure(point: GridPoint) -> Row:
    """Compiles ``point`` and simulates it on shapes alone (no weights, no inputs): one
    training step or one inference run of its global batch, or a generation served. A
    CgcError (a model that does not fit, a batch that does not split, a context longer than
    the model's positions) is the row's ``error``."""
    try:
        figures = _served(point) if point.measure == GENERATION else _stepped(point)
    except CgcError as error:
        return {**point.parameters(), **dict.fromkeys(RESULTS), "error": str(error)}
    return {**point.parameters(), **dict.fromkeys(RESULTS), **figures, "error": None}


def _stepped(point: GridPoint) -> Row:
    """The figures of a training step's or an inference run's ``point``: its simulation's."""
    from cgc.runtime.simulation import simulate

    started = time.perf_counter()
    artifact = _compiled(point)
    compiled = time.perf_counter() - started
    stats = simulate(artifact).stats
    tokens = stats.tokens_per_second
    return {
        "samples_per_second": float(stats.samples_per_second),
        "tokens_per_second": None if tokens is None else float(tokens),
        "simulated_seconds": float(stats.simulated_seconds),
        "mfu": float(stats.mfu),
        "pe_utilization": float(stats.pe_utilization),
        "peak_pe_sram_bytes": int(stats.peak_pe_sram_bytes),
        "micro_batch": int(stats.micro_batch),
        "micro_batches": int(stats.micro_batches),
        "bound": stats.bound,
        "ran_mode": stats.mode,
        "compile_seconds": compiled,
    }


def _served(point: GridPoint) -> Row:
    """The figures of a generation's ``point``, timed as ``cgc generate --timing-only`` times
    it: its serving's (``simulated_seconds`` the whole generation's). Its ``compile_seconds``
    is the whole of ``cgc.generate``, which compiles the two programs and times each once."""
    import cgc

    started = time.perf_counter()
    generated = cgc.generate(
        point.source,
        timing_only=True,
        prompt_len=point.prompt_len,
        max_new_tokens=point.max_new_tokens,
        concurrent=point.concurrent,
        mode=point.mode,
        target=_target(point),
        num_csx=point.num_csx,
    )
    seconds = time.perf_counter() - started
    serving = generated.serving
    return {
        "tokens_per_second": float(serving.tokens_per_second),
        "simulated_seconds": float(serving.seconds),
        "ttft_seconds": float(serving.ttft_seconds),
        "tpot_seconds": float(serving.tpot_seconds),
        "tokens_per_second_per_sequence": float(serving.tokens_per_second_per_sequence),
        "kv_capacity_tokens": int(serving.kv_capacity_tokens),
        "decode_bound": serving.decode.bound,
        "ran_mode": str(generated.compiled.mode),
        "compile_seconds": seconds,
    }


def _target(point: GridPoint) -> Target:
    """The point's target with its overrides."""
    return with_figures(get_target(point.target), point.set.split())


def _compiled(point: GridPoint) -> Artifact:
    """The artifact of ``point``, as ``cgc train --timing-only`` or ``cgc compile
    --no-weights`` makes it (sparsity 0 is the dense compile itself)."""
    import cgc

    options = CompileOptions(
        mode=point.mode,
        target=_target(point),
        batch_size=point.batch_size,
        num_csx=point.num_csx,
        no_weights=True,
    )
    sparse = SparsityOptions(sparsity=point.sparsity or None)
    if point.measure == "training":
        return cgc.prepare_training(point.source, options, sparse)[0]
    return cgc.compile(point.source, options, sparse)


Finished = Generator[tuple[int, Row], None, None]
"""The points of a list as they finish: each one's index in the list and its row."""


def in_process(points: Sequence[GridPoint]) -> Finished:
    """One point after another, in this process."""
    for index, point in enumerate(points):
        yield index, measure(point)


WARM = ["cgc.sweep", "cgc.compiler.driver", "cgc.runtime.simulation", "cgc.tools.generation"]
"""What the pool's fork server imports once, so that its workers start warm."""


def in_pool(points: Sequence[GridPoint], jobs: int) -> Finished:
    """Up to ``jobs`` points at once in worker processes. The workers fork from a server
    started afresh (``forkserver``), never from this process, which may hold threads (Ray's)
    a fork would copy mid-lock. Leaving early cancels the points not started; a worker that
    dies (killed, out of memory) breaks the pool, which is ``WorkerDied``."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WARM)
    pool = ProcessPoolExecutor(jobs, context, _exit_with, (os.getpid(),))
    try:
        futures = {pool.submit(measure, point): index for index, point in enumerate(points)}
        for future in as_completed(futures):
            yield futures[future], future.result()
    except BrokenProcessPool:
        raise WorkerDied("a worker process of the pool died") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _exit_with(driver: int) -> None:
    """Makes a pool's worker exit soon after the process that runs the sweep: killed, that
    process cannot shut its pool down, and the workers would wait for points forever."""

    def watch() -> None:
        while True:
            time.sleep(1)
            try:
                os.kill(driver, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def on_ray(points: Sequence[GridPoint], address: str | None, cpus: int | None) -> Finished:
    """Every point a Ray task of one CPU, on the cluster at ``address`` (or a local instance
    of ``cpus`` CPUs); the workers import cgc, which must be installed where they run.
    Leaving early cancels the tasks not finished. A worker or node that dies (once Ray stops
    retrying its task) is ``WorkerDied``; an exception of ``measure`` itself, a bug, is Ray's
    ``RayTaskError`` as it is."""
    ray = connect(address, cpus)
    task = ray.remote(num_cpus=1)(measure)
    indices = {task.remote(point): index for index, point in enumerate(points)}
    pending = list(indices)
    died = (
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.NodeDiedError,
        ray.exceptions.OutOfMemoryError,
    )
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield indices[ready[0]], ray.get(ready[0])
    except died as error:
        raise WorkerDied(f"a Ray worker died ({type(error).__name__})") from None
    finally:
        for ref in pending:
            ray.cancel(ref)


class WorkerDied(Exception):
    """A process that ran points ended without answering: killed, or out of memory."""


def executed(
    points: Sequence[GridPoint], executor: str, jobs: int, ray_address: str | None
) -> Finished:
    """``points`` run by ``executor``: ``local`` in this process (``jobs`` 1) or a pool of
    ``jobs`` processes, or ``ray``."""
    if checked_executor(executor) != LOCAL:
        return on_ray(points, ray_address, jobs)
    if jobs == 1 or len(points) <= 1:
        return in_process(points)
    return in_pool(points, min(jobs, len(points)))


class Journal:
    """``DIR/points.jsonl``: the rows of the finished points, a line each, appended and
    synced one by one, each with the version of cgc that simulated it and its ``IDENTITY``. A
    line cut short by a kill is dropped when the journal is opened again (only whole lines are
    points), and the rows of another version of cgc are not taken: their points are simulated
    again. DIR and the file are made with the first row: a sweep that fails before any point
    leaves DIR as it was. The journal holds DIR's lock from when DIR exists until it is
    closed: a second sweep into DIR is refused, not interleaved."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.path = directory / JOURNAL
        self.lock = DirectoryLock(directory, f"-o {directory}")
        if directory.is_dir():
            self.lock.acquire()
        try:
            self.rows = self._read()
            """The finished points' rows, by ``key``."""
        except BaseException:
            self.lock.release()
            raise
        self.fd: int | None = None

    def _read(self) -> dict[str, Row]:
        if not os.path.lexists(self.path):
            return {}
        data = input_file(str(self.path), "the sweep's journal").read_bytes()
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            os.truncate(self.path, whole)
        rows = {}
        for number, line in enumerate(data[:whole].splitlines(), 1):
            try:
                record = json.loads(line)
                if record.pop("cgc") == __version__:
                    rows[key(record)] = _table_row(_checked_results(record))
            except (ValueError, TypeError, KeyError, AttributeError):
                raise CgcError(f"{self.path}: line {number} is not a point's row") from None
        return rows

    def append(self, point: GridPoint, row: Row) -> Row:
        """Records ``row``, the row of ``point``; returns it as the journal gives it back."""
        if self.fd is None:
            if self.lock.key is None:
                self.lock.acquire()
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            with writing(self.path):
                self.fd = os.open(self.path, flags, permissions(directory=False))
        line = json.dumps({"cgc": __version__, **point.identity(), **row}) + "\n"
        append_whole(self.fd, self.path, line.encode(), sync=True)
        record = json.loads(line)
        del record["cgc"]
        loaded = self.rows[key(record)] = _table_row(record)
        return loaded

    def row_of(self, point: GridPoint) -> Row | None:
        """The row of ``point``, if the journal has it, its model named as ``point`` names it
        (the same file under another name is the same point)."""
        row = self.rows.get(key(point.identity()))
        return None if row is None else {**row, **point.parameters()}

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.lock.release()


STEP_NUMBERS = ("samples_per_second", "simulated_seconds", "mfu", "pe_utilization",
                "peak_pe_sram_bytes", "micro_batch", "micro_batches")  # fmt: skip
"""The figures of ``STEP`` that a training step or an inference run which ran always has, as
finite numbers (``tokens_per_second`` too where it is not None)."""
SERVING_NUMBERS = tuple(name for name in SERVING if name != "decode_bound")
"""The figures of ``SERVING`` that a generation which ran always has, as finite numbers."""


def _checked_results(record: Row) -> Row:
    """``record``, if its figures are those ``measure`` writes: every one of ``RESULTS``,
    numbers and names of its measure where the point ran (None for the other measure's),
    None beside an error message where it failed. A ValueError otherwise: a row edited by
    hand must not reach the table's arithmetic."""
    results = {name: record[name] for name in RESULTS}
    error = results.pop("error")
    if isinstance(error, str):
        if any(value is not None for value in results.values()):
            raise ValueError("a failed point with figures")
        return record
    generation = record["measure"] == GENERATION
    figures, bound = (SERVING, "decode_bound") if generation else (STEP, "bound")
    if any(results[name] is not None for name in {*STEP, *SERVING} - {*figures}):
        raise ValueError("another measure's figures")
    numbers = [*SERVING_NUMBERS] if generation else [*STEP_NUMBERS]
    if not generation and results["tokens_per_second"] is not None:
        numbers.append("tokens_per_second")
    for name in [*numbers, "compile_seconds"]:
        value = results[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not isfinite(value):
            raise ValueError(f"{name} is not a number")
    named = isinstance(results[bound], str) or (results[bound] is None and not generation)
    if error is not None or not isinstance(results["ran_mode"], str) or not named:
        raise ValueError("not a point's row")
    return record


def _table_row(record: Row) -> Row:
    """A journal's record without what only the journal keeps."""
    return {name: value for name, value in record.items() if name not in IDENTITY[:2]}


@dataclass(frozen=True)
class SweepOutcome:
    """What a sweep did: its table in the grid's order, and how many points it ran."""

    rows: list[Row]
    ran: int
    skipped: int
    """Points found in the journal of an earlier run."""
    files: list[Path]
    """The table's and the plot's."""


OnPoint = Callable[[int, int, Row], None]
"""Hears of each finished point: the points done (an earlier run's too), of all, its row."""


def run_sweep(
    spec: Spec,
    directory: str | os.PathLike[str],
    executor: str = LOCAL,
    jobs: int | None = None,
    ray_address: str | None = None,
    on_point: OnPoint | None = None,
) -> SweepOutcome:
    """Runs the points of ``spec`` missing from ``directory``'s journal on ``executor``
    (``jobs`` processes, or Ray CPUs of a local instance; default the CPUs here), then writes
    the table and the plot of every point finished, even if the sweep stops early (and
    nothing, if no point has finished). A worker that dies is a one-line CgcError."""
    checked_options(executor, jobs, ray_address)
    root = Path(directory)
    _check_outputs(root)
    grid = spec.points()
    journal = Journal(root)
    remove_stale_temporaries(root, OUTPUTS)  # a killed run's half-written files
    rows = [journal.row_of(point) for point in grid]
    missing = [i for i, row in enumerate(rows) if row is None]
    done = len(grid) - len(missing)
    todo = [grid[i] for i in missing]
    cpus = jobs or os.cpu_count() or 1
    try:
        with contextlib.closing(executed(todo, executor, cpus, ray_address)) as finished:
            for index, row in finished:
                recorded = rows[missing[index]] = journal.append(todo[index], row)
                done += 1
                if on_point is not None:
                    on_point(done, len(grid), recorded)
    except WorkerDied as died:
        kept = f"{done} of {len(grid)} points are kept in {root}"
        raise CgcError(f"{died}; {kept}, and a re-run into it resumes from them") from None
    finally:
        try:
            table = with_speedups([row for row in rows if row is not None])
            files = write_outputs(spec, root, table) if table else []
        finally:
            journal.close()
    return SweepOutcome(table, len(missing), len(grid) - len(missing), files)


def _check_outputs(root: Path) -> None:
    """A CgcError if one of the files a sweep writes in ``root`` is there as something a file
    cannot replace (a directory, say): found after the points ran, it would lose the table."""
    for name in OUTPUTS:
        path = root / name
        if os.path.lexists(path) and not path.is_file():
            raise CgcError(f"{path}: not a file, where the sweep writes its {name}")


def checked_options(executor: str, jobs: int | None, ray_address: str | None) -> None:
    """A one-line error for ``jobs`` below 1 or for an option that would set nothing:
    ``ray_address`` but on Ray, or ``jobs`` (a pool's processes, or the CPUs of a local Ray
    instance) with a cluster at ``ray_address``, whose CPUs are its own."""
    if checked_executor(executor) != RAY and ray_address is not None:
        raise CgcError("--ray-address needs --executor ray")
    if jobs is not None and jobs < 1:
        raise CgcError(f"--jobs {jobs}: must be at least 1")
    if jobs is not None and ray_address is not None:
        raise CgcError("--jobs sets nothing with --ray-address: the cluster's CPUs run the points")
