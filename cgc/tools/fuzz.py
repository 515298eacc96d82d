"""A mutational fuzzer over cgc's three doors: ONNX files, artifacts, and options and files.

The oracle: every case ends either in exit 0 (and, for an ONNX model that onnxruntime also
accepts, outputs that agree with onnxruntime's to rtol 1e-4, atol 1e-5, or, for an
ill-conditioned output, lie nearer its float64 value, by onnx's reference evaluator, than
onnxruntime's float32 does), or in exit 2 with
exactly one line on stderr naming the culprit. Anything else is a defect: exit 1 (an internal
error), exit 2 with an empty or multi-line message, outputs that disagree (silently wrong), a
hang (over the per-case timeout) or a memory-cap hit (``MemoryError``, or the worker killed by
a signal). Click's own usage errors ("Usage: ... / Try ... / Error: ...") count as one line:
their preamble is click's fixed format, the ``Error:`` line is the message.

Cases run in a long-lived worker process that imports cgc once and calls the installed ``cgc``
command in-process through ``click.testing.CliRunner``, under ``RLIMIT_AS`` and a SIGALRM per
case; the worker is restarted when it dies. The command is found through its console-script
entry point: the fuzzer tests the command a user runs, and (as a tool) does not import the
command-line module. Everything is deterministic from the seed: case ``i`` draws from
``random.Random(f"{seed}:{i}")``.

    python -m cgc.tools.fuzz --cases 1000 --seed 0 --time-budget 600 --keep build/fuzz-cases \\
        --json build/fuzz.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

import cgc.tools.fuzz_mutators as mut
from cgc.tools.fuzz_cases import (
    DIR,
    Case,
    SetupFiles,
    Step,
    inputs_for,
    manifest_of,
    npz,
    options_case,
)

FAMILIES = ("onnx", "artifact", "options")
CATEGORIES = ("clean", "success", "internal", "hang", "memcap")
RTOL, ATOL = 1e-4, 1e-5
# ------------------------------------------------------------------------------- case makers


def onnx_case(index: int, rng: random.Random, setup: SetupFiles) -> Case:
    """A (mutated) seed model: compile it, run it on random inputs, compare with onnxruntime.
    The first case of each seed model is the seed itself, a control for the oracle."""
    names = sorted(setup.models)
    name = names[(index // len(FAMILIES)) % len(names)]
    if index // len(FAMILIES) < len(names):
        data, what = setup.models[name].SerializeToString(), "unmutated (control)"
    elif rng.random() < 0.35:
        data, what = mut.mutate_model_valid(setup.models[name], rng)
    else:
        data, what = mut.mutate_model(setup.models[name], rng)
    files = {"model.onnx": data, "w.bin": bytes(range(256)) * 8}
    compile_args = ["compile", f"{DIR}/model.onnx", "-o", f"{DIR}/model.cgc"]
    compile_args += rng.choice([[], [], ["--mode", "weight_streaming"], ["--mode", "pipelined"]])
    run_args = ["run", f"{DIR}/model.cgc", "--inputs", f"{DIR}/inputs.npz"]
    steps = [
        Step(compile_args),
        Step([*run_args, "--output", f"{DIR}/outputs.npz"], make_inputs="model.cgc",
             compare_with="model.onnx"),
    ]  # fmt: skip
    return Case(index, "onnx", f"{name}.onnx: {what}", steps, files, ["sub"])


def artifact_case(index: int, rng: random.Random, setup: SetupFiles) -> Case:
    """A compiled seed artifact, mutated behind its checksums, through ``inspect`` and ``run``."""
    name = rng.choice(sorted(setup.artifacts))
    data, what = mut.mutate_artifact(setup.artifacts[name], rng)
    flags = rng.sample(["--json", "--disasm", "--ir"], rng.randint(0, 2))
    files = {"model.cgc": data, "inputs.npz": setup.inputs[name]}
    run = ["run", f"{DIR}/model.cgc", "--inputs", f"{DIR}/inputs.npz"]
    run += rng.choice([["--output", f"{DIR}/out.npz"], ["--stats-json", f"{DIR}/s.json"], []])
    if rng.random() < 0.2:
        run = ["run", f"{DIR}/model.cgc", "--timing-only"]
    steps = [Step(["inspect", f"{DIR}/model.cgc", *flags]), Step(run, after_success=False)]
    return Case(index, "artifact", f"{name}: {what}", steps, files)


MAKERS: dict[str, Callable[[int, random.Random, SetupFiles], Case]] = {
    "onnx": onnx_case,
    "artifact": artifact_case,
    "options": options_case,
}


def make_case(index: int, seed: int, setup: SetupFiles, families: tuple[str, ...]) -> Case:
    """Case ``index`` of the run with ``seed``: the families take turns."""
    rng = random.Random(f"{seed}:{index}")
    family = families[index % len(families)]
    case = MAKERS[family](index, rng, setup)
    case.id = index
    return case


# ------------------------------------------------------------------------------- the worker


class CaseTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so that the CLI's ``except Exception`` lets it by."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


def cgc_command() -> Any:
    """The installed ``cgc`` console script's click command."""
    (entry,) = entry_points(group="console_scripts", name="cgc")
    return entry.load()


