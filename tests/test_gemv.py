"""MeshGEMV (``plan_gemv``): the turn's flight against every assignment of row blocks to mesh
rows, its traffic against routed flows and a hand count, where the planner picks it, and a
compiled GEMV against numpy, timing-only equal to numeric."""

from __future__ import annotations

from itertools import permutations
from math import ceil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cgc
from cgc.machine.hardware.target import Target, get_target
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, route
from cgc.machine.plans.gemv import plan_gemv, turn_flight, turn_traffic
from cgc.machine.plans.kernel import RESIDENT, WAFER, Operand, PlanRequest
from cgc.machine.plans.matmul import Matmul
from cgc.machine.timing.utilization import layer_kernels
from cgc.runtime.cluster import Cluster

T = Target("t", 8, 8, 48 * 1024, 850e6)


def request(target: Target, rect, k: int, n: int, dtype: str = "float32", batch=()):
    """``[*batch, 1, k] @ [k, n]``: the vector on the wafer in its default layout on
    ``rect``, the matrix resident."""
    shape = (*batch, 1, k)
    a = Operand(shape, dtype, WAFER, Layout.on(shape, dtype, rect))
    b = Operand((k, n), dtype, RESIDENT)
    return PlanRequest(target, rect, (a, b), {}, (((*batch, 1, n), dtype),)), a, b


