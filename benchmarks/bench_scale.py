"""Compile and timing-only simulation at real model sizes: wall time and peak memory.

Each measurement runs in a fresh process (``cgc`` imported, then timed), so no cache of an
earlier one helps; memory is the process's peak resident set (``VmHWM`` of the child itself).

* ``step``: compile plus one timing-only training step of GPT-3 175B on 64 wse2 systems (what
  ``cgc train zoo:gpt3-175b --timing-only --num-csx 64`` does), and the same on 1 system;
* ``sweep``: ``cgc scale zoo:gpt3-175b --num-csx 1,2,4,8,16,32,64``;
* ``family``: compile plus a step of every Cerebras-GPT model and of GPT-3 175B at the batch and
  on the systems of its params file: the cost grows with the layers, not the tensors;
* ``flat``: four blocks of a GPT at hidden sizes 768 to 12288 and sequences 512 to 8192 at a
  fixed layer count: flat in both.

    python benchmarks/bench_scale.py [--only step|sweep|family|flat]

Prints a line per measurement: wall seconds, peak RSS, and the simulated step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time

from child import peak_rss_mib

FAMILY = (
    "cerebras-gpt-111m", "cerebras-gpt-256m", "cerebras-gpt-590m", "cerebras-gpt-1.3b",
    "cerebras-gpt-2.7b", "cerebras-gpt-6.7b", "cerebras-gpt-13b", "gpt3-175b",
)  # fmt: skip


def _params(name: str, overrides: dict) -> object:
    from cgc.frontends.params import load_params

    params = load_params(f"zoo:{name}")
    model = dataclasses.replace(params.model, **overrides.get("model", {}))
    train = dataclasses.replace(params.train_input, **overrides.get("train_input", {}))
    return dataclasses.replace(params, model=model, train_input=train)


def _step(name: str, systems: int | None, overrides: dict) -> dict:
    """Compile and simulate one training step; the figures of the run."""
    import cgc

    params = _params(name, overrides)
    start = time.perf_counter()
    sim = cgc.simulate(params, num_csx=systems)
    seconds = time.perf_counter() - start
    stats = sim.stats
    return {
        "wall_seconds": seconds,
        "layers": len(stats.layers),
        "step_seconds": stats.simulated_seconds,
        "tokens_per_second": stats.tokens_per_second,
        "mfu": stats.mfu,
        "bound": stats.bound,
        "micro_batches": stats.micro_batches,
    }


def _sweep(name: str) -> dict:
    from cgc.compiler.sources import source_of
    from cgc.compiler.training import training_options
    from cgc.machine.hardware.target import get_target
    from cgc.tools import scaling

    source = source_of(f"zoo:{name}", training=True)
    start = time.perf_counter()
    points = scaling.study(
        source,
        get_target("wse2"),
        training_options(source.params),  # type: ignore[attr-defined]
        scaling.Clusters((1, 2, 4, 8, 16, 32, 64)),
    )
    return {
        "wall_seconds": time.perf_counter() - start,
        "efficiency_64": points[-1].efficiency,
        "bounds": [p.bound for p in points],
    }


def _child(kind: str, argument: str) -> None:
    import cgc  # noqa: F401  (imports are not what is measured)

    request = json.loads(argument)
    if kind == "sweep":
        result = _sweep(request["name"])
    else:
        result = _step(request["name"], request["systems"], request.get("overrides", {}))
    result["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(result))


def _spawn(kind: str, request: dict) -> dict:
    command = [sys.executable, __file__, "--one", kind, json.dumps(request)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _line(label: str, result: dict) -> str:
    extra = ""
    if "step_seconds" in result:
        tokens = result["tokens_per_second"] or 0
        extra = (
            f"  step {result['step_seconds']:.3f} s  {tokens:.3g} tokens/s  "
            f"MFU {result['mfu']:.1%}  {result['micro_batches']} micro-batches  "
            f"bound {result['bound']}  ({result['layers']} layers)"
        )
    return f"{label:44s} {result['wall_seconds']:7.2f} s  {result['peak_rss_mib']:7.0f} MiB{extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["step", "sweep", "family", "flat"])
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _child(*args.one)
        return
    chosen = [args.only] if args.only else ["step", "sweep", "family", "flat"]
    print(f"{'measurement':44s} {'wall':>9s}  {'peak RSS':>11s}")
    if "step" in chosen:
        for systems in (64, 1):
            result = _spawn("step", {"name": "gpt3-175b", "systems": systems})
            print(_line(f"gpt3-175b compile + step, {systems} systems", result))
    if "sweep" in chosen:
        result = _spawn("sweep", {"name": "gpt3-175b"})
        print(_line("gpt3-175b scale 1..64", result) + f"  efficiency(64) "
              f"{result['efficiency_64']:.1%}  bounds {','.join(result['bounds'])}")  # fmt: skip
    if "family" in chosen:
        for name in FAMILY:
            result = _spawn("step", {"name": name, "systems": None})
            print(_line(f"{name} compile + step, its own batch and systems", result))
    if "flat" in chosen:
        for hidden, seq in ((768, 2048), (3072, 2048), (12288, 2048), (4096, 512), (4096, 8192)):
            overrides = {
                "model": {"hidden_size": hidden, "num_hidden_layers": 4, "num_heads": hidden // 128,
                          "num_kv_heads": hidden // 128, "filter_size": 4 * hidden,
                          "max_position_embeddings": seq},
                "train_input": {"max_sequence_length": seq, "batch_size": 16 * 8},
            }  # fmt: skip
            result = _spawn("step", {"name": "gpt3-175b", "systems": 16, "overrides": overrides})
            print(_line(f"4 blocks, hidden {hidden}, sequence {seq}", result))


if __name__ == "__main__":
    main()
