"""A corpus of real exports, measured (issue 30, item 3): how cgc maps transformers' models as
users bring them, beside the same architecture written as a params file.

Every architecture of ``corpus_models`` (GPT-2, BERT, DistilBERT, Llama, Qwen2, Mistral with a
sliding window, T5's encoder, T5, Whisper, ViT), with random weights (nothing is downloaded),
tiny (``--size small``: 2 layers of width 64, 16 tokens) and at a real size (``--size real``:
GPT-2 124M at 1024 tokens, BERT-base at 512 and at 128, DistilBERT-base at 512, a Llama of 1.1B
(hidden 2048, 16 layers, 32 heads, 8 kv heads, intermediate 8192, vocab 32000) at 1024,
Qwen2-0.5B, a Mistral of that Llama's shape with a window of 512, t5-small, whisper-base,
ViT-base; and
``gpt2-6x512``, the issue's GPT-2 of 6 blocks x 512 on 128 tokens with GPT-2's vocabulary and
tied LM head, as ``bench_torch.py``'s GPT-2-mid, and ``gpt2-6x512-blocks``, its blocks alone),
each in transformers' ``eager`` and ``sdpa`` attention, goes into cgc by every route:

- ``ts``: ``torch.onnx.export(dynamo=False)``, opset 17 (TorchScript);
- ``tsnv``: the same with transformers' vmap mask builder replaced by its vmap-free one (what
  TorchScript needs to trace transformers' causal masks);
- ``dyn``: ``torch.onnx.export(dynamo=True)``, opset 18 (torch's default exporter and opset);
- ``dyn23``: the same at opset 23 (ONNX's own ``Attention`` op);
- ``torch``: cgc's PyTorch frontend, ``cgc.compile(module, args=...)`` (captured once with
  ``cgc.frontends.torch.capture``, then compiled for each mode).

Beside them stand the references: ``params``, the same architecture as a params file
(``corpus_models.params_twin``: GPT-2 and Llama, float32 like the exports), and for the two
6 x 512 GPT-2s also ``zoo``, the in-house decoder of that shape (``zoo.decoder``, the model of
``bench_pipeline.py``: blocks only, no embedding or LM head).

Per model and route it prints:

- ``attn``: attention blocks fused of those found. From the manifest's ``attention`` record
  when the compiler writes one, else counted: ``wse.attention`` ops in the compiled IR over
  ``wse.softmax`` and ``wse.attention`` ops in the imported IR (``--dump-ir``'s
  ``00-import.mlir``), or ONNX ``Attention`` nodes where the importer wrote no softmax;
- ``WS step`` and ``MFU``: one inference batch (forward) of 8 samples in weight-streaming mode
  on one wse2, timing only (``cgc.simulate``);
- ``/twin``: that step's time over the params-file twin's (1.000 is the twin's time);
- ``pipe/bound`` and ``wafer``: pipelined at batch 1, the throughput over the compute bound
  (every PE's peak over the model's FLOPs per sample, as ``bench_pipeline.py`` computes it) and
  the share of the wafer's PEs placed;
- ``wall s``: the export and the compiles, in seconds;
- the first block not fused and why (when the manifest says), or the first error: a model that
  cannot be built, exported or compiled is a row with the one-line message, never a crash.

It ends with issue 30's two goals, met or not: every export within 10 % of its params-file
twin's weight-streaming step time or faster (exports that failed in torch are listed, not
counted; those faster than their twin by more than 10 % are listed too: GPT-2's exports
compute q, k and v in one projection where the params file writes three), and the
``gpt2-6x512-blocks`` dynamo export (opset 18, sdpa, batch 1) at 0.45 of the bound or more,
pipelined (``corpus_models.GOAL_CASE``: with its LM head, the logits' bytes through the host
links bound the model at 0.053 of its compute bound, however it is placed).

    python benchmarks/bench_corpus.py [--size small|real|all] [--models gpt2,llama-1b,...]
        [--routes ts,tsnv,dyn,dyn23,torch,params,zoo] [--impls eager,sdpa] [--jobs 2]
        [--timeout SECONDS] [--no-weights] [--out results.json]
    python benchmarks/bench_corpus.py --rows results.json     (the table of an earlier run)

The rows of ``--out`` also hold what the table leaves out: the step's time by term
(``cgc.machine.timing.utilization``: model FLOPs, other data movement, weight stream, ...),
the stage that sets the pipeline's period, every error, and each stage's wall time.

``--models`` takes architectures (``gpt2``: its case of each ``--size``) or case names
(``gpt2-6x512``, ``llama-1b``: that case whatever ``--size``). ``--out`` writes the rows as a
JSON list. Each model runs in a fresh process (``--jobs`` at a time), which builds it once per
attention implementation and takes it through every route. ``--no-weights`` compiles the
exports without their float initializers' data (``cgc.compile(no_weights=True)``): less
memory, but the exporters' float scalars and mask tables (the dynamo exporter's scale and fill
values among them) are then unknown to the compiler, so attention may fuse less than it would.

Time, measured on 2 cores that a test suite was using too (load 3): the small set's workers
took 16 minutes in all, about 8 minutes of wall time with 2 jobs; ``gpt2-6x512`` and
``gpt2-6x512-blocks`` about 5 minutes each (the small set and both: 13 minutes of wall time);
the dynamo exporter and the PyTorch frontend take most of it. The real sizes take long
(GPT-2 124M about 30 s a route, Llama-1B about 4 minutes for its dynamo export and compiles,
so all routes of all real models take hours) and need memory: the 1B models hold their 4.4 GB
of weights more than once (the module, the export, cgc's copy; 5 GB resident measured for
Llama-1B through ``dyn``), so run them with ``--jobs 1``, and ``--no-weights`` if memory is
short.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corpus_models import Built, Case

    from cgc import Artifact

ROUTES = ("ts", "tsnv", "dyn", "dyn23", "torch")
"""How a model enters cgc: four ONNX exporters and the PyTorch frontend."""
REFERENCES = ("params", "zoo")
"""The rows that are not exports: the params-file twin and the in-house decoder."""
ALL = "all"
"""The route of the one row of a model that could not be built (with that attention)."""
TARGET = "wse2"
TWIN_TOLERANCE = 0.10
"""Goal 1: every export's weight-streaming step within this fraction of its twin's."""
PIPELINED_GOAL = 0.45
"""Goal 2: the gpt2-6x512 dynamo export's pipelined throughput over the compute bound."""
GOAL_ROUTE, GOAL_IMPL = "dyn", "sdpa"
"""Goal 2's export: torch's default exporter and transformers' default attention."""
ATTENTION = re.compile(r"\bwse\.attention\b")
SOFTMAX = re.compile(r"\bwse\.softmax\b")


