"""Peak RSS and seconds of ``cgc compile`` and a timing-only ``cgc run`` against the batch.

The project's rule: compiling and timing-only simulation cost by the program, not by the
data. Each compile and run is its own process, so its peak RSS is its own
(``RUSAGE_CHILDREN`` of a fresh child).

    python examples/build_models.py --out build/examples
    python benchmarks/bench_compile_memory.py --model build/examples/mlp.onnx --batches 1e4,1e8
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CGC = [str(Path(sys.executable).with_name("cgc"))]
"""The console script of the interpreter running this."""


def measured(args: list[str]) -> tuple[float, float, int]:
    """Peak RSS (MB) and seconds of ``cgc args`` in a child process, and its exit code."""
    code = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "rc = subprocess.run(sys.argv[1:], capture_output=True).returncode\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(rss, time.perf_counter() - t, rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *CGC, *args], capture_output=True, text=True)
    rss, seconds, rc = out.stdout.split()
    return float(rss), float(seconds), int(rc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model to compile (.onnx, params file)")
    parser.add_argument("--batches", default="1e4,1e6,1e7,1e8,1e9", help="global batches")
    parser.add_argument("--modes", default="auto,weight_streaming", help="compile modes")
    args = parser.parse_args()
    print(f"{'mode':18} {'batch':>8} {'compile MB':>11} {'s':>6} {'run MB':>8} {'s':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        artifact = str(Path(tmp) / "m.cgc")
        for mode in args.modes.split(","):
            for text in args.batches.split(","):
                batch = str(int(float(text)))
                compile_args = ["compile", args.model, "-o", artifact, "--mode", mode]
                rss, secs, rc = measured([*compile_args, "--batch-size", batch])
                if rc:
                    print(f"{mode:18} {text:>8} {rss:11.0f} {secs:6.2f}   (exit {rc})")
                    continue
                run_rss, run_secs, _ = measured(["run", artifact, "--timing-only"])
                print(f"{mode:18} {text:>8} {rss:11.0f} {secs:6.2f} {run_rss:8.0f} {run_secs:6.2f}")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s; peak RSS of each child process)")
