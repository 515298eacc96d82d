"""The table of a design study (``cgc.sweep``): its columns, each point's speed-up and
efficiency within its series, and the files written from it (CSV, JSON and the scaling
plot), with the text table and the progress bar ``cgc sweep`` shows.

A training step's or an inference run's figures are ``STEP``'s, a generation's ``SERVING``'s
(the two share ``tokens_per_second`` and ``simulated_seconds``); a row leaves the other
measure's empty. A series' throughput is samples a second, or a generation's tokens a second
(``THROUGHPUT``)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cgc.files import write_atomically
from cgc.sweep_spec import GENERATION, PARAMETERS, Row, Spec
from cgc.tools.progress import ProgressBar
from cgc.tools.scaling import cell, table_lines

STEP = ("samples_per_second", "tokens_per_second", "simulated_seconds", "mfu", "pe_utilization",
        "peak_pe_sram_bytes", "micro_batch", "micro_batches", "bound")  # fmt: skip
"""What a training step or an inference run of the global batch measures
(``tokens_per_second`` a language model's alone, ``bound`` a weight-streamed run's)."""
SERVING = ("tokens_per_second", "simulated_seconds", "ttft_seconds", "tpot_seconds",
           "tokens_per_second_per_sequence", "kv_capacity_tokens", "decode_bound")  # fmt: skip
"""What a generation measures (``cgc.machine.timing.serving``): all its sequences' tokens a
second, the whole generation's simulated seconds, the time to the first token and per output
token, one sequence's tokens a second, the tokens the key-value caches hold and what bounds a
decode step."""
RESULTS = (
    *STEP,
    *(name for name in SERVING if name not in STEP),
    "ran_mode",
    "compile_seconds",
    "error",
)
"""What a point measured (all None but ``error`` when it failed, and the other measure's
figures always)."""
THROUGHPUT = {"training": "samples_per_second", "inference": "samples_per_second",
              GENERATION: "tokens_per_second"}  # fmt: skip
"""The figure of a measure that speed-ups compare and the plot draws."""
DERIVED = ("speedup", "efficiency")
"""Against the point of fewest systems in its series, computed when the table is written."""
COLUMNS = (*PARAMETERS, *RESULTS, *DERIVED)

OUTPUTS = ("sweep.csv", "sweep.json", "scaling.png")


def unit(rate: str) -> str:
    """How a throughput, a ``THROUGHPUT`` figure, is written: ``samples/s``, ``tokens/s``."""
    return rate.removesuffix("_per_second") + "/s"


def series(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """The rows by series: the points that differ only in ``num_csx``, in order."""
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        name = json.dumps([row[p] for p in PARAMETERS if p != "num_csx"])
        grouped.setdefault(name, []).append(row)
    return grouped


def with_speedups(rows: Sequence[Row]) -> list[Row]:
    """``rows`` with each point's speed-up over the point of fewest systems of its series
    that ran, and its efficiency: the speed-up over the ratio of their systems."""
    derived: dict[int, Row] = {}
    for members in series(rows).values():
        rate = THROUGHPUT[members[0]["measure"]]
        ran = [r for r in members if r["error"] is None and r[rate]]
        if not ran:
            continue
        one = min(ran, key=lambda r: r["num_csx"])
        for r in ran:
            speedup = r[rate] / one[rate]
            derived[id(r)] = {
                "speedup": speedup,
                "efficiency": speedup * one["num_csx"] / r["num_csx"],
            }
    empty = dict.fromkeys(DERIVED)
    return [{**row, **derived.get(id(row), empty)} for row in rows]


def varying(rows: Sequence[Row]) -> list[str]:
    """The parameters that take more than one value in ``rows``."""
    return [p for p in PARAMETERS if len({json.dumps(r[p]) for r in rows}) > 1]


def to_csv(rows: Sequence[Row]) -> str:
    """The table as CSV, a row per point (empty cells for what a failed point lacks)."""
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return stream.getvalue()


def to_json(spec: Spec, rows: Sequence[Row]) -> dict[str, Any]:
    """The table as JSON, with the spec it comes from."""
    return {"spec": spec.to_json(), "points": list(rows)}


TEXT_COLUMNS = (
    ("samples_per_second", "samples/s", "{:.4g}"),
    ("speedup", "speed-up", "{:.3f}"),
    ("efficiency", "efficiency", "{:.1%}"),
    ("mfu", "MFU", "{:.1%}"),
    ("peak_pe_sram_bytes", "SRAM/PE", "{}"),
    ("bound", "bound", "{}"),
)
"""The figures the text table shows of a training step or an inference run, beside the
parameters that vary (and ``num_csx``)."""
GENERATION_COLUMNS = (
    ("tokens_per_second", "tokens/s", "{:.4g}"),
    ("speedup", "speed-up", "{:.3f}"),
    ("efficiency", "efficiency", "{:.1%}"),
    ("tokens_per_second_per_sequence", "tokens/s/seq", "{:.4g}"),
    ("ttft_seconds", "TTFT s", "{:.3g}"),
    ("tpot_seconds", "TPOT s", "{:.3g}"),
    ("kv_capacity_tokens", "KV tokens", "{}"),
    ("ran_mode", "ran", "{}"),
    ("decode_bound", "decode bound", "{}"),
)
"""The figures the text table shows of a generation."""
LONGEST_ERROR = 60


def table_text(rows: Sequence[Row], measure: str) -> str:
    """The table for people: the parameters that vary, the main figures of ``measure``, and
    the error of a point that failed, cut short (the CSV and JSON have it whole)."""
    columns = GENERATION_COLUMNS if measure == GENERATION else TEXT_COLUMNS
    shown = [p for p in varying(rows) if p != "num_csx"] + ["num_csx"]
    headers = [*shown, *(label for _, label, _ in columns)]
    lines = []
    for row in rows:
        cells = [cell(row[p], "{}") or "-" for p in shown]
        cells += [cell(row[name], fmt) for name, _, fmt in columns]
        if row["error"] is not None:
            error = " ".join(row["error"].split())
            cut = error[:LONGEST_ERROR] + ("..." if len(error) > LONGEST_ERROR else "")
            cells[len(shown)] = f"error: {cut}"
            cells[len(shown) + 1 :] = [""] * (len(columns) - 1)
        lines.append(cells)
    left = range(len(shown) - 1)
    return "\n".join(table_lines(headers, lines, left)) + "\n"


def write_outputs(spec: Spec, directory: Path, rows: Sequence[Row]) -> list[Path]:
    """``sweep.csv``, ``sweep.json`` and, when a point ran, ``scaling.png``; their paths."""
    written = [directory / name for name in OUTPUTS[:2]]
    write_atomically(written[0], to_csv(rows).encode())
    write_atomically(written[1], json.dumps(to_json(spec, rows), indent=1).encode())
    if any(row["error"] is None for row in rows):
        written.append(directory / OUTPUTS[2])
        title = f"{spec.measure}, {', '.join(spec.models)}"
        save_png(rows, written[-1], title, THROUGHPUT[spec.measure])
    return written


def save_png(rows: Sequence[Row], path: Path, title: str, rate: str) -> None:
    """Throughput (the figure ``rate``) and efficiency against the systems, a line per series
    of points that ran, labelled by the parameters that vary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [p for p in varying(rows) if p != "num_csx"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=100)
    systems: set[int] = set()
    highest = 1.0  # a generation's may pass 1: more systems free SRAM for another mode
    for members in series(rows).values():
        ran = [r for r in members if r["error"] is None]
        if not ran:
            continue
        label = ", ".join(f"{p}={_named(ran[0][p])}" for p in labels) or ran[0]["model"]
        ks = [r["num_csx"] for r in ran]
        systems.update(ks)
        left.plot(ks, [r[rate] for r in ran], "o-", label=label)
        right.plot(ks, [r["efficiency"] for r in ran], "o-", label=label)
        highest = max([highest, *(r["efficiency"] for r in ran if r["efficiency"] is not None)])
    left.set(xscale="log", yscale="log", xlabel="systems", ylabel=unit(rate))
    right.axhline(1.0, linestyle="--", color="gray")
    right.set(xscale="log", xlabel="systems", ylabel="efficiency", ylim=(0, highest * 1.05))
    for axis in (left, right):
        axis.minorticks_off()
        axis.set_xticks(sorted(systems), [str(k) for k in sorted(systems)])
    right.legend(fontsize="small", loc="lower left")  # below the efficiencies, mostly near 1
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(figure)
    write_atomically(path, buffer.getvalue())


def _named(value: object) -> object:
    """A parameter in a label: ``none`` for an empty override list."""
    return "none" if value == "" else value


class SweepBar(ProgressBar):
    """``cgc train``'s bar, counting points: a resumed sweep starts at the points it found,
    and the time left is estimated from this run's points alone."""

    label = "sweep"

    def status(self, metrics: dict) -> str:
        return f"{metrics['errors']} failed" if metrics["errors"] else ""