def _serve(conn: Connection, mem_cap: int, timeout: float) -> None:
    """The worker's loop: run each case received, send back its step results."""
    if mem_cap:
        resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))
    from click.testing import CliRunner

    command = cgc_command()
    signal.signal(signal.SIGALRM, _on_alarm)
    conn.send("ready")
    while (case := conn.recv()) is not None:
        case_dir, steps = case
        results: list[dict[str, Any]] = []
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            _run_steps(CliRunner(), command, case_dir, steps, results)
        except CaseTimeout:
            results.append({"died": "hang"})
        except MemoryError as e:
            results.append({"died": f"memory: {e}"})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        conn.send(results)


def _run_steps(runner: Any, command: Any, case_dir: str, steps: list[Step], results: list) -> None:
    previous = 0
    for step in steps:
        if step.after_success and previous != 0:
            return
        if step.make_inputs and not write_inputs(Path(case_dir), step.make_inputs):
            return  # inputs too large or of a dtype numpy lacks: nothing to compare
        args = [a.replace(DIR, case_dir) for a in step.args]
        result = runner.invoke(command, args)
        previous = result.exit_code
        record = {"args": step.args, "exit": result.exit_code, "stderr": result.stderr[-2000:]}
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            record["escaped"] = f"{type(result.exception).__name__}: {result.exception}"
        if previous == 0 and step.compare_with:
            record["checked"], record["mismatch"] = compare(Path(case_dir), step.compare_with)
        results.append(record)


def write_inputs(case_dir: Path, artifact: str) -> bool:
    """Writes ``inputs.npz`` for the artifact; False when there are none to give."""
    try:
        manifest = manifest_of((case_dir / artifact).read_bytes())
        arrays = inputs_for(manifest, seed=len(manifest["inputs"]))
    except (TypeError, ValueError, KeyError):
        return False
    if arrays is None:
        return False
    (case_dir / "inputs.npz").write_bytes(npz(arrays))
    return True


def compare(case_dir: Path, model: str) -> tuple[bool, str | None]:
    """Whether the outputs could be checked (onnxruntime accepts the model and the inputs),
    and how cgc's outputs disagree with onnxruntime's, or None."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # its warnings about mutants would flood the terminal
    with np.load(case_dir / "inputs.npz") as f:
        inputs = dict(f)
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(case_dir / model), options, ["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        expected = dict(zip(names, session.run(None, inputs), strict=True))
    except Exception:  # onnxruntime does not accept the model or the inputs: no reference
        return False, None
    with np.load(case_dir / "outputs.npz") as f:
        got = dict(f)
    for name, want in expected.items():
        if name not in got:
            return True, f"output '{name}' missing"
        if got[name].shape != np.shape(want):
            return True, f"output '{name}' shape {got[name].shape} != {np.shape(want)}"
        if np.allclose(got[name], want, rtol=RTOL, atol=ATOL, equal_nan=True):
            continue
        exact = _in_float64(case_dir / model, inputs, name)
        if exact is not None and _error(got[name], exact) <= _error(want, exact):
            continue  # an ill-conditioned output: cgc is nearer the exact one than onnxruntime
        worst = float(np.nanmax(np.abs(got[name].astype(np.float64) - want)))
        return True, f"output '{name}' differs (max abs diff {worst:.3g})"
    return True, None


def _in_float64(path: Path, inputs: dict[str, np.ndarray], name: str) -> np.ndarray | None:
    """Output ``name`` of the model computed in float64 by onnx's reference evaluator (every
    float32 tensor, initializer, constant and cast made float64; onnxruntime has no float64
    convolution), or None where it cannot run so."""
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    graph = model.graph
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    tensors = [*graph.initializer]
    for node in graph.node:
        for attribute in node.attribute:
            if (
                node.op_type == "Cast"
                and attribute.name == "to"
                and attribute.i == TensorProto.FLOAT
            ):
                attribute.i = TensorProto.DOUBLE
            if attribute.type == onnx.AttributeProto.TENSOR:
                tensors.append(attribute.t)
    for tensor in tensors:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(
                numpy_helper.from_array(
                    numpy_helper.to_array(tensor).astype(np.float64), tensor.name
                )
            )
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in inputs.items()}
    try:
        (value,) = ReferenceEvaluator(model).run([name], wide)
        return np.asarray(value, dtype=np.float64)
    except Exception:  # an op the evaluator has not, or not for float64
        return None


def _error(values: np.ndarray, exact: np.ndarray) -> float:
    """The largest distance of ``values`` from ``exact`` in units of the tolerance."""
    scale = ATOL + RTOL * np.abs(exact)
    return float(np.nanmax(np.abs(values.astype(np.float64) - exact) / scale, initial=0.0))


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
            target=_serve, args=(child, self.mem_cap, self.timeout), daemon=True
        )
        self.process.start()
        child.close()
        self.restarts += 1
        if not self.conn.poll(300) or self.conn.recv() != "ready":
            raise RuntimeError("the fuzz worker did not start")

    def run(self, case_dir: str, steps: list[Step]) -> list[dict[str, Any]]:
        """The step results; a last ``{"died": ...}`` when the case killed or hung the worker."""
        self.conn.send((case_dir, steps))
        try:
            if not self.conn.poll(self.timeout + 30):  # SIGALRM did not get through
                self.process.kill()
                results = [{"died": "hang"}]
            else:
                results = self.conn.recv()
        except EOFError:
            self.process.join()
            results = [{"died": f"signal {-(self.process.exitcode or 0)}"}]
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


# ------------------------------------------------------------------------------- verdicts


@dataclass
class Verdict:
    """A case's category and, for a bad one, its signature and the step it failed at."""

    category: str
    signature: str = ""
    door: str = ""
    message: str = ""


