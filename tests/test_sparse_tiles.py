"""Sparse weights in the simulator: live values streamed in the cheapest encoding per tile,
AXPYs of live weights only, the imbalance of the mask between PE columns, against hand
counts; statistics for weights too large to mask; density 1 is the dense path."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import mlp_train_data
from onnx import numpy_helper

import cgc
from cgc.cli import main
from cgc.errors import DoesNotFitError
from cgc.frontends import zoo
from cgc.machine import plans
from cgc.machine.hardware.target import get_target, with_figures
from cgc.machine.movement.layout import Layout
from cgc.machine.plans import STREAM, WAFER, Operand
from cgc.machine.program.artifact import Artifact, weights_from_bytes, weights_to_bytes
from cgc.machine.sparse import tiles as sparse_tiles
from cgc.machine.sparse.sparsity import mask
from cgc.machine.sparse.tiles import SparseView, SparseWeight, TileGrid, tile_counts, with_mask
from cgc.runtime.cluster import Cluster


def _hand_mask() -> np.ndarray:
    """8 x 8, cut 4 x 4 by a 2 x 2 mesh: tiles of 16, 1, 8 and 0 live values."""
    live = np.zeros((8, 8), dtype=bool)
    live[:4, :4] = True  # tile (0, 0): whole
    live[2, 5] = True  # tile (0, 1): one
    live[4:8:2, :4] = True  # tile (1, 0): eight
    return live


def test_sparse_streaming_matmul_against_a_hand_count() -> None:
    target = get_target("mesh2x2")
    rect = target.whole
    a_at = Layout((4, 8), "float32", 0, 0, 2, 2)
    view = SparseView(with_mask("w", _hand_mask(), seed=0), None)
    plan = plans.plan(
        "matmul",
        target,
        rect,
        [Operand((4, 8), "float32", WAFER, a_at), Operand((8, 8), "float32", STREAM, None, view)],
        {},
        [((4, 8), "float32")],
    )
    # Each PE holds 2 rows of A: a dense tile costs 16 x 2 cycles, a live weight an AXPY of
    # 2 cycles and 1 for its index, a coordinate tile 1.5 words a value and 1 a column, a
    # bitmap tile 1 word a value and 1 for its 16 bits.
    # tile (0,0), 16 live: dense 32 | coordinate max(52, 28) | bitmap max(49, 17): dense, 16 words
    # tile (0,1),  1 live: dense 32 | coordinate max(7, 5.5)  | bitmap max(4, 2):   bitmap, 2
    # tile (1,0),  8 live: dense 32 | coordinate max(28, 16)  | bitmap max(25, 9):  bitmap, 9
    # tile (1,1),  0 live: dense 32 | coordinate max(4, 4)    | bitmap max(1, 1):   bitmap, 1
    assert plan.detail["formats"] == {"dense": 1, "bitmap": 3}
    assert plan.detail["stream_bytes"] == (16 + 2 + 9 + 1) * 4
    # the FMACs issued: the dense tile's 16 and the 9 live ones, 2 rows, on 2 PE rows
    assert plan.cost.fmacs == (16 + 1 + 8 + 0) * 2 * 2
    assert plan.cost.flops == 2 * 4 * 25  # useful: the live weights only
    # chunk 0: its slower column is done at 32, the chain (8 words, one hop) takes it at 40;
    # chunk 1: the columns ran ahead (a buffer each was free) and are done at 36 and 26,
    # the chain takes it at 48; then the weights' and the partials' time of flight (2, 1)
    assert plan.cost.cycles == 48 + 2 + 1
    assert plan.detail["binds"] == "the AXPYs and indices"
    assert plan.detail["imbalance"] == pytest.approx((32 + 4) / ((32 + 4 + 25 + 1) / 2))


def test_sampled_weight_gradient_against_a_hand_count() -> None:
    """``a^T @ b`` on 2 x 2 PEs, 2 rows of ``a`` and ``b`` and 2 columns of ``b`` each: a
    dense block of a result row costs 2 x 2 cycles, a live entry a dot of 2 and 1 for its
    index; the PEs of a block take whichever is sooner."""
    target = get_target("mesh2x2")
    placed = Layout((4, 4), "float32", 0, 0, 2, 2)
    live = np.zeros((4, 4), dtype=bool)
    live[0, :2] = live[1, 3] = live[2, :] = True
    view = SparseView(with_mask("w", live, seed=0), None)
    operands = [Operand((4, 4), "float32", WAFER, placed)] * 2
    results = [((4, 4), "float32")]
    plan = plans.plan("matmul_transpose_a", target, target.whole, operands, {"live": view}, results)
    dense = plans.plan("matmul_transpose_a", target, target.whole, operands, {}, results)
    # per result row and column block, the larger of its compute and its partials down:
    # row 0: dense 4 (2 live: 6) | none live: 0;  row 1: 0 | one live, 3 (1 word down)
    # row 2: dense 4 | dense 4;                   row 3: 0 | 0
    # a's column m reaches the blocks at 2 and 4; the third waits for a free buffer (two a
    # block: row 0's, done at 6) and arrives at 8, the fourth at 10 (row 1's done at 7):
    # block 0 is done at 6, 6, 12, 12, block 1 at 2, 7, 12, 12; a hop across and one down
    assert plan.cost.cycles == 12 + 1 + 1
    assert dense.cost.cycles == 4 * 4 + 1 + 1
    assert plan.cost.fmacs == (4 + 0 + 0 + 2 + 4 + 4 + 0 + 0) * 2  # on both PE rows
    assert plan.cost.flops == 2 * 4 * 7
    # four matrices each with that mask: four times the work, not sixteen
    stacked = SparseView(with_mask("w", np.stack([live] * 4), seed=0), None)
    placed = Layout((4, 4, 4), "float32", 0, 0, 2, 2)
    operands = [Operand((4, 4, 4), "float32", WAFER, placed)] * 2
    four = plans.plan(
        "matmul_transpose_a",
        target,
        target.whole,
        operands,
        {"live": stacked},
        [((4, 4, 4), "float32")],
    )
    assert four.cost.fmacs == 4 * plan.cost.fmacs and four.cost.flops == 4 * plan.cost.flops


def test_tile_counts_of_a_view_follow_its_permutation() -> None:
    live = _hand_mask()
    weight = with_mask("w", live, seed=0)
    grid = TileGrid(8, 8, 4, 4)
    np.testing.assert_array_equal(tile_counts(weight, None, grid), [[16, 1], [8, 0]])
    np.testing.assert_array_equal(tile_counts(weight, (1, 0), grid), [[16, 8], [1, 0]])
    assert weight.mask() is not None and np.array_equal(weight.mask(), live)


def test_a_weight_too_large_to_mask_is_counted_by_statistics(monkeypatch) -> None:
    monkeypatch.setattr(sparse_tiles, "MASK_LIMIT", 100)
    record = {"density": 0.1, "init": "random", "seed": 3, "weights": ["big", "small"]}
    found = sparse_tiles.sparse_weights(record, {"big": (300, 200), "small": (10, 10)}, {})
    big, small = found["big"], found["small"]
    assert big.bits is None and big.live == 6000 and small.bits is not None
    grid = TileGrid(300, 200, 7, 9)
    counts = tile_counts(big, None, grid)
    assert counts.shape == (43, 23) and counts.sum() == 6000
    assert (counts <= grid.sizes).all()
    np.testing.assert_array_equal(counts, tile_counts(big, None, grid))  # deterministic
    # the same shape, density and seed: the same counts, whatever the name
    twin = SparseWeight("other", (300, 200), 6000, 3)
    assert twin == big


def _training(sparsity: float | None) -> Artifact:
    model = zoo.MODELS["mlp_train"]()
    return cgc.prepare_training(model, batch_size=8, target="mesh16x16", lr=0.1, sparsity=sparsity)[
        0
    ]


def _timing(sparsity: float | None, numerics: bool) -> tuple[dict, float]:
    artifact = _training(sparsity)
    cluster = Cluster(artifact, numerics=numerics)
    if numerics:
        rng = np.random.default_rng(0)
        inputs = {
            "x": rng.standard_normal((8, 64)).astype(np.float32),
            "labels": rng.integers(0, 10, 8),
        }
        stats = cluster.train_step(inputs)[1]
    else:
        stats = cluster.train_step()[1]
    return artifact.manifest, stats.simulated_seconds


def test_density_one_is_the_dense_path_and_sparse_streams_less() -> None:
    a, b = _training(None), _training(0.0)
    assert a.program.encode() == b.program.encode()
    assert weights_to_bytes(a.weights) == weights_to_bytes(b.weights)
    record = b.manifest.pop("sparsity")
    assert a.to_bytes() == b.to_bytes()  # the same artifact but for its sparsity record
    assert record["density"] == 1.0
    dense, dense_seconds = _timing(None, False)
    whole, whole_seconds = _timing(0.0, False)
    assert whole.pop("sparsity")["density"] == 1.0
    assert whole == dense and whole_seconds == dense_seconds
    sparse, _ = _timing(0.9, False)
    # a matmul streams its weight sparse, or whole where the dense kernel is sooner
    streamed = {x["name"]: x["stream_in_bytes"] for x in sparse["layers"]}
    for layer in dense["layers"]:
        assert streamed[layer["name"]] <= layer["stream_in_bytes"]
    assert sum(streamed.values()) < 0.5 * sum(x["stream_in_bytes"] for x in dense["layers"])


def test_a_sparse_step_times_alike_however_the_artifact_was_had(tmp_path) -> None:
    """Compiled, written and read back (its sparse weights rebuilt from the manifest), run
    with numbers or timing only, or compiled without the weights' values (a random mask
    needs none): one simulated time."""
    compiled = _training(0.75)
    compiled.save(tmp_path / "a.cgc")
    read = cgc.load(tmp_path / "a.cgc")
    assert read.program.sparse == compiled.program.sparse
    shapes_only = cgc.prepare_training(
        zoo.MODELS["mlp_train"](), batch_size=8, target="mesh16x16", lr=0.1, sparsity=0.75,
        no_weights=True,
    )[0]  # fmt: skip
    rng = np.random.default_rng(0)
    inputs = {
        "x": rng.standard_normal((8, 64)).astype(np.float32),
        "labels": rng.integers(0, 10, 8),
    }
    numeric = Cluster(read).train_step(inputs)[1].simulated_seconds
    for artifact in (compiled, read, shapes_only):
        assert Cluster(artifact, numerics=False).train_step()[1].simulated_seconds == numeric
    dense = Cluster(_training(None), numerics=False).train_step()[1].simulated_seconds
    assert numeric != dense


# -- inference: --sparsity and --detect-sparsity ---------------------------------------------


def _pruned(model: onnx.ModelProto, zeros: float) -> onnx.ModelProto:
    """``model`` with the smallest ``zeros`` of every matrix set to 0."""
    pruned = onnx.ModelProto()
    pruned.CopyFrom(model)
    for tensor in pruned.graph.initializer:
        values = numpy_helper.to_array(tensor)
        if values.ndim == 2:
            cut = np.quantile(np.abs(values), zeros)
            tensor.CopyFrom(
                numpy_helper.from_array(np.where(np.abs(values) > cut, values, 0), tensor.name)
            )
    return pruned


def _onnxruntime(model: onnx.ModelProto, inputs: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


@pytest.mark.parametrize("mode", ["weight_streaming", "pipelined"])
def test_a_pruned_model_runs_as_onnxruntime_runs_it_and_streams_less(mode: str) -> None:
    model = _pruned(zoo.MODELS["mlp"](), 0.8)
    inputs = zoo.sample_inputs(model, 8)
    dense = cgc.compile(model, mode=mode, target="mesh16x16", batch_size=8)
    found = cgc.compile(model, mode=mode, target="mesh16x16", batch_size=8, detect_sparsity=0.7)
    record = found.manifest["sparsity"]
    assert record["init"] == "detected" and len(record["weights"]) == 3
    assert record["density"] == pytest.approx(0.2, abs=0.01)
    outputs = cgc.run(found, inputs)
    for ours, theirs in zip(outputs.values(), _onnxruntime(model, inputs), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    if mode == "weight_streaming":
        sent = sum(x["stream_in_bytes"] for x in found.manifest["layers"])
        assert sent < 0.5 * sum(x["stream_in_bytes"] for x in dense.manifest["layers"])


def test_compiling_sparse_prunes_as_a_masked_model_does() -> None:
    """``--sparsity`` on a dense model: the outputs of the model with the masks' zeros."""
    model = zoo.MODELS["mlp"]()
    inputs = zoo.sample_inputs(model, 8)
    artifact = cgc.compile(
        model, mode="weight_streaming", target="mesh16x16", batch_size=8, sparsity=0.75, seed=4
    )
    masked = onnx.ModelProto()
    masked.CopyFrom(model)
    for tensor in masked.graph.initializer:
        if tensor.name in artifact.manifest["sparsity"]["weights"]:
            values = numpy_helper.to_array(tensor)
            live = mask(tensor.name, values, 0.25, "random", 4)
            tensor.CopyFrom(numpy_helper.from_array(np.where(live, values, 0), tensor.name))
    outputs = cgc.run(artifact, inputs)
    for ours, theirs in zip(outputs.values(), _onnxruntime(masked, inputs), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sparsity", "1"], "--sparsity 1: the fraction of zeros must be in [0, 1)"),
        (["--detect-sparsity", "0"], "--detect-sparsity 0: the fraction of zeros must be in"),
        (["--detect-sparsity", "0.99"], "--detect-sparsity 0.99: no weight has that fraction"),
        (["--detect-sparsity", "0.5", "--sparsity", "0.5"], "--detect-sparsity and --sparsity"),
        (["--detect-sparsity", "0.5", "--no-weights"], "has no values to look at"),
        (["--sparse-params", "fc.*"], "--sparse-params needs --sparsity"),
        (["--sparsity", "0.5", "--sparse-params", "nothing"], "--sparse-params: no weight is"),
    ],
)
def test_bad_sparsity_options_of_compile_name_the_option(args, message, tmp_path) -> None:
    path = tmp_path / "mlp.onnx"
    zoo.save(_pruned(zoo.MODELS["mlp"](), 0.6), path)
    command = ["compile", str(path), "-o", str(tmp_path / "a.cgc"), "--batch-size", "8",
               "--target", "mesh16x16", "--mode", "weight_streaming", *args]  # fmt: skip
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert not (tmp_path / "a.cgc").exists()


