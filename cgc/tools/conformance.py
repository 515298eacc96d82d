"""The ONNX backend node suite against cgc.

The node cases come from the installed onnx package (``onnx.backend.test.case.node``), which
builds each model and computes its expected outputs; they are cached as ``.onnx`` and ``.npz``
files under a folder named after the onnx version, so later runs only read files.

A case is out of scope when it needs a type cgc does not model (strings, sequences, maps,
optionals), control flow, randomness, the training ops or a non-default domain. Everything else
is in scope and runs through ``cgc.tools.backend``; its outputs are compared as the ONNX backend
runner does (same dtype, ``allclose`` with the case's tolerances).

``python -m cgc.tools.conformance --run`` runs the suite and prints what fails; with
``--expected-failures FILE --fixed-inputs FILE`` (the lists a test suite keeps), ``--update``
rewrites both lists from a run and ``--docs FILE`` writes the coverage table from them.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from cgc.files import permissions

CONTROL_FLOW = {"Loop", "If", "Scan"}
RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
          "Bernoulli", "Multinomial"}  # fmt: skip
TRAINING = {"Adam", "Adagrad", "Momentum", "Gradient"}
TENSOR_FREE = {
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
    "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence", "Optional",
    "OptionalGetElement", "OptionalHasElement",
}  # fmt: skip
HELPER_OPS = {"Constant"}
"""Ops the suite uses only to feed the op under test."""


@dataclass
class ConformanceCase:
    """One node test: a model and its data sets of inputs and expected outputs."""

    name: str
    model: onnx.ModelProto
    data_sets: list[tuple[list[np.ndarray], list[np.ndarray]]]
    rtol: float
    atol: float

    @property
    def ops(self) -> list[str]:
        """The op types the case exercises, in graph order, without helpers."""
        seen = []
        for node in self.model.graph.node:
            if node.op_type not in HELPER_OPS and node.op_type not in seen:
                seen.append(node.op_type)
        return seen or ["Constant"]

    @property
    def op(self) -> str:
        """The op under test: the case's first non-helper op."""
        return self.ops[0]

    @property
    def opset(self) -> int:
        """The default-domain opset of the case's model."""
        return next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))


def _all_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs] if attr.type in (5, 10) else []:
                yield from _all_nodes(sub)


def _non_tensor(value: onnx.ValueInfoProto) -> bool:
    t = value.type
    if not t.HasField("tensor_type"):
        return True
    return t.tensor_type.elem_type == onnx.TensorProto.STRING


def out_of_scope(case: ConformanceCase) -> str | None:
    """Why the case is out of scope, or None if it is in scope."""
    graph = case.model.graph
    if not case.data_sets or any(_non_tensor(v) for v in [*graph.input, *graph.output]):
        return "string, sequence, map or optional types"
    for node in _all_nodes(graph):
        if node.domain not in ("", "ai.onnx"):
            return f"non-default domain {node.domain}"
        if node.op_type in CONTROL_FLOW:
            return "control flow"
        if node.op_type in RANDOM or (node.op_type == "Dropout" and _random_dropout(case, node)):
            return "random"
        if node.op_type in TRAINING:
            return "training ops"
        if node.op_type in TENSOR_FREE:
            return "sequences and optionals"
        if any(a.type == onnx.AttributeProto.STRING and node.op_type.startswith("String")
               for a in node.attribute):  # fmt: skip
            return "strings"
    return None


def _random_dropout(case: ConformanceCase, node: onnx.NodeProto) -> bool:
    """A Dropout in training mode with a non-zero ratio draws random masks."""
    if len(node.input) < 3 or not node.input[2]:
        return False
    names = [i.name for i in case.model.graph.input]
    values = dict(zip(names, case.data_sets[0][0], strict=False))
    training = values.get(node.input[2])
    ratio = values.get(node.input[1]) if len(node.input) > 1 else None
    return bool(training is not None and np.all(training)) and (
        ratio is None or float(np.asarray(ratio)) != 0.0
    )


USER_CACHE = Path.home() / ".cache" / "cgc"


def load_cases(root: Path = USER_CACHE) -> list[ConformanceCase]:
    """Every node case of the installed onnx, from the cache under ``root`` (written on first
    use, in a folder named after the onnx version)."""
    cache = root / f"onnx-node-{onnx.__version__}"
    index = cache / "index.json"
    if not index.exists():
        _publish_cache(cache)
    entries = json.loads(index.read_text())
    return [_read_case(cache, entry) for entry in entries]


