"""A design study (``cgc sweep SPEC.yaml``): a grid of independent timing-only simulations.

The spec, a YAML mapping, lists the values of each axis of the grid: ``models`` (ONNX files,
params files or ``zoo:NAME``; relative paths from the spec's directory), ``targets``, ``set``
(lists of ``FIGURE=VALUE`` target overrides, as ``--set`` takes them; ``[]`` is none),
``mode``, ``sparsity`` (fractions of zeros), ``batch_size`` (global; ``null`` is the model's)
and ``num_csx``, and ``measure``: a ``training`` step or an ``inference`` run. A point of the
grid is compiled and simulated on shapes alone: a design study compares times, and nothing in
a run's time depends on the values it computes (``cgc.runtime.simulation``), so no weights
or inputs are read and the cost of a point grows with the model's layers, not its tensors.

Every point is its own task, sharing nothing with the others (each compiles from scratch), so
they run in any order on any executor: here one after another (``jobs=1``), in a local
process pool, or as Ray tasks. Whatever the executor, the table lists the points in the grid's
order with the same figures; only ``compile_seconds``, a wall time, varies between runs.

A point whose model does not fit, or that is otherwise impossible (a batch that does not split
over the systems), is a row with its error: a design study maps where a design stops working.
Any other exception is a bug and stops the sweep.

The output directory keeps ``points.jsonl``, one line per finished point, appended and synced
as each point finishes: a killed sweep loses only the points in flight, and a re-run computes
only the points the journal lacks (found by their parameters, the model by its file and the
SHA-256 of its bytes, so a model replaced or edited is simulated again). A worker that dies
stops the sweep with the points finished kept. From the journal come ``sweep.csv``,
``sweep.json`` and ``scaling.png`` (throughput and efficiency against the systems, a line per
series of points that differ only in ``num_csx``, as ``cgc scale`` draws one model's). Rows
that another version of cgc simulated are not taken: their points are simulated again.

A pool's workers start from a fresh server process, as ``multiprocessing`` does outside Linux:
a script that calls ``run_sweep`` with ``jobs`` above 1 needs the ``if __name__ ==
"__main__":`` guard. Ray's workers need cgc installed, and the models' files, where they run.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from math import isfinite
from pathlib import Path
from typing import Any

import yaml

from cgc.errors import CgcError
from cgc.files import (
    DirectoryLock,
    append_whole,
    permissions,
    remove_stale_temporaries,
    write_atomically,
    writing,
)
from cgc.machine.hardware.target import MAX_BATCH, MAX_SYSTEMS, get_target, with_figures
from cgc.machine.program.artifact import Artifact
from cgc.runtime.executors import LOCAL, RAY, checked_executor, connect
from cgc.tools.paths import input_file, input_text
from cgc.tools.progress import ProgressBar
from cgc.tools.scaling import cell, table_lines
from cgc.version import __version__

Row = dict[str, Any]
"""A point's parameters and its figures, as the table has them (JSON values only)."""

MEASURES = ("training", "inference")
MODES = ("weight_streaming", "pipelined", "auto")
FIELDS = ("models", "measure", "targets", "set", "mode", "sparsity", "batch_size", "num_csx")
"""The fields of a spec; all but ``models`` have defaults (``DEFAULTS``)."""
DEFAULTS: dict[str, Any] = {
    "measure": "training",
    "targets": ["wse2"],
    "set": [[]],
    "mode": ["weight_streaming"],
    "sparsity": [0],
    "batch_size": [None],
    "num_csx": [1],
}
MOST_POINTS = 10_000
"""Most points one spec asks for: a typing slip in an axis should not queue a month's work."""

PARAMETERS = ("model", "measure", "target", "set", "mode", "sparsity", "batch_size", "num_csx")
"""A point's parameters, outer axis first: its columns of the table."""
IDENTITY = ("source", "digest", *PARAMETERS[1:])
"""What identifies a point across runs (its key in the journal): its parameters, but the model
by what is read, not by the name the spec gives it."""
RESULTS = (
    "samples_per_second",
    "tokens_per_second",
    "simulated_seconds",
    "mfu",
    "pe_utilization",
    "peak_pe_sram_bytes",
    "micro_batch",
    "micro_batches",
    "bound",
    "ran_mode",
    "compile_seconds",
    "error",
)
"""What a point measured (all None but ``error`` when it failed)."""
DERIVED = ("speedup", "efficiency")
"""Against the point of fewest systems in its series, computed when the table is written."""
COLUMNS = (*PARAMETERS, *RESULTS, *DERIVED)

