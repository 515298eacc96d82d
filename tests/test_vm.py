"""Unit tests of cgc.runtime.vm (the Cluster), cgc.runtime.trainer and cgc.runtime.trace."""

from __future__ import annotations

import copy
import itertools
import json
import math
from functools import cache

import numpy as np
import onnx
import pytest
import torch
from conftest import mlp_train_data, run_onnxruntime
from ir_builders import STATS_FIELDS
from onnx import numpy_helper
from safetensors.numpy import load_file

import cgc
from cgc.errors import CgcError
from cgc.frontends import zoo
from cgc.machine.hardware.target import Target
from cgc.machine.plans import Plan
from cgc.machine.program.artifact import Artifact
from cgc.machine.timing.cost import SimulationError, Sram, Timing
from cgc.machine.timing.run_stats import system_tracks
from cgc.runtime import trace
from cgc.runtime.cluster import Cluster
from cgc.runtime.trainer import LoopOptions
from cgc.runtime.trainer import train as run_training

MODES = ("pipelined", "weight_streaming")
MODEL_NAMES = ("mlp", "cnn", "transformer")


@cache
def model(name: str) -> onnx.ModelProto:
    return zoo.MODELS[name]()


@cache
def compiled(name: str, mode: str, target: str = "mesh8x8", batch: int = 4, num_csx: int = 1):
    art = cgc.compile(model(name), mode=mode, target=target, batch_size=batch, num_csx=num_csx)
    assert art.mode == mode
    return art


def inputs_for(art: Artifact, samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        spec["name"]: rng.standard_normal((samples, *spec["shape"][1:])).astype(spec["dtype"])
        for spec in art.manifest["inputs"]
    }


def check_against_onnxruntime(name, outputs, feeds, art, atol=1e-5):
    want = run_onnxruntime(model(name), feeds)
    specs = art.manifest["outputs"]
    assert list(outputs) == [s["name"] for s in specs]
    for spec, w in zip(specs, want, strict=True):
        got = outputs[spec["name"]]
        assert got.shape == w.shape and got.dtype == w.dtype
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=atol, err_msg=spec["name"])


# --------------------------------------------------------------------------- inference


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_infer_matches_onnxruntime(name, mode):
    art = compiled(name, mode)
    feeds = inputs_for(art, 4)
    outputs, stats = Cluster(art).infer(feeds)
    check_against_onnxruntime(name, outputs, feeds, art)
    assert stats.mode == mode


@pytest.mark.parametrize("mode", MODES)
def test_infer_on_a_larger_mesh(mode):
    art = compiled("cnn", mode, target="mesh16x16", batch=2)
    feeds = inputs_for(art, 2, seed=3)
    outputs = cgc.run(art, feeds)
    check_against_onnxruntime("cnn", outputs, feeds, art)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_timing_only_run_gives_the_same_time(name, mode):
    art = compiled(name, mode)
    feeds = inputs_for(art, 8)
    _, full = Cluster(art).infer(feeds)
    outputs, timed = Cluster(art, numerics=False).infer(feeds)
    assert outputs == {}
    assert timed.simulated_seconds == full.simulated_seconds > 0
    assert [layer["cycles"] for layer in timed.layers] == [layer["cycles"] for layer in full.layers]
    assert timed.layers == full.layers
    assert timed.peak_pe_sram_bytes == full.peak_pe_sram_bytes > 0
    assert timed.pe_utilization == full.pe_utilization
    assert timed.wavelet_hops == full.wavelet_hops


def _algorithms(art: Artifact) -> set[str]:
    """The matmul algorithms the placed layers' plans chose."""
    program, target = art.program, Target.from_json(art.manifest["target"])
    chosen = set()
    for index, layer in enumerate(program.layers):
        timing = Timing(program, target, Sram(target, False, layer.rect), deliver=True)
        timing.enter_layer(index, layer.rect)
        for position in program.layer_spans[index][1:]:
            plan = timing.step(program.instructions[position])
            if isinstance(plan, Plan) and "algorithm" in plan.detail:
                chosen.add(plan.detail["algorithm"])
    return chosen


