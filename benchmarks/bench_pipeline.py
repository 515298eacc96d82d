"""Placement quality in pipelined mode: simulated throughput against the compute bound.

For four models (issue 33's), compiled for wse2 in pipelined mode:

- ``resnet50``: ResNet-50, the 'light' model that ships with onnx, its batch freed
  (``light_models``);
- ``gpt2-6x512x128``: the in-house GPT-2-style decoder of 6 blocks of width 512 on 128 tokens
  (``zoo.decoder``: blocks only, no embedding or LM head);
- ``gpt2-6x512-blocks``: transformers' GPT-2 of that shape (``GPT2Model``, 128 tokens, its
  token and position embeddings but no LM head, whose logits would bind the model to the host
  links: see ``corpus_models.GOAL_CASE``);
- ``bert-base-128``: transformers' BERT-base (``BertModel``) on 128 tokens;

the two transformers models built by ``corpus_models`` (random weights, sdpa attention) and
exported by the dynamo exporter (opset 18, the batch axis symbolic). For each: the batch
compiled (``--batch``; a model of a fixed batch would keep its own), the
pipeline's samples per second (the slowest stage sets it), the bound (every PE's peak FLOP/s
over the model's FLOPs per sample), their ratio, one sample's latency, the stages' mean
utilization, the share of PEs placed, the routing colors used, the slowest stage (and whether
its kernels or its busiest input link bound it), the slowest stage's time over the mean stage's
(plain, and weighted by the stages' PEs), and the compile time; then where each
model's compute bound goes (``cgc.machine.timing.pipeline_bound``: all PEs times the period,
by term, and the stages that lose the most); and how often ``fuse-epilogues`` matched: the
matmuls that took an epilogue, the elementwise ops that run in one rather than as kernels of
their own, and the batch norms' gains folded into weights. Each model is built (and exported)
and compiled in a fresh process; the compile time leaves the export out.

    python benchmarks/bench_pipeline.py [--only NAME] [--batch 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import onnx

EXPORTED = ("gpt2-6x512-blocks", "bert-base-128")
"""The ``corpus_models`` cases measured, by their case names."""


def exported(case: str) -> onnx.ModelProto:
    """The ``corpus_models`` case with sdpa attention, exported by the dynamo exporter (opset
    18, the batch axis symbolic)."""
    import corpus_models

    built = corpus_models.build(corpus_models.CASES[case], "sdpa")
    with tempfile.TemporaryDirectory() as scratch:
        path = corpus_models.export_onnx(built, "dyn", Path(scratch) / f"{case}.onnx")
        return onnx.load(str(path))


def models() -> dict[str, Callable[[], onnx.ModelProto]]:
    """Builders of the benchmark models (built in the child process)."""
    from light_models import resnet50

    from cgc.frontends import zoo

    return {
        "resnet50": resnet50,
        "gpt2-6x512x128": lambda: zoo.decoder(blocks=6, seq=128, width=512, heads=8),
        **{case: partial(exported, case) for case in EXPORTED},
    }


def fusion(ir: str) -> dict[str, int]:
    """How the artifact's matmuls took their epilogues (``fuse-epilogues``): matmuls fused and
    left, the elementwise ops in epilogues and those left as kernels of their own, and the
    batch norms' gains folded into the weights (scales)."""
    from cgc.dialects import parse_module, wse

    ops = list(parse_module(ir).walk())
    fused = [op for op in ops if isinstance(op, wse.FusedMatmulOp)]
    inside = {id(o) for op in fused for o in op.epilogue.block.ops}
    elementwise = [
        op for op in ops if op.name.startswith("wse.") and wse.mnemonic(op) in wse.EPILOGUE_OPS
    ]
    return {
        "fused": len(fused),
        "matmuls": len(fused) + sum(isinstance(op, wse.MatmulOp) for op in ops),
        "in_epilogues": sum(id(op) in inside for op in elementwise),
        "elementwise": len(elementwise),
        "scales": sum(len(op.scales) for op in fused),
    }


