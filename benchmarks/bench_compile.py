"""Times cgc's compile against onnxruntime's session creation on the same models.

cgc: import, every pass, lowering and writing the artifact file (what ``cgc compile`` does),
in each execution mode on wse2. onnxruntime: ``InferenceSession`` creation with its default
graph optimizations, one thread. The models: stacks of GPT-style decoder blocks
(``zoo.decoder``, width 32, 8 tokens) of about 1,000 and 10,000 ONNX nodes, and the nine
'light' zoo models that ship with onnx. Every measurement is the first compile (or session)
of a fresh process, so that no cache of an earlier one helps; times are the best over a few
processes.

    python benchmarks/bench_compile.py [--repeat 3] [--only NAME]

Prints one line per model and mode: the times and the ratio cgc / onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def models() -> dict[str, onnx.ModelProto]:
    from cgc.frontends import zoo

    found = {"decoder-1k": zoo.decoder(blocks=36), "decoder-10k": zoo.decoder(blocks=360)}
    for path in sorted(LIGHT.glob("light_*.onnx")):
        found[path.stem.removeprefix("light_")] = onnx.load(str(path))
    return found


def measure_cgc(model: onnx.ModelProto, mode: str) -> float:
    import cgc

    batch = 8 if model.graph.input[0].type.tensor_type.shape.dim[0].dim_param else None
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        cgc.compile(model, mode=mode, target="wse2", batch_size=batch).save(Path(tmp) / "m.cgc")
        return time.perf_counter() - start


def measure_onnxruntime(model: onnx.ModelProto) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    data = model.SerializeToString()
    start = time.perf_counter()
    ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return time.perf_counter() - start


def _child(name: str, kind: str) -> None:
    model = models()[name]
    seconds = measure_onnxruntime(model) if kind == "ort" else measure_cgc(model, kind)
    print(json.dumps({"seconds": seconds, "nodes": len(model.graph.node)}))


def _spawn(name: str, kind: str, repeat: int) -> dict:
    """The best of ``repeat`` fresh processes."""
    runs = []
    for _ in range(repeat):
        command = [sys.executable, __file__, "--one", name, kind]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda run: run["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", help="one model by name")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _child(*args.one)
        return
    names = [args.only] if args.only else list(models())
    print(f"best of {args.repeat} processes; cgc compiles for wse2 and writes the artifact")
    print(f"{'model':18s} {'nodes':>6s} {'mode':17s} {'cgc s':>8s} {'ort s':>8s} {'ratio':>7s}")
    for name in names:
        ort_run = _spawn(name, "ort", args.repeat)
        for mode in ("weight_streaming", "pipelined"):
            ours = _spawn(name, mode, args.repeat)
            print(
                f"{name:18s} {ours['nodes']:6d} {mode:17s} {ours['seconds']:8.2f} "
                f"{ort_run['seconds']:8.3f} {ours['seconds'] / ort_run['seconds']:7.1f}"
            )


if __name__ == "__main__":
    main()