def test_a_split_contraction_runs_and_times_as_planned():
    """Batch 2 on 8 rows: the first layer splits its contraction over two groups of rows
    (``summa-split-k``); its numbers match onnxruntime and a timing-only run its time."""
    art = compiled("mlp", "pipelined", batch=2)
    assert "summa-split-k" in _algorithms(art)
    feeds = inputs_for(art, 2)
    outputs, full = Cluster(art).infer(feeds)
    check_against_onnxruntime("mlp", outputs, feeds, art)
    _, timed = Cluster(art, numerics=False).infer(feeds)
    assert timed.layers == full.layers and timed.simulated_seconds == full.simulated_seconds


@pytest.mark.parametrize("mode", MODES)
def test_stats_json(mode):
    art = compiled("mlp", mode)
    _, stats = Cluster(art).infer(inputs_for(art, 8))
    data = json.loads(json.dumps(stats.to_json()))
    for key in STATS_FIELDS:
        assert key in data, key
    target = art.manifest["target"]
    assert data["mode"] == mode
    assert data["target"] == "mesh8x8"
    assert data["num_csx"] == 1
    assert data["batch_size"] == 8
    # the compiled batch of 4 runs twice on the one system
    assert (data["per_system_batch"], data["micro_batch"]) == (8, 4)
    assert data["simulated_seconds"] > 0
    assert data["simulated_cycles"] == round(data["simulated_seconds"] * target["clock_hz"])
    assert data["simulated_cycles"] > 0
    assert data["samples_per_second"] == pytest.approx(8 / data["simulated_seconds"])
    assert 0 < data["pe_utilization"] <= 1
    assert 0 < data["peak_pe_sram_bytes"] <= target["sram_bytes_per_pe"]
    assert [layer["name"] for layer in data["layers"]] == [
        layer["name"] for layer in art.manifest["layers"]
    ]
    assert all(layer["cycles"] > 0 for layer in data["layers"])
    assert sum(layer["flops"] for layer in data["layers"]) == pytest.approx(
        2 * 4 * (64 * 32 + 32 * 32 + 32 * 10), rel=0.1
    )


def test_weight_streaming_streams_every_weight_once():
    art = compiled("mlp", "weight_streaming")
    _, stats = Cluster(art).infer(inputs_for(art, 4))
    streamed = sum(layer["stream_in_bytes"] for layer in stats.layers)
    assert streamed == sum(w.nbytes for w in art.weights.values())
    assert all(layer["stream_out_bytes"] == 0 for layer in stats.layers)


