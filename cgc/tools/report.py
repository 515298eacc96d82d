"""What an artifact holds, for people (``cgc inspect``) and for tools (``--json``), and what a
run or a timing-only simulation cost, for people.

Per-layer figures come from the compiler's timing-only simulation of one chunk of the
per-system batch, stored in the manifest; the estimates of ``cgc inspect`` are the floor's
timing models (``cgc.machine.timing``), which the simulator asks too: inspecting an artifact
imports no part of the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target
from cgc.machine.hardware.units import human_bytes
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.bytecode import Program, Route
from cgc.machine.program.mode import Mode
from cgc.machine.timing.pipeline import pipeline_figures, pipeline_stages
from cgc.machine.timing.pipeline_bound import BOUND_LABELS, TERMS, WORST, artifact_bound
from cgc.machine.timing.run_stats import RunStats, Simulation
from cgc.machine.timing.streaming import Tree
from cgc.machine.timing.utilization import (
    LABELS,
    PARTS,
    StepUtilization,
    layer_groups,
    step_utilization,
)


def _batch(artifact: Artifact) -> int:
    return artifact.manifest["micro_batch"] or 1


def has_batch_axis(manifest: dict) -> bool:
    """Whether the artifact's inputs have a batch axis; without one (a model exported with a
    fixed leading dim) a run takes the inputs' fixed shapes, counted as one sample."""
    return any(spec["batch_axis"] == 0 for spec in manifest["inputs"])


def _batch_line(manifest: dict) -> str:
    """The systems and how many samples each runs."""
    if manifest["per_system_batch"] is None or not has_batch_axis(manifest):
        batch = "no batch axis (each run takes the inputs' fixed shapes)"
    else:
        batch = f"per-system batch {manifest['per_system_batch']}{_runs(manifest)}"
    return f"systems: {manifest['num_csx']}, {batch}"


def _runs(manifest: dict) -> str:
    """How a system's batch runs, when it runs as several micro-batches."""
    if manifest["micro_batches"] == 1:
        return ""
    runs = f" as {manifest['micro_batches']} runs of {manifest['micro_batch']}"
    buffers = (manifest.get("training") or {}).get("buffers")
    return runs + (" (batch statistics per run)" if buffers else "")


def _target(artifact: Artifact) -> Target:
    return Target.from_json(artifact.manifest["target"])


def inspect_json(artifact: Artifact) -> dict:
    """The ``cgc inspect --json`` object; a pipelined artifact's has where its compute bound
    goes (``compute_bound``: ``cgc.machine.timing.pipeline_bound``)."""
    m = artifact.manifest
    target, batch = _target(artifact), _batch(artifact)
    out: dict = {
        "mode": m["mode"],
        "mode_reason": m["mode_reason"],
        "target": {
            "name": target.name,
            "rows": target.rows,
            "cols": target.cols,
            "sram_bytes_per_pe": target.sram_bytes_per_pe,
            "clock_hz": target.clock_hz,
            "peak_flops_per_pe_per_cycle": target.peak_flops_per_pe_per_cycle(),
        },
        "num_csx": m["num_csx"],
        "per_system_batch": m["per_system_batch"],
        "micro_batch": m["micro_batch"],
        "micro_batches": m["micro_batches"],
        "inputs": m["inputs"],
        "outputs": m["outputs"],
        "pipeline_passes": m["pipeline"],
        "caches": m.get("caches", []),
        "generation": m.get("generation"),
    }
    if m["mode"] == Mode.PIPELINED:
        stages = pipeline_stages(artifact)
        out["layers"] = [
            {
                "name": layer["name"],
                "region": layer["rect"],
                "sram_bytes_per_pe": layer["sram_bytes_per_pe"],
                "flops_per_sample": layer["flops"] / batch,
                "cycles_per_sample": layer["cycles"] / batch,
                "link_cycles_per_sample": stage.link_cycles / batch,
                "cycles_by_part": _parts(layer),
                "weight_bytes": layer["weight_bytes"],
                "activation_in_bytes_per_sample": layer["activation_in_bytes"] / batch,
                "activation_out_bytes_per_sample": layer["activation_out_bytes"] / batch,
                "routes": [_route_json(route, artifact) for route in stage.routes],
            }
            for layer, stage in zip(m["layers"], stages, strict=True)
        ]
        out["pipeline"] = pipeline_figures(artifact)
        bound = artifact_bound(artifact, stages)
        if bound is not None:
            out["compute_bound"] = bound.to_json()
    else:
        tree = Tree(m["num_csx"], target)
        out["layers"] = [
            {
                "name": layer["name"],
                "weight_bytes": layer["weight_bytes"],
                "stream_seconds": tree.stream_seconds(layer["stream_in_bytes"]),
                "compute_seconds": target.seconds(layer["cycles"]),
                "cycles_by_part": _parts(layer),
            }
            for layer in m["layers"]
        ]
    if m.get("training"):
        out["training"] = m["training"]
    return out


