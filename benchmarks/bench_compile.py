"""Times cgc's compile against onnxruntime's session creation on the same models.

cgc: import, every pass, lowering and writing the artifact file (what ``cgc compile`` does),
in each execution mode on wse2. onnxruntime: ``InferenceSession`` creation with its default
graph optimizations, one thread. The models: stacks of transformer blocks sized to about
1,000 and 10,000 ONNX nodes, and the nine 'light' zoo models that ship with onnx. Every
measurement is the first compile (or session) of a fresh process, so that no cache of an
earlier one helps; times are the best over a few processes.

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

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
WIDTH, HEADS, SEQ = 32, 4, 8


def transformer_stack(blocks: int, seed: int = 0) -> onnx.ModelProto:
    """``blocks`` pre-norm transformer blocks (27 nodes each) on x [N, SEQ, WIDTH]."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []

    def tensor(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def weight(name: str, rows: int, cols: int) -> str:
        return tensor(name, (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype("f4"))

    heads_shape = tensor("heads_shape", np.array([0, SEQ, HEADS, WIDTH // HEADS], np.int64))
    merged_shape = tensor("merged_shape", np.array([0, SEQ, WIDTH], np.int64))
    scale = tensor("scale", np.array(np.sqrt(WIDTH // HEADS), np.float32))
    half, one = tensor("half", np.float32(0.5)), tensor("one", np.float32(1.0))
    root2 = tensor("root2", np.float32(np.sqrt(2.0)))
    x = "x"
    for b in range(blocks):
        p = f"b{b}."
        gamma = tensor(p + "ln.g", np.ones(WIDTH, np.float32))
        h = node("LayerNormalization", [x, gamma], p + "ln", axis=-1)
        qkv = []
        for part in "qkv":
            projected = node("MatMul", [h, weight(p + part + ".w", WIDTH, WIDTH)], p + part)
            split = node("Reshape", [projected, heads_shape], p + part + ".heads")
            qkv.append(node("Transpose", [split], p + part + ".t", perm=[0, 2, 1, 3]))
        keys = node("Transpose", [qkv[1]], p + "kt", perm=[0, 1, 3, 2])
        scores = node("Div", [node("MatMul", [qkv[0], keys], p + "qk"), scale], p + "scaled")
        attn = node("MatMul", [node("Softmax", [scores], p + "softmax", axis=-1), qkv[2]], p + "av")
        merged = node("Transpose", [attn], p + "merge.t", perm=[0, 2, 1, 3])
        merged = node("Reshape", [merged, merged_shape], p + "merge")
        x = node("Add", [x, node("MatMul", [merged, weight(p + "o.w", WIDTH, WIDTH)], p + "o")],
                 p + "res1")  # fmt: skip
        up = node("MatMul", [x, weight(p + "up.w", WIDTH, 2 * WIDTH)], p + "up")
        erf = node("Erf", [node("Div", [up, root2], p + "gelu.div")], p + "gelu.erf")
        gelu = node("Mul", [node("Mul", [up, half], p + "gelu.half"),
                            node("Add", [erf, one], p + "gelu.add")], p + "gelu")  # fmt: skip
        down = node("MatMul", [gelu, weight(p + "down.w", 2 * WIDTH, WIDTH)], p + "down")
        x = node("Add", [x, down], p + "res2")
    graph = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SEQ, WIDTH])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", SEQ, WIDTH])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def models() -> dict[str, onnx.ModelProto]:
    found = {
        "transformer-1k": transformer_stack(40),
        "transformer-10k": transformer_stack(400),
    }
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