@pytest.mark.parametrize(("samples", "systems"), [(4, 1), (12, 1), (12, 3), (16, 2)])
def test_pipelined_time_is_fill_plus_slowest_stage(samples, systems):
    # per sample, a stage takes the longest of its cycles, its host I/O and its busiest input
    # link's wavelets, over the batch (they overlap); it starts a sample once its producer
    # finished it and its route's hops passed, once the host sent it (one sample's host I/O
    # after another), and once it finished the sample before
    art = compiled("mlp", "pipelined")
    _, stats = Cluster(art, systems).infer(inputs_for(art, samples))
    target = art.manifest["target"]
    clock, rate = target["clock_hz"], target["io_bytes_per_s"]
    host = {"fc1": 4 * 64 * 4, "fc2": 0, "fc3": 4 * 10 * 4}  # input in, logits out
    assert [layer["name"] for layer in stats.layers] == list(host)
    routes = [info.routes for info in art.program.layers]
    assert [[r.source for r in into] for into in routes] == [[], [0], [1]]  # a chain
    sent = [host[layer["name"]] / rate / 4 for layer in stats.layers]
    stage = [
        max(layer["cycles"] / clock, sent[i] * 4, max((r.busiest for r in into), default=0) / clock)
        / 4
        for i, (layer, into) in enumerate(zip(stats.layers, routes, strict=True))
    ]
    hops = [sum(r.hops for r in into) / clock for into in routes]
    per_system = 4 * math.ceil(samples // 4 / systems)  # the busiest system's samples
    finish = [[0.0] * per_system for _ in stage]
    for i, service in enumerate(stage):
        for k in range(per_system):
            ready = (k + 1) * sent[i]
            if i:
                ready = max(ready, finish[i - 1][k] + hops[i])
            finish[i][k] = max(ready, finish[i][k - 1] if k else 0.0) + service
    assert stats.simulated_seconds == pytest.approx(finish[-1][-1], rel=1e-12)
    figures = stats.to_json()["pipeline"]
    assert figures["fill_seconds"] == pytest.approx(finish[-1][0], rel=1e-12)
    assert figures["period_seconds"] == pytest.approx(max(stage), rel=1e-12)
    assert figures["samples"] == per_system
    assert [s["name"] for s in figures["stages"]] == list(host)
    assert [(r["source"], r["consumer"]) for r in figures["routes"]] == [
        ("fc1", "fc2"),
        ("fc2", "fc3"),
    ]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_weight_streaming_time_bounds(name):
    # layers run one after another, and every weight crosses the one ingress link
    art = compiled(name, "weight_streaming")
    _, stats = Cluster(art).infer(inputs_for(art, 4))
    target = art.manifest["target"]
    compute = sum(layer["cycles"] for layer in stats.layers) / target["clock_hz"]
    rate = min(
        target["memoryx_bytes_per_s"], target["swarmx_link_bytes_per_s"], target["io_bytes_per_s"]
    )
    streamed = sum(layer["stream_in_bytes"] for layer in stats.layers)
    assert streamed > 0
    assert stats.simulated_seconds >= compute
    assert stats.simulated_seconds >= streamed / rate + target["swarmx_hop_seconds"]


@pytest.mark.parametrize("mode", MODES)
def test_more_samples_take_longer_on_one_system(mode):
    art = compiled("mlp", mode)
    _, four = Cluster(art).infer(inputs_for(art, 4))
    _, twelve = Cluster(art).infer(inputs_for(art, 12))
    assert twelve.simulated_seconds > four.simulated_seconds


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_splitting_samples_over_systems(name, mode):
    art = compiled(name, mode)
    feeds = inputs_for(art, 12, seed=5)
    one, one_stats = Cluster(art, 1).infer(feeds)
    check_against_onnxruntime(name, one, feeds, art)  # sample order is kept
    for k in (2, 3):
        out, stats = Cluster(art, k).infer(feeds)
        assert list(out) == list(one)
        for key in one:
            np.testing.assert_array_equal(out[key], one[key])
        assert stats.num_csx == k
        assert stats.batch_size == 12
        if mode == "pipelined":  # each system pipelines fewer samples
            assert stats.simulated_seconds < one_stats.simulated_seconds
    # chunk by chunk on one system, concatenated
    chunks = [cgc.run(art, {k: v[i : i + 4] for k, v in feeds.items()}) for i in range(0, 12, 4)]
    for key in one:
        np.testing.assert_array_equal(np.concatenate([c[key] for c in chunks]), one[key])


@pytest.mark.parametrize("mode", MODES)
def test_artifact_compiled_for_two_systems(mode):
    art = compiled("mlp", mode, batch=8, num_csx=2)
    assert art.manifest["per_system_batch"] == 4 and art.manifest["num_csx"] == 2
    feeds = inputs_for(art, 8, seed=9)
    outputs, stats = cgc.run_with_stats(art, feeds)
    assert stats.num_csx == 2 and stats.per_system_batch == 4
    check_against_onnxruntime("mlp", outputs, feeds, art)


def test_repeated_runs_on_one_cluster_agree():
    art = compiled("cnn", "pipelined")
    cluster = Cluster(art)
    feeds = inputs_for(art, 8, seed=4)
    first, s1 = cluster.infer(feeds)
    second, s2 = cluster.infer(feeds)
    np.testing.assert_array_equal(first["logits"], second["logits"])
    assert s1.simulated_seconds == s2.simulated_seconds
    assert s1.peak_pe_sram_bytes == s2.peak_pe_sram_bytes  # nothing leaks between runs


@pytest.mark.parametrize("mode", MODES)
def test_more_systems_than_chunks(mode):
    art = compiled("mlp", mode)
    feeds = inputs_for(art, 4, seed=6)
    outputs, stats = Cluster(art, 3).infer(feeds)
    check_against_onnxruntime("mlp", outputs, feeds, art)
    assert stats.num_csx == 3 and stats.batch_size == 4
    assert 0 < stats.pe_utilization <= 1


@pytest.mark.parametrize("mode", MODES)
def test_model_without_a_batch_axis(mode):
    static = zoo.MODELS["mlp"]()
    static.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    static.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 4
    art = cgc.compile(static, mode=mode, target="mesh8x8")
    assert art.manifest["per_system_batch"] is None
    x = np.random.default_rng(7).standard_normal((4, 64)).astype(np.float32)
    outputs, stats = cgc.run_with_stats(art, {"x": x})
    (want,) = run_onnxruntime(static, {"x": x})
    np.testing.assert_allclose(outputs["logits"], want, rtol=1e-4, atol=1e-5)
    assert stats.simulated_seconds > 0


# --------------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def mlp_art():
    return compiled("mlp", "weight_streaming")


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"x": np.zeros((4, 63), np.float32)}, "shape"),
        ({"x": np.zeros((4, 64, 1), np.float32)}, "shape"),
        ({"x": np.zeros((64,), np.float32)}, "shape"),
        ({"x": np.zeros((), np.float32)}, "shape"),
        ({"x": np.zeros((6, 64), np.float32)}, "multiple"),
        ({"x": np.zeros((0, 64), np.float32)}, "multiple"),
        ({"y": np.zeros((4, 64), np.float32)}, "missing"),
        ({}, "missing"),
        ({"x": np.zeros((4, 64), np.complex64)}, "dtype"),
    ],
)
def test_bad_inputs(mlp_art, feeds, message):
    with pytest.raises(CgcError, match=message):
        cgc.run(mlp_art, feeds)