def _parts(layer: dict) -> dict[str, float]:
    """Where a layer's cycles (per run of the per-system batch) go."""
    return {part: layer[f"{part}_cycles"] for part in ("compute", "movement", "arrival")}


def _route_json(route: Route, artifact: Artifact) -> dict:
    return {
        "source": artifact.program.layers[route.source].name,
        "color": route.color,
        "lanes": route.lanes,
        "hops": route.hops,
        "wavelets": route.wavelets,
        "busiest_link_wavelets": route.busiest,
        "path": [list(route.path[i : i + 2]) for i in range(0, len(route.path), 2)],
    }


def _tensor_line(spec: dict) -> str:
    batch = " (batch axis 0)" if spec["batch_axis"] == 0 else ""
    return f"{spec['name']} {spec['dtype']} {list(spec['shape'])}{batch}"


def _attention_lines(census: dict | None) -> list[str]:
    """How many attention blocks the compile fused of those it found, and why the first
    unfused one is not (none: the model has no attention)."""
    if not census or not census["found"]:
        return []
    line = f"attention: {census['fused']} of {census['found']} blocks fused"
    first = census["first_unfused"]
    if first is not None:
        line += f"; the first unfused, {first['name']}: {first['reason']}"
    return [line]


def bound_lines(data: Mapping[str, Any]) -> list[str]:
    """The ``cgc inspect`` block of a ``compute_bound`` object (``PipelineBound.to_json``):
    a line per term with its share, and the stages that lose the most with what binds
    them."""
    if not data["period_seconds"]:
        return []
    width = max(len(label) for _, label in TERMS)
    shares = data["shares"]
    busy = 1 - shares.get("idle", 0.0) - shares.get("waiting", 0.0)
    lines = [
        f"PEs: {data['placed_pes'] / data['pes']:.1%} placed, {busy:.1%} busy (shares of all "
        "PEs; busy: placed and at work over the period, not waiting on the slowest stage)",
        "where the compute bound goes (shares of all PEs x the period; model FLOPs at peak "
        "= throughput / bound):",
    ]
    for key, share in data["shares"].items():
        lines.append(f"  {BOUND_LABELS[key]:<{width}}  {share:7.2%}")
    worst = sorted(data["stages"], key=lambda s: -s["loss"])[:WORST]
    for stage in worst:
        bound = stage["bound"]
        binding = f" ({BOUND_LABELS[bound]} {stage['shares'][bound]:.2%})" if bound else ""
        lines.append(f"  loses {stage['loss']:6.2%}: {stage['name']}{binding}")
    return lines


