"""The long fuzzing run over cgc's three doors: at least 3,000 cases within a time budget.

Prints, per family (onnx, artifact, options), the clean errors, successes, internal errors,
hangs and memory-cap hits, then the distinct failure signatures; writes everything as JSON.
Bad cases are kept with a replay script under ``--keep``.

    python benchmarks/fuzz.py --cases 3000 --time-budget 1800 --json build/fuzz.json
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
    args = parser.parse_args()
    if args.cases < 3000:
        parser.error("the long run is at least 3,000 cases (use python -m cgc.tools.fuzz)")
    return fuzz.main(
        ["--cases", str(args.cases), "--seed", str(args.seed), "--time-budget",
         str(args.time_budget), "--keep", args.keep, "--json", args.json]
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
