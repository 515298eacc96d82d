"""PyTorch's OpInfo samples through the torch frontend, on a bounded selection.

The full sweep is ``python -m cgc.tools.aten_coverage --update --docs docs/aten_coverage.md
--expected-failures tests/aten_expected_failures.txt``; it writes the list of samples that
fail. Here the first float32 samples of common ops run, and the list is strict both ways: an
unlisted sample that fails fails the suite, and so does a listed sample that passes now.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("expecttest")  # torch's test helpers, which op_db imports, need it

from cgc.tools.aten_coverage import Sample, read_case_list, run_sample, samples

HERE = Path(__file__).resolve().parent
EXPECTED_FAILURES = read_case_list(HERE / "aten_expected_failures.txt")

OPS = [
    "abs", "add", "addmm", "amax", "bmm", "cat", "clamp", "cos", "div.no_rounding_mode",
    "eq", "exp", "expand", "flatten", "ge", "log", "logical_not", "maximum", "mean", "mm",
    "mul", "neg", "nn.functional.gelu", "nn.functional.layer_norm", "nn.functional.linear",
    "nn.functional.relu", "nn.functional.silu", "permute", "pow", "reciprocal", "rsqrt",
    "sigmoid", "sin", "softmax", "sqrt", "squeeze", "sub", "sum", "t", "tanh", "transpose",
    "unsqueeze", "view", "where",
    "argmax", "cumsum", "diagonal", "flip", "gather", "index_put", "nn.functional.avg_pool2d",
    "nn.functional.conv2d", "nn.functional.conv_transpose2d", "nn.functional.max_pool2d",
    "remainder", "scatter", "sort", "topk",
]  # fmt: skip
"""Common ops of the models cgc compiles, and of indexing, windows and convolutions (of which
some samples are expected failures)."""

SAMPLES_PER_OP = 2


def _chosen() -> list[Sample]:
    wanted = set(OPS)
    chosen = [s for s in samples(dtypes=(torch.float32,), limit=SAMPLES_PER_OP) if s.op in wanted]
    assert {s.op for s in chosen} == wanted, "an op of OPS is not in op_db"
    return chosen


CHOSEN = _chosen()


@pytest.mark.parametrize("sample", CHOSEN, ids=[s.name for s in CHOSEN])
def test_opinfo_sample(sample: Sample) -> None:
    outcome = run_sample(sample)
    if outcome.status == "out of scope":
        assert sample.name not in EXPECTED_FAILURES, "an out-of-scope sample is listed"
        pytest.skip(outcome.reason)
    reason = EXPECTED_FAILURES.get(sample.name)
    if reason is None:
        assert outcome.status == "pass", outcome.reason
    elif outcome.status == "pass":
        pytest.fail(f"{sample.name} passes now: remove it from aten_expected_failures.txt")
    else:
        pytest.xfail(reason)