def summary_text(artifact: Artifact) -> str:
    """A readable summary: manifest, then the placement or the stream schedule."""
    m = artifact.manifest
    info = inspect_json(artifact)
    t = info["target"]
    lines = [
        f"artifact of {m['source']}, cgc {m['cgc_version']} (format {m['format_version']})",
        f"mode: {m['mode']} ({m['mode_reason']})",
        f"target: {t['name']}, {t['rows']} x {t['cols']} PEs, "
        f"{human_bytes(t['sram_bytes_per_pe'])} SRAM per PE, {t['clock_hz'] / 1e6:.0f} MHz",
        _batch_line(m),
        *[f"input:  {_tensor_line(s)}" for s in m["inputs"]],
        *[f"output: {_tensor_line(s)}" for s in m["outputs"]],
        f"passes: {m['pipeline']}",
        *_attention_lines(m.get("attention")),
    ]
    width = max((len(layer["name"]) for layer in info["layers"]), default=4)
    if m["mode"] == Mode.PIPELINED:
        lines.append("placement (x, y, columns x rows):")
        for layer in info["layers"]:
            x, y, w, h = layer["region"]
            link = layer["link_cycles_per_sample"]
            lines.append(
                f"  {layer['name']:<{width}}  ({x}, {y}) {w}x{h}  "
                f"{human_bytes(layer['sram_bytes_per_pe'])}/PE  "
                f"{layer['cycles_per_sample']:.0f} cycles/sample"
                + (f", busiest input link {link:.0f}" if link else "")
            )
        p = info["pipeline"]
        bound = p["bound_samples_per_second"]
        share = (
            f"{p['samples_per_second'] / bound:.1%} of the compute bound {bound:.4g}"
            if bound
            else "no compute bound (no flops)"
        )
        colors = {r["color"] for layer in info["layers"] for r in layer["routes"]}
        routes = sum(len(layer["routes"]) for layer in info["layers"])
        lines.append(
            f"routes: {routes} tensors between layers on {len(colors)} of "
            f"{_target(artifact).colors} colors"
        )
        lines.append(
            f"pipeline: {p['samples_per_second']:.4g} samples/s per system, "
            f"{share}; "
            f"latency {p['latency_seconds'] * 1e6:.2f} us"
        )
        lines += bound_lines(info["compute_bound"])
    else:
        lines.append("stream schedule (one layer at a time, on the whole wafer):")
        for layer in info["layers"]:
            lines.append(
                f"  {layer['name']:<{width}}  weights {human_bytes(layer['weight_bytes'])}  "
                f"stream {layer['stream_seconds'] * 1e6:.2f} us  "
                f"compute {layer['compute_seconds'] * 1e6:.2f} us"
            )
    lines += _generation_lines(m)
    if m.get("training"):
        tr = m["training"]
        reduction = tr["batch_reduction"] or "unknown reduction"
        lines.append(
            f"training: loss '{tr['loss']}' ({reduction} over the batch), "
            f"{tr['optimizer']}, trains {', '.join(tr['trainable'])}"
        )
    return "\n".join(lines) + "\n"


def _generation_lines(m: dict) -> list[str]:
    """A generation's key-value caches and serving figures (none for another artifact)."""
    generation = m.get("generation")
    caches = generation["decode"]["caches"] if generation else m.get("caches", [])
    if not caches:
        return []
    first = caches[0]
    per_token = sum(c["bytes_per_token"] for c in caches)
    held = sum(c["shape"][0] * c["bytes_per_token"] for c in caches)
    lines = [
        f"key-value caches: {len(caches)} ({human_bytes(per_token)} a token of a sequence), "
        f"{first['capacity']} tokens for each of {first['sequences']} sequences "
        f"({human_bytes(held)}); {first['name']} on layer {first['layer']}, "
        f"{first['tile'][0]}x{first['tile'][1]} a PE of {first['rect'][2]}x{first['rect'][3]}"
    ]
    if generation:
        s = generation["serving"]
        lines += [
            f"generation: decode step of {len(generation['decode']['layers'])} layers; prompt "
            f"{s['prompt_tokens']} tokens in {s['prompt_chunks']} chunk(s), {s['new_tokens']} new",
            f"serving: time to first token {human_seconds(s['ttft_seconds'])}, per output "
            f"token {human_seconds(s['tpot_seconds'])}, {s['tokens_per_second']:,.1f} tokens/s "
            f"({s['tokens_per_second_per_sequence']:,.1f} a sequence) on {s['num_csx']} "
            f"system(s); bound by {s.get('decode_bound', 'what the artifact does not say')}",
            f"longest context: {s['kv_capacity_tokens']:,} cache tokens fit, the longest "
            "context times the sequences served at once",
        ]
    return lines