def test_inputs_are_cast_when_safe(mlp_art):
    x = inputs_for(mlp_art, 4)["x"]
    want = cgc.run(mlp_art, {"x": x})
    got = cgc.run(mlp_art, {"x": x.astype(np.float64)})
    np.testing.assert_array_equal(got["logits"], want["logits"])


def test_negative_num_csx(mlp_art):
    with pytest.raises(CgcError, match="num_csx"):
        Cluster(mlp_art, -1)


def test_zero_num_csx(mlp_art):
    with pytest.raises(CgcError, match="num_csx"):
        Cluster(mlp_art, 0)


@pytest.mark.parametrize("numerics", [True, False])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_sram_overflow(name, numerics):
    art = compiled(name, "pipelined")
    manifest = copy.deepcopy(art.manifest)
    _, stats = Cluster(art).infer(inputs_for(art, 4))
    # kernels fit their buffers to what SRAM is left, so the peak is not the least that fits
    manifest["target"]["sram_bytes_per_pe"] = 64
    small = Artifact(manifest, art.program, art.ir, art.weights)
    with pytest.raises(SimulationError, match="SRAM overflow"):
        Cluster(small, numerics=numerics).infer(inputs_for(art, 4))
    manifest["target"]["sram_bytes_per_pe"] = stats.peak_pe_sram_bytes
    Cluster(Artifact(manifest, art.program, art.ir, art.weights)).infer(inputs_for(art, 4))


# --------------------------------------------------------------------------- training

TRAIN_CONFIGS = [
    {},
    {"momentum": 0.9, "weight_decay": 0.01, "nesterov": True},
    {"momentum": 0.9, "dampening": 0.3},
]


def torch_mlp_training(init, data, batch, steps, lr, config):
    params = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in init.items()}
    opt = torch.optim.SGD(list(params.values()), lr=lr, **config)
    samples = len(data["x"])
    losses = []
    for step in range(steps):
        index = np.arange(step * batch, (step + 1) * batch) % samples
        h = torch.from_numpy(data["x"][index])
        for i in (1, 2, 3):
            h = h @ params[f"fc{i}.weight"].T + params[f"fc{i}.bias"]
            if i < 3:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, torch.from_numpy(data["labels"][index]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: p.detach().numpy() for k, p in params.items()}


def train_data(samples=12, seed=0):
    return mlp_train_data(samples, seed)


