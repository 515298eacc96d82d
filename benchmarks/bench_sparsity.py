"""What sparse weights cost the simulator itself: wall time and peak memory, dense beside sparse.

Each measurement runs in a fresh process (``cgc`` imported, then timed), so no cache of an
earlier one helps; memory is the process's peak resident set (``VmHWM`` of the child itself).
The sparse runs are at 90 % sparsity (density 0.1), the sparse weights chosen by default.

* ``timing``: compile plus one timing-only training step of Cerebras-GPT 13B (what ``cgc train
  zoo:cerebras-gpt-13b --timing-only --steps 1`` does), dense and sparse. The sparse one must
  take at most ``TIMING_LIMIT`` times the dense one's wall time (its weights are too large for
  masks: their tiles' live counts are drawn, ``cgc.machine.sparse.tiles``);
* ``numeric``: training steps with numbers of small models (the zoo's ``mlp_train`` and a
  two-block GPT), compiled first, then at least ``STEPS`` steps and ``MIN_SECONDS`` timed
  after one warm-up step, dense and sparse. A sparse step must take at most
  ``NUMERIC_LIMIT`` times a dense one.

    python benchmarks/bench_sparsity.py [--only timing|numeric] [--json PATH]

Prints a line per measurement and the ratios; exits 1 if a ratio is over its limit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from child import peak_rss_mib

DENSITY = 0.1
"""Of the sparse runs: 90 % sparsity."""
TIMING_LIMIT = 2.0
NUMERIC_LIMIT = 1.5
STEPS = 5
"""Fewest numeric training steps timed (after one warm-up)..."""
MIN_SECONDS = 2.0
"""... and for at least this long: a small model's step takes milliseconds."""
GPT = """\
model:
  hidden_size: 128
  num_hidden_layers: 2
  num_heads: 4
  filter_size: 512
  vocab_size: 512
  max_position_embeddings: 64
train_input:
  batch_size: 8
  max_sequence_length: 64
optimizer:
  optimizer_type: adamw
  learning_rate: 1.0e-3
runconfig:
  num_csx: 1
  precision: float32
"""
"""A two-block GPT small enough to train with numbers in a second a step."""


def _timing(name: str, density: float | None) -> dict:
    """Compile and simulate one timing-only training step, as ``cgc train --timing-only``."""
    from cgc.compiler.driver import compile_model
    from cgc.compiler.training import training_options
    from cgc.frontends.params import load_params
    from cgc.machine.sparse.sparsity import Sparsity
    from cgc.runtime.simulation import simulate

    start = time.perf_counter()
    params = load_params(f"zoo:{name}")
    # the Sparsity itself, not an option whose meaning (density or zeros) may change
    sparse = None if density is None else Sparsity(density)
    artifact = compile_model(
        params, mode="weight_streaming", training=training_options(params, None, (), sparse)
    )
    stats = simulate(artifact).stats
    return {
        "wall_seconds": time.perf_counter() - start,
        "step_seconds": stats.simulated_seconds,
        "bound": stats.bound,
    }


def _model(kind: str, directory: Path) -> tuple[object, dict, int]:
    """The model, a batch of its data and its batch size."""
    import numpy as np

    if kind == "mlp_train":
        from cgc.frontends import zoo

        rng = np.random.default_rng(0)
        model = zoo.MODELS["mlp_train"]()
        batch = {"x": rng.standard_normal((8, 64)).astype(np.float32),
                 "labels": rng.integers(0, 10, 8).astype(np.int64)}  # fmt: skip
        return model, batch, 8
    path = directory / "gpt.yaml"
    path.write_text(GPT)
    ids = np.random.default_rng(0).integers(0, 512, (8, 64)).astype(np.int32)
    return str(path), {"input_ids": ids, "labels": np.roll(ids, -1, axis=1)}, 8


