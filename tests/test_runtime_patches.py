"""A convolution's patches kept as its image (``cgc.runtime.patches``): the matmuls that read
them give the products of the patches as the reference makes them, exactly where the
arithmetic is exact (integer values), on strided, padded, grouped and dilated windows over
channels-first and channels-last images; a kernel that is not a matmul gets the reference's
patches. Max pooling folds its taps one kernel position at a time, and padding keeps an
image's memory order."""

from __future__ import annotations

import numpy as np
import pytest

from cgc.machine import plans
from cgc.machine.hardware.target import Target
from cgc.machine.movement.layout import Layout
from cgc.machine.plans import STREAM, WAFER, Operand
from cgc.machine.reference.data_movement import (
    channels_first,
    channels_first_rows,
    im2col_taps_first,
    movement,
    pool,
    taps_first_rows,
    windows,
)
from cgc.runtime import kernels
from cgc.runtime.patches import Patches
from cgc.runtime.tiles import DistTensor

T = Target("t", 8, 8, 48 * 1024, 850e6)
RECT = (0, 0, 4, 4)

WINDOWS = [
    # image (N, C, H, W), kernel, strides, pads, dilations, group
    ((2, 3, 6, 6), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 4, 7, 6), (3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 2),
    ((1, 4, 5, 5), (2, 2), (1, 2), (0, 0, 0, 0), (2, 1), 4),
    ((2, 6, 5, 4), (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    ((2, 2, 9), (3,), (2,), (2, 1), (2,), 1),
]
"""Grouped, strided, padded and dilated windows (and a pointwise and a 1-D one)."""


def _attrs(kernel, strides, pads, dilations, group, channels_last) -> dict:
    return {
        "kernel": list(kernel),
        "strides": list(strides),
        "pads": list(pads),
        "dilations": list(dilations),
        "group": group,
        "channels_last": channels_last,
    }


def _integers(shape, seed: int, dtype: str = "float32") -> np.ndarray:
    """Small integers: every product and sum below is exact in any order."""
    return np.random.default_rng(seed).integers(-4, 5, shape).astype(dtype)


def _plan(name: str, args: list[tuple[tuple[int, ...], str, str]], attrs, out) -> plans.Plan:
    operands = [
        Operand(shape, dtype, source, Layout.on(shape, dtype, RECT) if source == WAFER else None)
        for shape, dtype, source in args
    ]
    return plans.plan(name, T, RECT, operands, attrs, [out])


def _deferred(window, channels_last: bool, dtype: str = "float32"):
    """A deferred im2col from the kernel, its image (in the op's axis order) and its attrs."""
    shape, kernel, strides, pads, dilations, group = window
    image = _integers(shape, 1, dtype)
    if channels_last:
        image = np.ascontiguousarray(np.moveaxis(image, 1, -1))
    attrs = _attrs(kernel, strides, pads, dilations, group, channels_last)
    want = movement("im2col", attrs, [image], ())
    plan = _plan("im2col", [(image.shape, dtype, WAFER)], attrs, (want.shape, dtype))
    value = DistTensor.scatter(image, plan.inputs[0])
    (patches,) = kernels.run("im2col", plan, [value], attrs)
    assert isinstance(patches.deferred, Patches)
    return patches, want, attrs


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("source", [STREAM, WAFER])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_matmul_of_deferred_patches_is_the_product_of_the_patches(
    window, channels_last, source, dtype
):
    patches, want, _ = _deferred(window, channels_last, dtype)
    group, _, columns = want.shape
    filters = _integers((group, columns, 5), 2, dtype)
    args = [(want.shape, dtype, WAFER), (filters.shape, dtype, source)]
    plan = _plan("matmul", args, {}, ((group, want.shape[1], 5), dtype))
    moved = patches.relaid(plan.inputs[0])
    assert moved.deferred is patches.deferred  # the VM's relayout keeps the recipe
    right = filters if source == STREAM else DistTensor.scatter(filters, plan.inputs[1])
    (got,) = kernels.run("matmul", plan, [moved, right], {})
    product = want.astype(np.float32) @ filters.astype(np.float32)
    np.testing.assert_array_equal(got.gather(), product.astype(dtype))
    # the same kernel on the patches made gives the same numbers
    made = DistTensor.scatter(want, plan.inputs[0])
    (plain,) = kernels.run("matmul", plan, [made, right], {})
    np.testing.assert_array_equal(got.gather(), plain.gather())


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_filter_gradient_of_deferred_patches_is_in_the_ops_row_order(
    window, channels_last, dtype
):
    patches, want, _ = _deferred(window, channels_last, dtype)
    group, rows, columns = want.shape
    gradient = _integers((group, rows, 3), 3, dtype)
    args = [(want.shape, dtype, WAFER), (gradient.shape, dtype, WAFER)]
    plan = _plan("matmul_transpose_a", args, {}, ((group, columns, 3), dtype))
    right = DistTensor.scatter(gradient, plan.inputs[1])
    (got,) = kernels.run("matmul_transpose_a", plan, [patches.relaid(plan.inputs[0]), right], {})
    product = np.swapaxes(want, -1, -2).astype(np.float32) @ gradient.astype(np.float32)
    np.testing.assert_array_equal(got.gather(), product.astype(dtype))


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_other_kernels_read_the_reference_patches(window, channels_last):
    """A consumer that is not a matmul makes the patches in the op's order, bit for bit from
    values that are not integers, and their tiles."""
    shape, kernel, strides, pads, dilations, group = window
    image = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    if channels_last:
        image = np.ascontiguousarray(np.moveaxis(image, 1, -1))
    attrs = _attrs(kernel, strides, pads, dilations, group, channels_last)
    want = movement("im2col", attrs, [image], ())
    plan = _plan("im2col", [(image.shape, "float32", WAFER)], attrs, (want.shape, "float32"))
    (patches,) = kernels.run("im2col", plan, [DistTensor.scatter(image, plan.inputs[0])], attrs)
    args = [(want.shape, "float32", WAFER)]
    neg = _plan("neg", args, {}, (want.shape, "float32"))
    (negated,) = kernels.run("neg", neg, [patches.relaid(neg.inputs[0])], {})
    np.testing.assert_array_equal(negated.gather(), -want)
    np.testing.assert_array_equal(patches.gather(), want)
    assert patches.deferred is None  # made once, kept
    np.testing.assert_array_equal(patches.tiles, DistTensor.scatter(want, patches.layout).tiles)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_taps_first_patches_are_the_patches_with_their_columns_permuted(window, channels_last):
    shape, kernel, strides, pads, dilations, group = window
    image = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    attrs = _attrs(kernel, strides, pads, dilations, group, False)
    want = movement("im2col", attrs, [image], ())
    view = np.moveaxis(np.moveaxis(image, 1, -1).copy(), -1, 1) if channels_last else image
    got = im2col_taps_first(view, kernel, strides, pads, dilations, group)
    taps = int(np.prod(kernel))
    columns = np.arange(want.shape[-1])[None, :, None]
    order = taps_first_rows(columns, taps)[0, :, 0]
    np.testing.assert_array_equal(got, want[..., order])
    filters = np.random.default_rng(6).standard_normal((group, want.shape[-1], 3))
    np.testing.assert_array_equal(
        channels_first_rows(taps_first_rows(filters, taps), taps), filters
    )
    assert not np.array_equal(order, np.sort(order)) or taps == 1 or want.shape[-1] == taps


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pooling_folds_taps_as_a_reduction_would(window, channels_last):
    """The maximum of every window, NaN propagating and padding at minus infinity, equal
    to numpy's reduction over the windows."""
    shape, kernel, strides, pads, dilations, _ = window
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    x.flat[::7] = -np.inf
    x.flat[0] = np.nan  # read by the first window
    if channels_last:
        x = channels_first(np.ascontiguousarray(np.moveaxis(x, 1, -1)), True)
    got = pool("max_pool", x, kernel, strides, pads, dilations)
    taps = windows(x, kernel, strides, pads, dilations, -np.inf)
    want = taps.max(axis=tuple(range(-len(kernel), 0)))
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got).any()


def test_padding_keeps_a_channels_last_image_channels_last():
    """Windows of a padded channels-last image seen channels-first step one element per
    channel: the padded copy keeps the image's memory order."""
    last = np.random.default_rng(8).standard_normal((2, 5, 6, 4)).astype(np.float32)
    image = channels_first(last, True)
    view = windows(image, (3, 3), (1, 1), (1, 2, 1, 0), (1, 1), 0.0)
    assert view.strides[1] == last.itemsize
    padded = np.pad(image, ((0, 0), (0, 0), (1, 1), (2, 0)))
    np.testing.assert_array_equal(view, windows(padded, (3, 3), (1, 1), (0,) * 4, (1, 1), 0.0))


def _counted(monkeypatch) -> list[int]:
    """How many times a filter's rows are ordered from now on (one element per time)."""
    orderings: list[int] = []
    order = Patches.filter_rows

    def counted(self, filters):
        orderings.append(1)
        return order(self, filters)

    monkeypatch.setattr(Patches, "filter_rows", counted)
    return orderings


def test_a_filters_rows_are_ordered_once_per_tensor(monkeypatch):
    orderings = _counted(monkeypatch)
    patches, want, _ = _deferred(WINDOWS[0], True)
    filters = _integers((1, want.shape[2], 5), 2)
    args = [(want.shape, "float32", WAFER), (filters.shape, "float32", WAFER)]
    plan = _plan("matmul", args, {}, ((1, want.shape[1], 5), "float32"))
    right = DistTensor.scatter(filters, plan.inputs[1])
    first, again = (kernels.run("matmul", plan, [patches, right], {})[0] for _ in range(2))
    assert len(orderings) == 1
    np.testing.assert_array_equal(first.gather(), again.gather())
    kernels.run("matmul", plan, [patches, DistTensor.scatter(filters, plan.inputs[1])], {})
    assert len(orderings) == 2  # another tensor orders its own


def test_a_weights_rows_serve_its_artifacts_runs_until_the_weight_is_replaced(monkeypatch):
    """Each run opens a cluster of its own; the weights laid out on the wafer (and a filter's
    rows ordered there) serve the artifact's later runs while it holds the same arrays, which
    no one writes to; a weight given a new array (as training gives one) is laid out anew."""
    import dataclasses

    import cgc
    from cgc.frontends import zoo

    model = zoo.MODELS["cnn"]()
    artifact = cgc.compile(model, mode="pipelined", target="mesh16x16", batch_size=2)
    x = zoo.sample_inputs(model, 2, seed=0)
    orderings = _counted(monkeypatch)
    first = cgc.run(artifact, x)
    ordered = len(orderings)
    assert ordered
    np.testing.assert_array_equal(cgc.run(artifact, x)["logits"], first["logits"])
    assert len(orderings) == ordered
    with pytest.raises(ValueError, match="read-only"):
        artifact.weights["conv2.weight"][0] = 0
    artifact.weights["conv2.weight"] = artifact.weights["conv2.weight"] * -2
    changed = cgc.run(artifact, x)
    assert len(orderings) > ordered
    assert not np.array_equal(changed["logits"], first["logits"])
    # an artifact of the same weights that never ran before computes them all anew
    fresh = dataclasses.replace(artifact, weights=dict(artifact.weights))
    np.testing.assert_array_equal(cgc.run(fresh, x)["logits"], changed["logits"])
