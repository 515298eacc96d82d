"""The long fuzzing run over cgc's doors: at least 3,000 cases within a time budget.

Every family takes turns (``python -m cgc.tools.fuzz --help`` lists them): ONNX files,
artifacts, options and files, aliased paths, special files, full disks, concurrent runs,
hostile params files, PyTorch factories and edge values. Prints, per family, the clean
errors, successes, internal errors, wrong results, lost and half-written files, hangs and
memory-cap hits, then the distinct failure signatures; writes everything as JSON. Bad cases
are kept with a replay script under ``--keep``.

    python benchmarks/fuzz.py --cases 3000 --time-budget 1800 --json build/fuzz.json
    python benchmarks/fuzz.py --families alias,special,fulldisk
"""

from __future__ import annotations

import argparse
import sys

from cgc.tools import fuzz


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=1800.0, help="seconds")
    parser.add_argument("--keep", default="build/fuzz-cases", help="bad cases go here")
    parser.add_argument("--json", default="build/fuzz.json", help="the report")
    parser.add_argument(
        "--families", default=",".join(fuzz.FAMILIES),
        help=f"comma-separated, of: {', '.join(fuzz.FAMILIES)} (default: all)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.cases < 3000:
        parser.error("the long run is at least 3,000 cases (use python -m cgc.tools.fuzz)")
    return fuzz.main(
        ["--cases", str(args.cases), "--seed", str(args.seed), "--time-budget",
         str(args.time_budget), "--keep", args.keep, "--json", args.json, "--families",
         args.families]
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
