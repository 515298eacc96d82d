"""Soak test of the training loop: trains the zoo's small MLP with numbers (not timing-only)
for many steps and prints the process's resident memory as it goes, to show that a long run
does not grow. A benchmark, never part of the tests (it takes minutes).

    python benchmarks/soak_training.py --steps 10000

prints one line at step 100, 1,000 and every further 1,000, and at the last step, then the
growth from step 100 to the end (the goal: under 5 %) and how much of it is the one thing
that is meant to grow, the metrics lines ``train`` returns (a small dict a step).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import numpy as np

from cgc.frontends import zoo
from cgc.runtime.trainer import train


def rss_kib() -> int:
    """The resident set size now (VmRSS), in KiB; Linux only."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def data(samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs and labels for ``zoo.MODELS["mlp_train"]`` (64 features, 10 classes)."""
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((samples, 64)).astype(np.float32),
        "labels": rng.integers(0, 10, samples),
    }


def line_bytes(line: dict) -> int:
    """What one metrics line costs in memory as ``TrainResult.metrics`` keeps it: its compact
    JSON text (``MetricLines``) and the list's slot."""
    return sys.getsizeof(json.dumps(line, separators=(",", ":")).encode()) + 8


def soak(steps: int, batch: int, target: str, checkpoint_every: int) -> dict[int, tuple[int, int]]:
    """Trains for ``steps`` steps; returns the RSS and the metrics lines' bytes (both KiB) at
    the steps where they were read."""
    import cgc

    artifact, loop, _ = cgc.prepare_training(
        zoo.MODELS["mlp_train"](),
        batch_size=batch,
        steps=steps,
        target=target,
        optimizer="adam",
        lr=0.001,
        shuffle=True,
        checkpoint_every=checkpoint_every,
    )
    readings: dict[int, tuple[int, int]] = {}
    start = time.monotonic()
    metrics = 0

    def on_step(line: dict) -> None:
        nonlocal metrics
        metrics += line_bytes(line)  # the line ``train`` keeps in TrainResult.metrics
        step = line["step"]
        if step in (100, steps) or step % 1000 == 0:
            readings[step] = rss_kib(), metrics // 1024
            rate = step / (time.monotonic() - start)
            print(
                f"step {step:>7}: RSS {readings[step][0] / 1024:8.1f} MiB, metrics lines "
                f"{readings[step][1] / 1024:5.1f} MiB  ({rate:.0f} steps/s)"
            )

    with tempfile.TemporaryDirectory() as directory:
        train(artifact, data(4 * batch), loop, directory, on_step)
    return readings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--target", default="mesh16x16")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    args = parser.parse_args()
    readings = soak(args.steps, args.batch_size, args.target, args.checkpoint_every)
    if 100 in readings and args.steps > 100:
        (first, lines_first), (last, lines_last) = readings[100], readings[args.steps]
        rest = last - first - (lines_last - lines_first)
        print(
            f"growth from step 100 to {args.steps}: {100 * (last - first) / first:+.1f} % "
            f"({(last - first) / 1024:.1f} MiB), of which the metrics lines "
            f"{(lines_last - lines_first) / 1024:.1f} MiB; the rest {100 * rest / first:+.1f} %"
        )


if __name__ == "__main__":
    main()
