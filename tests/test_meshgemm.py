"""MeshGEMM (``plan_meshgemm``): the interleaved ring, the skew and the shifts against routed
flows and hand counts, the schedule's arithmetic on tiles, and where it wins or loses
against SUMMA and split-K SUMMA."""

from __future__ import annotations

import numpy as np
import pytest

from cgc.machine.hardware.target import Target, get_target
from cgc.machine.movement.layout import Layout
from cgc.machine.movement.traffic import NO_TRAFFIC, Routes, Traffic
from cgc.machine.plans.kernel import RESIDENT, WAFER, Operand, Plan, PlanRequest
from cgc.machine.plans.matmul import Matmul, sram_overflow
from cgc.machine.plans.meshgemm import (
    mesh_side,
    plan_meshgemm,
    ring_line,
    ring_position,
    shift_traffic,
    skew_traffic,
)
from cgc.runtime.tiles import DistTensor

T = Target("t", 8, 8, 48 * 1024, 850e6)


def request(
    target: Target,
    rect: tuple[int, int, int, int],
    m: int,
    k: int,
    n: int,
    b_source: str,
    batch: tuple[int, ...] = (),
) -> tuple[PlanRequest, Operand, Operand]:
    """``[*batch, m, k] @ [k, n]`` in float32: A on the wafer in its default layout on
    ``rect``, B from ``b_source``."""
    a_shape = (*batch, m, k)
    a = Operand(a_shape, "float32", WAFER, Layout.on(a_shape, "float32", rect))
    b_layout = Layout.on((k, n), "float32", rect) if b_source == WAFER else None
    b = Operand((k, n), "float32", b_source, b_layout)
    return PlanRequest(target, rect, (a, b), {}, (((*batch, m, n), "float32"),)), a, b


def meshgemm(target, rect, m, k, n, b_source=WAFER) -> Plan:
    q, a, b = request(target, rect, m, k, n, b_source)
    return plan_meshgemm(q, a, b, False, 2.0 * m * k * n)


def summa(target, rect, m, k, n, b_source=WAFER) -> Plan:
    q, a, b = request(target, rect, m, k, n, b_source)
    return Matmul._plan_summa(q, a, b, Layout.on((m, n), "float32", rect), 2.0 * m * k * n)


def split_k(target, rect, m, k, n, b_source=WAFER) -> Plan | None:
    """Split-K SUMMA where the matmul plan would consider it (a rectangle at least twice as
    tall as the result's rows)."""
    q, a, b = request(target, rect, m, k, n, b_source)
    out = Layout.on((m, n), "float32", rect)
    if rect[3] < 2 * out.h or k < 2:
        return None
    return Matmul._plan_split_k(q, a, b, out, 2.0 * m * k * n)


def utilization(plan: Plan, target: Target, rect, cycles: float | None = None) -> float:
    """Useful FLOPs over the peak of the whole rectangle for ``cycles`` (the plan's)."""
    peak = rect[2] * rect[3] * target.peak_flops_per_pe_per_cycle("float32")
    return plan.cost.flops / ((cycles or plan.cost.cycles) * peak)


# --------------------------------------------------------------------------- the ring


@pytest.mark.parametrize("side", range(1, 12))
def test_ring_neighbours_are_at_most_two_hops_apart(side):
    positions = np.arange(side)
    places = ring_line(positions, side)
    assert sorted(places.tolist()) == list(range(side))
    assert (ring_position(places, side) == positions).all()
    gaps = np.abs(places - np.roll(places, -1))
    assert gaps.max(initial=0) <= 2


def test_ring_line_interleaves():
    assert ring_line(np.arange(5), 5).tolist() == [0, 2, 4, 3, 1]
    assert ring_line(np.arange(6), 6).tolist() == [0, 2, 4, 5, 3, 1]


# --------------------------------------------------------------------------- routed flows