JOURNAL = "points.jsonl"
OUTPUTS = ("sweep.csv", "sweep.json", "scaling.png")


@dataclass(frozen=True)
class Point:
    """One point of the grid: what to compile and simulate."""

    model: str
    """As the spec names it."""
    source: str
    """Where it is read from (an absolute path, or ``zoo:NAME``)."""
    digest: str
    """The SHA-256 of the file's bytes (empty for ``zoo:NAME``)."""
    measure: str
    target: str
    set: str
    """Target overrides, ``FIGURE=VALUE`` separated by spaces."""
    mode: str
    sparsity: float
    batch_size: int | None
    num_csx: int

    def parameters(self) -> Row:
        """The point's columns of the table."""
        return {name: getattr(self, name) for name in PARAMETERS}

    def identity(self) -> Row:
        """The point's fields that ``key`` reads."""
        return {name: getattr(self, name) for name in IDENTITY}


def key(fields: Row) -> str:
    """The key of the point whose ``IDENTITY`` is in ``fields`` (a journal's line without
    them, from an older cgc, is the key of no point)."""
    return json.dumps([fields.get(name) for name in IDENTITY])


@dataclass(frozen=True)
class Spec:
    """A checked spec: the values of every axis, in the order given."""

    models: tuple[str, ...]
    sources: tuple[str, ...]
    digests: tuple[str, ...]
    measure: str
    targets: tuple[str, ...]
    set: tuple[str, ...]
    mode: tuple[str, ...]
    sparsity: tuple[float, ...]
    batch_size: tuple[int | None, ...]
    num_csx: tuple[int, ...]

    def points(self) -> list[Point]:
        """The grid, models outermost and ``num_csx`` innermost (a series is contiguous)."""
        models = zip(self.models, self.sources, self.digests, strict=True)
        grid = itertools.product(
            models, self.targets, self.set, self.mode, self.sparsity, self.batch_size, self.num_csx
        )
        return [
            Point(*model, self.measure, target, figures, mode, level, batch, systems)
            for model, target, figures, mode, level, batch, systems in grid
        ]

    def to_json(self) -> dict[str, Any]:
        """The spec as the sweep's JSON records it."""
        data = asdict(self)
        del data["sources"], data["digests"]
        return data


def load_spec(path: str) -> Spec:
    """The spec in the YAML file at ``path``, checked: a bad field is a one-line CgcError
    naming the file, the field and the value."""
    text = input_text(path, "SPEC")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise CgcError(f"{path}: not YAML ({' '.join(str(error).split())})") from None
    except RecursionError:
        raise CgcError(f"{path}: not YAML we read (nested too deeply)") from None
    except ValueError as error:  # Python's own bound on the digits of an integer
        reason = str(error).split(";")[0]
        raise CgcError(f"{path}: not YAML we read ({reason})") from None
    if not isinstance(data, dict):
        raise CgcError(f"{path}: expected a mapping of the fields {', '.join(FIELDS)}")
    try:
        return _checked(data, Path(path).parent)
    except CgcError as error:
        raise CgcError(f"{path}: {error}") from None


def _checked(data: dict[Any, Any], base: Path) -> Spec:
    unknown = [name for name in data if name not in FIELDS]
    if unknown:
        raise CgcError(f"{unknown[0]}: not a field of a sweep (fields: {', '.join(FIELDS)})")
    if "models" not in data:
        raise CgcError("models: missing; give at least one model")
    given = {**DEFAULTS, **data}
    measure = given["measure"]
    if measure not in MEASURES:
        raise CgcError(f"measure: {_shown(measure)}: expected one of {', '.join(MEASURES)}")
    models = _axis(given, "models", _is_text, "a model name")
    targets = _axis(given, "targets", _is_text, "a target name")
    for name in targets:
        _field("targets", get_target, name)
    figures = _axis(given, "set", _is_assignments, "a list of FIGURE=VALUE")
    sets = [_overrides(assignments, targets) for assignments in figures]
    modes = _axis(given, "mode", lambda m: m in MODES, f"one of {', '.join(MODES)}")
    if measure == "training" and modes != ["weight_streaming"]:
        wrong = next(m for m in modes if m != "weight_streaming")
        raise CgcError(f"mode: {wrong}: a training step runs in weight_streaming mode")
    systems = _axis(given, "num_csx", _is_systems, f"a number of systems, 1 to {MAX_SYSTEMS}")
    sources = tuple(_source(model, base) for model in models)
    spec = Spec(
        models=tuple(models),
        sources=sources,
        digests=tuple(map(_digest, sources)),
        measure=measure,
        targets=tuple(targets),
        set=tuple(_distinct("set", sets)),
        mode=tuple(modes),
        sparsity=tuple(_axis(given, "sparsity", _is_level, "a fraction of zeros in [0, 1)")),
        batch_size=tuple(
            _axis(given, "batch_size", _is_batch, f"a batch of 1 to {MAX_BATCH}, or null")
        ),
        num_csx=tuple(systems),
    )
    count = len(models) * len(targets) * len(sets) * len(modes) * len(systems)
    count *= len(spec.sparsity) * len(spec.batch_size)
    if count > MOST_POINTS:
        raise CgcError(f"the grid has {count} points, more than a sweep of {MOST_POINTS}")
    return spec


