"""cgc's own speed (issue 15, item 4): the simulator's wall time against onnxruntime and
PyTorch eager on compute-bound models, single-threaded.

Inference: ``cgc run`` (compiled once, for wse2) against an onnxruntime session with one
intra-op thread, on the same inputs: the in-house GPT-2-style decoder (``zoo.decoder``, 6 blocks
of width 512, 128 tokens) at batch 8 in both execution modes; ResNet-50 (the 'light' model that
ships with onnx, its batch freed: ``light_models``) at batch 8 in both modes and at batch 1
pipelined; and transformers' GPT-2 of the decoder's shape (``GPT2Model``, sdpa attention,
exported by the dynamo exporter with its batch axis symbolic: ``bench_pipeline``'s
``gpt2-6x512-blocks``) at batch 8 pipelined. Each inference line also gives cgc's compile time
(the export left out). Training: one step of a GPT-2-style LM
(``gpt_torch.GPT``, vocabulary 8192, 6 blocks of width 512, 128 tokens, batch 8, AdamW) and
of a ResNet-style CNN (basic residual blocks with batch norm, 32x32 images, batch 8, SGD with
momentum) through ``cgc.torch.session`` on wse2, against the same PyTorch module trained
eagerly. The goal: at most 2x the reference. The tiny zoo models of ``bench_run.py`` follow,
reported apart: they measure cgc's per-instruction Python overhead, not its arithmetic.

Every case runs in a fresh subprocess with OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and
MKL_NUM_THREADS at 1 (and ``torch.set_num_threads(1)``); a time is the median of
``--repeat`` runs (training: steps) after a warm-up run (training: the first step, which
also compiles).

    python benchmarks/bench_speed.py [--repeat 3] [--only SUBSTRING] [--skip-tiny]

Prints one line per case: cgc's time, the reference's, their ratio, and (inference) cgc's
compile seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from child import median_seconds

BATCH = 8
TARGET = "wse2"
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _onnx_model(name: str, batch: int):
    """The ONNX model of inference case ``name`` and the batch it runs at: ``batch``, or the
    model's own if it fixes one."""
    from bench_pipeline import models

    model = models()[name]()
    first = model.graph.input[0].type.tensor_type.shape.dim[0]
    return model, batch if first.dim_param else first.dim_value


def _inputs(model, batch: int) -> dict[str, np.ndarray]:
    from onnx import helper

    from cgc.frontends import zoo

    initializers = {t.name for t in model.graph.initializer}
    fixed = [i for i in model.graph.input if i.name not in initializers]
    if fixed[0].type.tensor_type.shape.dim[0].dim_param:
        return zoo.sample_inputs(model, batch, seed=1)
    rng = np.random.default_rng(1)
    dtype = helper.tensor_dtype_to_np_dtype
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            dtype(i.type.tensor_type.elem_type)
        )
        for i in fixed
    }


def measure_cgc(name: str, mode: str, batch: int, repeat: int) -> dict:
    import cgc

    model, batch = _onnx_model(name, batch)
    start = time.perf_counter()
    artifact = cgc.compile(model, mode=mode, target=TARGET, batch_size=batch)
    compile_seconds = time.perf_counter() - start
    inputs = _inputs(model, batch)
    seconds = median_seconds(lambda: cgc.run(artifact, inputs), repeat)
    return {"seconds": seconds, "batch": batch, "compile_seconds": compile_seconds}


def measure_onnxruntime(name: str, batch: int, repeat: int) -> dict:
    import onnxruntime as ort

    model, batch = _onnx_model(name, batch)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    inputs = _inputs(model, batch)
    return {"seconds": median_seconds(lambda: session.run(None, inputs), repeat), "batch": batch}


def _resnet_cnn():
    """A ResNet-style CNN whose forward returns its cross-entropy loss: a stem, two stages of
    two basic residual blocks (64 then 128 channels, the second stage at half the size,
    with a projection shortcut), global average pooling and a classifier."""
    import torch

    nn, F = torch.nn, torch.nn.functional

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            h = F.relu(self.bn1(self.conv1(x)))
            h = self.bn2(self.conv2(h))
            return F.relu(h + (x if self.short is None else self.short(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64))
            self.blocks = nn.Sequential(
                Basic(64, 64, 1), Basic(64, 64, 1), Basic(64, 128, 2), Basic(128, 128, 1)
            )
            self.fc = nn.Linear(128, 10)

        def forward(self, x, y):
            h = self.blocks(F.relu(self.stem(x)))
            return F.cross_entropy(self.fc(h.mean(dim=(2, 3))), y)

    return ResNet()


def _training_case(name: str, steps: int, batch: int):
    """The module, its optimizer's factory and the batches of training case ``name``."""
    import torch

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(1)
    if name == "gpt-lm":
        from gpt_torch import GPT, Shape

        shape = Shape(vocab=8192, width=512, heads=8, blocks=6, tokens=128)
        tokens = torch.randint(
            0, shape.vocab, (steps, batch, shape.tokens + 1), generator=generator
        )
        batches = [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]
        return GPT(shape), lambda p: torch.optim.AdamW(p, lr=1e-3), batches
    images = torch.randn(steps, batch, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (steps, batch), generator=generator)
    batches = list(zip(images, labels, strict=True))
    return _resnet_cnn(), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), batches