def _numeric(kind: str, density: float | None) -> dict:
    """Compile a small model for training, then time ``STEPS`` steps with numbers."""
    import cgc
    from cgc.runtime.cluster import Cluster

    with tempfile.TemporaryDirectory() as directory:
        model, batch, size = _model(kind, Path(directory))
        start = time.perf_counter()
        artifact = _sparse_artifact(model, size, density)
        compiled = time.perf_counter() - start
        cluster = Cluster(artifact)
        cluster.train_step(batch)  # warm-up: first-run caches
        steps, start = 0, time.perf_counter()
        while steps < STEPS or time.perf_counter() - start < MIN_SECONDS:
            cluster.train_step(batch)
            steps += 1
        step = (time.perf_counter() - start) / steps
        live = (artifact.manifest.get("sparsity") or {}).get("density", 1.0)
    del cgc
    return {"wall_seconds": step, "compile_seconds": compiled, "density": live}


def _sparse_artifact(model: object, batch: int, density: float | None) -> object:
    """The training artifact at ``density`` (None: dense), on a small mesh; the API's
    ``sparsity`` is the fraction of zeros."""
    import cgc

    options: dict = {"batch_size": batch, "target": "mesh16x16", "num_csx": 1}
    if isinstance(model, str):  # a params file: its weights drawn, to train with numbers
        options["init_seed"] = 0
    level = None if density is None else 1 - density
    artifact = cgc.prepare_training(model, sparsity=level, **options)[0]
    record = artifact.manifest.get("sparsity")
    live = 1.0 if record is None else record["density"]
    assert abs(live - (density or 1.0)) < 1e-9, f"asked for density {density}, got {live}"
    return artifact


def _child(kind: str, argument: str) -> None:
    import cgc  # noqa: F401  (imports are not what is measured)

    request = json.loads(argument)
    if kind == "timing":
        result = _timing(request["name"], request["density"])
    else:
        result = _numeric(request["name"], request["density"])
    result["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(result))


def _spawn(kind: str, request: dict) -> dict:
    command = [sys.executable, __file__, "--one", kind, json.dumps(request)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{kind} {request}: failed\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pair(kind: str, name: str, limit: float) -> dict:
    """The dense and the sparse measurement of one model, printed, and their ratios."""
    dense = _spawn(kind, {"name": name, "density": None})
    sparse = _spawn(kind, {"name": name, "density": DENSITY})
    ratio = sparse["wall_seconds"] / dense["wall_seconds"]
    memory = sparse["peak_rss_mib"] / dense["peak_rss_mib"]
    what = "compile + timing-only step" if kind == "timing" else "numeric step"
    for label, result in (("dense", dense), (f"{1 - DENSITY:.0%} sparse", sparse)):
        extra = f"  step {result['step_seconds']:.3f} s" if "step_seconds" in result else ""
        print(f"{name} {what}, {label:10s} {result['wall_seconds']:8.3f} s  "
              f"{result['peak_rss_mib']:7.0f} MiB{extra}")  # fmt: skip
    verdict = "ok" if ratio <= limit else "OVER"
    print(f"{name}: sparse / dense wall {ratio:.2f} (limit {limit:g}: {verdict}), "
          f"peak RSS {memory:.2f}")  # fmt: skip
    return {"name": name, "kind": kind, "dense": dense, "sparse": sparse,
            "wall_ratio": ratio, "rss_ratio": memory, "limit": limit}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["timing", "numeric"])
    parser.add_argument("--json", help="Write the measurements here.")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _child(*args.one)
        return
    chosen = [args.only] if args.only else ["timing", "numeric"]
    results = []
    if "timing" in chosen:
        results.append(_pair("timing", "cerebras-gpt-13b", TIMING_LIMIT))
    if "numeric" in chosen:
        for name in ("mlp_train", "gpt-2-blocks"):
            results.append(_pair("numeric", name, NUMERIC_LIMIT))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if any(r["wall_ratio"] > r["limit"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