@pytest.mark.parametrize("num_csx", [1, 2])
@pytest.mark.parametrize("config", TRAIN_CONFIGS, ids=["plain", "nesterov_wd", "dampening"])
def test_train_matches_torch(tmp_path, num_csx, config):
    data = train_data()
    onnx_model = model("mlp_train")
    init = {t.name: numpy_helper.to_array(t) for t in onnx_model.graph.initializer}
    result = cgc.train(
        onnx_model,
        data,
        batch_size=4,
        steps=4,  # 12 samples: step 4 wraps around to samples 0..3
        model_dir=tmp_path,
        lr=0.1,
        num_csx=num_csx,
        target="mesh8x8",
        **config,
    )
    losses, weights = torch_mlp_training(init, data, 4, 4, 0.1, config)

    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == result.metrics
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    for line, want in zip(lines, losses, strict=True):
        assert {"step", "loss", "simulated_seconds", "samples_per_second"} <= set(line)
        assert line["loss"] == pytest.approx(want, rel=1e-5)
        assert line["simulated_seconds"] > 0
        assert line["samples_per_second"] == pytest.approx(4 / line["simulated_seconds"])

    saved = load_file(tmp_path / "weights.safetensors")
    assert sorted(saved) == sorted(init)
    for name, want in weights.items():
        assert saved[name].dtype == np.float32
        np.testing.assert_allclose(saved[name], want, rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(saved[name], result.weights[name])
        assert not np.array_equal(saved[name], init[name])


def test_first_training_loss_equals_onnxruntime(tmp_path):
    data = train_data(seed=2)
    result = cgc.train(
        model("mlp_train"), data, batch_size=4, steps=1, model_dir=tmp_path, target="mesh8x8"
    )
    feeds = {"x": data["x"][:4], "labels": data["labels"][:4]}
    loss = run_onnxruntime(model("mlp_train"), feeds)[0]
    assert result.metrics[0]["loss"] == pytest.approx(float(loss), rel=1e-5)


@cache
def training_artifact():
    from cgc.compiler.driver import compile_model
    from cgc.compiler.training import Training

    return compile_model(
        model("mlp_train"),
        mode="weight_streaming",
        target="mesh8x8",
        batch_size=4,
        training=Training(lr=0.1),
    )


def test_trainer_keeps_untrained_initializers(tmp_path):
    from cgc.compiler.driver import compile_model
    from cgc.compiler.training import Training

    art = compile_model(
        model("mlp_train"),
        mode="weight_streaming",
        target="mesh8x8",
        batch_size=4,
        training=Training(lr=0.1, trainable=("fc3\\..*",)),
    )
    assert art.manifest["training"]["trainable"] == ["fc3.bias", "fc3.weight"]
    init = {t.name: numpy_helper.to_array(t) for t in model("mlp_train").graph.initializer}
    run_training(art, train_data(), LoopOptions(2), tmp_path)
    saved = load_file(tmp_path / "weights.safetensors")
    assert sorted(saved) == sorted(init)
    for name in init:
        frozen = not name.startswith("fc3")
        assert np.array_equal(saved[name], init[name]) == frozen, name


@pytest.mark.parametrize(
    ("data", "steps", "message"),
    [
        ({"x": np.zeros((4, 64), np.float32)}, 1, "lacks"),
        ({"x": np.zeros((4, 64), np.float32), "labels": np.zeros(3, np.int64)}, 1, "sample"),
        (train_data(), 0, "steps"),
    ],
)
def test_trainer_errors(tmp_path, data, steps, message):
    with pytest.raises(CgcError, match=message):
        run_training(training_artifact(), data, LoopOptions(steps), tmp_path)


def test_train_step_takes_exactly_one_global_batch():
    cluster = Cluster(training_artifact())
    with pytest.raises(CgcError, match="training step takes 4 samples"):
        cluster.train_step(train_data(8))


def test_trainer_ignores_extra_arrays(tmp_path):
    """An array that is no model input is left alone, even with another sample count (3, the
    inputs have 12): the run is the one without it, step for step and bit for bit."""
    data = {**train_data(), "notes": np.arange(3)}
    extra = run_training(training_artifact(), data, LoopOptions(4), tmp_path / "extra")
    plain = run_training(training_artifact(), train_data(), LoopOptions(4), tmp_path / "plain")
    assert [m["step"] for m in extra.metrics] == [1, 2, 3, 4]
    assert extra.metrics == plain.metrics
    assert sorted(extra.weights) == sorted(plain.weights)
    for name, value in plain.weights.items():
        assert np.array_equal(extra.weights[name], value), name
    for name in ("metrics.jsonl", "weights.safetensors"):
        assert (tmp_path / "extra" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


def test_trainer_rejects_an_inference_artifact(tmp_path):
    with pytest.raises(CgcError, match="training"):
        run_training(compiled("mlp", "weight_streaming"), train_data(), LoopOptions(1), tmp_path)


# --------------------------------------------------------------------------- traces


def check_trace(spans):
    obj = json.loads(trace.trace_json(spans))
    assert obj == json.loads(json.dumps(trace.chrome_trace(spans)))
    events = obj["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    complete = [e for e in events if e["ph"] != "M"]
    assert [e["name"] for e in meta if e["name"] == "process_name"] == ["process_name"]
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert sorted(threads.values()) == sorted({s.track for s in spans})
    assert len(threads) == len(set(threads.values()))
    assert len(complete) == len(spans) > 0
    for event, span in zip(complete, spans, strict=True):
        assert event["ph"] == "X"
        assert event["pid"] == 1
        assert threads[event["tid"]] == span.track
        assert event["name"] == span.name and event["name"]
        assert event["ts"] >= 0 and event["dur"] >= 0
        assert math.isclose(event["ts"], span.start * 1e6)
        assert math.isclose(event["dur"], (span.end - span.start) * 1e6, abs_tol=1e-9)
    return threads


@pytest.mark.parametrize("mode", MODES)
def test_trace_of_a_run(mode):
    art = compiled("mlp", mode)
    # three chunks of 4: system 0 runs two, system 1 one, so their timelines differ
    _, stats = Cluster(art, 2).infer(inputs_for(art, 12))
    tracks = set(check_trace(stats.spans).values())
    assert all(0 <= s.start <= s.end <= stats.simulated_seconds for s in stats.spans)
    assert max(s.end for s in stats.spans) > 0.5 * stats.simulated_seconds
    if mode == "weight_streaming":
        assert {"system 0", "system 1", "MemoryX -> SwarmX"} <= tracks
    else:  # a track per stage of each system, a span per sample on it
        assert tracks == {f"system {k}: {n}" for k in (0, 1) for n in ("fc1", "fc2", "fc3")}
        fc2 = [s for s in stats.spans if s.track == "system 1: fc2"]
        assert [s.name for s in fc2] == [f"sample {i}" for i in range(4)]
        assert all(a.end <= b.start * (1 + 1e-12) for a, b in itertools.pairwise(fc2))
        assert len([s for s in stats.spans if s.track == "system 0: fc2"]) == 8


@pytest.mark.parametrize("mode", MODES)
def test_systems_that_run_alike_share_a_track(mode):
    art = compiled("mlp", mode)
    _, stats = Cluster(art, 2).infer(inputs_for(art, 8))
    tracks = set(check_trace(stats.spans).values())
    assert not any(t.startswith("system 0") or t.startswith("system 1") for t in tracks)
    assert any(t.startswith("systems 0-1") for t in tracks)


def test_system_tracks_group_systems_by_their_runs():
    assert system_tracks([2, 2, 1, 1]) == {2: "systems 0-1", 1: "systems 2-3"}
    assert system_tracks([1]) == {1: "system 0"}
    assert system_tracks([3, 2, 3]) == {3: "systems 0, 2", 2: "system 1"}


def test_trace_of_a_training_step():
    cluster = Cluster(training_artifact())
    data = train_data(4)
    _, stats = cluster.train_step(data)
    tracks = set(check_trace(stats.spans).values())
    assert {"system 0", "MemoryX -> SwarmX", "SwarmX -> MemoryX", "MemoryX"} <= tracks
    # MemoryX updates the weights of the step before, layer by layer in the order this step
    # streams them: a layer's weights leave no earlier than their update ends
    updates = {s.name.split()[0]: s for s in stats.spans if s.track == "MemoryX"}
    assert list(updates) == ["fc1", "fc2", "fc3"]
    assert all(a.end <= b.start * (1 + 1e-12) for a, b in itertools.pairwise(updates.values()))
    streams = {s.name.split()[0]: s for s in stats.spans if s.track == "MemoryX -> SwarmX"}
    assert all(streams[name].start >= updates[name].end * (1 - 1e-12) for name in updates)


def test_trace_of_no_spans():
    obj = trace.chrome_trace([])
    assert [e["ph"] for e in obj["traceEvents"]] == ["M"]
