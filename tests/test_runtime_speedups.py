"""The simulator's fast paths give the numbers of the plain ones: ``erf`` of float32 values
correctly rounded, tensors that keep their logical arrays, reductions split as the grid splits
their axes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cgc.machine import plans
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Layout
from cgc.machine.plans.kernel import WAFER, Operand
from cgc.machine.reference.arithmetic import erf
from cgc.runtime import kernels
from cgc.runtime.tiles import DistTensor

T = Target("t", 8, 8, 48 * 1024, 850e6)


def test_erf_of_float32_is_correctly_rounded():
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, np.inf, -np.inf, 1e-45, 1e-30, 0.46875, 3.92, 4.0, 10.0, 3e38]
    grid = np.concatenate(
        [
            np.linspace(-6, 6, 200_001, dtype=np.float32),
            np.array(special, dtype=np.float32),
            (10.0 ** rng.uniform(-40, 1.5, 50_000)).astype(np.float32),
        ]
    )
    grid = np.concatenate([grid, -grid])
    got = erf(grid)
    want = np.array([math.erf(float(v)) for v in grid]).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert np.signbit(got[grid == 0]).tolist() == np.signbit(grid[grid == 0]).tolist()
    assert np.isnan(erf(np.array([np.nan, -np.nan], dtype=np.float32))).all()


@pytest.mark.parametrize("dtype", ["int16", "float16", "bool"])
def test_erf_of_narrow_types_is_float32(dtype):
    x = np.array([0, 1, 3, 7], dtype=np.float64).astype(dtype)
    want = np.array([math.erf(float(v)) for v in x.astype(np.float64)]).astype(np.float32)
    np.testing.assert_array_equal(erf(x), want)


def test_tensor_keeps_its_array_and_makes_tiles_when_asked():
    a = np.arange(2 * 5 * 7, dtype=np.float32).reshape(2, 5, 7)
    lay = Layout(a.shape, "float32", 0, 0, 2, 3)
    dist = DistTensor.scatter(a, lay)
    assert dist.has_array and dist.gather() is not None
    tiles = dist.tiles
    assert tiles.shape == lay.tile_shape()
    pad = ~np.broadcast_to(lay.valid_mask(), lay.tile_shape())
    assert (tiles[pad] == 0).all()
    back = DistTensor(lay, tiles)
    assert not back.has_array
    np.testing.assert_array_equal(back.gather(), a)
    other = Layout(a.shape, "float32", 1, 1, 5, 1)
    moved = back.relaid(other)
    assert moved.has_array and moved.layout == other
    np.testing.assert_array_equal(moved.tiles.reshape(5, 1, 2, 1, 7)[:, 0, :, 0], a.swapaxes(0, 1))


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_max", "reduce_mean", "reduce_prod"])
@pytest.mark.parametrize("axes", [[0], [1], [2], [1, 2], [0, 2]])
@pytest.mark.parametrize("tiled", [False, True])
def test_reduce_over_split_axes(name, axes, tiled):
    """Padded grid splits (reduceat) and whole ones (reshape) of the reduced axes, from a
    tensor's array or from its tiles with garbage in the padding."""
    a = np.random.default_rng(1).uniform(0.5, 1.5, (3, 10, 7)).astype(np.float32)
    lay = Layout(a.shape, "float32", 0, 0, 3, 3)  # rows 10 over 3 (4, 4, 2), cols 7 (3, 3, 1)
    operand = Operand(a.shape, "float32", WAFER, lay)
    shape = tuple(1 if i in axes else d for i, d in enumerate(a.shape))
    attrs = {"axes": axes, "keepdims": True}
    plan = plans.plan(name, T, (0, 0, 4, 4), [operand], attrs, [(shape, "float32")])
    value = DistTensor.scatter(a, plan.inputs[0])
    if tiled:
        tiles = value.tiles.copy()
        tiles[~np.broadcast_to(value.layout.valid_mask(), tiles.shape)] = np.nan
        value = DistTensor(value.layout, tiles)
    (out,) = kernels.run(name, plan, [value], attrs)
    numpy = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_mean": np.mean}
    want = numpy.get(name, np.prod)(a, axis=tuple(axes), keepdims=True)
    np.testing.assert_allclose(out.gather(), want, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("per_pe", range(2, kernels._SHORT + 1))
def test_short_per_pe_sums_are_numpys_bit_for_bit(dtype, per_pe):
    """The per-PE partial sums of a few elements each along the last axis, in whole-array
    steps, are numpy's reduce (runs of a whole number) and reduceat (a shorter last run), bit
    for bit, signed zeros, infinities and subnormals too (a NaN stays a NaN)."""
    rng = np.random.default_rng(per_pe)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3e38, -3e38, 1, -1])
    for size in range(1, 4 * per_pe + 2):
        for values in (rng.standard_normal((6, size)), rng.choice(special, (6, size))):
            a = values.astype(dtype)
            with np.errstate(all="ignore"):
                got = kernels._per_pe(np.add, a, 1, per_pe)
                if size % per_pe:
                    want = np.add.reduceat(a, np.arange(0, size, per_pe), axis=-1)
                else:
                    want = np.add.reduce(a.reshape(6, size // per_pe, per_pe), axis=-1)
            assert np.array_equal(np.isnan(got), np.isnan(want))
            finite = ~np.isnan(want)
            assert got[finite].tobytes() == want[finite].tobytes(), (size, a)
