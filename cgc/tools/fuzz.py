"""A mutational fuzzer over cgc's doors: the files, options, paths, disks and values it takes.

Its families (``MAKERS``): ONNX files, artifacts, options and files, and the hostile inputs an
outside check found open: paths that alias an input, special files, full disks, two runs into
one directory, hostile params files, misbehaving PyTorch factories and edge values against
independent references.

The oracle: every case ends either in exit 0 (and, for a model with a reference, outputs
that agree with it: onnxruntime for an ONNX model, torch eager for a PyTorch module;
``fuzz_reference``), or in exit 2 with exactly one line on stderr naming the culprit, and its
files are whole (``fuzz_worker``). Anything else is a defect, by category:

- ``internal``: exit 1, exit 2 with an empty or multi-line message (a log line or warning
  that reached file descriptor 2 counts), an exception past click;
- ``wrong``: outputs that disagree with the reference, or an exit 0 without its output or
  with another output written over it (silently wrong);
- ``lost``: an input's bytes changed, a file changed by a command that failed, a model or
  sweep directory that no single run left so (data loss);
- ``partial``: a temporary left behind, or an output half-written by a command that failed;
- ``hang``: over the per-case timeout; ``memcap``: ``MemoryError``, or the worker killed.

Click's own usage errors ("Usage: ... / Try ... / Error: ...") count as one line: their
preamble is click's fixed format, the ``Error:`` line is the message.

Cases run in a long-lived worker process (``fuzz_worker``). Everything is deterministic from
the seed: case ``k`` of family ``F`` draws from ``random.Random(f"{seed}:{F}:{k}")``, whatever
other families run beside it; the families take turns.

    python -m cgc.tools.fuzz --cases 1000 --seed 0 --time-budget 600 --keep build/fuzz-cases \\
        --json build/fuzz.json
    python -m cgc.tools.fuzz --counts alias=100,special=100 --families alias,special
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cgc.tools.fuzz_mutators as mut
from cgc.machine.program.mode import Mode
from cgc.tools.fuzz_artifacts import mutate_artifact
from cgc.tools.fuzz_cases import DIR, FuzzCase, SetupFiles, Step, options_case
from cgc.tools.fuzz_files import alias_case, concurrent_case, fulldisk_case, special_case
from cgc.tools.fuzz_hostile import factory_case, yaml_case
from cgc.tools.fuzz_numeric import numeric_case
from cgc.tools.fuzz_worker import Worker

CATEGORIES = ("clean", "success", "internal", "wrong", "lost", "partial", "hang", "memcap")
# ------------------------------------------------------------------------------- case makers


def onnx_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """A (mutated) seed model: compile it, run it on random inputs, compare with onnxruntime.
    The first case of each seed model is the seed itself, a control for the oracle."""
    names = sorted(setup.models)
    name = names[index % len(names)]
    if index < len(names):
        data, what = setup.models[name].SerializeToString(), "unmutated (control)"
    elif rng.random() < 0.35:
        data, what = mut.mutate_model_valid(setup.models[name], rng)
    else:
        data, what = mut.mutate_model(setup.models[name], rng)
    files = {"model.onnx": data, "w.bin": bytes(range(256)) * 8}
    compile_args = ["compile", f"{DIR}/model.onnx", "-o", f"{DIR}/model.cgc"]
    compile_args += rng.choice(
        [[], [], ["--mode", Mode.WEIGHT_STREAMING], ["--mode", Mode.PIPELINED]]
    )
    run_args = ["run", f"{DIR}/model.cgc", "--inputs", f"{DIR}/inputs.npz"]
    steps = [
        Step(compile_args),
        Step([*run_args, "--output", f"{DIR}/outputs.npz"], make_inputs="model.cgc",
             compare_with="model.onnx"),
    ]  # fmt: skip
    return FuzzCase(index, "onnx", f"{name}.onnx: {what}", steps, files, ["sub"])


def artifact_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """A compiled seed artifact, mutated behind its checksums, through ``inspect`` and ``run``."""
    name = rng.choice(sorted(setup.artifacts))
    data, what = mutate_artifact(setup.artifacts[name], rng)
    flags = rng.sample(["--json", "--disasm", "--ir"], rng.randint(0, 2))
    files = {"model.cgc": data, "inputs.npz": setup.inputs[name]}
    run = ["run", f"{DIR}/model.cgc", "--inputs", f"{DIR}/inputs.npz"]
    run += rng.choice([["--output", f"{DIR}/out.npz"], ["--stats-json", f"{DIR}/s.json"], []])
    if rng.random() < 0.2:
        run = ["run", f"{DIR}/model.cgc", "--timing-only"]
    steps = [Step(["inspect", f"{DIR}/model.cgc", *flags]), Step(run, after_success=False)]
    return FuzzCase(index, "artifact", f"{name}: {what}", steps, files)


Maker = Callable[[int, random.Random, SetupFiles], FuzzCase]
MAKERS: dict[str, Maker] = {
    "onnx": onnx_case,
    "artifact": artifact_case,
    "options": options_case,
    "alias": alias_case,
    "special": special_case,
    "fulldisk": fulldisk_case,
    "concurrent": concurrent_case,
    "yaml": yaml_case,
    "factory": factory_case,
    "numeric": numeric_case,
}
"""Every family: case ``k`` of a family from its random draws and the setup's files."""
NEEDS_TORCH = ("factory",)
"""Families that exist only where torch does (``numeric`` leaves its torch cases out)."""
FAMILIES = tuple(
    f for f in MAKERS if f not in NEEDS_TORCH or importlib.util.find_spec("torch") is not None
)
"""The families this machine can run: all, unless torch is missing."""


