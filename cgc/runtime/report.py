"""What an artifact holds, for people (``cgc inspect``) and for tools (``--json``).

Per-layer figures come from the compiler's timing-only simulation of one chunk of the
per-system batch, stored in the manifest.
"""

from __future__ import annotations

from cgc.runtime.artifact import Artifact
from cgc.runtime.machine import Target
from cgc.runtime.swarmx import SwarmX


def human_bytes(n: float) -> str:
    """``n`` bytes in KiB, MiB or GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _batch(artifact: Artifact) -> int:
    return artifact.manifest["per_system_batch"] or 1


def _target(artifact: Artifact) -> Target:
    return Target.from_json(artifact.manifest["target"])


def pipeline_figures(artifact: Artifact) -> dict:
    """Throughput of a pipelined artifact: the slowest stage against the compute bound."""
    target, batch = _target(artifact), _batch(artifact)
    layers = artifact.manifest["layers"]
    slowest = max((layer["cycles"] for layer in layers), default=0.0) / batch
    flops = sum(layer["flops"] for layer in layers) / batch
    peak = target.pes * target.peak_flops_per_pe_per_cycle() * target.clock_hz
    return {
        "samples_per_second": target.clock_hz / slowest if slowest else 0.0,
        "bound_samples_per_second": peak / flops if flops else 0.0,
    }


def inspect_json(artifact: Artifact) -> dict:
    """The ``cgc inspect --json`` object."""
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
        "inputs": m["inputs"],
        "outputs": m["outputs"],
        "pipeline_passes": m["pipeline"],
    }
    if m["mode"] == "pipelined":
        out["layers"] = [
            {
                "name": layer["name"],
                "region": layer["rect"],
                "sram_bytes_per_pe": layer["sram_bytes_per_pe"],
                "flops_per_sample": layer["flops"] / batch,
                "cycles_per_sample": layer["cycles"] / batch,
            }
            for layer in m["layers"]
        ]
        out["pipeline"] = pipeline_figures(artifact)
    else:
        swarmx = SwarmX(m["num_csx"], target)
        out["layers"] = [
            {
                "name": layer["name"],
                "weight_bytes": layer["weight_bytes"],
                "stream_seconds": swarmx.link_seconds(layer["stream_in_bytes"])
                + (swarmx.latency_seconds if layer["stream_in_bytes"] else 0.0),
                "compute_seconds": target.seconds(layer["cycles"]),
            }
            for layer in m["layers"]
        ]
    if m.get("training"):
        out["training"] = m["training"]
    return out


def _tensor_line(spec: dict) -> str:
    batch = " (batch axis 0)" if spec["batch_axis"] == 0 else ""
    return f"{spec['name']} {spec['dtype']} {list(spec['shape'])}{batch}"


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
        f"systems: {m['num_csx']}, per-system batch {m['per_system_batch']}",
        *[f"input:  {_tensor_line(s)}" for s in m["inputs"]],
        *[f"output: {_tensor_line(s)}" for s in m["outputs"]],
        f"passes: {m['pipeline']}",
    ]
    width = max((len(layer["name"]) for layer in info["layers"]), default=4)
    if m["mode"] == "pipelined":
        lines.append("placement (x, y, columns x rows):")
        for layer in info["layers"]:
            x, y, w, h = layer["region"]
            lines.append(
                f"  {layer['name']:<{width}}  ({x}, {y}) {w}x{h}  "
                f"{human_bytes(layer['sram_bytes_per_pe'])}/PE  "
                f"{layer['cycles_per_sample']:.0f} cycles/sample"
            )
        p = info["pipeline"]
        lines.append(
            f"pipeline: {p['samples_per_second']:.4g} samples/s per system "
            f"(compute bound {p['bound_samples_per_second']:.4g})"
        )
    else:
        lines.append("stream schedule (one layer at a time, on the whole wafer):")
        for layer in info["layers"]:
            lines.append(
                f"  {layer['name']:<{width}}  weights {human_bytes(layer['weight_bytes'])}  "
                f"stream {layer['stream_seconds'] * 1e6:.2f} us  "
                f"compute {layer['compute_seconds'] * 1e6:.2f} us"
            )
    if m.get("training"):
        tr = m["training"]
        reduction = tr["batch_reduction"] or "unknown reduction"
        lines.append(
            f"training: loss '{tr['loss']}' ({reduction} over the batch), "
            f"{tr['optimizer']}, trains {', '.join(tr['trainable'])}"
        )
    return "\n".join(lines) + "\n"
