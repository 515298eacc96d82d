"""Loading and running an artifact imports neither xDSL nor the compiler (DESIGN.md).

Each check runs in a fresh interpreter, so modules imported by the test process do not count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cgc
from cgc.frontends import zoo

FORBIDDEN = ("xdsl", "cgc.compiler", "cgc.passes", "cgc.dialects", "cgc.frontends")

REPORT = textwrap.dedent(
    """
    import atexit, json, sys

    FORBIDDEN = {forbidden!r}

    def report():
        bad = sorted(
            m for m in sys.modules
            if any(m == p or m.startswith(p + ".") for p in FORBIDDEN)
        )
        with open({report!r}, "w") as f:
            loaded = "cgc.machine.program.artifact" in sys.modules
            json.dump({{"forbidden": bad, "cgc_loaded": loaded}}, f)

    atexit.register(report)
    """
)


@pytest.fixture(scope="module", params=["pipelined", "weight_streaming"])
def saved(request, tmp_path_factory):
    """An artifact file, an inputs file and the outputs of an in-process run."""
    directory = tmp_path_factory.mktemp(request.param)
    art = cgc.compile(zoo.MODELS["mlp"](), mode=request.param, target="mesh8x8", batch_size=4)
    path = directory / "mlp.cgc"
    art.save(path)
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    inputs = directory / "inputs.npz"
    np.savez(inputs, x=x)
    want = cgc.run(art, {"x": x}, num_csx=2)
    return directory, path, inputs, want


def run_python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def read_report(path) -> dict:
    report = json.loads(path.read_text())
    assert report["cgc_loaded"], "the check ran before the runtime was imported"
    return report


def test_report_detects_forbidden_imports(tmp_path):
    # the checker itself must be able to fail
    report = tmp_path / "report.json"
    code = REPORT.format(forbidden=FORBIDDEN, report=str(report)) + textwrap.dedent(
        """
        import cgc.machine.program.artifact
        import cgc.dialects.ir
        """
    )
    proc = run_python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    bad = read_report(report)["forbidden"]
    assert "cgc.dialects.ir" in bad and "xdsl" in bad


def test_python_api_run_imports_no_compiler(saved):
    directory, path, inputs, want = saved
    report = directory / "api_report.json"
    out = directory / "api_out.npz"
    code = REPORT.format(forbidden=FORBIDDEN, report=str(report)) + textwrap.dedent(
        f"""
        import numpy as np
        import cgc

        a = cgc.load({str(path)!r})
        with np.load({str(inputs)!r}) as f:
            feeds = {{k: f[k] for k in f.files}}
        outputs = cgc.run(a, feeds, num_csx=2)
        np.savez({str(out)!r}, **outputs)
        """
    )
    proc = run_python(code, directory)
    assert proc.returncode == 0, proc.stderr
    assert read_report(report)["forbidden"] == []
    with np.load(out) as got:
        assert sorted(got.files) == sorted(want)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize(
    "command",
    [
        ["run", "{path}", "--inputs", "{inputs}", "--output", "{dir}/cli_out.npz",
         "--stats-json", "{dir}/stats.json", "--trace", "{dir}/trace.json", "--num-csx", "2"],
        ["inspect", "{path}", "--disasm"],
        ["inspect", "{path}", "--json"],
    ],
    ids=["run", "inspect", "inspect-json"],
)  # fmt: skip
def test_cli_imports_no_compiler(saved, command):
    directory, path, inputs, want = saved
    report = directory / f"cli_report_{command[0]}.json"
    argv = ["cgc"] + [a.format(path=path, inputs=inputs, dir=directory) for a in command]
    code = REPORT.format(forbidden=FORBIDDEN, report=str(report)) + textwrap.dedent(
        f"""
        import sys
        from cgc.cli import main

        sys.argv = {argv!r}
        main()
        """
    )
    proc = run_python(code, directory)
    assert proc.returncode == 0, proc.stderr
    assert read_report(report)["forbidden"] == []
    if command[0] == "run":
        with np.load(directory / "cli_out.npz") as got:
            np.testing.assert_array_equal(got["logits"], want["logits"])
        stats = json.loads((directory / "stats.json").read_text())
        assert stats["num_csx"] == 2 and stats["batch_size"] == 8
        assert json.loads((directory / "trace.json").read_text())["traceEvents"]
    else:
        assert proc.stdout.strip()
