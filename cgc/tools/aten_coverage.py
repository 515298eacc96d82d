"""PyTorch's own operator test samples against cgc: the core ATen coverage of the torch
frontend.

Each OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` yields sample
inputs; a sample becomes a tiny module whose inputs are the sample's tensors (its other
arguments are constants), captured with ``cgc.frontends.torch.capture`` and decomposed to core
ATen. A sample is out of scope when torch cannot capture it, when its program holds an op that
is not core ATen or is random, in-place, sparse or quantized, or when its inputs or outputs
are not tensors of a dtype cgc runs. An in-scope sample is compiled for ``mesh8x8`` in
pipelined mode, run on the simulator and compared with torch eager.

A sample is named ``op[.variant]:dtype:index``; its inputs are drawn after seeding torch's
generator from the op and dtype, so a name means the same values in every run.

``python -m cgc.tools.aten_coverage --run [--filter NAME] [--limit N]`` prints what fails;
``--update --docs FILE --expected-failures FILE`` rewrites the coverage table and the list of
expected failures from a run of every sample.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import operator
import os
import re
import signal
import time
import warnings
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from cgc.frontends.torch import ALWAYS_WHOLE
from cgc.tools.conformance import read_case_list, write_case_list

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)
"""The dtypes swept, float32 first."""

SAMPLES_PER_DTYPE = {torch.float32: 2, torch.float16: 1, torch.bfloat16: 1, torch.int64: 1}
"""How many samples of each dtype the full sweep takes per OpInfo: enough to see each op's
common forms in every dtype the frontend runs, few enough that the sweep takes about eight
minutes on two cores (``--limit`` takes as many of every dtype)."""

TOLERANCES = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
"""rtol, atol by dtype; float32 and the exact types use ``DEFAULT_TOLERANCE``."""
DEFAULT_TOLERANCE = (1e-4, 1e-5)

TIMEOUT = 60.0
"""Seconds a sample may take before it counts as failing."""

SUPPORTED_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}  # fmt: skip

UNINITIALIZED = re.compile(r"^aten\.(empty|empty_strided|new_empty|new_empty_strided)\.")
"""Factory ops whose values are whatever memory held: nothing to compare."""


@dataclass
class Sample:
    """One OpInfo sample at one dtype."""

    name: str
    """``op[.variant]:dtype:index``."""
    op: str
    dtype: torch.dtype
    make: Callable[[], Any]
    """Returns the OpInfo's SampleInput (drawn lazily: some are large)."""
    call: Callable[..., Any]


@dataclass
class SampleOutcome:
    """What became of one sample: out of scope, passing, or failing, and why."""

    name: str
    op: str
    status: str
    """``out of scope``, ``pass`` or ``fail``."""
    reason: str = ""


class Timeout(Exception):
    """A sample ran longer than ``TIMEOUT``."""


def op_label(opinfo: Any) -> str:
    """An OpInfo's name with its variant (``nn.functional.gelu``, ``div.floor_rounding``)."""
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def samples(
    name_filter: str = "", limit: int | None = None, dtypes: Sequence[torch.dtype] = DTYPES
) -> Iterator[Sample]:
    """The samples of every OpInfo whose label contains ``name_filter``: per dtype the
    OpInfo supports on the CPU, the first ``limit`` (default ``SAMPLES_PER_DTYPE``)."""
    with warnings.catch_warnings():  # torch's test helpers warn of optional test packages
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db

    for opinfo in op_db:
        label = op_label(opinfo)
        if name_filter not in label:
            continue
        supported = opinfo.supported_dtypes("cpu")
        for dtype in dtypes:
            if dtype not in supported:
                continue
            count = limit if limit is not None else SAMPLES_PER_DTYPE[dtype]
            tag = str(dtype).removeprefix("torch.")
            for index in range(count):
                yield Sample(
                    f"{label}:{tag}:{index}",
                    label,
                    dtype,
                    _sample_maker(opinfo, dtype, index),
                    opinfo.op,
                )