def _shown(value: object) -> str:
    """A value of the spec as YAML writes it."""
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def _axis(given: dict[Any, Any], name: str, ok: Callable[[Any], bool], what: str) -> list[Any]:
    """The values of the axis ``name`` (one value alone is an axis of one), each ``ok``."""
    values = given[name]
    values = values if isinstance(values, list) else [values]
    if not values:
        raise CgcError(f"{name}: []: give at least one value")
    for value in values:
        if not ok(value):
            raise CgcError(f"{name}: {_shown(value)}: expected {what}")
    return _distinct(name, values)


def _distinct(name: str, values: list[Any]) -> list[Any]:
    """``values``, unless one is given twice (a point would be simulated twice)."""
    repeated = [v for i, v in enumerate(values) if v in values[:i]]
    if repeated:
        raise CgcError(f"{name}: {_shown(repeated[0])} is given twice")
    return values


def _field(name: str, check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)``, its CgcError prefixed with the field's name."""
    try:
        return check(value)
    except CgcError as error:
        raise CgcError(f"{name}: {error}") from None


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_systems(value: object) -> bool:
    return isinstance(value, int) and _is_count(value) and value <= MAX_SYSTEMS


def _is_batch(value: object) -> bool:
    return value is None or (_is_count(value) and isinstance(value, int) and value <= MAX_BATCH)