def test_sparse_weights_take_less_sram_so_a_pipelined_model_fits() -> None:
    """On 4 x 4 PEs of 1.75 KiB the MLP's dense weights do not fit; at 90 % sparsity they do,
    and the run gives the masked model's outputs."""
    small = with_figures(get_target("mesh4x4"), ["sram_bytes_per_pe=1792"])
    model = zoo.MODELS["mlp"]()
    with pytest.raises(DoesNotFitError):
        cgc.compile(model, mode="pipelined", target=small, batch_size=8)
    pruned = _pruned(model, 0.9)
    artifact = cgc.compile(
        pruned, mode="pipelined", target=small, batch_size=8, detect_sparsity=0.8
    )
    assert max(x["sram_bytes_per_pe"] for x in artifact.manifest["layers"]) <= 1792
    inputs = zoo.sample_inputs(model, 8)
    outputs = cgc.run(artifact, inputs)
    for ours, theirs in zip(outputs.values(), _onnxruntime(pruned, inputs), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    auto = cgc.compile(pruned, target=small, batch_size=8, detect_sparsity=0.8)
    assert auto.manifest["mode"] == "pipelined"


def test_weights_from_a_safetensors_file_with_their_zeros_detected(tmp_path) -> None:
    """``cgc compile --weights FILE --detect-sparsity``: pruned weights from a file (as
    ``cgc train`` writes them) replace the model's, and their zeros are dead."""
    model = zoo.MODELS["mlp"]()
    pruned = _pruned(model, 0.8)
    tensors = {t.name: numpy_helper.to_array(t) for t in pruned.graph.initializer}
    (tmp_path / "w.safetensors").write_bytes(weights_to_bytes(tensors))
    zoo.save(model, tmp_path / "mlp.onnx")
    weights = str(tmp_path / "w.safetensors")
    command = ["compile", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "a.cgc"),
               "--batch-size", "8", "--target", "mesh16x16", "--mode", "weight_streaming",
               "--weights", weights, "--detect-sparsity", "0.7"]  # fmt: skip
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 0, result.output
    artifact = cgc.load(tmp_path / "a.cgc")
    assert artifact.manifest["sparsity"]["init"] == "detected"
    inputs = zoo.sample_inputs(model, 8)
    outputs = cgc.run(artifact, inputs)
    for ours, theirs in zip(outputs.values(), _onnxruntime(pruned, inputs), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"nothing": np.zeros(3, np.float32)}, "--weights: 'nothing' is not a weight of"),
        ({"fc1.weight": np.zeros((3, 3), np.float32)}, "--weights: 'fc1.weight' is [3, 3]"),
        ({"fc1.bias": np.zeros(32, np.int64)}, "--weights: 'fc1.bias' is int64"),
        (None, "the weights' safetensors header claims"),
    ],
)
def test_a_bad_weights_file_is_named(tensors, message, tmp_path) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"not safetensors" if tensors is None else weights_to_bytes(tensors))
    zoo.save(zoo.MODELS["mlp"](), tmp_path / "mlp.onnx")
    command = ["compile", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "a.cgc"),
               "--batch-size", "8", "--target", "mesh16x16", "--weights", str(path)]  # fmt: skip
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_a_pruned_model_trains_with_its_zeros_dead(tmp_path) -> None:
    """``cgc train --weights FILE --detect-sparsity``: the file's zeros are the masks, and they
    stay zero through the steps, where a dense training of the same weights fills them."""
    model = zoo.MODELS["mlp_train"]()
    tensors = {t.name: numpy_helper.to_array(t) for t in _pruned(model, 0.8).graph.initializer}
    (tmp_path / "w.safetensors").write_bytes(weights_to_bytes(tensors))
    data = mlp_train_data(16, seed=1)
    zoo.save(model, tmp_path / "mlp.onnx")
    np.savez(tmp_path / "data.npz", **data)
    common = [str(tmp_path / "mlp.onnx"), "--data", str(tmp_path / "data.npz"), "--steps", "3",
              "--batch-size", "8", "--target", "mesh16x16", "--lr", "0.1",
              "--weights", str(tmp_path / "w.safetensors")]  # fmt: skip
    runs = {}
    for name, extra in (("sparse", ["--detect-sparsity", "0.7"]), ("dense", [])):
        out = tmp_path / name
        result = CliRunner().invoke(main, ["train", *common, "--model-dir", str(out), *extra])
        assert result.exit_code == 0, result.output
        runs[name] = weights_from_bytes((out / "weights.safetensors").read_bytes())
    for name, start in tensors.items():
        if start.ndim == 2:
            assert not runs["sparse"][name][start == 0].any(), name
            assert runs["dense"][name][start == 0].any(), name