def _publish_cache(cache: Path) -> None:
    """Writes the cache in a staging folder beside ``cache`` and renames it into place, so
    that a reader sees no folder or a whole one: processes that start at once (the workers
    of ``pytest -n``) each write their own, and the first rename wins. A folder without an
    index (left by a write that was cut short) is replaced."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{cache.name}."))
    os.chmod(staging, permissions(directory=True))  # mkdtemp's are owner-only
    try:
        _write_cache(staging)
        if cache.exists() and not (cache / "index.json").exists():
            shutil.rmtree(cache, ignore_errors=True)
        try:
            os.rename(staging, cache)
        except OSError as error:  # another process published first: its cache is as good
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_cache(cache: Path) -> None:
    """Writes every case in the layout of onnx's own backend test data: ``<name>/model.onnx``
    and ``<name>/test_data_set_<i>/{input,output}_<j>.pb``; data sets holding sequences or
    optionals are left out (their cases are out of scope)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case import node

        generated = node.collect_testcases()
    entries = []
    for case in generated:
        folder = cache / case.name
        folder.mkdir(parents=True, exist_ok=True)
        assert case.model is not None and case.data_sets is not None  # node cases have both
        onnx.save(case.model, folder / "model.onnx")
        kept = 0
        for inputs, outputs in case.data_sets:
            converted = [_tensor(a) for a in [*inputs, *outputs]]
            tensors = [t for t in converted if t is not None]
            if len(tensors) < len(converted):
                continue
            data = folder / f"test_data_set_{kept}"
            data.mkdir(exist_ok=True)
            for j, tensor in enumerate(tensors[: len(inputs)]):
                (data / f"input_{j}.pb").write_bytes(tensor.SerializeToString())
            for j, tensor in enumerate(tensors[len(inputs) :]):
                (data / f"output_{j}.pb").write_bytes(tensor.SerializeToString())
            kept += 1
        entries.append({"name": case.name, "data_sets": kept, "rtol": case.rtol, "atol": case.atol})
    (cache / "index.json").write_text(json.dumps(entries, indent=0))


def _tensor(value) -> onnx.TensorProto | None:
    """A TensorProto of an array, a numpy scalar or a TensorProto; None for anything else."""
    if isinstance(value, onnx.TensorProto):
        return value
    if isinstance(value, np.ndarray | np.generic) and np.asarray(value).dtype != object:
        return numpy_helper.from_array(np.asarray(value))
    return None


def _read_case(cache: Path, entry: dict) -> ConformanceCase:
    folder = cache / entry["name"]
    model = onnx.load(folder / "model.onnx")
    data_sets = []
    for i in range(entry["data_sets"]):
        data = folder / f"test_data_set_{i}"
        data_sets.append((_read_tensors(data, "input"), _read_tensors(data, "output")))
    return ConformanceCase(entry["name"], model, data_sets, entry["rtol"], entry["atol"])


def _read_tensors(folder: Path, kind: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    tensors = []
    for path in files:
        tensor = onnx.TensorProto()
        tensor.ParseFromString(path.read_bytes())
        tensors.append(numpy_helper.to_array(tensor))
    return tensors


def run_case(case: ConformanceCase) -> list[str]:
    """Runs every data set of ``case`` through cgc; raises on any mismatch. Returns the graph
    inputs whose values had to be fixed at compile time (because shapes depend on them)."""
    from cgc.tools.backend import CgcBackend

    rep = CgcBackend.prepare(case.model)
    for inputs, expected in case.data_sets:
        outputs = rep.run(inputs)
        assert len(outputs) == len(expected), f"{len(outputs)} outputs, expected {len(expected)}"
        for got, want in zip(outputs, expected, strict=True):
            assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
            assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
            np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)
    return sorted({name for fixed in rep.specialized.values() for name in fixed})


def read_case_list(path: Path) -> dict[str, str]:
    """``case name -> note`` from a file of ``name  # note`` lines."""
    notes = {}
    for line in path.read_text().splitlines():
        text = line.split("#", 1)
        name = text[0].strip()
        if name:
            notes[name] = text[1].strip() if len(text) > 1 else ""
    return notes


def write_case_list(path: Path, notes: dict[str, str]) -> None:
    """Writes ``name  # note`` lines, sorted by name."""
    path.write_text("".join(f"{name}  # {note}\n" for name, note in sorted(notes.items())))


