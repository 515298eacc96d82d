"""Pictures of a pipelined placement: the terminal map, the PNG and their errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

import cgc
from cgc.cli import main
from cgc.frontends import zoo
from cgc.tools import picture


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    """The small residual network placed on a 24 x 32 mesh, saved."""
    artifact = cgc.compile(
        zoo.MODELS["resnet"](), mode="pipelined", target="mesh24x32", batch_size=4
    )
    path = tmp_path_factory.mktemp("picture") / "resnet.cgc"
    artifact.save(path)
    return artifact, path


def layer_edges(artifact) -> list[tuple[int, int]]:
    """``(producer, consumer)`` layer indices: a consumer reads a tensor the producer
    computed."""
    inputs = artifact.program.layer_inputs
    return sorted({(source, i) for i, reads in enumerate(inputs) for source in reads.values()})


def test_stages_and_edges(placed):
    artifact, _ = placed
    stages = picture.stages(artifact)
    assert [s.name for s in stages] == [layer["name"] for layer in artifact.manifest["layers"]]
    assert all(0 < s.utilization <= 1 for s in stages)
    names = [s.name for s in stages]
    edges = {(names[a], names[b]) for a, b in layer_edges(artifact)}
    assert ("stem", "stem_pool") in edges and ("se", "fc") in edges
    assert ("stem_pool", "res_b") in edges, "the residual connection skips a layer"
    assert all(a < b for a, b in layer_edges(artifact)), "a pipeline only flows forward"


def test_terminal_map(placed):
    artifact, path = placed
    result = CliRunner().invoke(main, ["inspect", str(path), "--placement", "-"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rects = [layer["rect"] for layer in artifact.manifest["layers"]]
    bottom, right = max(y + h for _, y, _, h in rects), max(x + w for x, _, w, _ in rects)
    used = (
        ""
        if (bottom, right) == (24, 32)
        else f"; rows 0-{bottom - 1}, columns 0-{right - 1} in use"
    )
    assert lines[0] == f"mesh24x32: 24 x 32 PEs{used} (1 x 1 PEs per character)"
    grid = lines[1 : 1 + bottom]
    assert all(len(row) == right for row in grid)
    for index, layer in enumerate(artifact.manifest["layers"]):
        x, y, w, h = layer["rect"]
        label = picture.LABELS[index]
        cells = np.array([list(row) for row in grid])
        assert (cells[y : y + h, x : x + w] == label).all(), layer["name"]
        assert f"  {label} {layer['name']}: ({x}, {y}) {w}x{h}, utilization " in result.output
    assert re.match(r"routes: stem -> stem_pool \(color 0, \d+ lanes\), ", lines[-1])
    tensors = sum(len(reads) for reads in artifact.program.layer_inputs)
    assert lines[-1].count(" -> ") == tensors > len(layer_edges(artifact))  # se reads 2


def test_terminal_map_scales_a_big_mesh():
    artifact = cgc.compile(zoo.MODELS["mlp"](), mode="pipelined", target="wse2", batch_size=2)
    text = picture.ascii_map(artifact, columns=60, rows=20)
    lines = text.splitlines()
    # the three layers stack in one strip, one under the other, each on the columns its
    # tensors split across (the mlp's widest has 64)
    rects = [layer["rect"] for layer in artifact.manifest["layers"]]
    assert [x for x, _, _, _ in rects] == [0] * 3
    assert max(w for _, _, w, _ in rects) < 750
    bottom = max(y + h for _, y, _, h in rects)
    assert re.fullmatch(
        rf"wse2: 994 x 750 PEs; rows 0-{bottom - 1}, columns 0-(\d+) in use "
        r"\(([\d.]+) x 1 PEs per character\)",
        lines[0],
    )
    rows = lines[1 : 1 + bottom]
    labels = [picture.LABELS[i] for i, (_, _, _, h) in enumerate(rects) for _ in range(h)]
    assert [row[0] for row in rows] == labels
    assert all(len(row) == 60 for row in rows)
    used = set("".join(rows)) - {"."}
    assert used == set(picture.LABELS[: len(artifact.manifest["layers"])]), "every layer shows"


def test_png_is_written_atomically_and_deterministically(placed, tmp_path):
    _, path = placed
    runner = CliRunner()
    for name in ("a.png", "b.png"):
        result = runner.invoke(main, ["inspect", str(path), "--placement", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    png = (tmp_path / "a.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert png == (tmp_path / "b.png").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"], "no temporary files"


def test_placement_of_a_weight_streaming_artifact_is_an_error(tmp_path):
    artifact = cgc.compile(
        zoo.MODELS["mlp"](), mode="weight_streaming", target="mesh8x8", batch_size=2
    )
    path = tmp_path / "mlp.cgc"
    artifact.save(path)
    result = CliRunner().invoke(main, ["inspect", str(path), "--placement", "-"])
    assert result.exit_code == 2
    assert result.output == (
        f"error: --placement: {path} is a weight_streaming artifact, whose layers each run on "
        "the whole wafer in turn; compile with --mode pipelined to place them\n"
    )


def test_png_into_a_missing_directory_is_an_error(placed, tmp_path):
    _, path = placed
    target = tmp_path / "nowhere" / "p.png"
    result = CliRunner().invoke(main, ["inspect", str(path), "--placement", str(target)])
    assert result.exit_code == 2
    assert result.output == f"error: {target}: directory {target.parent} does not exist\n"
