"""Pipelined placement and routing on random layer graphs: the invariants, the numbers.

Each case builds a random DAG of dense layers (MatMul + Relu on any earlier tensor, sums and
concatenations of earlier tensors), compiles it in pipelined mode for a small mesh and checks:
every rectangle inside the mesh and disjoint from the others, every PE's SRAM within the
target's (by the compiler's estimate, and by a strict run of several batches that would stop
at an overflow), every tensor between layers routed from its producer, no two routes of one
color on a link and no more colors than the target has, each route's busiest link as loaded
as a hop-by-hop walk over all lanes counts; then that the outputs equal onnxruntime's and that
the run's pipeline agrees with the compiler's estimate.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
import pytest
from conftest import run_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from test_layout import walk_links

import cgc
from cgc.dialects import context, parse_module, print_module
from cgc.dialects.ir import main_function
from cgc.errors import CgcError
from cgc.frontends import zoo
from cgc.machine.hardware.target import get_target
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import lane_ends, overlap
from cgc.machine.program.bytecode import Route
from cgc.machine.timing.pipeline import Stage, simulate
from cgc.passes.place_layers.packing import pack_runs
from cgc.passes.route_tensors import RouteTensorsPass
from cgc.runtime.cluster import Cluster
from cgc.tools.report import inspect_json, summary_text

MESHES = [(8, 8), (6, 10), (12, 5), (16, 16), (4, 24)]


def random_graph(seed: int) -> onnx.ModelProto:
    """A random DAG of 4-13 steps (mostly dense layers with biases) over one input of a
    dynamic batch;
    every tensor no step reads is an output, so that no step is dead."""
    rng = np.random.default_rng(seed)
    width = int(rng.integers(4, 24))
    tensors = [("x", width)]
    nodes, weights = [], []
    for step in range(int(rng.integers(4, 14))):
        kind = rng.choice(["dense", "dense", "dense", "sum", "concat"])
        name = f"t{step}"
        first = tensors[int(rng.integers(len(tensors)))]
        same = [t for t in tensors if t[1] == first[1] and t != first]
        if kind == "sum" and same:
            other = same[int(rng.integers(len(same)))]
            nodes.append(helper.make_node("Add", [first[0], other[0]], [name], name=f"add{step}"))
            tensors.append((name, first[1]))
        elif kind == "concat" and len(tensors) > 1:
            other = tensors[int(rng.integers(len(tensors)))]
            nodes.append(
                helper.make_node("Concat", [first[0], other[0]], [name], axis=1, name=f"cat{step}")
            )
            tensors.append((name, first[1] + other[1]))
        else:
            out = int(rng.integers(4, 40))
            weight = (rng.standard_normal((first[1], out)) / np.sqrt(first[1])).astype(np.float32)
            weights.append(numpy_helper.from_array(weight, f"w{step}"))
            bias = rng.standard_normal(out).astype(np.float32)
            weights.append(numpy_helper.from_array(bias, f"b{step}"))
            nodes.append(helper.make_node("MatMul", [first[0], f"w{step}"], [f"m{step}"],
                                          name=f"dense{step}"))  # fmt: skip
            nodes.append(
                helper.make_node("Add", [f"m{step}", f"b{step}"], [f"a{step}"], name=f"bias{step}")
            )
            nodes.append(helper.make_node("Relu", [f"a{step}"], [name], name=f"relu{step}"))
            tensors.append((name, out))
    read = {name for node in nodes for name in node.input}
    ends = [t for t in tensors[1:] if t[0] not in read]
    graph = helper.make_graph(
        nodes,
        f"random{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", w]) for n, w in ends],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def link_walk(source, target, wavelets: float) -> dict[tuple, float]:
    """Wavelets per directed link of a route's lanes, walked hop by hop along the row and
    then down the column."""
    src_r, src_c, dst_r, dst_c = lane_ends(source, target)
    share = wavelets / len(src_r)
    lanes = zip(src_r, src_c, dst_r, dst_c, strict=True)
    return walk_links([(int(a), int(b), int(c), int(d), share) for a, b, c, d in lanes])


@pytest.mark.parametrize("seed", range(16))
def test_random_layer_graphs_place_route_and_compute(seed):
    rows, cols = MESHES[seed % len(MESHES)]
    model = random_graph(seed)
    artifact = cgc.compile(model, mode="pipelined", target=f"mesh{rows}x{cols}", batch_size=4)
    program, manifest = artifact.program, artifact.manifest
    target = manifest["target"]
    rects = [tuple(info.rect) for info in program.layers]
    assert len(rects) >= 2
    for i, (x, y, w, h) in enumerate(rects):
        assert x >= 0 and y >= 0 and w >= 1 and h >= 1
        assert x + w <= cols and y + h <= rows
        for other in rects[i + 1 :]:
            assert not overlap(rects[i], other), (rects[i], other)
    for layer in manifest["layers"]:
        assert 0 < layer["sram_bytes_per_pe"] <= target["sram_bytes_per_pe"], layer
    # every tensor between layers has its route, from the layer that computes it
    for info, inputs in zip(program.layers, program.layer_inputs, strict=True):
        assert [r.source for r in info.routes] == list(inputs.values()), info.name
        for route, register in zip(info.routes, inputs, strict=True):
            layout = Layout.on(*program.registers[register], (0, 0, 1, 1))
            assert route.wavelets == int(np.ceil(layout.size * layout.words_per_element))
            assert 0 <= route.color < target["colors"]
    # links: no two routes of one color, and each route's busiest link as loaded as counted
    walks = {
        (consumer, k): link_walk(rects[r.source], rects[consumer], r.wavelets)
        for consumer, info in enumerate(program.layers)
        for k, r in enumerate(info.routes)
    }
    load: dict[tuple, float] = defaultdict(float)
    colors: dict[tuple, list[int]] = defaultdict(list)
    for (consumer, k), walk in walks.items():
        for link, wavelets in walk.items():
            load[link] += wavelets
            colors[link].append(program.layers[consumer].routes[k].color)
    for link, on_link in colors.items():
        assert len(on_link) == len(set(on_link)) <= target["colors"], link
    for (consumer, k), walk in walks.items():
        route = program.layers[consumer].routes[k]
        assert route.busiest == int(np.ceil(max(load[link] for link in walk) - 1e-9))
        src_r, src_c, dst_r, dst_c = lane_ends(rects[route.source], rects[consumer])
        assert route.hops == int((abs(dst_r - src_r) + abs(dst_c - src_c)).max())
    # numbers: onnxruntime's, for two runs of the compiled batch of 4
    width = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = np.random.default_rng(seed).standard_normal((8, width)).astype(np.float32)
    outputs, stats = Cluster(artifact).infer({"x": x})
    for output, want in zip(model.graph.output, run_onnxruntime(model, {"x": x}), strict=True):
        np.testing.assert_allclose(outputs[output.name], want, rtol=1e-4, atol=1e-5)
    # the run's pipeline is the compiler's: same stage times, rate and latency
    figures = inspect_json(artifact)["pipeline"]
    pipeline = stats.pipeline
    assert pipeline["steady_samples_per_second"] == pytest.approx(figures["samples_per_second"])
    assert pipeline["fill_seconds"] == pytest.approx(figures["latency_seconds"])
    assert [s["name"] for s in pipeline["stages"]] == [layer.name for layer in program.layers]


def test_random_graph_artifacts_are_deterministic():
    model = random_graph(3)
    first = cgc.compile(model, mode="pipelined", target="mesh8x8", batch_size=4).to_bytes()
    second = cgc.compile(model, mode="pipelined", target="mesh8x8", batch_size=4).to_bytes()
    assert first == second


def test_routes_between_touching_rectangles_are_straight():
    # rectangles that share a boundary: the tensor crosses it on one lane per shared row or
    # column, one hop each
    touching = 0
    for seed in range(4):
        model = random_graph(seed)
        artifact = cgc.compile(model, mode="pipelined", target="mesh16x16", batch_size=4)
        layers = artifact.program.layers
        for info in layers:
            for route in info.routes:
                (ax, ay, aw, ah), (bx, by, bw, bh) = layers[route.source].rect, info.rect
                columns = min(ax + aw, bx + bw) - max(ax, bx)
                rows = min(ay + ah, by + bh) - max(ay, by)
                if columns > 0 and (ay + ah == by or by + bh == ay):
                    assert (route.lanes, route.hops) == (columns, 1), (route, info.name)
                    touching += 1
                if rows > 0 and (ax + aw == bx or bx + bw == ax):
                    # and a lane from each of as many of the source's other rows as the
                    # consumer has columns
                    corner = min(max(by - ay, 0), bw) + min(max(ay + ah - by - bh, 0), bw)
                    assert route.lanes == rows + corner, (route, info.name)
                    assert route.hops == 1 or corner, (route, info.name)
                    touching += 1
    assert touching >= 4


def test_lanes_between_rectangles_share_no_link():
    # random disjoint pairs: every lane runs from a PE of the source to a PE on the target's
    # edge facing it, no two lanes cross one link, and side by side there is a lane per
    # shared row and one from each of as many of the source's other rows (above and below the
    # target) as the target has columns
    rng = np.random.default_rng(11)
    pairs = 0
    while pairs < 300:
        source, target = (tuple(int(v) for v in rng.integers(1, 9, size=4)) for _ in range(2))
        if overlap(source, target):
            continue
        pairs += 1
        src_r, src_c, dst_r, dst_c = lane_ends(source, target)
        (sx, sy, sw, sh), (tx, ty, tw, th) = source, target
        assert np.all((sx <= src_c) & (src_c < sx + sw) & (sy <= src_r) & (src_r < sy + sh))
        assert np.all((tx <= dst_c) & (dst_c < tx + tw) & (ty <= dst_r) & (dst_r < ty + th))
        ends = (src_r.tolist(), src_c.tolist(), dst_r.tolist(), dst_c.tolist())
        lanes = list(zip(*ends, strict=True))
        assert max(walk_links([(*lane, 1) for lane in lanes]).values(), default=1) == 1, lanes
        if sx + sw <= tx or tx + tw <= sx:
            shared = max(min(sy + sh, ty + th) - max(sy, ty), 0)
            above, below = min(max(ty - sy, 0), sh), min(max(sy + sh - ty - th, 0), sh)
            assert len(lanes) == shared + min(above, tw) + min(below, tw), (source, target)
        else:
            assert len(lanes) == min(sx + sw, tx + tw) - max(sx, tx), (source, target)


def test_pipeline_timeline_equals_a_sample_by_sample_simulation():
    # random stages and routes: the vectorized timeline equals the plain recurrence, sample by
    # sample; a stage whose busiest input link carries more wavelets than its kernels take
    # cycles runs at the link's pace
    rng = np.random.default_rng(7)
    target = get_target("mesh8x8")
    stages = []
    for index in range(6):
        sources = sorted(set(rng.integers(0, index, size=2))) if index else []
        routes = tuple(
            Route(int(s), 0, 1, 100, int(rng.integers(0, 4000)), int(rng.integers(1, 9)), ())
            for s in sources
        )
        stages.append(Stage(f"s{index}", float(rng.integers(100, 3000)), 0.0, routes))
    batch, samples = 2, 9
    timeline = simulate(stages, target, samples, batch)
    service = [s.service_seconds(target, batch) for s in stages]
    finish = np.zeros((len(stages), samples))
    for i, stage in enumerate(stages):
        link = max((r.busiest for r in stage.routes), default=0)
        assert service[i] == max(stage.cycles, link) / target.clock_hz / batch
        for sample in range(samples):
            ready = max(
                (finish[r.source, sample] + r.hops / target.clock_hz for r in stage.routes),
                default=0.0,
            )
            previous = finish[i, sample - 1] if sample else 0.0
            finish[i, sample] = max(ready, previous) + service[i]
    np.testing.assert_allclose(timeline.finish, finish, rtol=1e-12)
    assert timeline.period_seconds == max(service)
    assert timeline.fill_seconds == pytest.approx(finish[:, 0].max())
    assert timeline.seconds == pytest.approx(finish.max())


def test_sram_estimate_is_the_steady_state_of_a_run():
    # the compiler's per-PE SRAM counts every weight and bias pinned from the first batch on:
    # a layer placed at exactly the SRAM limit runs batch after batch without overflowing, and
    # the run's peak equals the estimate
    model = zoo.mlp(in_features=512, hidden=(512,))
    artifact = cgc.compile(model, mode="pipelined", target="mesh1x64", batch_size=2)
    estimate = max(layer["sram_bytes_per_pe"] for layer in artifact.manifest["layers"])
    x = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    _, stats = Cluster(artifact).infer({"x": x})
    assert stats.peak_pe_sram_bytes == estimate <= 48 * 1024


def test_a_model_without_layers_compiles_and_runs_pipelined():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="same")],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for mode in ("pipelined", "auto"):
        artifact = cgc.compile(model, mode=mode, target="mesh4x4", batch_size=2)
        assert artifact.manifest["mode"] == "pipelined"
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        outputs, _ = Cluster(artifact).infer({"x": x})
        np.testing.assert_array_equal(outputs["y"], x)


ROUTED = r"""
builtin.module attributes {wse.target = #wse.target<"mesh4x4">} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %h = wse.layer "a\"1"(%x) {rect = #wse.rect<0, 0, 1x2>} : (tensor<2x4xf32>) -> tensor<2x4xf32> {
    ^bb0(%a: tensor<2x4xf32>):
      %r = wse.relu %a : tensor<2x4xf32>
      wse.yield %r : tensor<2x4xf32>
    }
    %g = wse.layer "b"(%h) {rect = #wse.rect<RECT>} : (tensor<2x4xf32>) -> tensor<2x4xf32> {
    ^bb0(%a: tensor<2x4xf32>):
      %r = wse.relu %a : tensor<2x4xf32>
      wse.yield %r : tensor<2x4xf32>
    }
    func.return %g : tensor<2x4xf32>
  }
}
"""


def test_routes_of_oddly_named_layers_print_and_parse_back():
    module = parse_module(ROUTED.replace("RECT", "1, 0, 1x2"))
    RouteTensorsPass().apply(context(), module)
    text = print_module(module)
    assert r'routes = [#wse.route<"a\221", color 0, lanes 2' in text  # xDSL's escape
    parsed = parse_module(text)
    assert print_module(parsed) == text
    layer = list(main_function(parsed).body.block.ops)[1]
    assert layer.routes.data[0].source.data == 'a"1'


def test_routing_refuses_overlapping_layers():
    module = parse_module(ROUTED.replace("RECT", "0, 1, 2x2"))
    with pytest.raises(CgcError, match="layers 'a\"1' and 'b' overlap on the mesh"):
        RouteTensorsPass().apply(context(), module)


def test_summary_of_a_model_without_flops():
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], name="flip", perm=[1, 0])],
        "flip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    artifact = cgc.compile(model, mode="pipelined", target="mesh4x4")
    assert "no compute bound (no flops)" in summary_text(artifact)


def test_strips_of_runs_are_disjoint_and_start_level_with_the_strip_before():
    # random strips of random widths and member heights: every rectangle inside the mesh and
    # disjoint from the others, each strip at its place; a strip whose members fit there
    # starts level with the last rectangle of the strip before, so the two share rows
    rng = np.random.default_rng(5)
    rows = 40
    for _ in range(50):
        strips = []
        for _ in range(int(rng.integers(1, 6))):
            heights = [int(h) for h in rng.integers(1, 12, size=int(rng.integers(1, 6)))]
            while sum(heights) > rows:
                heights.pop()
            strips.append((int(rng.integers(1, 9)), heights))
        rects = pack_runs(strips, rows)
        assert [h for _, _, _, h in rects] == [h for _, heights in strips for h in heights]
        for i, (_, y, _, h) in enumerate(rects):
            assert y >= 0 and y + h <= rows
            for other in rects[i + 1 :]:
                assert not overlap(rects[i], other), (rects[i], other)
        first, x = 0, 0
        for index, (width, heights) in enumerate(strips):
            members = rects[first : first + len(heights)]
            assert all(r[0] == x and r[2] == width for r in members)
            if index:
                _, last_y, _, last_h = rects[first - 1]
                down = index % 2 == 0
                fits = last_y + sum(heights) <= rows if down else last_y + last_h >= sum(heights)
                touching = min(last_y + last_h, members[0][1] + members[0][3]) > max(
                    last_y, members[0][1]
                )
                assert touching or not fits, (strips, rects)
            first, x = first + len(heights), x + width