def _sample_maker(opinfo: Any, dtype: torch.dtype, index: int) -> Callable[[], Any]:
    """Draws the ``index``-th sample, seeded by op and dtype so that it is reproducible."""

    def make() -> Any:
        torch.manual_seed(zlib.crc32(f"{op_label(opinfo)}:{dtype}".encode()))
        for i, sample in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=False)):
            if i == index:
                return sample
        return None

    return make


class SampleModule(torch.nn.Module):
    """Calls the op on a sample's arguments with its tensors replaced by the inputs."""

    def __init__(self, call: Callable[..., Any], spec: Any, leaves: list[Any]):
        super().__init__()
        self.call = call
        self.spec = spec
        self.leaves = leaves
        """The flattened arguments, with None where an input goes."""

    def forward(self, *tensors: torch.Tensor) -> Any:
        inputs = iter(tensors)
        leaves = [next(inputs) if leaf is None else leaf for leaf in self.leaves]
        x, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.call(x, *args, **kwargs)


def module_of(sample: Sample, drawn: Any) -> tuple[SampleModule, tuple[torch.Tensor, ...]]:
    """The module of a drawn sample and its tensor inputs."""
    leaves, spec = pytree.tree_flatten((drawn.input, tuple(drawn.args), dict(drawn.kwargs)))
    tensors = tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))
    kept = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return SampleModule(sample.call, spec, kept), tensors


def out_of_scope(program: Any, tensors: Sequence[torch.Tensor], expected: Any) -> str | None:
    """Why a captured sample is out of scope, or None if it is in scope."""
    for t in tensors:
        if t.layout != torch.strided:
            return "sparse layout"
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {t.dtype}"
    outputs = pytree.tree_leaves(expected)
    if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
        return "outputs that are not tensors"
    if any(o.dtype not in SUPPORTED_DTYPES or o.layout != torch.strided for o in outputs):
        return "outputs of a dtype or layout cgc does not model"
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        reason = _op_out_of_scope(node.target)
        if reason:
            return reason
    return None