def make_case(family: str, index: int, seed: int, setup: SetupFiles) -> FuzzCase:
    """Case ``index`` of ``family`` in the run with ``seed``."""
    return MAKERS[family](index, random.Random(f"{seed}:{family}:{index}"), setup)


def schedule(counts: dict[str, int]) -> Iterator[tuple[str, int]]:
    """Each family's cases, ``(family, its index in the family)``, the families taking turns."""
    for index in range(max(counts.values(), default=0)):
        for family, count in counts.items():
            if index < count:
                yield family, index


def even_counts(cases: int, families: tuple[str, ...]) -> dict[str, int]:
    """``cases`` cases shared out over ``families`` in turn."""
    return {f: len(range(i, cases, len(families))) for i, f in enumerate(families)}


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


def _door(record: dict[str, Any]) -> str:
    return str(record["args"][0]) if "args" in record else record.get("door", "?")


def classify(results: list[dict[str, Any]]) -> Verdict:
    """The verdict of a case from its records: a death first, then lost or half-written
    files (whatever the exit codes said), then each command's exit in order."""
    for record in results:
        if "died" in record:
            died = record["died"]
            category = "hang" if died.startswith("hang") else "memcap"
            return Verdict(category, f"worker: {died[:60]}", _door(record), died)
    for kind in ("lost", "partial"):
        for record in results:
            if record.get(kind):
                text = (
                    f"{record[kind]} (exit {record['exit']})" if "exit" in record else record[kind]
                )
                return Verdict(kind, _normalize(text), _door(record), text)
    for record in results:
        if "exit" in record:
            verdict = _command_verdict(record)
            if verdict:
                return verdict
    codes = [r["exit"] for r in results if "exit" in r]
    return Verdict("clean" if codes and codes[-1] == 2 else "success")


def _command_verdict(record: dict[str, Any]) -> Verdict | None:
    """A command's defect: an internal error, a message of other than one line, an exit code
    of neither 0 nor 2, a memory-cap hit, outputs that are wrong; None for a good one."""
    door, stderr, code = _door(record), record["stderr"], record["exit"]
    planted = record.get("planted") == "MemoryError" and code == 2
    if "MemoryError" in stderr and not planted:
        return Verdict("memcap", "MemoryError", door, stderr.strip()[:300])
    if code == 1:
        said = [stderr, record.get("escaped", ""), record.get("stdout", "")]
        head = next((text.strip().splitlines()[0] for text in said if text.strip()), "")
        head = head.removeprefix("internal error: ").removesuffix(" (rerun with --debug)")
        kind, _, rest = head.partition(": ")
        signature = f"{kind}: {_normalize(rest)}" if rest else _normalize(kind or "no message")
        return Verdict("internal", signature, door, (stderr.strip() or head)[:300])
    lines = [*_message_lines(record.get("leaked", "")), *_message_lines(stderr)]
    lines = [line for line in lines if line not in record.get("user_lines", ())]
    if code == 2 and len(lines) != 1:
        shape = "empty message" if not lines else f"{len(lines)}-line message"
        first = _normalize(lines[0]) if lines else ""
        message = "\n".join(lines)[:300]
        return Verdict("internal", f"exit 2 with {shape}: {first}", door, message)
    if code not in (0, 2):
        return Verdict("internal", f"exit {code}", door, stderr[:300])
    if record.get("mismatch"):
        return Verdict("wrong", f"silently wrong: {_normalize(record['mismatch'])}", door,
                       record["mismatch"])  # fmt: skip
    return None


# ------------------------------------------------------------------------------- the run