def supported_ops_markdown(
    cases: Sequence[ConformanceCase],
    failures: dict[str, str],
    fixed: dict[str, str],
    lists: tuple[str, str],
) -> str:
    """The coverage table: per op under test, opsets seen, in-scope cases passing, and how
    many of those pass only with inputs fixed at compile time; ``lists`` names the files of
    ``failures`` and ``fixed``."""
    rows: dict[str, list[ConformanceCase]] = defaultdict(list)
    scoped = [c for c in cases if out_of_scope(c) is None]
    op_of = {c.name: c.op for c in cases}
    for case in scoped:
        # an "_expanded" case inlines its op's function body: it tests the unexpanded op
        rows[op_of.get(case.name.removesuffix("_expanded"), case.op)].append(case)
    passing = sum(c.name not in failures for c in scoped)
    lines = [
        "# ONNX ops supported by cgc",
        "",
        f"Generated by `python -m cgc.tools.conformance --docs docs/supported_ops.md "
        f"--expected-failures {lists[0]} --fixed-inputs {lists[1]}` from the ONNX backend node "
        f"suite of onnx {onnx.__version__} and those two lists.",
        "A case counts as passing when cgc compiles it for weight streaming on `mesh8x8` and its",
        "simulated outputs match the suite's (same dtype, the case's rtol/atol).",
        "",
        f"In scope: {passing} of {len(scoped)} cases pass ({100 * passing / len(scoped):.1f} %). "
        f"Out of scope ({len(cases) - len(scoped)} cases): strings, sequences, maps, optionals, "
        "control flow, random ops, training ops, non-default domains.",
        "",
        "cgc compiles static shapes. Where a case feeds at run time an input that decides a "
        "shape (a Reshape's `shape`, a Resize's `sizes`, the data of NonZero), the ONNX backend "
        "compiles the case again with that input fixed to the case's value, and the artifact "
        f"serves only that value: {len(fixed)} of the passing cases need this (column "
        f"'inputs fixed'; the inputs are listed in `{lists[1]}`), "
        f"{passing - len(fixed)} pass with every input fed at run time.",
        "",
        "| op | opsets | passing / cases | inputs fixed | failing cases |",
        "|---|---|---|---|---|",
    ]
    for op in sorted(rows):
        group = rows[op]
        opsets = sorted({c.opset for c in group})
        span = str(opsets[0]) if len(opsets) == 1 else f"{opsets[0]}-{opsets[-1]}"
        bad = [c.name for c in group if c.name in failures]
        ok = len(group) - len(bad)
        pinned = sum(c.name in fixed for c in group)
        shown = ", ".join(re.sub(r"^test_", "", n) for n in bad[:6])
        shown += f", +{len(bad) - 6} more" if len(bad) > 6 else ""
        lines.append(f"| {op} | {span} | {ok} / {len(group)} | {pinned} | {shown} |")
    return "\n".join(lines) + "\n"


def outcomes_of(cases: Iterable[ConformanceCase]) -> tuple[dict[str, str], dict[str, str]]:
    """Runs the in-scope cases: ``name -> why`` for each that fails, and ``name -> inputs`` for
    each that passes with inputs fixed at compile time."""
    failures, fixed = {}, {}
    for case in cases:
        if out_of_scope(case) is not None:
            continue
        try:
            inputs = run_case(case)
        except Exception as e:  # a report: every failure is listed, none stops it
            text = str(e).strip()
            first = text.splitlines()[0] if text else type(e).__name__
            failures[case.name] = re.sub(r" \(nodes? [^)]*\)", "", first)[:150]
            continue
        if inputs:
            fixed[case.name] = ", ".join(inputs)
    return failures, fixed


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The ONNX node suite against cgc.")
    parser.add_argument("--docs", help="write the supported-ops table here")
    parser.add_argument("--run", action="store_true", help="run the in-scope cases")
    parser.add_argument(
        "--update",
        action="store_true",
        help="run every case and rewrite the expected failures and the fixed inputs",
    )
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--expected-failures", help="the list of cases expected to fail")
    parser.add_argument("--fixed-inputs", help="the list of cases passing with inputs fixed")
    parser.add_argument("--cache", default=str(USER_CACHE), help="where the cases are kept")
    args = parser.parse_args(argv)
    lists = (args.expected_failures, args.fixed_inputs)
    if (args.update or args.docs) and None in lists:
        parser.error("--update and --docs need --expected-failures and --fixed-inputs")
    cases = load_cases(Path(args.cache))
    chosen = [c for c in cases if args.filter in c.name]
    if args.run:
        for name, why in sorted(outcomes_of(chosen)[0].items()):
            print(f"{name}  # {why}")
    if args.update:
        failures, fixed = outcomes_of(cases)
        write_case_list(Path(lists[0]), failures)
        write_case_list(Path(lists[1]), fixed)
    if args.docs:
        failures, fixed = read_case_list(Path(lists[0])), read_case_list(Path(lists[1]))
        Path(args.docs).write_text(supported_ops_markdown(cases, failures, fixed, lists))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
