"""docs/validation.md: the published figures beside cgc's predictions, as
``benchmarks/validation.py`` writes them (the simulated rows take minutes: the script runs
them; this test checks the page against the script's data and recomputes the closed-form
rows)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "validation.py"


def script():
    spec = importlib.util.spec_from_file_location("validation", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return json.loads((ROOT / "docs" / "validation.json").read_text())


def test_the_page_is_the_scripts_rendering_of_its_data(rows):
    assert (ROOT / "docs" / "validation.md").read_text() == script().render(rows)


def test_the_closed_form_rows_are_what_cgc_computes_today(rows):
    by_figure = {row["figure"]: row for row in rows}
    for row in script().closed_form_rows():
        assert by_figure[row["figure"]] == row


@pytest.mark.parametrize(
    "figure",
    [
        "WSE-2 dense FP16 peak at 1.1 GHz",
        "Andromeda: 120 PF dense over 16 CS-2",
        "GPT-3 XL: one to two CS-2s cuts training time in half",
        "GPT-3 XL: near-linear scaling to 16 CS-2",
        "GPT-J: near-linear scaling to 16 CS-2",
        "GPT-NeoX: near-linear scaling to 16 CS-2",
        "SwarmX latency logarithmic in K",
        "MemoryX holds GPT-3 175B with Adam state",
        "Cerebras-GPT family",
        "WaferLLM Table 4: LLaMA3-8B decode, 2699.9 tokens/s per request (cgc on 420 x 420",
        "WaferLLM Table 4: LLaMA3-8B decode, 2699.9 tokens/s per request (cgc on its wse2",
        "WaferLLM Table 4: QWen2-72B decode, 839.7 tokens/s per request (cgc on 420 x 420",
        "WaferLLM Table 4: QWen2-72B decode, 839.7 tokens/s per request (cgc on its wse2",
        "WaferLLM Table 5: LLaMA3-8B maximum decode output length",
        "Cerebras Inference: Llama 3.1 8B, 1,800 tokens/s per user",
        "Cerebras Inference: Llama 3.1 70B, 450 tokens/s per user on 4 CS-3 |",
        "Cerebras Inference: Llama 3.1 70B, 450 tokens/s per user on 4 CS-3 (cgc on 5 wse3)",
    ],
)
def test_every_required_figure_is_on_the_page(rows, figure):
    matching = [row for row in rows if (row["figure"] + " |").startswith(figure)]
    assert len(matching) == 1, figure
    row = matching[0]
    assert row["published"] > 0 and row["predicted"] > 0 and row["why"]


def test_the_predictions_are_sane(rows):
    (halving,) = [row for row in rows if row["unit"] == "speed-up"]
    assert 1.0 < halving["predicted"] <= 2.0 + 1e-9  # two systems: at most twice as fast
    for row in rows:
        if row["unit"] == "efficiency at 16":
            assert 0 < row["predicted"] <= 1 + 1e-9


def test_the_serving_rows_cite_their_sources_and_say_what_binds_where_far_off(rows):
    serving = [row for row in rows if row.get("section") == script().SERVING]
    assert serving
    for row in serving:
        assert "https://" in row["source"], row["figure"]
        if abs(row["predicted"] / row["published"] - 1) > script().DIFFER:
            assert "slowest layer" in row["why"] or "What binds it" in row["why"], row["figure"]


@pytest.mark.slow
def test_a_simulated_row_is_what_cgc_computes_today(rows):
    """The page's GPT-3 XL speed-up from one to two systems, simulated again: a change to the
    timing that moves it needs the page written anew (``python benchmarks/validation.py``)."""
    row = next(r for r in rows if r["figure"].startswith("GPT-3 XL: one to two"))
    points = script()._scaling("cerebras-gpt-1.3b", [1, 2], 528)
    assert points[1].speedup == pytest.approx(row["predicted"], rel=1e-9)