def measure(name: str, batch: int) -> dict:
    import cgc
    from cgc.machine.hardware.target import Target
    from cgc.machine.timing.pipeline import pipeline_figures, pipeline_stages
    from cgc.machine.timing.pipeline_bound import artifact_bound
    from cgc.tools.picture import stages
    from cgc.tools.report import bound_lines

    model = models()[name]()
    first = model.graph.input[0].type.tensor_type.shape.dim[0]
    symbolic = first.dim_param
    start = time.perf_counter()
    artifact = cgc.compile(
        model, mode="pipelined", target="wse2", batch_size=batch if symbolic else None
    )
    seconds = time.perf_counter() - start
    figures = pipeline_figures(artifact)
    layers = artifact.manifest["layers"]
    timed = pipeline_stages(artifact)
    slowest = max(timed, key=lambda stage: max(stage.cycles, stage.link_cycles))
    target = Target.from_json(artifact.manifest["target"])
    service = [stage.service_seconds(target, 1) for stage in timed]
    bound_by = "link" if slowest.link_cycles > slowest.cycles else "kernels"
    routes = [r for info in artifact.program.layers for r in info.routes]
    placed = stages(artifact)
    areas = [s.region[2] * s.region[3] for s in placed]
    bound = artifact_bound(artifact, timed)
    assert bound is not None
    return {
        # a model of a fixed batch is measured at that batch, not --batch
        "batch": batch if symbolic else first.dim_value,
        "layers": len(layers),
        "compile_seconds": seconds,
        **figures,
        "slowest": f"{slowest.name} ({bound_by})",
        "colors": len({r.color for r in routes}),
        "mean_utilization": sum(s.utilization for s in placed) / len(placed),
        "pes_used": sum(s.region[2] * s.region[3] for s in placed),
        "pes": artifact.manifest["target"]["rows"] * artifact.manifest["target"]["cols"],
        "slowest_over_mean": max(service) / (sum(service) / len(service)),
        "slowest_over_pe_mean": max(service)
        / (sum(s * a for s, a in zip(service, areas, strict=True)) / sum(areas)),
        "breakdown": bound_lines(bound.to_json()),
        "fusion": fusion(artifact.ir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(models()), help="one model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.batch)))
        return
    print("wse2, pipelined; throughput per system")
    print(
        f"{'model':17s} {'batch':>5s} {'layers':>6s} {'samples/s':>10s} {'bound':>10s} "
        f"{'ratio':>7s} {'latency us':>10s} {'mean util':>9s} {'PEs used':>8s} {'colors':>6s} "
        f"{'compile s':>9s} slowest/mean  slowest stage"
    )
    breakdowns, fusions = {}, {}
    for name in models():
        if args.only and name != args.only:
            continue
        command = [sys.executable, __file__, "--one", name, "--batch", str(args.batch)]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        breakdowns[name], fusions[name] = r["breakdown"], r["fusion"]
        ratio = r["samples_per_second"] / r["bound_samples_per_second"]
        print(
            f"{name:17s} {r['batch']:5d} {r['layers']:6d} {r['samples_per_second']:10.4g} "
            f"{r['bound_samples_per_second']:10.4g} {ratio:7.4f} "
            f"{r['latency_seconds'] * 1e6:10.1f} "
            f"{r['mean_utilization']:9.2%} {r['pes_used'] / r['pes']:8.1%} {r['colors']:6d} "
            f"{r['compile_seconds']:9.1f} "
            f"{r['slowest_over_mean']:5.3f} {r['slowest_over_pe_mean']:5.3f}  {r['slowest']}"
        )
    for name, lines in breakdowns.items():
        print(f"\n{name}: " + "\n".join(lines))
    print("\nepilogues (fuse-epilogues): matmuls fused, elementwise ops in epilogues, scales")
    for name, f in fusions.items():
        print(
            f"{name:17s} {f['fused']:4d} of {f['matmuls']:4d} matmuls, "
            f"{f['in_epilogues']:4d} of {f['elementwise']:4d} elementwise ops, "
            f"{f['scales']:3d} scales"
        )


if __name__ == "__main__":
    main()
