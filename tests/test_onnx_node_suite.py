"""The ONNX backend node suite through cgc.tools.backend.

Every in-scope case runs; the cases in ``onnx_node_expected_failures.txt`` are strict xfails,
so the list must name exactly the cases that fail: a listed case that starts passing fails the
suite as surely as an unlisted case that fails. Likewise ``onnx_node_fixed_inputs.txt`` names
exactly the passing cases that the backend compiles with some inputs fixed to their values,
and which inputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import cgc.tools.conformance as conformance
from cgc.tools.conformance import (
    load_cases,
    out_of_scope,
    read_case_list,
    run_case,
    supported_ops_markdown,
)

HERE = Path(__file__).resolve().parent
EXPECTED_FAILURES = HERE / "onnx_node_expected_failures.txt"
FIXED_INPUTS = HERE / "onnx_node_fixed_inputs.txt"
"""The passing cases whose shapes depend on input values: the backend compiles them with
those inputs fixed to the case's data."""
LISTS = (f"tests/{EXPECTED_FAILURES.name}", f"tests/{FIXED_INPUTS.name}")
CASES = load_cases(HERE / ".cache")
FAILURES = read_case_list(EXPECTED_FAILURES)
FIXED = read_case_list(FIXED_INPUTS)
IN_SCOPE = [case for case in CASES if out_of_scope(case) is None]
DOCS = HERE.parent / "docs" / "supported_ops.md"


@pytest.mark.parametrize("case", IN_SCOPE, ids=[case.name for case in IN_SCOPE])
def test_node_case(case) -> None:
    # strict expected failures, decided here rather than by marks: pytest would format the
    # whole traceback of each of hundreds of expected failures
    reason = FAILURES.get(case.name)
    failed = False
    try:
        fixed = ", ".join(run_case(case))
    except Exception:
        if reason is None:
            raise
        failed = True
    if failed:  # outside the handler, so that the failure is not chained to the xfail
        pytest.xfail(reason)
    if reason is not None:
        pytest.fail(f"{case.name} passes now: remove it from {EXPECTED_FAILURES.name}")
    assert fixed == FIXED.get(case.name, ""), f"inputs fixed at compile time ({FIXED_INPUTS.name})"


def test_case_lists_name_in_scope_cases() -> None:
    names = {case.name for case in IN_SCOPE}
    assert sorted(set(FAILURES) - names) == []
    assert sorted(set(FIXED) - names) == []
    assert sorted(set(FIXED) & set(FAILURES)) == []


def test_supported_ops_table_is_current() -> None:
    assert DOCS.read_text() == supported_ops_markdown(CASES, FAILURES, FIXED, LISTS)


def _index_writer(name: str):
    def write(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "index.json").write_text(f'[{{"name": "{name}", "data_sets": 0}}]')

    return write


def test_cache_published_by_another_process_first_is_read(tmp_path, monkeypatch) -> None:
    # two pytest workers start on an empty cache: the one that renames second keeps the
    # first one's folder and leaves no staging folder behind
    final = tmp_path / f"onnx-node-{conformance.onnx.__version__}"
    ours = _index_writer("ours")

    def racing(folder: Path) -> None:
        ours(folder)
        _index_writer("theirs")(final)

    monkeypatch.setattr(conformance, "_write_cache", racing)
    monkeypatch.setattr(conformance, "_read_case", lambda cache, entry: entry["name"])
    assert load_cases(tmp_path) == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


def test_cache_folder_without_index_is_written_again(tmp_path, monkeypatch) -> None:
    final = tmp_path / f"onnx-node-{conformance.onnx.__version__}"
    (final / "test_abs").mkdir(parents=True)  # a write cut short
    monkeypatch.setattr(conformance, "_write_cache", _index_writer("whole"))
    monkeypatch.setattr(conformance, "_read_case", lambda cache, entry: entry["name"])
    assert load_cases(tmp_path) == ["whole"]
    assert sorted(p.name for p in final.iterdir()) == ["index.json"]