def _message_lines(stderr: str) -> list[str]:
    """The lines of an error message, without click's usage preamble."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if lines and lines[0].startswith("Usage:"):
        lines = [ln for ln in lines[1:] if not ln.startswith("Try '")]
    return lines


def _normalize(text: str) -> str:
    """A message head with the case's particulars (paths, quoted names, numbers) blanked, so
    that equal defects group together."""
    text = re.sub(r"/tmp/\S+|/proc/\S+", "PATH", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\d+", "N", text)
    return text[:90]


def classify(results: list[dict[str, Any]]) -> Verdict:
    """The verdict of a case from its step results."""
    for record in results:
        door = record.get("args", ["?"])[0] if "args" in record else "?"
        if "died" in record:
            died = record["died"]
            category = "hang" if died == "hang" else "memcap"
            return Verdict(category, f"worker: {died[:60]}", door, died)
        stderr = record["stderr"]
        code = record["exit"]
        if "MemoryError" in stderr:
            return Verdict("memcap", "MemoryError", door, stderr.strip()[:300])
        if code == 1:
            head = stderr.strip().splitlines()[0] if stderr.strip() else record.get("escaped", "")
            head = head.removeprefix("internal error: ").removesuffix(" (rerun with --debug)")
            kind, _, rest = head.partition(": ")
            return Verdict("internal", f"{kind}: {_normalize(rest)}", door, stderr.strip()[:300])
        if code == 2 and len(_message_lines(stderr)) != 1:
            lines = _message_lines(stderr)
            shape = "empty message" if not lines else f"{len(lines)}-line message"
            first = _normalize(lines[0]) if lines else ""
            return Verdict("internal", f"exit 2 with {shape}: {first}", door, stderr[:300])
        if code not in (0, 2):
            return Verdict("internal", f"exit {code}", door, stderr[:300])
        if record.get("mismatch"):
            return Verdict("internal", f"silently wrong: {record['mismatch']}", door)
    last = results[-1] if results else {"exit": 0}
    return Verdict("clean" if last["exit"] == 2 else "success")


# ------------------------------------------------------------------------------- the run


@dataclass
class Report:
    """The counts per family and category, and every bad case."""

    seed: int
    cases: int = 0
    seconds: float = 0.0
    counts: dict[str, Counter] = field(default_factory=dict)
    usage_errors: int = 0
    checked: int = 0
    """ONNX cases whose outputs were compared with onnxruntime's."""
    bad: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failures(self) -> int:
        """Internal errors, hangs and memory-cap hits, all families."""
        return len(self.bad)

    def signatures(self) -> list[dict[str, Any]]:
        """Distinct failure signatures, most frequent first, with one example each."""
        groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
        for case in self.bad:
            key = (case["family"], case["door"], case["category"], case["signature"])
            groups.setdefault(key, []).append(case)
        rows = [
            {"family": k[0], "door": k[1], "category": k[2], "signature": k[3],
             "count": len(v), "example": v[0]["description"], "case": v[0]["id"]}
            for k, v in groups.items()
        ]  # fmt: skip
        return sorted(rows, key=lambda r: (-r["count"], r["family"], r["signature"]))

    def table(self) -> str:
        """The per-family summary table."""
        header = f"{'family':<10}" + "".join(f"{c:>10}" for c in (*CATEGORIES, "total"))
        lines = [header]
        for family, counts in self.counts.items():
            cells = "".join(f"{counts[c]:>10}" for c in CATEGORIES)
            lines.append(f"{family:<10}{cells}{sum(counts.values()):>10}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """Everything, for ``--json``."""
        return {
            "seed": self.seed, "cases": self.cases, "seconds": round(self.seconds, 1),
            "counts": {f: {c: n[c] for c in CATEGORIES} for f, n in self.counts.items()},
            "click_usage_errors": self.usage_errors, "numerics_checked": self.checked,
            "signatures": self.signatures(),
            "bad": self.bad,
        }  # fmt: skip


def _write_case(case: Case, case_dir: Path) -> None:
    case_dir.mkdir(parents=True)
    for name in case.dirs:
        (case_dir / name).mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        path = case_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _keep(case: Case, case_dir: Path, keep: Path, verdict: Verdict, results: list) -> None:
    """Copies a bad case's directory to ``keep`` with a replay script and its description."""
    target = keep / f"{case.family}-{case.id:05d}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(case_dir, target, symlinks=True)
    here = 'D="$(cd "$(dirname "$0")" && pwd)"'
    (target / "replay.sh").write_text(
        "#!/bin/sh\n# " + case.description + "\n" + here + "\n"
        + "\n".join(c + " ; echo exit $?" for c in case.commands('"$D"')) + "\n"
    )  # fmt: skip
    (target / "case.json").write_text(
        json.dumps({"case": case.id, "family": case.family, "description": case.description,
                    "verdict": asdict(verdict), "steps": results}, indent=1, default=str)
    )  # fmt: skip


def run_fuzz(
    cases: int,
    seed: int = 0,
    time_budget: float | None = None,
    keep: str | None = None,
    timeout: float = 30.0,
    mem_cap_mib: int = 3072,
    families: tuple[str, ...] = FAMILIES,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Runs up to ``cases`` cases (fewer if ``time_budget`` seconds run out)."""
    start = time.monotonic()
    report = Report(seed, counts={f: Counter() for f in families})
    with tempfile.TemporaryDirectory(prefix="cgc-fuzz-") as tmp:
        worker = Worker(mem_cap_mib << 20, timeout)
        try:
            setup = SetupFiles.build(Path(tmp) / "setup", lambda d, s: worker.run(d, s))
            for index in range(cases):
                if time_budget is not None and time.monotonic() - start > time_budget:
                    break
                case = make_case(index, seed, setup, families)
                _one(case, Path(tmp) / f"case-{index}", worker, report, keep)
                if progress and (index + 1) % 100 == 0:
                    progress(f"{index + 1} cases, {report.failures} bad, "
                             f"{time.monotonic() - start:.0f} s")  # fmt: skip
        finally:
            worker.close()
    report.seconds = time.monotonic() - start
    return report


def _one(case: Case, case_dir: Path, worker: Worker, report: Report, keep: str | None) -> None:
    _write_case(case, case_dir)
    results = worker.run(str(case_dir), case.steps)
    verdict = classify(results)
    report.cases += 1
    report.counts[case.family][verdict.category] += 1
    report.usage_errors += any(r.get("stderr", "").startswith("Usage:") for r in results)
    report.checked += any(r.get("checked") for r in results)
    if verdict.category not in ("clean", "success"):
        report.bad.append(
            {"id": case.id, "family": case.family, "category": verdict.category,
             "door": verdict.door, "signature": verdict.signature,
             "description": case.description, "commands": case.commands("DIR"),
             "message": verdict.message}
        )  # fmt: skip
        if keep:
            _keep(case, case_dir, Path(keep), verdict, results)
    shutil.rmtree(case_dir, ignore_errors=True)


def describe(report: Report, limit: int = 40) -> Iterator[str]:
    """Human-readable lines: the table, then the failure signatures with an example each."""
    yield (
        f"{report.cases} cases in {report.seconds:.0f} s (seed {report.seed}); "
        f"{report.checked} compared with onnxruntime"
    )
    yield report.table()
    for row in report.signatures()[:limit]:
        where = f"[{row['family']}/{row['door']}] {row['category']}"
        yield f"{row['count']:>5}  {where}: {row['signature']}"
        yield f"       e.g. case {row['case']}: {row['example'][:150]}"


def main(argv: list[str] | None = None) -> int:
    """The command line; exit 1 when some case failed the oracle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, help="stop after this many seconds")
    parser.add_argument("--keep", help="write every bad case's files and replay.sh here")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    parser.add_argument("--mem-cap-mib", type=int, default=3072, help="the worker's RLIMIT_AS")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    args = parser.parse_args(argv)
    families = tuple(args.families.split(","))
    report = run_fuzz(
        args.cases, args.seed, args.time_budget, args.keep, args.timeout, args.mem_cap_mib,
        families, progress=lambda s: print(s, file=sys.stderr, flush=True),
    )  # fmt: skip
    for line in describe(report):
        print(line)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    return 1 if report.failures else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
