"""Times a training step through the ``cgc.torch`` session API against ``cgc.train`` on the same
model.

The model: a GPT-2-style language model (2 blocks of width 64, 32 tokens, a vocabulary of 256,
the LM head tied to the embedding) whose forward returns its cross-entropy loss; AdamW; a
global batch of 8 on one system of ``mesh16x16``, with numbers.

- session route: ``cgc.torch.module`` / ``optimizer`` / ``session`` and ``s.step(batch)``.
- ``cgc train`` route: the module exported with ``torch.onnx.export``, trained by
  ``cgc.train`` on the same batches.

The first step of each route also compiles; the figure is the median wall time of the later
steps, and the ratio session / ``cgc train`` (issue 12 asks for at most 1.1). Both routes'
losses are printed side by side: the session's equal torch eager's, the ONNX route's drift
from the second step on, because ``torch.onnx.export`` writes the tied LM head as a transposed
copy of the embedding (``onnx::MatMul_*``), which then trains as a weight of its own.

    python benchmarks/bench_torch_training.py [--steps 6]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from gpt_torch import GPT, Shape

import cgc

SHAPE = Shape(vocab=256, width=64, heads=4, blocks=2, tokens=32)
BATCH = 8


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SHAPE.vocab, (steps, BATCH, SHAPE.tokens + 1), generator=generator)
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


def session_route(steps: int, directory: Path) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    model = cgc.torch.module(GPT(SHAPE))
    optimizer = cgc.torch.optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    times, losses = [], []
    with cgc.torch.session(model, optimizer, num_csx=1, model_dir=str(directory),
                           target="mesh16x16") as session:  # fmt: skip
        for batch in batches(steps):
            start = time.perf_counter()
            losses.append(float(session.step(batch)))
            times.append(time.perf_counter() - start)
    return times, losses


def train_route(steps: int, directory: Path) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    model = GPT(SHAPE)
    idx, targets = batches(1)[0]
    path = directory / "lm.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (idx, targets), str(path), input_names=["idx", "targets"],
                          output_names=["loss"], dynamo=False,
                          dynamic_axes={"idx": {0: "batch"}, "targets": {0: "batch"}})  # fmt: skip
    data = {
        "idx": np.concatenate([b[0].numpy() for b in batches(steps)]),
        "targets": np.concatenate([b[1].numpy() for b in batches(steps)]),
    }
    moments = [time.perf_counter()]

    def stepped(_: dict) -> None:
        moments.append(time.perf_counter())

    # torch.optim.AdamW's defaults, said out loud: cgc's own default weight decay differs
    result = cgc.train(str(path), data, batch_size=BATCH, steps=steps, model_dir=directory / "run",
                       optimizer="adamw", lr=1e-3, weight_decay=0.01, target="mesh16x16",
                       on_step=stepped)  # fmt: skip
    times = [b - a for a, b in itertools.pairwise(moments)]
    return times, [m["loss"] for m in result.metrics]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    steps = parser.parse_args().steps
    with tempfile.TemporaryDirectory() as scratch:
        session_times, session_losses = session_route(steps, Path(scratch) / "session")
        train_times, train_losses = train_route(steps, Path(scratch))
    session_step = statistics.median(session_times[1:])
    train_step = statistics.median(train_times[1:])
    sizes = f"{SHAPE.blocks} x {SHAPE.width}, {SHAPE.tokens} tokens, batch {BATCH}"
    print(f"GPT-2-style LM ({sizes}), AdamW, mesh16x16")
    print(f"  cgc.torch session step   {session_step * 1e3:8.1f} ms (first, with compile: "
          f"{session_times[0]:.2f} s)")  # fmt: skip
    print(f"  cgc.train step           {train_step * 1e3:8.1f} ms (first, with compile: "
          f"{train_times[0]:.2f} s)")  # fmt: skip
    print(f"  ratio session / cgc.train {session_step / train_step:.2f} (issue 12: at most 1.1)")
    print(f"  losses, session:   {' '.join(f'{x:.5f}' for x in session_losses)}")
    print(f"  losses, cgc.train: {' '.join(f'{x:.5f}' for x in train_losses)}")


if __name__ == "__main__":
    main()
