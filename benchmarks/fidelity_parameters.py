"""The figures cgc assumes for what is not published (MemoryX, SwarmX, host I/O, the clock),
their reasoning, and how a Cerebras-GPT 1.3B training step moves when each is halved or
doubled: the last section of ``docs/fidelity.md`` (``benchmarks/fidelity.py`` writes it)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import cgc
from cgc.machine.hardware.target import ASSUMED, Target, get_target, with_figures

HEADLINE = "cerebras-gpt-1.3b"
HEADLINE_BATCH = 528
"""Cerebras-GPT 1.3B's global batch."""
SENSITIVITY = {
    "clock_hz": ASSUMED["clock_hz"],
    "memoryx_bytes_per_s": ASSUMED["memoryx_bytes_per_s"],
    "memoryx_update_params_per_s": ASSUMED["memoryx_update_params_per_s"],
    "swarmx_hop_seconds": ASSUMED["swarmx_hop_seconds"],
    "io_bytes_per_s": "published: 1.2 Tb/s per CS-2 (S6), not the SDK's memcpy (7 Gb/s a "
    "channel, S10), which cgc does not model",
    "swarmx_link_bytes_per_s": "a system's I/O rate: each CS-2 needs its weights at 1.2 Tb/s "
    "(S6); a node's 100 Gb/s ports are published, their number is not",
    "swarmx_fanout": "published: 1:4 broadcast-reduce nodes (S6)",
}
"""The figures of the MemoryX, SwarmX and host-I/O model and their reasoning."""


def scaled(target: Target, figure: str, factor: float) -> Target:
    """``target`` with ``figure`` times ``factor`` (a count rounded), as ``--set`` sets it."""
    value = getattr(target, figure) * factor
    text = f"{round(value)}" if isinstance(getattr(target, figure), int) else f"{value!r}"
    return with_figures(target, [f"{figure}={text}"])


def _headline(systems: int) -> cgc.Artifact:
    """Cerebras-GPT 1.3B's training step on ``systems`` wse2 systems, compiled once."""
    artifact, _, _ = cgc.prepare_training(
        f"zoo:{HEADLINE}", batch_size=HEADLINE_BATCH, num_csx=systems, target="wse2"
    )
    return artifact


def step(artifact: cgc.Artifact, target: Target) -> tuple[float, float]:
    """A training step's seconds and MFU of ``artifact`` on ``target`` (the program as
    compiled, the figures that do not shape it changed, as ``cgc run --set`` does)."""
    manifest = {**artifact.manifest, "target": target.to_json()}
    stats = cgc.simulate(replace(artifact, manifest=manifest)).stats
    return stats.simulated_seconds, stats.mfu


def sensitivity() -> list[dict[str, Any]]:
    """Per figure, its value and reasoning and the step time and MFU of the headline at half
    and twice its value, on one and on sixteen systems."""
    wse2 = get_target("wse2")
    out = []
    artifacts = {k: _headline(k) for k in (1, 16)}
    base = {k: step(a, wse2) for k, a in artifacts.items()}
    for figure, why in SENSITIVITY.items():
        cells = {}
        for factor in (0.5, 2.0):
            target = scaled(wse2, figure, factor)
            for k, artifact in artifacts.items():
                cells[(factor, k)] = step(artifact, target)
        out.append({"figure": figure, "value": getattr(wse2, figure), "why": why,
                    "base": base, "cells": cells})  # fmt: skip
    return out


def sensitivity_lines(table: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Unpublished figures and the headline's sensitivity to them",
        "",
        f"`{HEADLINE}` training step, global batch {HEADLINE_BATCH}, timing only, on 1 and "
        "on 16 wse2 systems (compiled once; each figure changed as `cgc run --set` does). "
        "Cells: step time and MFU at half / twice the value, relative to the base.",
        "",
        "| figure | value | reasoning | 1 system: step, MFU at 0.5x | at 2x | "
        "16 systems: step, MFU at 0.5x | at 2x |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for entry in table:
        cells = [f"`{entry['figure']}`", f"{entry['value']:.3g}", entry["why"]]
        for k in (1, 16):
            seconds, mfu = entry["base"][k]
            for factor in (0.5, 2.0):
                s, m = entry["cells"][(factor, k)]
                cells.append(f"{s / seconds:.2f}x, {m / mfu:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    base = table[0]["base"]
    lines += [
        "",
        "Base: "
        + "; ".join(
            f"{k} system{'s' if k > 1 else ''}: step {s * 1e3:.0f} ms, MFU {m:.1%}"
            for k, (s, m) in base.items()
        )
        + ".",
    ]
    return lines
