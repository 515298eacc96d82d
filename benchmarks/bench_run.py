"""Times cgc's simulator against onnxruntime and PyTorch on the example models.

Inference: ``cgc run`` (compiled once, in each execution mode) against an onnxruntime session
on the same inputs. Training: one ``cgc train`` step of the MLP (SGD with momentum) and of the
CNN (Adam) against one PyTorch step (autograd + torch.optim) of the same model
(``cgc.frontends.zoo_torch``). Each measurement runs in a fresh subprocess, so its peak
resident memory is its own; times are the median of several repetitions after a warm-up.

    python benchmarks/bench_run.py [--batch 64] [--repeat 5] [--target wse2]

Prints one line per case and the ratios cgc / reference (time and peak memory).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import numpy as np
from child import median_seconds


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_cgc(model_name: str, mode: str, batch: int, repeat: int, target: str) -> dict:
    import cgc
    from cgc.frontends import zoo

    model = zoo.MODELS[model_name]()
    artifact = cgc.compile(model, mode=mode, target=target, batch_size=batch)
    inputs = zoo.sample_inputs(model, batch, seed=1)
    seconds = median_seconds(lambda: cgc.run(artifact, inputs), repeat)
    _, stats = cgc.run_with_stats(artifact, inputs)
    return {"seconds": seconds, "simulated_seconds": stats.simulated_seconds}


def measure_onnxruntime(model_name: str, batch: int, repeat: int) -> dict:
    import onnxruntime as ort

    from cgc.frontends import zoo

    model = zoo.MODELS[model_name]()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    inputs = zoo.sample_inputs(model, batch, seed=1)
    return {"seconds": median_seconds(lambda: session.run(None, inputs), repeat)}


TRAINING = {"mlp": ("sgd", {"lr": 0.05, "momentum": 0.9}), "cnn": ("adam", {"lr": 1e-3})}
"""The model of each training benchmark and its optimizer."""


def _training_data(name: str, batch: int) -> dict[str, np.ndarray]:
    from cgc.frontends import zoo

    return zoo.sample_inputs(zoo.MODELS[f"{name}_train"](), batch, seed=0)


def measure_cgc_training(name: str, batch: int, repeat: int, target: str) -> dict:
    from cgc.compiler.driver import compile_model
    from cgc.compiler.training import Training
    from cgc.frontends import zoo, zoo_torch
    from cgc.runtime.cluster import Cluster

    optimizer, settings = TRAINING[name]
    trainable = tuple(zoo_torch.TRAINABLE[f"{name}_train"])
    options = Training(optimizer, trainable=trainable, **settings)
    artifact = compile_model(
        zoo.MODELS[f"{name}_train"](),
        mode="weight_streaming",
        target=target,
        batch_size=batch,
        training=options,
    )
    cluster = Cluster(artifact)
    data = _training_data(name, batch)
    return {"seconds": median_seconds(lambda: cluster.train_step(data), repeat)}


def measure_torch_training(name: str, batch: int, repeat: int) -> dict:
    import re

    import torch
    from onnx import numpy_helper

    from cgc.frontends import zoo, zoo_torch

    torch.set_num_threads(1)
    model = zoo.MODELS[f"{name}_train"]()
    weights = {t.name: torch.tensor(numpy_helper.to_array(t)) for t in model.graph.initializer}
    patterns = zoo_torch.TRAINABLE[f"{name}_train"]
    params = [w for n, w in weights.items() if any(re.fullmatch(p, n) for p in patterns)]
    for param in params:
        param.requires_grad_(True)
    optimizer_name, settings = TRAINING[name]
    kind = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[optimizer_name]
    optimizer = kind(params, **settings)
    forward = zoo_torch.FORWARD[f"{name}_train"]
    data = _training_data(name, batch)
    x, labels = torch.tensor(data["x"]), torch.tensor(data["labels"])

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(forward(weights, x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return {"seconds": median_seconds(step, repeat)}


def _child(args: argparse.Namespace) -> None:
    kind, name, mode = args.one
    if kind == "cgc":
        result = measure_cgc(name, mode, args.batch, args.repeat, args.target)
    elif kind == "ort":
        result = measure_onnxruntime(name, args.batch, args.repeat)
    elif kind == "cgc-train":
        result = measure_cgc_training(name, args.batch, args.repeat, args.target)
    else:
        result = measure_torch_training(name, args.batch, args.repeat)
    result["peak_rss_mib"] = _peak_rss_mib()
    print(json.dumps(result))


def _spawn(args: argparse.Namespace, kind: str, name: str, mode: str) -> dict:
    command = [
        sys.executable,
        __file__,
        "--one",
        kind,
        name,
        mode,
        "--batch",
        str(args.batch),
        "--repeat",
        str(args.repeat),
        "--target",
        args.target,
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--target", default="wse2")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _child(args)
        return
    print(f"batch {args.batch}, target {args.target}, median of {args.repeat} runs, 1 thread")
    print(
        f"{'case':44s} {'cgc ms':>9s} {'ref ms':>9s} {'ratio':>7s} {'cgc MiB':>8s} "
        f"{'ref MiB':>8s} {'ratio':>6s}"
    )
    rows = []
    for name in ("mlp", "cnn", "transformer"):
        ref = _spawn(args, "ort", name, "-")
        for mode in ("pipelined", "weight_streaming"):
            rows.append((f"{name} {mode} vs onnxruntime", _spawn(args, "cgc", name, mode), ref))
    for name, (optimizer, _) in TRAINING.items():
        rows.append(
            (
                f"{name} training step ({optimizer}) vs pytorch",
                _spawn(args, "cgc-train", name, "-"),
                _spawn(args, "torch-train", name, "-"),
            )
        )
    for label, ours, ref in rows:
        print(
            f"{label:44s} {ours['seconds'] * 1e3:9.3f} {ref['seconds'] * 1e3:9.3f} "
            f"{ours['seconds'] / ref['seconds']:7.1f} {ours['peak_rss_mib']:8.0f} "
            f"{ref['peak_rss_mib']:8.0f} {ours['peak_rss_mib'] / ref['peak_rss_mib']:6.2f}"
        )


if __name__ == "__main__":
    main()