def human_seconds(value: float) -> str:
    """A duration in the unit that reads best."""
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value * 1e9:.3g} ns" if value else "0"


def shares_line(step: StepUtilization) -> str:
    """The step's time by term, largest first: ``model FLOPs 63%, ...``."""
    ordered = sorted(step.shares.items(), key=lambda kv: -abs(kv[1]))
    return ", ".join(f"{LABELS[key]} {share:.1%}" for key, share in ordered)


def _layer_lines(groups: list[dict], step: StepUtilization | None, what: str) -> list[str]:
    """The per-layer table: each part's seconds per step, then (weight streaming) the
    layer's FLOPs, share of the step, MFU and what binds it."""
    width = max(len(g["name"]) for g in groups)
    header = "  ".join(f"{label:>10}" for _, label in PARTS)
    used = {u.name: u for u in step.layers} if step else {}
    extra = f"  {'FLOPs':>9}  {'share':>6}  {'MFU':>6}" if used else ""
    lines = [
        f"per {what}, by layer:",
        f"  {'layer':<{width}}  {'count':>5}  {header}{extra}  bound",
    ]
    for g in groups:
        figures = "  ".join(f"{human_seconds(g[part]):>10}" for part, _ in PARTS)
        u = used.get(g["name"])
        tail = f"  {u.flops:>9.3g}  {u.share:>6.1%}  {u.mfu:>6.1%}  {u.bound}" if u else ""
        lines.append(
            f"  {g['name']:<{width}}  {g['count']:>5}  {figures}{tail or '  ' + g['bound']}"
        )
    if step is not None:
        limit = f"; the streams run at {step.stream_limit}'s rate" if step.stream_limit else ""
        lines.append(f"step MFU {step.mfu:.1%}; the step's time: {shares_line(step)}{limit}")
    return lines


def simulation_json(sim: Simulation, program: Program | None = None) -> dict[str, Any]:
    """The ``--stats-json`` object of a timing-only simulation, with (weight streaming) its
    ``utilization``: the step's MFU and time by term, and per layer group its FLOPs, share,
    MFU and bound (``cgc.machine.timing.utilization``)."""
    out = sim.to_json()
    step = step_utilization(sim.stats, program, sim.target)
    if step is not None:
        out["utilization"] = step.to_json()
    return out


