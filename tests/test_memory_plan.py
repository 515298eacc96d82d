"""The weight-streaming memory plan: micro-batches and recomputed activations where a batch
does not fit the SRAM, checked exactly; what does not fit at all is one line naming the layer
and its bytes (or MemoryX's shortfall)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from conftest import token_batch

import cgc
from cgc.compiler.memory import divisors
from cgc.frontends import zoo
from cgc.machine.hardware.target import get_target
from cgc.machine.timing.cost import program_peak
from cgc.runtime.cluster import Cluster

MESH = get_target("mesh8x8")


def with_sram(nbytes: int):
    return dataclasses.replace(MESH, name=f"mesh8x8-{nbytes}", sram_bytes_per_pe=nbytes)


def planned(tiny: Path, sram: int, **options):
    artifact = cgc.prepare_training(str(tiny), num_csx=1, target=with_sram(sram), **options)[0]
    return artifact, artifact.manifest["memory_plan"]


def test_divisors():
    assert divisors(12) == [12, 6, 4, 3, 2, 1]
    assert divisors(36) == [36, 18, 12, 9, 6, 4, 3, 2, 1]
    assert divisors(1) == [1]
    assert divisors(97) == [97, 1]
    # 10**12 = 2**12 * 5**12: 13 * 13 divisors, found in a million steps, not 10**12
    large = divisors(10**12)
    assert len(large) == 169 and large == sorted(large, reverse=True)
    assert large[:3] == [10**12, 5 * 10**11, 25 * 10**10] and large[-3:] == [4, 2, 1]
    assert all(10**12 % d == 0 for d in large)


def test_a_batch_that_fits_runs_whole(tiny):
    artifact, plan = planned(tiny, 48 * 1024)
    assert (plan["micro_batch"], plan["micro_batches"], plan["recompute"]) == (8, 1, False)
    assert artifact.manifest["per_system_batch"] == 8
    assert "micro-batch" not in artifact.manifest["mode_reason"]


@pytest.mark.parametrize("sram", [2 * 1024, 4 * 1024, 6 * 1024])
def test_the_plan_fits_exactly_and_is_the_largest_that_does(tiny, sram):
    artifact, plan = planned(tiny, sram)
    peak = program_peak(artifact.program, with_sram(sram)).bytes_per_pe
    assert peak == plan["peak_sram_bytes_per_pe"] <= sram
    assert plan["micro_batch"] * plan["micro_batches"] == 8
    if plan["micro_batch"] < 8:  # the next larger micro-batch would not fit, as planned
        larger = [d for d in divisors(8) if d > plan["micro_batch"]][-1]
        bigger, _ = planned(tiny, 10**6, micro_batch_size=larger, recompute=plan["recompute"])
        assert program_peak(bigger.program, with_sram(sram)).bytes_per_pe > sram
        assert f"{plan['micro_batches']} micro-batches of" in artifact.manifest["mode_reason"]


def test_recompute_when_nothing_else_fits(tiny):
    # one sample keeping every activation needs about 2 KB a PE; recomputing, about 1.2 KB
    artifact, plan = planned(tiny, 1536)
    assert plan["recompute"] and plan["micro_batch"] == 1
    names = [layer.name for layer in artifact.program.layers]
    assert "h.0.attn.q_proj.recompute" in names and "h.1.mlp.fc_out.recompute" in names
    assert "recomputed per segment" in artifact.manifest["mode_reason"]


def test_micro_batches_and_recompute_train_as_the_whole_batch(tiny):
    """Gradient accumulation over micro-batches and recomputed activations give the step of
    the whole batch, to float32 rounding (SGD: Adam's normalization would magnify it)."""
    data = token_batch(8, seed=3)
    results = []
    for sram in (48 * 1024, 2 * 1024, 1536):
        artifact, _ = planned(tiny, sram, init_seed=0, optimizer="sgd", lr=0.5)
        cluster = Cluster(artifact)
        loss, _ = cluster.train_step(data)
        results.append((loss, cluster.memoryx.weights))
    (loss, weights), *others = results
    for other_loss, other_weights in others:
        assert other_loss == pytest.approx(loss, rel=1e-5)
        for name, value in weights.items():
            np.testing.assert_allclose(other_weights[name], value, rtol=1e-4, atol=1e-6)


def test_a_model_that_does_not_fit_one_sample_names_the_layer_and_bytes(tiny):
    with pytest.raises(cgc.CgcError) as error:
        planned(tiny, 1024)
    message = str(error.value)
    assert "does not fit the SRAM of mesh8x8-1024 even 1 sample at a time" in message
    assert "with activations recomputed per segment" in message
    assert "layer 'h." in message and "bytes" in message and "a PE has 1024" in message


def test_options_fix_the_plan(tiny):
    _, plan = planned(tiny, 48 * 1024, micro_batch_size=2, recompute=True)
    assert (plan["micro_batch"], plan["micro_batches"], plan["recompute"]) == (2, 4, True)
    with pytest.raises(cgc.CgcError, match=r"^micro_batch_size 3 does not divide"):
        planned(tiny, 48 * 1024, micro_batch_size=3)
    with pytest.raises(cgc.CgcError, match="even 4 samples at a time"):
        planned(tiny, 2 * 1024, micro_batch_size=4, recompute=False)


def test_an_onnx_model_is_split_by_importing_it_again():
    model = zoo.mlp(in_features=64, hidden=(256, 256), classes=10, with_loss=True)
    whole = cgc.prepare_training(model, batch_size=16, target=MESH)[0]
    peak = whole.manifest["memory_plan"]["peak_sram_bytes_per_pe"]
    small = dataclasses.replace(MESH, name="small", sram_bytes_per_pe=peak - 1)
    split = cgc.prepare_training(model, batch_size=16, target=small)[0]
    plan = split.manifest["memory_plan"]
    assert plan["micro_batches"] > 1 and plan["peak_sram_bytes_per_pe"] <= peak - 1
    assert split.manifest["inputs"][0]["shape"][0] == plan["micro_batch"]
    with pytest.raises(cgc.CgcError, match=r"^recompute: the model has no segments"):
        cgc.prepare_training(model, batch_size=16, target=MESH, recompute=True)


def test_memoryx_too_small_names_the_bytes_and_the_largest_weight(tiny):
    small = dataclasses.replace(MESH, name="mx", memoryx_capacity_bytes=100_000)
    with pytest.raises(cgc.CgcError) as error:
        cgc.prepare_training(str(tiny), target=small)
    message = str(error.value)
    assert message.startswith("tiny.yaml does not fit MemoryX: it needs 301.0 KiB")
    assert "optimizer state 150.5 KiB" in message
    assert "the largest weight is 'h.0.mlp.fc_in.weight' (8.0 KiB)" in message
    # inference keeps the weights alone, which fit
    cgc.compile(str(tiny), mode="weight_streaming", target=small)
