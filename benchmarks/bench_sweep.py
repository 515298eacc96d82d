"""A 64-point timing-only design study (``cgc sweep``) one point after another, in a local
pool of two processes and as Ray tasks on a local instance of two CPUs: wall time, speed-up
over serial, and the same table from all three.

The grid: a two-block GPT's training step (``examples/tiny-gpt.yaml``, the tests' params file
too) on mesh8x8 and mesh16x16, with MemoryX as given and slowed to 100 GB/s, dense and 50%
sparse, global batch 8 and 16, on 1, 2, 4 and 8 systems; each point compiles from scratch,
about a second of work, so the work dominates the tasks' overhead. Every executor runs in a
fresh process (its imports, its pool's or its Ray workers' start, counted); Ray's own start
(``ray.init``) is reported apart, as a cluster would already be up.

    python benchmarks/bench_sweep.py [--only serial|pool|ray] [--rounds N] [--json FILE]

With ``--rounds N`` the runs take turns N times and the fastest of each counts (the machine
may be busy with other work now and then).

Goal (issue 16): the pool and Ray at least 1.7x faster than serial on this 2-core machine.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = Path(__file__).resolve().parent.parent / "examples" / "tiny-gpt.yaml"
SPEC = """\
models: [tiny.yaml]
targets: [mesh8x8, mesh16x16]
set: [[], [memoryx_bytes_per_s=1e11]]
sparsity: [0, 0.5]
batch_size: [8, 16]
num_csx: [1, 2, 4, 8]
"""
RUNS = {"serial": ("local", 1), "pool": ("local", 2), "ray": ("ray", 2)}
"""Each run: its executor and its jobs (processes, or Ray CPUs)."""


def one(name: str, directory: Path, output: str) -> dict:
    """Runs the sweep as ``name`` says, in this process, into ``directory/output``."""
    started = time.perf_counter()
    from cgc.sweep import run_sweep
    from cgc.sweep_spec import load_spec

    executor, jobs = RUNS[name]
    ray_seconds = 0.0
    if executor == "ray":
        from cgc.runtime.executors import connect

        connect(None, jobs)
        ray_seconds = time.perf_counter() - started
    spec = load_spec(str(directory / "sweep.yaml"))
    outcome = run_sweep(spec, directory / output, executor, jobs)
    return {
        "run": name,
        "points": outcome.ran,
        "wall_seconds": time.perf_counter() - started - ray_seconds,
        "ray_init_seconds": ray_seconds,
        "compile_seconds": sum(r["compile_seconds"] or 0.0 for r in outcome.rows),
    }


def _child(name: str, directory: Path, output: str) -> dict:
    command = [sys.executable, __file__, "--child", name, "--dir", str(directory), "--out", output]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def _figures(directory: Path) -> list[dict]:
    """The table without its wall times."""
    rows = csv.DictReader(io.StringIO((directory / "sweep.csv").read_text()))
    return [{k: v for k, v in row.items() if k != "compile_seconds"} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(RUNS), action="append")
    parser.add_argument("--rounds", type=int, default=1, help="Runs of each; the fastest counts.")
    parser.add_argument("--json", help="Write the results here.")
    parser.add_argument("--child", choices=list(RUNS), help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child, Path(args.dir), args.out)))
        return
    names = args.only or list(RUNS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    tables = []
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        shutil.copyfile(MODEL, directory / "tiny.yaml")
        (directory / "sweep.yaml").write_text(SPEC)
        for turn in range(args.rounds):  # interleaved: each run sees the machine's load alike
            for name in names:
                runs[name].append(_child(name, directory, f"{name}-{turn}"))
                tables.append(_figures(directory / f"{name}-{turn}"))
    results = [min(runs[name], key=lambda r: r["wall_seconds"]) for name in names]
    serial = results[names.index("serial")] if "serial" in names else None
    for result in results:
        speedup = serial["wall_seconds"] / result["wall_seconds"] if serial else None
        result["speedup"] = speedup
        result["all_wall_seconds"] = [r["wall_seconds"] for r in runs[result["run"]]]
        ray = result["run"] == "ray"
        extra = f", Ray start {result['ray_init_seconds']:.1f} s apart" if ray else ""
        shown = f"{speedup:.2f}x serial" if speedup else "-"
        walls = ", ".join(f"{w:.1f}" for w in result["all_wall_seconds"])
        print(
            f"{result['run']:>6}: {result['points']} points in {result['wall_seconds']:.1f} s "
            f"({shown}; compiling {result['compile_seconds']:.1f} s in all{extra}; runs {walls})"
        )
    same = all(t == tables[0] for t in tables)
    print(f"tables identical but for compile_seconds: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "identical": same}, indent=1))
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