def simulation_text(
    sim: Simulation,
    every_layer: bool = False,
    batched: bool = True,
    program: Program | None = None,
) -> str:
    """What a timing-only simulation found, for people: the step, the per-layer table with
    each layer's MFU and what binds it, the step's time by what it is lost to, the memory,
    and the assumptions it rests on; ``batched``: whether the model has a batch axis
    (without one, a batch is a run of the inputs' fixed shapes); ``program``: the
    simulated program, whose kernels name the wafer's terms
    (``cgc.machine.timing.utilization``)."""
    stats = sim.stats
    what, whats = ("training step", "training steps") if sim.training else ("batch", "batches")
    size = f"{stats.batch_size} samples" if batched else "the fixed input shapes (no batch axis)"
    lines = [
        f"{sim.steps} {what if sim.steps == 1 else whats} of {size} on "
        f"{stats.num_csx} x {stats.target} ({stats.mode}), timing only",
        f"per {what}: {human_seconds(stats.simulated_seconds)}, "
        f"{stats.samples_per_second:.4g} samples/s"
        + (f", {stats.tokens_per_second:.4g} tokens/s" if stats.tokens_per_second else "")
        + f", MFU {stats.mfu:.1%} of {stats.peak_flops_per_second / 1e15:.3g} PFLOP/s",
        f"micro-batches: {stats.micro_batches} of {stats.micro_batch} per system; "
        f"bound: {stats.bound or 'the pipeline'}",
        f"peak SRAM per PE: {human_bytes(stats.peak_pe_sram_bytes)}",
    ]
    # a pipelined run holds its weights on the wafer: MemoryX and SwarmX play no part in it
    on_wafer = stats.mode == Mode.PIPELINED
    if stats.memoryx is not None and not on_wafer:
        mx = stats.memoryx
        lines.append(
            f"MemoryX: {human_bytes(mx.total)} of {human_bytes(stats.memoryx_capacity_bytes)} "
            f"(weights {human_bytes(mx.weights)}, gradients {human_bytes(mx.gradients)}, "
            f"optimizer state {human_bytes(mx.optimizer_state)})"
        )
    if sim.steps > 1:
        lines.append(f"all {sim.steps} {whats}: {human_seconds(sim.seconds)}")
    groups = layer_groups(stats, every_layer)
    if groups:
        step = step_utilization(stats, program, sim.target, every_layer)
        lines += _layer_lines(groups, step, what)
    assumed = ", ".join(
        f"{name} = {value:g}"
        for name, value in sim.assumed.items()
        if not (on_wafer and name.startswith(("memoryx", "swarmx")))
    )
    lines.append(f"assumed (not published): {assumed}")
    return "\n".join(lines) + "\n"


def run_lines(outputs: Mapping[str, np.ndarray], stats: RunStats, batched: bool) -> list[str]:
    """What a run with numbers made and cost; ``batched``: whether the model has a batch
    axis (without one, a run is of the inputs' fixed shapes, whatever their leading dim)."""
    lines = [f"{name}: {value.dtype} {list(value.shape)}" for name, value in outputs.items()]
    if batched:
        what, rate = f"{stats.batch_size} samples", "samples/s"
    else:
        runs = stats.batch_size
        what = f"{runs} run{'s' if runs != 1 else ''} of the fixed input shapes (no batch axis)"
        rate = "runs/s"
    lines.append(
        f"simulated {what} on {stats.num_csx} x {stats.target} "
        f"({stats.mode}): {stats.simulated_seconds * 1e6:.2f} us, "
        f"{stats.samples_per_second:.4g} {rate}, PE utilization {stats.pe_utilization:.2%}, "
        f"peak {stats.peak_pe_sram_bytes} bytes SRAM per PE"
    )
    if stats.pipeline and stats.pipeline["stages"]:
        p = stats.pipeline
        slowest = max(p["stages"], key=lambda stage: stage["service_seconds"])
        bound = (
            "its input link" if slowest["link_seconds"] > slowest["compute_seconds"] else "kernels"
        )
        lines.append(
            f"pipeline: {p['steady_samples_per_second']:.4g} {rate} per system in the steady "
            f"state, fill {p['fill_seconds'] * 1e6:.2f} us, drain {p['drain_seconds'] * 1e6:.2f} "
            f"us; slowest stage {slowest['name']} (bound by {bound})"
        )
    return lines


def trained_line(artifact: Artifact, chosen: bool) -> str:
    """What a training trains, and which of the model's float initializers it leaves."""
    training = artifact.manifest["training"]
    names = training["trainable"]
    specs = artifact.weight_specs
    count = sum(specs[n].size for n in names)
    how = "chosen by --trainable" if chosen else "the model's parameters (default)"
    line = f"training {count} parameters in {len(names)} tensors, {how}: {', '.join(names)}"
    left = [
        n
        for n in training["initializers"]
        if n not in names and n in specs and dtypes.is_float(specs[n].dtype)
    ]
    if left:
        line += f"; frozen: {', '.join(left)} (--trainable and --frozen choose)"
    return line
