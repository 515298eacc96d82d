"""Chrome trace (Perfetto) timelines of simulated runs.

One process, one track per resource (each system, or in pipelined mode each stage of each
system, MemoryX -> SwarmX, SwarmX -> MemoryX, MemoryX), one complete event ("ph": "X") per
span, times in microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cgc.machine.timing.streaming import Span


def chrome_trace(spans: Sequence[Span]) -> dict:
    """The trace object for ``spans``."""
    tracks: dict[str, int] = {}
    for span in spans:
        tracks.setdefault(span.track, len(tracks) + 1)
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "cgc simulation"}}
    ]
    events += [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}}
        for track, tid in tracks.items()
    ]
    events += [
        {
            "name": span.name,
            "ph": "X",
            "pid": 1,
            "tid": tracks[span.track],
            "ts": span.start * 1e6,
            "dur": (span.end - span.start) * 1e6,
        }
        for span in spans
    ]
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def trace_json(spans: Sequence[Span]) -> str:
    """The trace as JSON text."""
    return json.dumps(chrome_trace(spans), indent=1)
