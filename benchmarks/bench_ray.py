"""Times a numeric training step of K systems on Ray (systems and MemoryX as actors) against
the local executor, once the actors are warm.

The model is a GPT-style decoder from a params file (its weights drawn from a seed), big
enough that a step's compute is not trivially small beside an actor call. Both executors run
the same steps on the same batch, one executor's step after the other's (a load that drifts
weighs on both alike); the losses must agree bit for bit. Times are the median of several
steps after a warm-up step.

    python benchmarks/bench_ray.py [--num-csx 4] [--hidden 128] [--layers 4] [--repeat 5]

Prints the step's wall time on each executor, the ratio ray / local, and what a step moves
through the object store (weights broadcast, gradients reduced).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

PARAMS = """\
model:
  hidden_size: {hidden}
  num_hidden_layers: {layers}
  num_heads: 4
  filter_size: {filter}
  vocab_size: 256
  max_position_embeddings: {seq}
train_input:
  batch_size: {batch}
  max_sequence_length: {seq}
optimizer:
  optimizer_type: adamw
  learning_rate: 1.0e-3
runconfig:
  num_csx: {num_csx}
  precision: float32
"""


def tokens(samples: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids and their next tokens."""
    ids = np.random.default_rng(seed).integers(0, 256, (samples, seq)).astype(np.int32)
    return {"input_ids": ids, "labels": np.roll(ids, -1, axis=1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-csx", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="global batch")
    parser.add_argument("--target", default="mesh32x32")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import ray

    import cgc
    from cgc.runtime.executors import Backend
    from cgc.runtime.launch import open_cluster

    text = PARAMS.format(
        hidden=args.hidden, layers=args.layers, filter=4 * args.hidden, seq=args.seq,
        batch=args.batch, num_csx=args.num_csx,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "gpt.yaml"
        path.write_text(text)
        artifact = cgc.prepare_training(path, init_seed=0, target=args.target)[0]
    batch = tokens(args.batch, args.seq)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    with contextlib.ExitStack() as stack:
        clusters = {
            executor: stack.enter_context(open_cluster(artifact, backend=Backend(executor)))
            for executor in ("local", "ray")
        }
        losses = {executor: [c.train_step(batch)[0]] for executor, c in clusters.items()}
        times: dict[str, list[float]] = {executor: [] for executor in clusters}
        for _ in range(args.repeat):  # interleaved: a load that drifts weighs on both alike
            for executor, cluster in clusters.items():
                start = time.perf_counter()
                losses[executor].append(cluster.train_step(batch)[0])
                times[executor].append(time.perf_counter() - start)
    assert losses["ray"] == losses["local"], "the executors disagree"
    seconds = {executor: statistics.median(values) for executor, values in times.items()}
    for executor, values in times.items():
        print(f"{executor:5s}: {seconds[executor]:.3f} s a step (min {min(values):.3f} s)")
    weights = sum(spec.nbytes for spec in artifact.weight_specs.values())
    trained = artifact.manifest["training"]["trainable"]
    micro_batches = artifact.manifest.get("micro_batches", 1)  # each reduced on its own
    gradients = micro_batches * sum(artifact.weight_specs[name].nbytes for name in trained)
    print(
        f"K={args.num_csx}, {args.layers} blocks of {args.hidden}, {args.batch} x {args.seq} "
        f"tokens: ray / local = {seconds['ray'] / seconds['local']:.2f}; per step and system "
        f"{weights / 2**20:.2f} MiB of weights in, {gradients / 2**20:.2f} MiB of gradients out"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