def _is_level(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1


def _is_assignments(value: object) -> bool:
    """An override list: a list of ``FIGURE=VALUE`` strings, or one such string alone."""
    listed = value if isinstance(value, list) else [value]
    return all(isinstance(v, str) and "=" in v for v in listed)


def _overrides(assignments: str | list[str], targets: Sequence[str]) -> str:
    """An override list, normalised to ``FIGURE=VALUE`` separated by spaces in the order of
    the figures' names (one list in two orders is one point), if it makes a valid target of
    every one of ``targets``."""
    listed = assignments if isinstance(assignments, list) else [assignments]
    pairs = sorted((k.strip(), v.strip()) for k, _, v in (a.partition("=") for a in listed))
    names = [name for name, _ in pairs]
    twice = [name for i, name in enumerate(names) if name in names[:i]]
    if twice:
        raise CgcError(f"set: {twice[0]} is given twice in one list")
    normal = [f"{name}={value}" for name, value in pairs]
    for name in targets:
        try:
            with_figures(get_target(name), normal)
        except CgcError as error:
            raise CgcError(f"set: {str(error).removeprefix('--set ')}") from None
    return " ".join(normal)


def _source(model: str, base: Path) -> str:
    """Where ``model`` is read from, once it is known to be readable: a params file or
    ``zoo:NAME`` is parsed now, an ONNX file found (its graph is read by its points)."""
    from cgc.frontends.params import ZOO_PREFIX, is_params_source, load_params

    if model.startswith(ZOO_PREFIX):
        _field("models", load_params, model)
        return model
    path = str((base / model).resolve())
    if is_params_source(model):
        input_file(path, "models:")
        _field("models", load_params, path)
    elif model.lower().endswith(".onnx"):
        input_file(path, "models:")
    else:
        raise CgcError(f"models: {model}: expected an .onnx file, a params .yaml file or zoo:NAME")
    return path


def _digest(source: str) -> str:
    """The SHA-256 of the bytes of the file at ``source``, empty for a zoo model (cgc's own,
    the same for a version of cgc, which the journal records)."""
    from cgc.frontends.params import ZOO_PREFIX

    if source.startswith(ZOO_PREFIX):
        return ""
    with open(source, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def measure(point: Point) -> Row:
    """Compiles ``point`` and simulates it on shapes alone (no weights, no inputs): one
    training step or one inference run of its global batch. A CgcError (a model that does not
    fit, a batch that does not split) is the row's ``error``."""
    from cgc.runtime.simulation import simulate

    started = time.perf_counter()
    try:
        artifact = _compiled(point)
        compiled = time.perf_counter() - started
        stats = simulate(artifact).stats
    except CgcError as error:
        return {**point.parameters(), **dict.fromkeys(RESULTS), "error": str(error)}
    tokens = stats.tokens_per_second
    return {
        **point.parameters(),
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
        "error": None,
    }


def _compiled(point: Point) -> Artifact:
    """The artifact of ``point``, as ``cgc train --timing-only`` or ``cgc compile
    --no-weights`` makes it (sparsity 0 is the dense compile itself)."""
    import cgc

    target = with_figures(get_target(point.target), point.set.split())
    sparsity = point.sparsity or None
    batch, systems = point.batch_size, point.num_csx
    if point.measure == "training":
        return cgc.prepare_training(
            point.source, batch, num_csx=systems, target=target, no_weights=True, sparsity=sparsity
        )[0]
    return cgc.compile(
        point.source, point.mode, target, batch, num_csx=systems, no_weights=True, sparsity=sparsity
    )


Finished = Generator[tuple[int, Row], None, None]
"""The points of a list as they finish: each one's index in the list and its row."""


def in_process(points: Sequence[Point]) -> Finished:
    """One point after another, in this process."""
    for index, point in enumerate(points):
        yield index, measure(point)


WARM = ["cgc.sweep", "cgc.compiler.driver", "cgc.runtime.simulation"]
"""What the pool's fork server imports once, so that its workers start warm."""


def in_pool(points: Sequence[Point], jobs: int) -> Finished:
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


def on_ray(points: Sequence[Point], address: str | None, cpus: int | None) -> Finished:
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
    points: Sequence[Point], executor: str, jobs: int, ray_address: str | None
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

    def append(self, point: Point, row: Row) -> Row:
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

    def row_of(self, point: Point) -> Row | None:
        """The row of ``point``, if the journal has it, its model named as ``point`` names it
        (the same file under another name is the same point)."""
        row = self.rows.get(key(point.identity()))
        return None if row is None else {**row, **point.parameters()}

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.lock.release()


NUMBERS = ("samples_per_second", "simulated_seconds", "mfu", "pe_utilization",
           "peak_pe_sram_bytes", "micro_batch", "micro_batches", "compile_seconds")  # fmt: skip
"""The figures of ``RESULTS`` that a point which ran always has, as finite numbers."""


def _checked_results(record: Row) -> Row:
    """``record``, if its figures are those ``measure`` writes: every one of ``RESULTS``,
    numbers and names where the point ran, None beside an error message where it failed. A
    ValueError otherwise: a row edited by hand must not reach the table's arithmetic."""
    results = {name: record[name] for name in RESULTS}
    error = results.pop("error")
    if isinstance(error, str):
        if any(value is not None for value in results.values()):
            raise ValueError("a failed point with figures")
        return record
    numbers = [
        *NUMBERS,
        *(["tokens_per_second"] if results["tokens_per_second"] is not None else []),
    ]
    for name in numbers:
        value = results[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not isfinite(value):
            raise ValueError(f"{name} is not a number")
    bound, ran_mode = results["bound"], results["ran_mode"]
    if error is not None or not isinstance(ran_mode, str) or not isinstance(bound, str | None):
        raise ValueError("not a point's row")
    return record


def _table_row(record: Row) -> Row:
    """A journal's record without what only the journal keeps."""
    return {name: value for name, value in record.items() if name not in IDENTITY[:2]}


@dataclass(frozen=True)
class Outcome:
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
) -> Outcome:
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
    return Outcome(table, len(missing), len(grid) - len(missing), files)


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


def series(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """The rows by series: the points that differ only in ``num_csx``, in order."""
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        name = json.dumps([row[p] for p in PARAMETERS if p != "num_csx"])
        grouped.setdefault(name, []).append(row)
    return grouped


def with_speedups(rows: Sequence[Row]) -> list[Row]:
    """``rows`` with each point's speed-up over the point of fewest systems of its series
    that ran, and its efficiency: the speed-up over the ratio of their systems."""
    derived: dict[int, Row] = {}
    for members in series(rows).values():
        ran = [r for r in members if r["error"] is None and r["samples_per_second"]]
        if not ran:
            continue
        one = min(ran, key=lambda r: r["num_csx"])
        for r in ran:
            speedup = r["samples_per_second"] / one["samples_per_second"]
            derived[id(r)] = {
                "speedup": speedup,
                "efficiency": speedup * one["num_csx"] / r["num_csx"],
            }
    empty = dict.fromkeys(DERIVED)
    return [{**row, **derived.get(id(row), empty)} for row in rows]


def varying(rows: Sequence[Row]) -> list[str]:
    """The parameters that take more than one value in ``rows``."""
    return [p for p in PARAMETERS if len({json.dumps(r[p]) for r in rows}) > 1]


def to_csv(rows: Sequence[Row]) -> str:
    """The table as CSV, a row per point (empty cells for what a failed point lacks)."""
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return stream.getvalue()


def to_json(spec: Spec, rows: Sequence[Row]) -> dict[str, Any]:
    """The table as JSON, with the spec it comes from."""
    return {"spec": spec.to_json(), "points": list(rows)}


TEXT_COLUMNS = (
    ("samples_per_second", "samples/s", "{:.4g}"),
    ("speedup", "speed-up", "{:.3f}"),
    ("efficiency", "efficiency", "{:.1%}"),
    ("mfu", "MFU", "{:.1%}"),
    ("peak_pe_sram_bytes", "SRAM/PE", "{}"),
    ("bound", "bound", "{}"),
)
"""The figures the text table shows, beside the parameters that vary (and ``num_csx``)."""
LONGEST_ERROR = 60


def table_text(rows: Sequence[Row]) -> str:
    """The table for people: the parameters that vary, the main figures, and the error of a
    point that failed, cut short (the CSV and JSON have it whole)."""
    shown = [p for p in varying(rows) if p != "num_csx"] + ["num_csx"]
    headers = [*shown, *(label for _, label, _ in TEXT_COLUMNS)]
    lines = []
    for row in rows:
        cells = [cell(row[p], "{}") or "-" for p in shown]
        cells += [cell(row[name], fmt) for name, _, fmt in TEXT_COLUMNS]
        if row["error"] is not None:
            error = " ".join(row["error"].split())
            cut = error[:LONGEST_ERROR] + ("..." if len(error) > LONGEST_ERROR else "")
            cells[len(shown)] = f"error: {cut}"
            cells[len(shown) + 1 :] = [""] * (len(TEXT_COLUMNS) - 1)
        lines.append(cells)
    left = range(len(shown) - 1)
    return "\n".join(table_lines(headers, lines, left)) + "\n"


def write_outputs(spec: Spec, directory: Path, rows: Sequence[Row]) -> list[Path]:
    """``sweep.csv``, ``sweep.json`` and, when a point ran, ``scaling.png``; their paths."""
    written = [directory / name for name in OUTPUTS[:2]]
    write_atomically(written[0], to_csv(rows).encode())
    write_atomically(written[1], json.dumps(to_json(spec, rows), indent=1).encode())
    if any(row["error"] is None for row in rows):
        written.append(directory / OUTPUTS[2])
        save_png(rows, written[-1], f"{spec.measure}, {', '.join(spec.models)}")
    return written


def save_png(rows: Sequence[Row], path: Path, title: str) -> None:
    """Throughput and efficiency against the systems, a line per series of points that ran,
    labelled by the parameters that vary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [p for p in varying(rows) if p != "num_csx"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=100)
    systems: set[int] = set()
    for members in series(rows).values():
        ran = [r for r in members if r["error"] is None]
        if not ran:
            continue
        label = ", ".join(f"{p}={_named(ran[0][p])}" for p in labels) or ran[0]["model"]
        ks = [r["num_csx"] for r in ran]
        systems.update(ks)
        left.plot(ks, [r["samples_per_second"] for r in ran], "o-", label=label)
        right.plot(ks, [r["efficiency"] for r in ran], "o-", label=label)
    left.set(xscale="log", yscale="log", xlabel="systems", ylabel="samples / s")
    right.axhline(1.0, linestyle="--", color="gray")
    right.set(xscale="log", xlabel="systems", ylabel="efficiency", ylim=(0, 1.05))
    for axis in (left, right):
        axis.minorticks_off()
        axis.set_xticks(sorted(systems), [str(k) for k in sorted(systems)])
    right.legend(fontsize="small", loc="lower left")  # below the efficiencies, at most 1
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(figure)
    write_atomically(path, buffer.getvalue())


def _named(value: object) -> object:
    """A parameter in a label: ``none`` for an empty override list."""
    return "none" if value == "" else value


class SweepBar(ProgressBar):
    """``cgc train``'s bar, counting points: a resumed sweep starts at the points it found,
    and the time left is estimated from this run's points alone."""

    label = "sweep"

    def status(self, metrics: dict) -> str:
        return f"{metrics['errors']} failed" if metrics["errors"] else ""
