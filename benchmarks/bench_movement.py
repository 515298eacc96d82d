"""Seconds and traced peak memory of counting one data movement exactly on the whole wafer,
against the batch: the count must cost by the program, not by the samples.

    python benchmarks/bench_movement.py --batches 1e4,1e6,1e8
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from cgc.machine.movement import flows
from cgc.machine.movement.layout import Layout

IM2COL = {"kernel": [3, 3], "strides": [1, 1], "pads": [1] * 4, "dilations": [1, 1], "group": 1,
          "channels_last": False}  # fmt: skip
"""The zoo cnn's first convolution's windows (3x3, same padding, channels first)."""

WAFER = (0, 0, 994, 750)


def measured(batch: int) -> tuple[float, float, float]:
    """Seconds, traced peak MB and wavelet hops of the cnn's im2col of ``batch`` images."""
    image = Layout.on((batch, 3, 16, 16), "float32", WAFER)
    out = Layout.on((1, batch * 256, 27), "float32", WAFER)
    tracemalloc.start()
    try:
        start = time.perf_counter()
        traffic = flows.movement_traffic("im2col", IM2COL, [image], out)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return seconds, peak / 1e6, traffic.wavelet_hops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1e4,1e6,1e8", help="comma-separated batches")
    batches = [int(float(b)) for b in parser.parse_args().batches.split(",")]
    print(f"{'batch':>12} {'seconds':>8} {'peak MB':>8} {'wavelet hops':>20}")
    for batch in batches:
        seconds, peak, hops = measured(batch)
        print(f"{batch:>12} {seconds:>8.2f} {peak:>8.1f} {hops:>20,.0f}")


if __name__ == "__main__":
    main()