def _op_out_of_scope(target: Any) -> str | None:
    if not isinstance(target, torch._ops.OpOverload):
        return None  # Python arithmetic on sizes
    name = str(target)
    tags = set(target.tags)
    if torch.Tag.nondeterministic_seeded in tags:
        return f"random ({name})"
    if target._schema.is_mutable:
        return f"in-place ({name})"
    if "quantize" in name or "sparse" in name:
        return f"quantized or sparse ({name})"
    if UNINITIALIZED.match(name):
        return f"uninitialized values ({name})"
    if torch.Tag.core not in tags and not name.startswith("aten.sym_") and name not in ALWAYS_WHOLE:
        return f"not core ATen ({name})"
    return None


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raises ``Timeout`` in the block after ``seconds`` (on the main thread; elsewhere, no
    limit)."""

    def expire(*_: object) -> None:
        raise Timeout(f"timed out after {seconds:.0f} s")

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_sample(sample: Sample, timeout: float = TIMEOUT) -> SampleOutcome:
    """Captures, compiles and runs one sample; never raises (but on ``KeyboardInterrupt``)."""
    try:
        with time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _run(sample)
    except Timeout as e:
        return SampleOutcome(sample.name, sample.op, "fail", str(e))
    except Exception as e:  # a report: every failure is listed, none stops it
        return SampleOutcome(sample.name, sample.op, "fail", _first_line(e))


def _run(sample: Sample) -> SampleOutcome:
    from cgc.compiler.driver import compile_model
    from cgc.errors import CgcError
    from cgc.frontends.torch import capture
    from cgc.frontends.torch.lowering import to_numpy
    from cgc.machine.program.mode import Mode
    from cgc.runtime.cluster import Cluster

    def outcome(status: str, reason: str = "") -> SampleOutcome:
        return SampleOutcome(sample.name, sample.op, status, reason)

    drawn = sample.make()
    if drawn is None:
        return outcome("out of scope", "no such sample")
    module, tensors = module_of(sample, drawn)
    try:
        with torch.no_grad():
            expected = module(*tensors)
    except Exception as e:
        return outcome("out of scope", f"torch eager fails: {_first_line(e)}")
    if any(t.numel() == 0 for t in tensors):
        return outcome("out of scope", "empty tensors")
    try:
        program = capture(module, tensors, dynamic_batch=False)
    except CgcError as e:
        return outcome("out of scope", _first_line(e))
    why = out_of_scope(program, tensors, expected)
    if why is not None:
        return outcome("out of scope", why)
    # compile_model takes the program as it is (its annotation leaves exported programs out;
    # its sources take them): cgc.compile would decompose it again
    artifact = compile_model(program, target="mesh8x8", mode=Mode.PIPELINED)  # type: ignore[arg-type]
    feeds = _feeds(program, tensors, to_numpy)
    got = Cluster(artifact).infer(feeds)[0]
    return outcome(*_compare(sample.dtype, got, pytree.tree_leaves(expected), to_numpy))


def _feeds(program: Any, tensors: Sequence[torch.Tensor], to_numpy: Any) -> dict:
    """The sample's tensors by the names of the program's user inputs."""
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in program.graph_signature.input_specs
            if s.kind == InputKind.USER_INPUT]  # fmt: skip
    return {name: to_numpy(t) for name, t in zip(user, tensors, strict=True)}


def _compare(
    dtype: torch.dtype, got: dict[str, np.ndarray], expected: list[torch.Tensor], to_numpy: Any
) -> tuple[str, str]:
    """``(status, reason)`` of cgc's outputs against torch eager's."""
    if len(got) != len(expected):
        return "fail", f"{len(got)} outputs, expected {len(expected)}"
    keys = ["output"] if len(expected) == 1 else [f"output_{i}" for i in range(len(expected))]
    rtol, atol = TOLERANCES.get(dtype, DEFAULT_TOLERANCE)
    for key, want in zip(keys, expected, strict=True):
        mine = np.asarray(got[key])
        theirs = to_numpy(want)
        if mine.shape != theirs.shape:
            return "fail", f"{key}: shape {list(mine.shape)}, expected {list(theirs.shape)}"
        if str(mine.dtype) != str(theirs.dtype):
            return "fail", f"{key}: dtype {mine.dtype}, expected {theirs.dtype}"
        a, b = mine.astype(np.float64), theirs.astype(np.float64)
        if not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            with np.errstate(invalid="ignore"):
                diff = np.nanmax(np.abs(a - b)) if a.size else 0.0
            return "fail", f"wrong values: max abs diff {diff:.3g}"
    return "pass", ""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return re.sub(r" \(nodes? [^)]*\)", "", first)[:150]


def outcomes_of(
    name_filter: str = "", limit: int | None = None, jobs: int = 1, verbose: bool = False
) -> list[SampleOutcome]:
    """Runs the chosen samples (as ``samples`` chooses them) on ``jobs`` processes; the
    outcomes come in the order of the samples."""
    if jobs <= 1:
        return _share((0, 1, name_filter, limit, verbose))
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs, maxtasksperchild=1) as pool:
        shares = pool.map(_share, [(k, jobs, name_filter, limit, verbose) for k in range(jobs)])
    # sample i went to process i % jobs: interleave the shares back
    ordered: list[SampleOutcome] = []
    for i in range(max(len(share) for share in shares)):
        ordered.extend(share[i] for share in shares if i < len(share))
    return ordered


def _share(task: tuple[int, int, str, int | None, bool]) -> list[SampleOutcome]:
    """Runs every ``jobs``-th sample from the ``k``-th."""
    k, jobs, name_filter, limit, verbose = task
    results = []
    start = time.monotonic()
    for i, sample in enumerate(samples(name_filter, limit)):
        if i % jobs != k:
            continue
        results.append(run_sample(sample))
        if verbose and len(results) % 100 == 0:
            print(f"  [{k}] {len(results)} samples, {time.monotonic() - start:.0f} s", flush=True)
    return results


def coverage_markdown(outcomes: Sequence[SampleOutcome], lists: str) -> str:
    """The coverage table: per op, in-scope samples, passing, failing, the commonest reason."""
    rows: dict[str, list[SampleOutcome]] = defaultdict(list)
    scope: Counter[str] = Counter()
    for o in outcomes:
        if o.status == "out of scope":
            scope[_scope_kind(o.reason)] += 1
        else:
            rows[o.op].append(o)
    total = sum(len(group) for group in rows.values())
    passing = sum(o.status == "pass" for group in rows.values() for o in group)
    percent = 100 * passing / total if total else 0.0
    lines = [
        "# Core ATen coverage of the PyTorch frontend",
        "",
        f"Generated by `python -m cgc.tools.aten_coverage --update --docs docs/aten_coverage.md "
        f"--expected-failures {lists}` from PyTorch {torch.__version__.split('+')[0]}'s "
        "operator test samples (`op_db` of `torch.testing._internal.common_methods_invocations`).",
        "Per OpInfo and dtype the sweep takes the first samples ("
        + ", ".join(f"{str(d).removeprefix('torch.')}: {n}" for d, n in SAMPLES_PER_DTYPE.items())
        + "); "
        "a sample passes when cgc compiles it for `mesh8x8` in pipelined mode and its simulated "
        "outputs match torch eager's (same shape and dtype; float32 and integers rtol 1e-4 "
        "atol 1e-5, float16 1e-2, bfloat16 2e-2).",
        "",
        f"**In scope: {passing} of {total} samples pass ({percent:.1f} %).**",
        "",
        "Out of scope: " + ", ".join(f"{k} ({n})" for k, n in scope.most_common()) + ".",
        "",
        "| op | in scope | passing | failing | commonest reason |",
        "|---|---|---|---|---|",
    ]
    for op in sorted(rows):
        group = rows[op]
        bad = [o.reason for o in group if o.status == "fail"]
        reason = Counter(bad).most_common(1)[0][0] if bad else ""
        reason = reason.replace("|", "\\|")
        lines.append(f"| {op} | {len(group)} | {len(group) - len(bad)} | {len(bad)} | {reason} |")
    return "\n".join(lines) + "\n"


def _scope_kind(reason: str) -> str:
    """The kind of an out-of-scope reason, for the summary (``random``, ``not core ATen``)."""
    for kind in ("random", "in-place", "quantized or sparse", "uninitialized values",
                 "not core ATen", "torch.export cannot capture", "torch cannot decompose",
                 "torch eager fails", "sparse layout", "dtype", "outputs", "empty tensors",
                 "no such sample"):  # fmt: skip
        if reason.startswith(kind):
            return kind
    return "other"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="PyTorch's OpInfo samples against cgc.")
    parser.add_argument("--run", action="store_true", help="run the samples; print failures")
    parser.add_argument("--update", action="store_true", help="rewrite the docs and the list")
    parser.add_argument("--filter", default="", help="only OpInfos whose name contains this")
    parser.add_argument("--limit", type=int, help="samples per OpInfo and dtype")
    parser.add_argument("--docs", help="where --update writes the coverage table")
    parser.add_argument("--expected-failures", help="where --update writes the failures")
    parser.add_argument("--jobs", type=int, help="processes (default: one per core)")
    parser.add_argument("--verbose", action="store_true", help="print progress")
    args = parser.parse_args(argv)
    if args.update and (args.docs is None or args.expected_failures is None):
        parser.error("--update needs --docs and --expected-failures")
    jobs = args.jobs or os.cpu_count() or 1
    run = args.run or args.update
    outcomes = outcomes_of(args.filter, args.limit, jobs, args.verbose) if run else []
    if args.run:
        for o in outcomes:
            if o.status == "fail":
                print(f"{o.name}  # {o.reason}")
        scoped = [o for o in outcomes if o.status != "out of scope"]
        passing = sum(o.status == "pass" for o in scoped)
        print(f"{passing} of {len(scoped)} in-scope samples pass "
              f"({len(outcomes) - len(scoped)} out of scope)")  # fmt: skip
    if args.update:
        failures = {o.name: o.reason for o in outcomes if o.status == "fail"}
        write_case_list(Path(args.expected_failures), failures)
        Path(args.docs).write_text(coverage_markdown(outcomes, args.expected_failures))


__all__ = ["read_case_list", "run_sample", "samples"]

if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