@dataclass
class Row:
    """One model through one route: what was found, and the figures."""

    case: str
    arch: str
    size: str
    impl: str
    """``eager`` or ``sdpa``; ``-`` for a reference."""
    route: str
    blocks: int
    """The attention blocks the architecture has."""
    attention: dict[str, Any] | None = None
    """``found``, ``fused``, ``first_unfused`` (``name``, ``reason``, or None) and ``source``
    (``manifest`` or ``counted``)."""
    ws_batch: int = 0
    ws_step_seconds: float | None = None
    ws_mfu: float | None = None
    ws_micro_batches: int | None = None
    ws_shares: dict[str, float] = field(default_factory=dict)
    """The step's time by term (``cgc.machine.timing.utilization``), shares adding up to one."""
    twin_ratio: float | None = None
    """``ws_step_seconds`` over the params-file twin's."""
    pipelined_batch: int = 0
    samples_per_second: float | None = None
    bound_samples_per_second: float | None = None
    pipelined_ratio: float | None = None
    wafer_share: float | None = None
    """The share of the wafer's PEs placed."""
    slowest_stage: str | None = None
    """The pipelined stage that sets the period, and whether its kernels or its busiest input
    link bound it (as ``bench_pipeline.py`` says it)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of the export and of each compile."""
    errors: list[str] = field(default_factory=list)
    """``stage: message``, one line each."""