@dataclass
class Report:
    """The counts per family and category, and every bad case."""

    seed: int
    cases: int = 0
    seconds: float = 0.0
    counts: dict[str, Counter] = field(default_factory=dict)
    family_seconds: dict[str, float] = field(default_factory=dict)
    """The wall time each family's cases took."""
    usage_errors: int = 0
    checked: int = 0
    """Cases whose outputs were compared with a reference's (onnxruntime, torch eager)."""
    bad: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failures(self) -> int:
        """The bad cases (every category but clean and success), all families."""
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
        header = f"{'family':<11}" + "".join(f"{c:>9}" for c in (*CATEGORIES, "total", "s"))
        lines = [header]
        for family, counts in self.counts.items():
            cells = "".join(f"{counts[c]:>9}" for c in CATEGORIES)
            seconds = self.family_seconds.get(family, 0.0)
            lines.append(f"{family:<11}{cells}{sum(counts.values()):>9}{seconds:>9.0f}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """Everything, for ``--json``."""
        return {
            "seed": self.seed, "cases": self.cases, "seconds": round(self.seconds, 1),
            "counts": {f: {c: n[c] for c in CATEGORIES} for f, n in self.counts.items()},
            "family_seconds": {f: round(t, 1) for f, t in self.family_seconds.items()},
            "click_usage_errors": self.usage_errors, "numerics_checked": self.checked,
            "signatures": self.signatures(),
            "bad": self.bad,
        }  # fmt: skip


def _keep(case: FuzzCase, case_dir: Path, keep: Path, verdict: Verdict, results: list) -> None:
    """Writes a bad case's files as they were before it ran (and the inputs the worker made
    for it) to ``keep``, with a replay script that makes its special files, and its
    records."""
    target = keep / f"{case.family}-{case.id:05d}"
    shutil.rmtree(target, ignore_errors=True)
    case.write(target, specials=False)
    made = case_dir / "inputs.npz"
    if "inputs.npz" not in case.files and made.is_file() and not made.is_symlink():
        shutil.copyfile(made, target / "inputs.npz")
    (target / "replay.sh").write_text(case.replay())
    (target / "case.json").write_text(
        json.dumps({"case": case.id, "family": case.family, "description": case.description,
                    "verdict": asdict(verdict), "steps": results}, indent=1, default=str)
    )  # fmt: skip


def run_fuzz(
    cases: int | dict[str, int],
    seed: int = 0,
    time_budget: float | None = None,
    keep: str | None = None,
    timeout: float = 30.0,
    mem_cap_mib: int = 3072,
    families: tuple[str, ...] = FAMILIES,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Runs ``cases`` cases shared out over ``families`` in turn, or the number of cases of
    each family a dict gives (fewer if ``time_budget`` seconds run out)."""
    start = time.monotonic()
    counts = cases if isinstance(cases, dict) else even_counts(cases, families)
    report = Report(seed, counts={f: Counter() for f in counts})
    with tempfile.TemporaryDirectory(prefix="cgc-fuzz-") as tmp:
        worker = Worker(mem_cap_mib << 20, timeout)
        try:
            setup = SetupFiles.build(Path(tmp) / "setup", worker.run)
            for number, (family, index) in enumerate(schedule(counts)):
                if time_budget is not None and time.monotonic() - start > time_budget:
                    break
                case = make_case(family, index, seed, setup)
                case.id = number
                _one(case, Path(tmp) / f"case-{number}", worker, report, keep)
                if progress and (number + 1) % 100 == 0:
                    progress(f"{number + 1} cases, {report.failures} bad, "
                             f"{time.monotonic() - start:.0f} s")  # fmt: skip
        finally:
            worker.close()
    report.seconds = time.monotonic() - start
    return report


def _one(case: FuzzCase, case_dir: Path, worker: Worker, report: Report, keep: str | None) -> None:
    start = time.monotonic()
    case.write(case_dir)
    results = worker.run(str(case_dir), case)
    spent = report.family_seconds.get(case.family, 0.0) + time.monotonic() - start
    report.family_seconds[case.family] = spent
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
        f"{report.checked} compared with a reference"
    )
    yield report.table()
    for row in report.signatures()[:limit]:
        where = f"[{row['family']}/{row['door']}] {row['category']}"
        yield f"{row['count']:>5}  {where}: {row['signature']}"
        yield f"       e.g. case {row['case']}: {row['example'][:150]}"


def _counts(text: str) -> dict[str, int]:
    """``FAMILY=N,...`` as a dict."""
    counts = {}
    for item in text.split(","):
        family, _, number = item.partition("=")
        counts[family] = int(number)
    return counts


def main(argv: list[str] | None = None) -> int:
    """The command line; exit 1 when some case failed the oracle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300, help="shared out over --families")
    parser.add_argument("--counts", type=_counts, help="FAMILY=N,...: cases per family instead")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, help="stop after this many seconds")
    parser.add_argument("--keep", help="write every bad case's files and replay.sh here")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    parser.add_argument("--mem-cap-mib", type=int, default=3072, help="the worker's RLIMIT_AS")
    parser.add_argument(
        "--families", default=",".join(FAMILIES),
        help=f"comma-separated, of: {', '.join(FAMILIES)} (default: all)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    families = tuple(args.families.split(","))
    chosen = args.counts or even_counts(args.cases, families)
    unknown = sorted(set(chosen) - set(FAMILIES))
    if unknown:
        parser.error(f"no family {', '.join(unknown)} here; the families: {', '.join(FAMILIES)}")
    report = run_fuzz(
        chosen, args.seed, args.time_budget, args.keep, args.timeout, args.mem_cap_mib,
        progress=lambda s: print(s, file=sys.stderr, flush=True),
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