def brute_flight(rows: int, middle: int, k: int, rt: int, ct: int, cols: int) -> int:
    """The turn's longest path under the best of every assignment of the row blocks to the
    mesh rows: a row waits for the farthest of its block's elements to reach its farthest
    column, down from the middle row and then along the row."""
    blocks = [range(s * rt, min(k, (s + 1) * rt)) for s in range(ceil(k / rt))]

    def row_time(row: int, block: range) -> int:
        sources = {e // ct for e in block}
        return abs(row - middle) + max(abs(j - d) for j in sources for d in range(cols))

    return min(
        max(row_time(row, blocks[s]) for row, s in enumerate(order))
        for order in permutations(range(rows))
    )


@pytest.mark.parametrize(
    ("rows", "middle", "k", "rt", "ct", "cols"),
    [
        (5, 2, 10, 2, 2, 5),  # aligned blocks: each row's block on one column
        (4, 1, 8, 2, 4, 3),  # a column's block feeds two rows; a source past the row's end
        (3, 1, 12, 4, 3, 4),  # a row's block comes from two columns
        (6, 2, 11, 2, 3, 7),  # a short last block
        (1, 0, 5, 5, 5, 1),
        (6, 5, 12, 2, 2, 6),  # the vector's row at the grid's edge
    ],
)
def test_the_turn_takes_the_best_assignment_of_row_blocks(rows, middle, k, rt, ct, cols):
    assert turn_flight(rows, middle, k, rt, ct, cols) == brute_flight(rows, middle, k, rt, ct, cols)


def test_the_turns_column_links_carry_a_columns_block():
    """The descents of the turn, routed flow by flow (every element from its column's PE of
    the vector's row to the mesh row that takes its block, the blocks assigned in order),
    load no link beyond what ``turn_traffic`` counts, and its wavelet-hops are theirs plus a
    multicast along every row."""
    k, n = 24, 20
    rect = (0, 0, 6, 8)
    q, a, b = request(T, rect, k, n)
    plan = plan_gemv(q, a, b, False, 2.0 * k * n)
    a_at, b_at = plan.inputs
    assert a_at is not None and b_at is not None
    turn = turn_traffic(a_at, b_at)
    element = np.arange(k)
    rows, columns = element // b_at.rt, element // a_at.ct
    middle = a_at.row0 - b_at.row0
    down = route(np.full(k, middle), columns, rows, columns, np.ones(k), a_at.words_per_element)
    assert down.max_link <= turn.max_link
    assert turn.wavelet_hops == down.wavelet_hops + k * (b_at.w - 1)


def test_a_small_gemv_by_hand():
    """[1, 8] @ [8, 8] on 4 x 4 PEs in float32: blocks of 2, the vector and the result on
    row 1. The vector arrives from row 0 (2 words, 1 hop: 3 cycles); the turn's rows 1, 0,
    2, 3 are 0, 1, 1, 2 hops from row 1 and the blocks' multicasts 3, 3, 2, 2 hops long
    (the edge columns' blocks to the nearest rows): 4 hops of flight, behind 4 cycles of
    arithmetic (2 x 2 FMACs); the partials' two chains meet at row 1, 2 hops away, taking 4
    words there (6 cycles), and 4 adds: the reduction binds."""
    q, a, b = request(T, (0, 0, 4, 4), 8, 8)
    plan = plan_gemv(q, a, b, False, 128.0)
    (out,) = plan.outputs
    assert (out.row0, out.h, out.w) == (1, 1, 4)
    assert plan.inputs[0] == Layout((1, 8), "float32", 1, 0, 1, 4)
    assert plan.cost.cycles == 3 + 4 + 4 + 6 + 4
    assert plan.cost.compute_cycles == 4
    assert plan.cost.fmacs == 4 * 16
    assert plan.detail == {"algorithm": "meshgemv", "steps": 1, "binds": "the reduction"}


def test_it_is_offered_for_one_row_and_a_resident_matrix_only():
    target = get_target("mesh64x64")
    rect = target.whole
    q, a, _ = request(target, rect, 4096, 4096, "float16")
    assert Matmul("matmul").plan(q).detail["algorithm"] == "meshgemv"
    # two vectors (their rows folded into two), or a matrix on the wafer: SUMMA and its rivals
    two, _, _ = request(target, rect, 4096, 4096, "float16", batch=(2,))
    assert Matmul("matmul").plan(two).detail["algorithm"] != "meshgemv"
    wafer = Operand((4096, 4096), "float16", WAFER, Layout.on((4096, 4096), "float16", rect))
    moved = PlanRequest(target, rect, (a, wafer), {}, q.results)
    assert Matmul("matmul").plan(moved).detail["algorithm"] != "meshgemv"


def test_it_beats_split_k_summa_near_full_wafer():
    """[1, 16K] @ [16K, 16K] in float16 on 720 x 720: the whole mesh multiplies, where split-K
    SUMMA keeps the result's row of PEs per group."""
    target = get_target("mesh720x720")
    q, a, b = request(target, target.whole, 16384, 16384, "float16")
    gemv = plan_gemv(q, a, b, False, 2.0 * 16384**2)
    out = Layout.on((1, 16384), "float16", target.whole)
    split = Matmul._plan_split_k(q, a, b, out, 2.0 * 16384**2)
    assert gemv.cost.cycles < split.cost.cycles / 2
    assert gemv.cost.compute_cycles == 23 * 23 / 4


def gemv_model(k: int, n: int, weights: np.ndarray) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "gemv", [x], [y], [numpy_helper.from_array(weights, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_compiled_gemv_computes_the_product_in_the_time_it_plans():
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((96, 80)).astype(np.float32)
    art = cgc.compile(gemv_model(96, 80, weights), mode="pipelined", target="mesh16x16")
    target = Target.from_json(art.manifest["target"])
    (kernel,) = layer_kernels(art.program, target, 0)
    assert kernel.detail["algorithm"] == "meshgemv"
    x = rng.standard_normal((1, 96)).astype(np.float32)
    outputs, full = Cluster(art).infer({"x": x})
    np.testing.assert_allclose(outputs["y"], x @ weights, rtol=1e-4, atol=1e-5)
    _, timed = Cluster(art, numerics=False).infer({"x": x})
    assert timed.layers == full.layers
    assert timed.simulated_seconds == full.simulated_seconds > 0


def test_the_placement_gives_a_gemv_the_rows_that_make_it_fastest():
    """[1, 16K] @ [16K, 16K] in float16 fits 720 x 720 on 16 rows, where it takes 200 times
    longer than on 256 (SUMMA, its blocks beyond its SRAM): the search of stage times starts
    again below the first strips' time, and the candidate heights reach past eight times the fewest
    rows."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 16384])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 16384])
    w = TensorProto(name="w", dims=[16384, 16384], data_type=TensorProto.FLOAT16)
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="absent.bin")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    art = cgc.compile(model, mode="pipelined", target="mesh720x720", no_weights=True)
    (layer,) = art.manifest["layers"]
    (kernel,) = layer_kernels(art.program, Target.from_json(art.manifest["target"]), 0)
    assert kernel.detail["algorithm"] == "meshgemv"
    assert layer["rect"][3] == 256
    assert kernel.cycles < 1400


def test_a_vector_on_one_pe_still_reaches_the_row_of_the_matrix():
    """[1, 1] @ [1, 8] on a row of 4 PEs: the vector's one element is multicast along the row."""
    q, a, b = request(T, (0, 0, 4, 1), 1, 8)
    a_at, b_at = plan_gemv(q, a, b, False, 16.0).inputs
    assert a_at is not None and b_at is not None
    assert (a_at.w, b_at.h, b_at.w) == (1, 1, 4)
    turn = turn_traffic(a_at, b_at)
    assert (turn.max_hops, turn.wavelet_hops, turn.max_eject) == (3, 3, 1)
    one = request(T, (0, 0, 1, 1), 1, 8)
    assert turn_traffic(*plan_gemv(*one, False, 16.0).inputs) == NO_TRAFFIC