# ---------------------------------------------------------------------------------------------
# The worker: one case, every impl and route (in its own process)
# ---------------------------------------------------------------------------------------------


def one_line(error: BaseException) -> str:
    """An error as one line: cgc's own message, else the type and the first line."""
    from cgc.errors import CgcError

    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if isinstance(error, CgcError):
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _timed(row: Row, stage: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, its wall time in ``row.seconds[stage]``; None (and the error in
    ``row.errors``) if it raised."""
    start = time.perf_counter()
    try:
        return fn()
    except Exception as e:  # every failure of a route is a row, not a crash
        row.errors.append(f"{stage}: {one_line(e)}")
        return None
    finally:
        row.seconds[stage] = round(time.perf_counter() - start, 2)


def _counted_attention(artifact: Artifact, dumps: Path, onnx_path: Path | None) -> dict[str, Any]:
    """Blocks fused (``wse.attention`` in the compiled IR) of blocks found (``wse.softmax``
    or ``wse.attention`` in the imported IR, or ONNX ``Attention`` nodes)."""
    imported = next(iter(sorted(dumps.glob("00-*.mlir"))), None)
    text = imported.read_text() if imported is not None else ""
    found = len(SOFTMAX.findall(text)) + len(ATTENTION.findall(text))
    if onnx_path is not None:
        import onnx

        graph = onnx.load(str(onnx_path), load_external_data=False).graph
        found = max(found, sum(node.op_type == "Attention" for node in graph.node))
    fused = len(ATTENTION.findall(artifact.ir))
    return {"found": max(found, fused), "fused": fused, "first_unfused": None, "source": "counted"}


def _attention(artifact: Artifact, dumps: Path, onnx_path: Path | None) -> dict[str, Any]:
    """The manifest's attention record if the compiler wrote one, else counted."""
    record = artifact.manifest.get("attention")
    if isinstance(record, dict) and "fused" in record:
        return {**record, "source": "manifest"}
    return _counted_attention(artifact, dumps, onnx_path)


def _streaming(row: Row, model: Any, batch: int, onnx_path: Path | None, **options: Any) -> None:
    """The weight-streaming compile (``options`` are ``cgc.compile``'s), its attention record
    and one timing-only batch."""
    import cgc
    from cgc.machine.timing.utilization import step_utilization

    with tempfile.TemporaryDirectory() as dumps:

        def compiled() -> Artifact:
            return cgc.compile(
                model,
                mode="weight_streaming",
                target=TARGET,
                batch_size=batch,
                dump_ir=dumps,
                **options,
            )

        artifact = _timed(row, "compile weight_streaming", compiled)
        if artifact is None:
            return
        row.attention = _attention(artifact, Path(dumps), onnx_path)
    sim = _timed(row, "simulate weight_streaming", lambda: cgc.simulate(artifact))
    if sim is None:
        return
    stats = sim.stats
    row.ws_step_seconds, row.ws_mfu = stats.simulated_seconds, stats.mfu
    row.ws_micro_batches = stats.micro_batches
    step = step_utilization(stats, artifact.program, sim.target)
    if step is not None:
        row.ws_shares = {key: round(share, 4) for key, share in step.shares.items()}


def _pipelined(row: Row, model: Any, batch: int, **options: Any) -> None:
    """The pipelined compile (``options`` are ``cgc.compile``'s): throughput over the compute
    bound, the wafer's share placed."""
    import cgc
    from cgc.machine.timing.pipeline import pipeline_figures, pipeline_stages
    from cgc.tools.picture import stages

    artifact = _timed(
        row,
        "compile pipelined",
        lambda: cgc.compile(model, mode="pipelined", target=TARGET, batch_size=batch, **options),
    )
    if artifact is None:
        return
    figures = pipeline_figures(artifact)
    row.samples_per_second = figures["samples_per_second"]
    row.bound_samples_per_second = figures["bound_samples_per_second"]
    if row.bound_samples_per_second:
        row.pipelined_ratio = row.samples_per_second / row.bound_samples_per_second
    target = artifact.manifest["target"]
    placed = sum(s.region[2] * s.region[3] for s in stages(artifact))
    row.wafer_share = placed / (target["rows"] * target["cols"])
    slowest = max(pipeline_stages(artifact), key=lambda s: max(s.cycles, s.link_cycles))
    bound_by = "link" if slowest.link_cycles > slowest.cycles else "kernels"
    row.slowest_stage = f"{slowest.name} ({bound_by})"


def _measure(
    row: Row, model: Any, case: Case, onnx_path: Path | None = None, **options: Any
) -> None:
    """Both modes' figures of ``model`` into ``row``."""
    row.ws_batch, row.pipelined_batch = case.ws_batch, case.pipelined_batch
    _streaming(row, model, case.ws_batch, onnx_path, **options)
    _pipelined(row, model, case.pipelined_batch, **options)


def _route_row(case: Case, impl: str, route: str, built: Built, no_weights: bool) -> Row:
    """``built`` (a ``corpus_models.Built``) through ``route``; an ONNX export compiled
    without its weights' data if ``no_weights``."""
    import corpus_models

    from cgc.frontends.torch import capture

    row = Row(case.name, case.arch, case.size, impl, route, case.attention_blocks)
    if route == "torch":
        program = _timed(row, "export", lambda: capture(built.module, built.args))
        if program is not None:
            _measure(row, program, case)
        return row
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / f"{case.name}-{impl}-{route}.onnx"
        exported = _timed(row, "export", lambda: corpus_models.export_onnx(built, route, path))
        if exported is not None:
            _measure(row, str(exported), case, exported, no_weights=no_weights)
    return row


def _reference_row(case: Case, route: str) -> Row:
    """The params-file twin (``params``) or the in-house decoder (``zoo``) of ``case``."""
    import corpus_models

    from cgc.frontends import zoo

    row = Row(case.name, case.arch, case.size, "-", route, case.attention_blocks)
    c = case.config
    if route == "params":
        model = _timed(row, "build", lambda: corpus_models.params_twin(case, case.ws_batch))
    else:
        model = _timed(
            row,
            "build",
            lambda: zoo.decoder(
                blocks=c["n_layer"], seq=case.seq, width=c["n_embd"], heads=c["n_head"]
            ),
        )
    if model is not None:
        _measure(row, model, case)
    return row


def work(case_name: str, impls: Sequence[str], routes: Sequence[str], no_weights: bool) -> None:
    """Prints one ``ROW`` JSON line per (impl, route) of the case, and per reference."""
    import torch
    from corpus_models import CASES, build

    torch.manual_seed(0)
    case = CASES[case_name]
    for route in (r for r in routes if r in REFERENCES):
        print("ROW " + json.dumps(asdict(_reference_row(case, route))), flush=True)
    for impl in impls:
        try:
            built = build(case, impl)
        except Exception as e:  # T5 has no sdpa attention, for one: a row for all routes
            row = Row(case.name, case.arch, case.size, impl, ALL, case.attention_blocks)
            row.errors.append(f"build: {one_line(e)}")
            print("ROW " + json.dumps(asdict(row)), flush=True)
            continue
        for route in (r for r in routes if r in ROUTES):
            print(
                "ROW " + json.dumps(asdict(_route_row(case, impl, route, built, no_weights))),
                flush=True,
            )
        del built


# ---------------------------------------------------------------------------------------------
# The driver: cases in worker processes, the table, the goals
# ---------------------------------------------------------------------------------------------


def planned(case: Case, impls: Sequence[str], routes: Sequence[str]) -> list[tuple[str, str]]:
    """The (impl, route) rows a worker prints for ``case``, in order."""
    from corpus_models import DECODER_CASES

    refs = [r for r in routes if r == "params" and case.arch in ("gpt2", "llama") and case.head]
    refs += [r for r in routes if r == "zoo" and case.name in DECODER_CASES]
    return [("-", r) for r in refs] + [(i, r) for i in impls for r in routes if r in ROUTES]


def spawn(case: Case, args: argparse.Namespace, threads: int) -> tuple[list[dict], float]:
    """Runs one case in a fresh process; its rows (a row for each the worker did not print,
    with why) and the wall time."""
    rows_wanted = planned(case, args.impls, args.routes)
    command = [
        sys.executable,
        __file__,
        "--one",
        case.name,
        "--impls",
        ",".join(args.impls),
        "--routes",
        ",".join(dict.fromkeys(route for _, route in rows_wanted)),
        *(["--no-weights"] if args.no_weights else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CORPUS_THREADS": str(threads)}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=args.timeout, env=env, check=False
        )
        stdout, failure = done.stdout, None
        if done.returncode:
            last = [line for line in done.stderr.splitlines() if line.strip()]
            failure = f"worker: exit {done.returncode}: {last[-1] if last else ''}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        stdout = out.decode() if isinstance(out, bytes) else out
        failure = f"worker: timed out after {args.timeout:g} s"
    rows = [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ROW ")]
    seen = {(r["impl"], r["route"]) for r in rows}
    for impl, route in rows_wanted:
        if (impl, route) not in seen and (impl, ALL) not in seen:
            missing = Row(case.name, case.arch, case.size, impl, route, case.attention_blocks)
            missing.errors.append(failure or "worker: no row")
            rows.append(asdict(missing))
    order: dict[tuple[str, str], int] = {}
    for k, (impl, route) in enumerate(rows_wanted):
        order.setdefault((impl, ALL), k)
        order[impl, route] = k
    rows.sort(key=lambda r: order.get((r["impl"], r["route"]), len(order)))
    return rows, time.perf_counter() - start


def with_twin_ratios(rows: list[dict]) -> None:
    """Sets every row's ``twin_ratio``: its step over its case's params-file twin's."""
    twins = {
        r["case"]: r["ws_step_seconds"]
        for r in rows
        if r["route"] == "params" and r["ws_step_seconds"]
    }
    for r in rows:
        twin, r["twin_ratio"] = twins.get(r["case"]), None
        if twin and r["ws_step_seconds"] and r["route"] != "zoo":  # zoo: blocks only
            r["twin_ratio"] = r["ws_step_seconds"] / twin


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= size:
            return f"{value / size:.4g} {unit}"
    return f"{value * 1e9:.4g} ns"


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def _note(row: dict) -> str:
    """The row's first error, else the first block not fused and why."""
    if row["errors"]:
        return row["errors"][0]
    first = (row["attention"] or {}).get("first_unfused")
    if first:
        return f"first unfused {first.get('name')}: {first.get('reason')}"
    return ""


def table(rows: list[dict], width: int) -> list[str]:
    """The rows as a table, one line each, notes cut to ``width`` characters."""
    name = max([len("case"), *(len(r["case"]) for r in rows)])
    head = (
        f"{'case':{name}s} {'impl':5s} {'route':6s} {'attn':>7s} {'WS step':>10s} {'MFU':>7s} "
        f"{'/twin':>6s} {'pipe/bound':>10s} {'wafer':>6s} {'wall s':>6s}  "
        "first unfused / error"
    )
    lines = [head, "-" * len(head)]
    previous = None
    for r in rows:
        if previous is not None and r["case"] != previous:
            lines.append("")
        previous = r["case"]
        a = r["attention"]
        attn = f"{a['fused']}/{a['found']}" if a else "-"
        note = _note(r)
        lines.append(
            f"{r['case']:{name}s} {r['impl']:5s} {r['route']:6s} {attn:>7s} "
            f"{_seconds(r['ws_step_seconds']):>10s} {_figure(r['ws_mfu'], '.2%'):>7s} "
            f"{_figure(r['twin_ratio'], '.3f'):>6s} {_figure(r['pipelined_ratio'], '.4f'):>10s} "
            f"{_figure(r['wafer_share'], '.1%'):>6s} {sum(r['seconds'].values()):6.1f}  "
            + (note if len(note) <= width else note[: width - 3] + "...")
        )
    return lines


def _exported(row: dict) -> bool:
    """Whether the row's model was built and exported (whatever cgc then made of it)."""
    return not any(e.startswith(("build:", "export:")) for e in row["errors"])


GOAL_1 = (
    f"goal 1: every export within {TWIN_TOLERANCE:.0%} of its params-file twin's "
    "weight-streaming step time (or faster)"
)
GOAL_2 = (
    f"goal 2: {{case}} dynamo export (opset 18, {GOAL_IMPL}), pipelined at batch 1, at "
    f">= {PIPELINED_GOAL} of the compute bound"
)


def _listed(rows: list[dict], most: int = 8) -> list[str]:
    """One line per row (at most ``most``): its case, route and ratio to the twin."""
    lines = []
    for r in rows[:most]:
        figure = f"{r['twin_ratio']:.3f} x the twin" if r["twin_ratio"] else _note(r)[:90]
        lines.append(f"    {r['case']} {r['impl']} {r['route']}: {figure}")
    if len(rows) > most:
        lines.append(f"    ... and {len(rows) - most} more")
    return lines


def goal_twins(rows: list[dict]) -> list[str]:
    """Goal 1, met or not: the exports at most the tolerance slower than their twin, the worst
    of the others, and those faster than their twin by more than the tolerance (a model the
    exporter writes with less work than the params file's: GPT-2's one projection of q, k and
    v where the params file writes three)."""
    twinned = {r["case"] for r in rows if r["route"] == "params" and r["ws_step_seconds"]}
    if not twinned:
        return [f"{GOAL_1}: not measured (no params-file twin in this run)"]
    exports = [r for r in rows if r["case"] in twinned and r["route"] in ROUTES]
    failed = [r for r in exports if not _exported(r)]
    exports = [r for r in exports if _exported(r)]
    within = [
        r for r in exports if r["twin_ratio"] is not None and r["twin_ratio"] <= 1 + TWIN_TOLERANCE
    ]
    verdict = "MET" if exports and len(within) == len(exports) else "NOT MET"
    lines = [
        f"{GOAL_1}: {verdict}, {len(within)} of {len(exports)} exports of {len(twinned)} "
        "twinned models" + (f" ({len(failed)} more did not export, not counted)" if failed else "")
    ]
    misses = sorted(
        (r for r in exports if r not in within), key=lambda r: -(r["twin_ratio"] or float("inf"))
    )
    faster = [r for r in within if r["twin_ratio"] < 1 - TWIN_TOLERANCE]
    lines += _listed(misses)
    if faster:
        lines.append(f"  faster than the twin by more than {TWIN_TOLERANCE:.0%}:")
        lines += _listed(faster)
    return lines


def goal_pipelined(rows: list[dict]) -> list[str]:
    """Goal 2, met or not, beside the other 6 x 512 GPT-2s measured."""
    from corpus_models import DECODER_CASES, GOAL_CASE

    goal = [r for r in rows if r["case"] == GOAL_CASE and r["route"] == GOAL_ROUTE]
    target = next((r for r in goal if r["impl"] == GOAL_IMPL), None)
    if target is None:
        return [f"{GOAL_2.format(case=GOAL_CASE)}: not measured (--models {GOAL_CASE})"]
    ratio = target["pipelined_ratio"]
    verdict = "MET" if ratio is not None and ratio >= PIPELINED_GOAL else "NOT MET"
    shown = f"{ratio:.4f}" if ratio is not None else _note(target)
    others = ", ".join(
        f"{r['impl']} {_figure(r['pipelined_ratio'], '.4f')}" for r in goal if r is not target
    )
    lines = [
        f"{GOAL_2.format(case=GOAL_CASE)}: {verdict}, {shown}"
        + (f" (also {others})" if others else "")
    ]
    beside = {
        "the params twin" if r["route"] == "params" else
        "the in-house decoder (zoo)" if r["route"] == "zoo" else
        f"{r['case']} {r['impl']} {r['route']}": _figure(r["pipelined_ratio"], ".4f")
        for r in rows
        if r["case"] in DECODER_CASES
        and (r["route"] in REFERENCES or (r["case"] != GOAL_CASE and r["route"] == GOAL_ROUTE))
    }  # fmt: skip
    if beside:
        lines.append("    beside it: " + ", ".join(f"{k} {v}" for k, v in beside.items()))
    return lines


def selected(size: str, models: Sequence[str]) -> list[Case]:
    """The cases of ``size`` whose architecture ``models`` names, and those it names."""
    from corpus_models import CASES

    sizes = ("small", "real") if size == "all" else (size,)
    unknown = [m for m in models if m not in CASES and m not in {c.arch for c in CASES.values()}]
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}; known: {', '.join(CASES)}")
    return [
        c
        for c in CASES.values()
        if c.name in models or (c.size in sizes and (not models or c.arch in models))
    ]


def _names(text: str, known: Sequence[str], flag: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in known]
    if bad:
        raise SystemExit(f"{flag}: unknown {', '.join(bad)}; expected some of {', '.join(known)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("small", "real", "all"), default="small")
    parser.add_argument("--models", default="", help="architectures or case names, a,b,...")
    parser.add_argument("--routes", default=",".join((*ROUTES, *REFERENCES)))
    parser.add_argument("--impls", default="eager,sdpa")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=float, default=None, help="seconds per model")
    parser.add_argument("--out", type=Path, help="write the rows here (a JSON list)")
    parser.add_argument(
        "--no-weights",
        action="store_true",
        help="compile the ONNX exports without their float initializers' data (less memory)",
    )
    parser.add_argument("--width", type=int, default=110, help="characters of a note shown")
    parser.add_argument("--rows", type=Path, help="print the table of an --out file, no run")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.routes = _names(args.routes, (*ROUTES, *REFERENCES), "--routes")
    args.impls = _names(args.impls, ("eager", "sdpa"), "--impls")
    if args.one:
        import torch

        torch.set_num_threads(int(os.environ.get("CORPUS_THREADS", "1")))
        work(args.one, args.impls, args.routes, args.no_weights)
        return
    if args.rows:
        rows = json.loads(args.rows.read_text())
        header = [f"rows of {args.rows}"]
    else:
        rows, header = measure(args)
    with_twin_ratios(rows)
    ws = ",".join(str(b) for b in sorted({r["ws_batch"] for r in rows if r["ws_batch"]}))
    pipelined = ",".join(
        str(b) for b in sorted({r["pipelined_batch"] for r in rows if r["pipelined_batch"]})
    )
    print("\n".join(header))
    print(
        f"on {TARGET}: weight streaming is one inference batch of {ws or '-'} (timing only), "
        f"pipelined a batch of {pipelined or '-'}; /twin is the step over the params-file twin's"
    )
    print("\n".join(table(rows, args.width)))
    print()
    print("\n".join([*goal_twins(rows), *goal_pipelined(rows)]))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"rows written to {args.out}")


def measure(args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Every selected case, ``args.jobs`` worker processes at a time: the rows, and the lines
    that say what was run."""
    import cgc

    cases = selected(args.size, [m for m in args.models.split(",") if m])
    jobs = max(1, args.jobs)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    start = time.perf_counter()
    results: dict[str, list[dict]] = {}

    def run(case: Case) -> None:
        rows, seconds = spawn(case, args, threads)
        results[case.name] = rows
        failed = sum(bool(r["errors"]) for r in rows)
        print(
            f"  {case.name}: {len(rows)} rows ({failed} with errors) in {seconds:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(run, cases))
    rows = [r for case in cases for r in results[case.name]]
    header = [
        f"corpus of exports, {time.strftime('%Y-%m-%d %H:%M')}: cgc {cgc.__version__} from "
        f"{Path(cgc.__file__).parent}; {len(cases)} models, {len(rows)} rows in "
        f"{time.perf_counter() - start:.0f} s with {jobs} jobs"
    ]
    return rows, header


if __name__ == "__main__":
    main()
