"""What the benchmarks that measure in fresh processes share: the peak memory of the process
itself, which a parent's ``ru_maxrss`` of its children would not give (it keeps the parent's
own)."""

from __future__ import annotations

from pathlib import Path


def peak_rss_mib() -> float:
    """This process's peak resident set (``VmHWM``), in MiB."""
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(line for line in status if line.startswith("VmHWM"))
    return int(peak.split()[1]) / 1024