def measure_cgc_training(name: str, batch: int, repeat: int) -> dict:
    import torch

    import cgc

    torch.manual_seed(0)
    model, optimizer, batches = _training_case(name, repeat + 1, batch)
    wrapped = cgc.torch.module(model)
    opt = cgc.torch.optimizer(optimizer(wrapped.parameters()))
    times, losses = [], []
    with (
        tempfile.TemporaryDirectory() as directory,
        cgc.torch.session(wrapped, opt, num_csx=1, model_dir=directory, target=TARGET) as session,
    ):
        for batch in batches:
            start = time.perf_counter()
            losses.append(float(session.step(batch)))
            times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times[1:]), "losses": losses}


def measure_torch_training(name: str, batch: int, repeat: int) -> dict:
    import torch

    torch.manual_seed(0)
    model, optimizer, batches = _training_case(name, repeat + 1, batch)
    opt = optimizer(model.parameters())
    times, losses = [], []
    for batch in batches:
        start = time.perf_counter()
        opt.zero_grad()
        loss = model(*batch)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach()))
    return {"seconds": statistics.median(times[1:]), "losses": losses}


def _tiny(kind: str, name: str, mode: str, batch: int, repeat: int) -> dict:
    """The cases of ``bench_run.py``."""
    import bench_run

    if kind == "tiny-cgc":
        return bench_run.measure_cgc(name, mode, batch, repeat, TARGET)
    if kind == "tiny-ort":
        return bench_run.measure_onnxruntime(name, batch, repeat)
    if kind == "tiny-cgc-train":
        return bench_run.measure_cgc_training(name, batch, repeat, TARGET)
    return bench_run.measure_torch_training(name, batch, repeat)


def _child(kind: str, name: str, mode: str, batch: int, repeat: int) -> dict:
    if kind == "cgc":
        return measure_cgc(name, mode, batch, repeat)
    if kind == "ort":
        return measure_onnxruntime(name, batch, repeat)
    if kind == "cgc-train":
        return measure_cgc_training(name, batch, repeat)
    if kind == "torch-train":
        return measure_torch_training(name, batch, repeat)
    return _tiny(kind, name, mode, batch, repeat)


Child = tuple[str, str, str, int]
"""A measurement in a child process: its kind, model, execution mode and batch."""


def _spawn(kind: str, name: str, mode: str, batch: int, repeat: int) -> dict:
    command = [sys.executable, __file__, "--one", kind, name, mode, str(batch)]
    command += ["--repeat", str(repeat)]
    env = {**os.environ, **THREADS}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


INFERENCE = (
    ("gpt2-6x512x128", "weight_streaming", BATCH),
    ("gpt2-6x512x128", "pipelined", BATCH),
    ("resnet50", "weight_streaming", BATCH),
    ("resnet50", "pipelined", BATCH),
    ("resnet50", "pipelined", 1),
    ("gpt2-6x512-blocks", "pipelined", BATCH),
)
"""The inference cases: model (``bench_pipeline.models``), execution mode and batch."""


def _cases(skip_tiny: bool) -> list[tuple[str, Child, Child]]:
    """Every case: its label, cgc's child arguments and the reference's."""
    cases = []
    for name, mode, batch in INFERENCE:
        label = f"{name} {mode} b{batch}"
        cases.append((label, ("cgc", name, mode, batch), ("ort", name, "-", batch)))
    for name, optimizer in (("gpt-lm", "adamw"), ("resnet-cnn", "sgd")):
        label = f"{name} training step ({optimizer})"
        cases.append((label, ("cgc-train", name, "-", BATCH), ("torch-train", name, "-", BATCH)))
    if not skip_tiny:
        for name in ("mlp", "cnn", "transformer"):
            for mode in ("pipelined", "weight_streaming"):
                label = f"tiny {name} {mode}"
                cases.append(
                    (label, ("tiny-cgc", name, mode, BATCH), ("tiny-ort", name, "-", BATCH))
                )
        for name in ("mlp", "cnn"):
            label = f"tiny {name} training step"
            cases.append(
                (label, ("tiny-cgc-train", name, "-", BATCH), ("tiny-torch", name, "-", BATCH))
            )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", help="run only the cases whose label contains this")
    parser.add_argument("--skip-tiny", action="store_true", help="leave out the tiny models")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, name, mode, batch = args.one
        print(json.dumps(_child(kind, name, mode, int(batch), args.repeat)))
        return
    print(f"target {TARGET}, 1 thread, median of {args.repeat}")
    print(f"{'case':44s} {'cgc s':>9s} {'ref s':>9s} {'ratio':>6s} {'compile s':>9s}")
    tiny = False
    for label, ours, ref in _cases(args.skip_tiny):
        if args.only and args.only not in label:
            continue
        if label.startswith("tiny") and not tiny:
            tiny = True
            print("tiny models, apart (Python overhead):")
        mine, theirs = _spawn(*ours, args.repeat), _spawn(*ref, args.repeat)
        line = f"{label:44s} {mine['seconds']:9.4f} {theirs['seconds']:9.4f} "
        line += f"{mine['seconds'] / theirs['seconds']:6.2f}"
        if "compile_seconds" in mine:
            line += f" {mine['compile_seconds']:9.2f}"
        if "losses" in mine:
            line += f"  loss cgc {mine['losses'][-1]:.5f} torch {theirs['losses'][-1]:.5f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
