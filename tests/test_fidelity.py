"""The fidelity harness (``benchmarks/fidelity.py``): its set-ups measure what they claim, and
its page flags what disagrees."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from cgc.machine.hardware.target import get_target

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "fidelity.py"
sys.path.insert(0, str(PATH.parent))  # its sibling, fidelity_parameters
spec = importlib.util.spec_from_file_location("fidelity", PATH)
assert spec is not None and spec.loader is not None
fidelity = importlib.util.module_from_spec(spec)
sys.modules["fidelity"] = fidelity  # its dataclasses look their module up
spec.loader.exec_module(fidelity)
fidelity_parameters = sys.modules["fidelity_parameters"]


@pytest.mark.parametrize("algorithm", ["summa", "cannon", "meshgemm"])
def test_forced_gemm_counts_2mnk_and_its_efficiency_is_the_hand_one(algorithm):
    shapes = (64, 96, 32)
    plan = fidelity.forced_gemm(algorithm, 8, shapes, "float16")
    assert plan.detail["algorithm"] == algorithm
    assert plan.cost.flops == 2 * 64 * 96 * 32
    assert plan.cost.arrival_cycles == 0  # the operands are where the kernel wants them
    target = get_target("mesh8x8")
    hand = 2 * 64 * 96 * 32 / (plan.cost.cycles * 64 * 2 * 4)  # four f16 FMACs a PE
    assert fidelity.efficiency(plan.cost.flops, plan.cost.cycles, 64, target, "float16") == hand


def test_compiled_gemm_reports_the_planners_kernel():
    algorithm, cycles, eff = fidelity.chosen_gemm(8, "float32", shapes=(64, 96, 32))
    assert algorithm in ("summa", "meshgemm", "summa-split-k")
    assert eff == pytest.approx(2 * 64 * 96 * 32 / (cycles * 64 * 2))  # one f32 FMAC a PE


def test_link_figures_are_one_wavelet_and_one_hop_a_cycle():
    assert fidelity.transfer_cycles(1000, 10) == 1010
    assert fidelity.transfer_cycles(1000, 20) == 1020


def test_allreduce_crosses_the_mesh():
    cycles, kernels = fidelity.allreduce_cycles(8, 6)
    assert [k.name for k in kernels] == ["reduce_sum", "add"]
    assert cycles == sum(k.cycles for k in kernels)
    assert cycles >= 8 + 6  # a sum over every PE is at least a diameter away from one


def test_bicgstab_iteration_has_its_kernels():
    import cgc

    artifact = cgc.compile(
        fidelity.bicgstab_model((4, 4, 4)), mode="weight_streaming", target="mesh4x4"
    )
    names = [k.name for k in fidelity._all_kernels(artifact)]
    assert names.count("reduce_sum") == 4  # four dot products
    assert names.count("slice") == 12  # two stencils of six neighbours


def test_scaled_figures():
    wse2 = get_target("wse2")
    assert fidelity_parameters.scaled(wse2, "swarmx_fanout", 0.5).swarmx_fanout == 2
    assert fidelity_parameters.scaled(wse2, "clock_hz", 2.0).clock_hz == 2 * wse2.clock_hz
    assert fidelity_parameters.scaled(wse2, "io_bytes_per_s", 0.5).memoryx_bytes_per_s == 150e9


def row(**given):
    fields = {"figure": "f", "source": "S0", "published": "p", "predicted": 1.0,
              "unit": "u", "why": "w"}  # fmt: skip
    return fidelity.Row(**{**fields, **given})


@pytest.mark.parametrize(
    ("predicted", "reference", "agrees"),
    [(1.14, 1.0, True), (0.86, 1.0, True), (1.16, 1.0, False), (0.84, 1.0, False)],
)
def test_a_number_agrees_within_fifteen_percent(predicted, reference, agrees):
    assert row(predicted=predicted, reference=reference).agrees is agrees


def test_bands_and_unmodelled_figures():
    assert row(predicted=0.3, band=(0.0, 0.5)).agrees is True
    assert row(predicted=0.6, band=(0.0, 0.5)).agrees is False
    assert row(predicted=None, band=(0.0, 0.5)).agrees is None


def test_the_page_has_a_row_per_figure_and_flags_disagreements():
    rows = [
        row(figure="good", predicted=1.1, reference=1.0),
        row(figure="bad", predicted=2.0, reference=1.0),
        row(figure="none", predicted=None, band=(0.0, 0.5)),
    ]
    page = fidelity.render(rows, [])
    lines = {line.split(" | ")[0][2:]: line for line in page.splitlines() if line.startswith("| ")}
    assert set(lines) >= {"good", "bad", "none"}
    assert "within 15 %" in lines["good"] and "1.10" in lines["good"]
    assert "**outside 15 %**" in lines["bad"] and "2.00" in lines["bad"]
    assert "not modelled" in lines["none"]
    assert "1 of 3 figures agree, 1 not modelled; disagreeing: bad." in page


def test_the_checked_in_page_has_every_figure():
    page = (Path(__file__).resolve().parent.parent / "docs" / "fidelity.md").read_text()
    figures = ["SUMMA efficiency", "MeshGEMM efficiency", "Cannon", "MeshGEMV", "T_R"]
    figures += ["Link bandwidth", "AllReduce", "BiCGStab", "memoryx_update_params_per_s"]
    for figure in figures:
        assert figure in page
