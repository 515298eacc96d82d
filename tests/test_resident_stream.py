"""The weight-streaming kernel on a resident B (``Matmul._plan_resident_stream``): its cost
against hand counts, the SRAM its own layout of the weight pins, where the matmul plan takes
it, and whole decoders that use it running onnxruntime's numbers in the time a timing-only
run gives."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import runs_exactly_and_times_alike
from test_kernels import close, matmul_ref, poisoned

import cgc
from cgc.frontends import zoo
from cgc.machine.hardware.target import Target, get_target
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import Traffic
from cgc.machine.plans.kernel import RESIDENT, WAFER, Operand, Plan, PlanRequest
from cgc.machine.plans.matmul import Matmul, sram_overflow
from cgc.machine.timing.cost import Sram, Timing
from cgc.runtime import kernels

T = Target("t", 8, 8, 48 * 1024, 850e6)


def request(target: Target, rect, m: int, k: int, n: int) -> tuple[PlanRequest, Operand, Operand]:
    """``[m, k] @ [k, n]`` in float32: A on the wafer in its default layout on ``rect``, B
    resident."""
    a = Operand((m, k), "float32", WAFER, Layout.on((m, k), "float32", rect))
    b = Operand((k, n), "float32", RESIDENT)
    return PlanRequest(target, rect, (a, b), {}, (((m, n), "float32"),)), a, b


def resident_stream(target: Target, rect, m: int, k: int, n: int) -> Plan:
    q, a, b = request(target, rect, m, k, n)
    out = Layout.on((m, n), "float32", rect)
    return Matmul._plan_resident_stream(q, a, b, out, 2.0 * m * k * n)


def summa(target: Target, rect, m: int, k: int, n: int) -> Plan:
    q, a, b = request(target, rect, m, k, n)
    return Matmul._plan_summa(q, a, b, Layout.on((m, n), "float32", rect), 2.0 * m * k * n)


def chosen(target: Target, rect, m: int, k: int, n: int) -> str:
    q, _, _ = request(target, rect, m, k, n)
    return Matmul("matmul").plan(q).detail["algorithm"]


# --------------------------------------------------------------------------- hand counts


def test_one_chunk_a_pe_against_a_hand_count():
    """[8, 8] @ [8, 12] on 4 x 4 PEs: the result's 4 x 4 blocks of 2 x 3, A's of 2 x 2, so 4
    chunks of 3 columns, one on each PE of a column, each 2 x 3 = 6 wavelets of B a PE
    column. A chunk is 2 x 2 x 3 = 12 FMACs a PE; a ramp takes the 4 chunks in (4 x 6
    wavelets; a holder's own go out through its ramp out) and waits 2 cycles at each of the 3
    hand-overs: 30 cycles, 7.5 a chunk, under the arithmetic. The first chunk's 3 hops down
    the column and the chain's 3 hops along the row are paid once."""
    plan = resident_stream(T, (0, 0, 4, 4), 8, 8, 12)
    assert plan.detail == {"algorithm": "stream-resident", "steps": 4, "binds": "arithmetic"}
    a_at, b_at = plan.inputs
    assert a_at == Layout((8, 8), "float32", 0, 0, 4, 4)
    assert b_at == Layout((8, 12), "float32", 0, 0, 4, 4)
    assert plan.resident_tiles == (None, (2, 3))
    cost = plan.cost
    assert cost.cycles == 4 * 12 + 3 + 3
    assert (cost.compute_cycles, cost.arrival_cycles) == (48, 0)
    # each chunk crosses the 3 links of each of the 4 columns; the down link from row 2
    # carries the chunks of rows 0-2; the chain: 4 partials of 2 x 3 over 3 links of 4 rows
    column = Traffic(4 * 6 * 3 * 4, 3 * 6, 6, 4 * 6, 3)
    chain = Traffic(4 * 6 * 3 * 4, 4 * 6, 4 * 6, 4 * 6 * 3, 3)
    assert cost.traffic == column + chain
    assert cost.fmacs == 8 * 8 * 12
    assert cost.scratch_bytes == (3 + 2 * 3) * 4
    # A's 2 x 2, B's 2 x 3, the result's 2 x 3 and the scratch, in float32
    assert plan.input_bytes(1) == 2 * 3 * 4
    assert sram_overflow(plan, T) == 0
    tight = Target("t", 8, 8, 90, 850e6)
    assert sram_overflow(plan, tight) == (2 * 2 + 2 * 3 + 2 * 3) * 4 + cost.scratch_bytes - 90


def test_runs_of_chunks_and_a_binding_ramp_against_hand_counts():
    """Two rows for 4 chunks: runs of 2 a PE; [8, 8] @ [8, 12] does 4 x 2 x 3 = 24 FMACs a
    chunk, more than the ramp's 4 x 6 + 2 = 26 cycles over 4 chunks. With one row of A a PE
    ([4, 8] on 4 rows) a chunk is 6 FMACs, and the ramp's 4 x 6 + 3 x 2 = 30 cycles bind:
    7.5 a chunk, 6 cycles beyond the arithmetic, and the 6 hops of flight and chain."""
    runs = resident_stream(T, (0, 0, 4, 2), 8, 8, 12)
    assert runs.inputs[1] == Layout((8, 12), "float32", 0, 0, 2, 4)
    assert runs.resident_tiles == (None, (2, 6))
    assert runs.cost.cycles == 4 * 24 + 1 + 3
    column = Traffic(4 * 6 * 1 * 4, 2 * 6, 2 * 6, 4 * 6, 1)
    chain = Traffic(4 * 12 * 3 * 2, 4 * 12, 4 * 12, 4 * 12 * 3, 3)
    assert runs.cost.traffic == column + chain
    ramp = resident_stream(T, (0, 0, 4, 4), 4, 8, 12)
    assert ramp.cost.cycles == 30 + 3 + 3
    assert (ramp.cost.compute_cycles, ramp.cost.movement_cycles) == (24, 12)


def test_the_pin_holds_the_kernels_tiles_not_the_layouts():
    """[8, 10] @ [10, 6] on 4 x 4 PEs: B's 10 rows 3 a PE column over 4 columns, its 3 chunks
    of 2 columns one a PE down 3 rows: 3 x 2 values a PE, where the grid's own blocks (10
    rows over 3 PE rows, 6 columns over 4) would be 4 x 2."""
    plan = resident_stream(T, (0, 0, 4, 4), 8, 10, 6)
    b_at = plan.inputs[1]
    assert b_at is not None and (b_at.h, b_at.w) == (3, 4)
    assert plan.input_bytes(1) == 3 * 2 * 4 < b_at.tile_bytes == 4 * 2 * 4
    a_tile, out_tile = 2 * 3 * 4, 2 * 2 * 4
    tight = Target("t", 8, 8, 50, 850e6)
    want = a_tile + 3 * 2 * 4 + out_tile + plan.cost.scratch_bytes - 50
    assert sram_overflow(plan, tight) == want > 0


def test_one_row_keeps_its_weights_and_sends_nothing():
    plan = resident_stream(T, (0, 0, 4, 1), 1, 8, 12)
    assert plan.resident_tiles == (None, (2, 12))
    assert plan.cost.traffic.max_hops == 3  # the chain alone
    assert plan.cost.cycles == 4 * max(2 * 3, 3) + 3


@pytest.mark.parametrize(
    ("rect", "m", "k", "n"), [((0, 0, 4, 4), 8, 8, 12), ((0, 0, 4, 2), 5, 7, 13)]
)
def test_the_arithmetic_is_the_product(rect, m, k, n):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    plan = resident_stream(T, rect, m, k, n)
    assert plan.detail["algorithm"] == "stream-resident"
    values = [poisoned(a, plan.inputs[0]), poisoned(b, plan.inputs[1])]
    with np.errstate(all="ignore"):  # as the VM runs kernels: padding may hold NaN
        (out,) = kernels.run("matmul", plan, values, {})
    assert out.layout == plan.outputs[0]
    close(out.gather(), matmul_ref(a, b))
    assert plan.cost.flops == 2 * m * k * n


# --------------------------------------------------------------------------- the choice


def test_taken_where_summas_flight_binds():
    """GPT-2's MLP down projection ([128, 2048] @ [2048, 512]) on a wide strip of 129 rows:
    SUMMA takes a row of the contraction a step and pays 511 hops of flight for every panel
    of 6; the streaming kernel pays them once."""
    wse2 = get_target("wse2")
    rect = (0, 0, 512, 129)
    base = summa(wse2, rect, 128, 2048, 512)
    assert base.cost.movement_cycles > 10 * base.cost.compute_cycles
    plan = resident_stream(wse2, rect, 128, 2048, 512)
    assert plan.cost.cycles < base.cost.cycles / 10
    assert chosen(wse2, rect, 128, 2048, 512) == "stream-resident"


@pytest.mark.parametrize(
    ("rect", "m", "k", "n", "algorithm"),
    [
        # all of SUMMA's steps in one panel: one flight, and no chain along the rows
        ((0, 0, 4, 4), 8, 8, 12, "summa"),
        # two result rows on 64 rows of PEs: split-K uses all of them, the stream two
        ((0, 0, 8, 64), 2, 256, 16, "summa-split-k"),
    ],
)
def test_not_taken_where_summas_flight_does_not_bind(rect, m, k, n, algorithm):
    wse2 = get_target("wse2")
    q, _, _ = request(wse2, rect, m, k, n)
    plan = Matmul("matmul").plan(q)
    assert plan.detail["algorithm"] == algorithm
    assert plan.cost.cycles < resident_stream(wse2, rect, m, k, n).cost.cycles


# --------------------------------------------------------------------------- whole models


def compiled_decoder():
    model = zoo.decoder(blocks=1, seq=16, width=32, heads=2)
    return model, cgc.compile(model, mode="pipelined", target="mesh16x16", batch_size=4)


def resident_plans(art) -> list[Plan]:
    """The placed layers' plans of the streaming kernel on resident weights, each layer's
    SRAM ledger checked against the tiles they pin."""
    program, target = art.program, Target.from_json(art.manifest["target"])
    found = []
    for index, layer in enumerate(program.layers):
        timing = Timing(program, target, Sram(target, False, layer.rect), deliver=True)
        timing.enter_layer(index, layer.rect)
        for position in program.layer_spans[index][1:]:
            plan = timing.step(program.instructions[position])
            if isinstance(plan, Plan) and plan.detail.get("algorithm") == "stream-resident":
                pins = timing.sram.pinned
                pinned = [b for _, lay, b in pins if lay == plan.inputs[1]]
                assert pinned == [plan.input_bytes(1)]
                found.append(plan)
    return found


def test_a_decoder_runs_onnxruntimes_numbers_in_the_timing_only_time():
    model, art = compiled_decoder()
    assert len(resident_plans(art)) >= 3
    runs_exactly_and_times_alike(model, art)
