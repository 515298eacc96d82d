"""What the benchmarks that measure in fresh processes share: the peak memory of the process
itself, which a parent's ``ru_maxrss`` of its children would not give (it keeps the parent's
own), and the median time of a repeated call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """The median wall time of ``repeat`` calls of ``fn``, after one call to warm up."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_rss_mib() -> float:
    """This process's peak resident set (``VmHWM``), in MiB."""
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(line for line in status if line.startswith("VmHWM"))
    return int(peak.split()[1]) / 1024