def grid_flows(side: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (line, index) pair of a ``side x side`` grid."""
    lines = np.arange(side)
    return np.repeat(lines, side), np.tile(lines, side)


def routed(side: int, a_dest, b_dest, a_words: float, b_words: float) -> Traffic:
    """Routes A's block ``(r, j)`` to column ``a_dest(r, j)`` of row ``r`` and B's block
    ``(i, c)`` to row ``b_dest(c, i)`` of column ``c``, each flow on its own."""
    routes = Routes(0, 0, side, side)
    line, index = grid_flows(side)
    if a_words:
        routes.add(line, index, line, a_dest(line, index), a_words)
    if b_words:
        routes.add(index, line, b_dest(line, index), line, b_words)
    return routes.traffic(1.0)


@pytest.mark.parametrize("side", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize(("a_words", "b_words"), [(3.0, 5.0), (7.0, 2.0)])
def test_shift_equals_its_routed_flows(side, a_words, b_words):
    """Every block goes from ring position ``p + 1`` of its line to position ``p``."""

    def previous(_line, place):
        return ring_line((ring_position(place, side) - 1) % side, side)

    want = routed(side, previous, previous, a_words, b_words)
    assert shift_traffic(side, a_words, b_words) == want


@pytest.mark.parametrize("side", [1, 2, 3, 4, 5, 7, 8, 16])
@pytest.mark.parametrize(("a_words", "b_words"), [(3.0, 5.0), (7.0, 2.0), (4.0, 0.0), (0.0, 6.0)])
def test_skew_equals_its_routed_flows(side, a_words, b_words):
    def skewed(line, block):
        return ring_line((block - ring_position(line, side)) % side, side)

    assert skew_traffic(side, a_words, b_words) == routed(side, skewed, skewed, a_words, b_words)


@pytest.mark.parametrize("side", [1, 2, 3, 4, 5, 8, 9])
def test_cannons_shift_and_skew_equal_their_routed_flows(side):
    """Cannon's plain ring: every block goes to the previous PE of its line, the first's to
    the last over the whole line; the skew sends block ``j`` of line ``r`` to ``j - r``."""

    def previous(_line, place):
        return (place - 1) % side

    def skewed(line, block):
        return (block - line) % side

    shift = shift_traffic(side, 3.0, 5.0, interleaved=False)
    assert shift == routed(side, previous, previous, 3.0, 5.0)
    assert shift.max_hops == side - 1
    want = routed(side, skewed, skewed, 3.0, 5.0)
    assert skew_traffic(side, 3.0, 5.0, interleaved=False) == want


def test_cannon_waits_on_its_wrap_around_every_step():
    """The same blocks and loads as MeshGEMM on 8 x 8 (A and B in 8 x 8 blocks of 64 words),
    but each of the 7 shifts pays the wrap-around's 7 hops where MeshGEMM's pays 2, and the
    skew is the plain ring's."""
    q, a, b = request(T, (0, 0, 8, 8), 64, 64, 64, WAFER)
    mesh = plan_meshgemm(q, a, b, False, 2.0 * 64**3)
    cannon = plan_meshgemm(q, a, b, False, 2.0 * 64**3, interleaved=False)
    assert (mesh.detail["algorithm"], cannon.detail["algorithm"]) == ("meshgemm", "cannon")
    assert cannon.cost.compute_cycles == mesh.cost.compute_cycles
    skews = [skew_traffic(8, 64.0, 64.0, ring).cycles for ring in (False, True)]
    assert cannon.cost.cycles - mesh.cost.cycles == 7 * (7 - 2) + skews[0] - skews[1]


# --------------------------------------------------------------------------- hand counts


def test_two_by_two_by_hand():
    """[4, 4] @ [4, 4] on 2 x 2: 2 x 2 blocks of 4 words, 8 FMACs a step. The skew swaps
    row 1's blocks of A and column 1's of B (1 hop; PE (1, 1) sends and receives both, 8
    words); the one shift moves every block 1 hop: a step is max(8 FMACs, 8 words) + 1."""
    plan = meshgemm(T, (0, 0, 2, 2), 4, 4, 4)
    skew, step, last = 8 + 1, max(8, 8) + 1, 8
    assert plan.cost.cycles == skew + step + last
    assert plan.cost.traffic.wavelet_hops == (2 + 2) * 4 + 2 * 2 * 2 * 4
    assert plan.cost.compute_cycles == 2 * 8
    assert plan.cost.fmacs == 2 * 8 * 4
    assert plan.cost.scratch_bytes == 2 * (4 + 4) * 4
    assert plan.detail == {"algorithm": "meshgemm", "steps": 2, "binds": "arithmetic"}


def test_three_by_three_by_hand():
    """[6, 6] @ [6, 6] on 3 x 3 (ring 0, 2, 1). Skew of A: row 0 swaps its columns 1 and 2,
    row 1 its columns 0 and 2 (2 hops each), row 2 its 0 and 1: 8 block-hops, one block per
    link direction, 2 hops at most; PE (0, 1) moves both operands' blocks. A shift: 4 hops a
    line, a step max(8, 4 + 4) + 2."""
    plan = meshgemm(T, (0, 0, 3, 3), 6, 6, 6)
    skew, step, last = 8 + 2, 8 + 2, 8
    assert plan.cost.cycles == skew + 2 * step + last
    skew_hops, shift_hops = 2 * 8 * 4, 2 * (2 * 4 * 3 * 4)
    assert plan.cost.traffic.wavelet_hops == skew_hops + shift_hops
    assert plan.cost.traffic.max_link == 4 + 2 * 4


def test_four_by_four_by_hand():
    """[8, 8] @ [8, 8] on 4 x 4 (ring 0, 2, 3, 1; rows' ring positions 0, 3, 1, 2). Skew of
    A: row 1 sends 0->2, 1->3, 2->1, 3->0, two blocks on link (1, 2) each way; 20 block-hops
    in all (4 + 8 + 2 + 6), 3 hops at most (row 3's 0->3). Three shifts of max(8, 8) + 2."""
    plan = meshgemm(T, (0, 0, 4, 4), 8, 8, 8)
    skew, step, last = 2 * 4 + 3, 8 + 2, 8
    assert plan.cost.cycles == skew + 3 * step + last
    assert plan.cost.traffic.wavelet_hops == 2 * 20 * 4 + 3 * (2 * 2 * 3 * 4 * 4)
    assert plan.cost.traffic.max_hops == 3 + 2


def test_resident_b_is_not_skewed():
    """A resident B is laid out skewed when the program loads: only A's skew remains."""
    wafer, resident = (
        meshgemm(T, (0, 0, 3, 3), 6, 6, 6),
        meshgemm(T, (0, 0, 3, 3), 6, 6, 6, RESIDENT),
    )
    assert wafer.cost.traffic.wavelet_hops - resident.cost.traffic.wavelet_hops == 8 * 4
    assert resident.cost.cycles == wafer.cost.cycles - 4  # PE (0, 1) sends A's block only


def test_one_pe_only_multiplies():
    plan = meshgemm(T, (0, 0, 1, 1), 3, 5, 2)
    assert plan.cost.traffic == NO_TRAFFIC
    assert plan.cost.cycles == 3 * 5 * 2


@pytest.mark.parametrize(
    ("m", "n", "k", "available", "side"),
    [(4096, 4096, 4096, 720, 683), (64, 64, 64, 8, 8), (9, 100, 100, 4, 3), (100, 100, 2, 8, 2)],
)
def test_mesh_side_leaves_no_pe_empty(m, n, k, available, side):
    assert mesh_side(m, n, k, available) == side
    for extent in (m, n, k):
        assert -(-extent // -(-extent // side)) == side


# --------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("batch", "m", "k", "n", "rect"),
    [
        ((), 5, 7, 3, (0, 0, 4, 4)),
        ((), 9, 11, 10, (1, 2, 5, 4)),
        ((), 16, 16, 16, (0, 0, 4, 4)),
        ((), 3, 2, 4, (0, 0, 8, 8)),
        ((2,), 7, 6, 5, (0, 0, 3, 3)),
    ],
)
def test_the_schedule_computes_the_product(batch, m, k, n, rect):
    """Runs the plan's schedule on its tiles, every PE at once: the skew as ``skew_traffic``
    routes it, then each step a block product and a shift from the next ring position.
    Integer values: exact."""
    rng = np.random.default_rng(5)
    a = rng.integers(-9, 9, (*batch, m, k)).astype(np.float64)
    b = rng.integers(-9, 9, (k, n)).astype(np.float64)
    plan = plan_meshgemm(*request(T, rect, m, k, n, WAFER, batch), False, 0.0)
    a_at, b_at = plan.inputs
    assert a_at is not None and b_at is not None
    side = plan.detail["steps"]
    a_tiles, b_tiles = DistTensor.scatter(a, a_at).tiles, DistTensor.scatter(b, b_at).tiles
    b_tiles = b_tiles.reshape(side, side, *[1] * len(batch), *b_tiles.shape[2:])
    line, block = grid_flows(side)
    dest = ring_line((block - ring_position(line, side)) % side, side)
    a_now, b_now = np.empty_like(a_tiles), np.empty_like(b_tiles)
    a_now[line, dest], b_now[dest, line] = a_tiles[line, block], b_tiles[block, line]
    after = ring_line((ring_position(np.arange(side), side) + 1) % side, side)
    out = np.zeros(plan.outputs[0].tile_shape())
    for _ in range(side):
        out += a_now @ b_now
        a_now, b_now = a_now[:, after], b_now[after, :]
    assert (DistTensor(plan.outputs[0], out).gather() == a @ b).all()


# --------------------------------------------------------------------------- where it wins


def test_beats_summa_near_full_wafer():
    """4096^3 on 720 x 720 PEs: MeshGEMM's steps wait for two hops of flight each, SUMMA's
    for broadcasts across the grid, a few blocks at a time (WaferLLM: SUMMA below 50 % of
    peak near full wafer, MeshGEMM above 70 %); the matmul plan takes MeshGEMM there, and
    SUMMA on 256 x 256, where the flight is short against the blocks (both lose to the
    streaming kernel on the resident B, which pays the flight once)."""
    for name, fastest in (("mesh720x720", "meshgemm"), ("mesh256x256", "summa")):
        target = get_target(name)
        mesh, base = (
            meshgemm(target, target.whole, 4096, 4096, 4096, RESIDENT),
            summa(target, target.whole, 4096, 4096, 4096, RESIDENT),
        )
        assert utilization(mesh, target, target.whole) > 0.8
        q, _, _ = request(target, target.whole, 4096, 4096, 4096, RESIDENT)
        assert min(mesh, base, key=lambda p: p.cost.cycles).detail["algorithm"] == fastest
        assert Matmul("matmul").plan(q).detail["algorithm"] == "stream-resident"
    assert utilization(base, target, target.whole) > 0.9
    wide = get_target("mesh720x720")
    assert utilization(summa(wide, wide.whole, 4096, 4096, 4096, RESIDENT), wide, wide.whole) < 0.7


@pytest.mark.parametrize(
    ("rect", "m", "k", "n"),
    [((0, 0, 16, 16), 8, 4096, 4096), ((0, 0, 16, 16), 256, 2, 256)],
)
def test_loses_on_skinny_or_tiny_matmuls(rect, m, k, n):
    """Few result rows (or a short contraction) shrink MeshGEMM's square to a few PEs; the
    SUMMA plans use the whole rectangle."""
    wse2 = get_target("wse2")
    best = min(
        p.cost.cycles
        for p in (summa(wse2, rect, m, k, n, RESIDENT), split_k(wse2, rect, m, k, n, RESIDENT))
        if p is not None
    )
    assert meshgemm(wse2, rect, m, k, n, RESIDENT).cost.cycles > best
    q, _, _ = request(wse2, rect, m, k, n, RESIDENT)
    assert Matmul("matmul").plan(q).detail["algorithm"] != "meshgemm"


TABLE = [
    ("4096^3", "mesh256x256", None, (4096, 4096, 4096)),
    ("4096^3", "mesh720x720", None, (4096, 4096, 4096)),
    ("resnet50 res3 1x1", "wse2", (0, 0, 16, 16), (8 * 28 * 28, 512, 128)),
    ("resnet50 res4 3x3", "wse2", (0, 0, 20, 20), (8 * 14 * 14, 256 * 9, 256)),
    ("resnet50 fc", "wse2", (0, 0, 16, 24), (8, 2048, 1000)),
    ("gpt2 qkv", "wse2", (0, 0, 16, 24), (1024, 768, 2304)),
    ("gpt2 mlp up", "wse2", (0, 0, 20, 20), (1024, 768, 3072)),
    ("gpt2 mlp down", "wse2", (0, 0, 20, 20), (1024, 3072, 768)),
]


@pytest.mark.parametrize(("label", "name", "rect", "dims"), TABLE)
def test_the_matmul_plan_takes_the_fastest_kernel(label, name, rect, dims):
    """Per layer, SUMMA, split-K SUMMA, MeshGEMM or the streaming kernel on the resident B,
    whichever is sooner among those whose tiles and scratch fit a PE's SRAM (else the least
    overflow); each a share of the rectangle's peak."""
    target = get_target(name)
    rect = rect or target.whole
    m, k, n = dims
    plans = [summa(target, rect, m, k, n, RESIDENT), meshgemm(target, rect, m, k, n, RESIDENT)]
    plans += [p for p in [split_k(target, rect, m, k, n, RESIDENT)] if p is not None]
    q, a, b = request(target, rect, m, k, n, RESIDENT)
    out = Layout.on((m, n), "float32", rect)
    plans.append(Matmul._plan_resident_stream(q, a, b, out, 2.0 * m * k * n))
    assert all(0 < utilization(p, target, rect) <= 1 for p in plans)
    chosen = Matmul("matmul").plan(q)
    least = min(sram_overflow(p, target) for p in plans)
    assert sram_overflow(chosen, target) == least
    assert chosen.cost.cycles == min(
        p.cost.cycles for p in plans if sram_overflow(p, target) == least
    )


def test_the_gemm_kernels_name_the_term_that_binds_them():
    """4096^3 in float16 on 720 x 720 PEs: 6 x 6 blocks, 54 cycles of arithmetic a step.
    Cannon waits on its wrap-around's 719 hops every step, SUMMA on its panels' flight (719
    hops every six steps), MeshGEMM's two-hop shifts hide behind its arithmetic; on 90 x 90
    (46 x 46 blocks) SUMMA computes too."""

    def plans(side: int) -> dict[str, Plan]:
        target = get_target(f"mesh{side}x{side}")
        rect, shape, flops = (0, 0, side, side), (4096, 4096), 2.0 * 4096**3
        a, b = (Operand(shape, "float16", WAFER, Layout.on(shape, "float16", rect)),) * 2
        q = PlanRequest(target, rect, (a, b), {}, ((shape, "float16"),))
        out = Layout.on(shape, "float16", rect)
        return {
            "summa": Matmul._plan_summa(q, a, b, out, flops),
            "cannon": plan_meshgemm(q, a, b, False, flops, interleaved=False),
            "meshgemm": plan_meshgemm(q, a, b, False, flops),
        }

    binds = {name: plan.detail["binds"] for name, plan in plans(720).items()}
    assert binds == {
        "summa": "the panels' flight",
        "cannon": "the shifts' flight",
        "meshgemm": "arithmetic",
    }
    assert plans(90)["summa"].detail["binds"] == "arithmetic"
