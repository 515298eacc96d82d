"""cgc.machine.movement.window_flows: im2col's traffic counted by tap ranges equals the per-element
oracle (traffic.gather_traffic) and the general engine (flows.movement_traffic), wherever it
applies; elsewhere the engine answers."""

from __future__ import annotations

import dataclasses
from math import prod

import numpy as np
import pytest

from cgc.machine import reference
from cgc.machine.movement import flows, window_flows
from cgc.machine.movement.layout import Layout, grid_extent, matrix_dims
from cgc.machine.movement.traffic import Traffic, gather_traffic
from cgc.machine.movement.window_segments import collide

SEEDS = range(60)


@pytest.fixture(autouse=True)
def count_afresh():
    """Every test counts afresh, by tap ranges and by the engine alike."""
    window_flows._window_traffic.cache_clear()
    flows._exact_traffic.cache_clear()
    yield
    window_flows._window_traffic.cache_clear()
    flows._exact_traffic.cache_clear()


def fields(t: Traffic) -> tuple:
    return dataclasses.astuple(t)


def random_attrs(rng, spatial: int, channels_last: bool) -> dict:
    kernel = [int(rng.integers(1, 4)) for _ in range(spatial)]
    return {
        "kernel": kernel,
        "strides": [int(rng.integers(1, 4)) for _ in range(spatial)],
        "pads": [int(rng.integers(0, 3)) for _ in range(2 * spatial)],
        "dilations": [int(rng.integers(1, 3)) for _ in range(spatial)],
        "group": 1,
        "channels_last": channels_last,
    }


def random_layout(rng, shape, dtype: str, fold: bool) -> Layout:
    """A layout at a random place, on a random grid (both folded and not)."""
    _, rows, cols = matrix_dims(shape, fold)
    return Layout(
        tuple(shape),
        dtype,
        int(rng.integers(0, 4)),
        int(rng.integers(0, 4)),
        grid_extent(rows, int(rng.integers(1, 8))),
        grid_extent(cols, int(rng.integers(1, 8))),
        fold,
    )


def oracle(attrs: dict, src: Layout, out: Layout) -> Traffic:
    return gather_traffic(out, [(src, reference.im2col_sources(src.shape, attrs))])


def counted(attrs: dict, src: Layout, out: Layout) -> Traffic:
    """The traffic by tap ranges, which must apply."""
    found = window_flows._window_traffic(window_flows.Windows(attrs, src, out))
    assert found is not None
    return found


@pytest.mark.parametrize("seed", SEEDS)
def test_tap_ranges_count_what_the_oracle_counts(seed):
    """Random windows (strides, padding, dilation, batches, one to three spatial axes),
    channels-last or channels-first images, folded or not, each layout anywhere on its own
    grid: the same traffic as element by element, and as the engine."""
    rng = np.random.default_rng(seed)
    last = bool(rng.random() < 0.5)
    spatial = int(rng.integers(1 if last else 2, 4))
    attrs = random_attrs(rng, spatial, last)
    k, d, pads = attrs["kernel"], attrs["dilations"], attrs["pads"]
    sizes = [  # at least one window along every axis
        max(1, d[i] * (k[i] - 1) + 1 - pads[i] - pads[spatial + i]) + int(rng.integers(0, 5))
        for i in range(spatial)
    ]
    batch, channels = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    image = (batch, *sizes, channels) if last else (batch, channels, *sizes)
    patches = reference.im2col_sources(image, attrs).shape
    dtype = str(rng.choice(["float32", "float16"]))
    src = random_layout(rng, image, dtype, fold=last and bool(rng.random() < 0.5))
    out = random_layout(rng, patches, dtype, fold=bool(rng.random() < 0.5))
    got = counted(attrs, src, out)
    assert fields(got) == fields(oracle(attrs, src, out))
    assert fields(got) == fields(flows.movement_traffic("im2col", attrs, [src], out))


def test_a_first_convolution_on_many_windows_matches_the_engine():
    """A 7x7 stride-2 convolution on a 3-channel image, as ResNet's first, with more windows
    than numpy's unravel_index handles in one buffer: the engine's count, at less cost."""
    attrs = {
        "kernel": [7, 7],
        "strides": [2, 2],
        "pads": [3, 3, 3, 3],
        "dilations": [1, 1],
        "group": 1,
    }
    rect = (0, 0, 202, 202)
    src = Layout.on((1, 3, 192, 192), "float32", rect)
    out = Layout.on(reference.im2col_sources(src.shape, attrs).shape, "float32", rect)
    got = counted(attrs, src, out)
    assert got.max_inject == 48  # each pixel: 16 windows' taps of 3 channels, to 48 columns
    assert fields(got) == fields(flows.movement_traffic("im2col", attrs, [src], out))


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("seed", range(8))
def test_tap_ranges_on_thin_spread_images(last, stride, seed):
    """Larger images, channels-first or (folded) channels-last, a pixel or two per source PE,
    with several taps on each destination PE column (so that ranges whose taps read one pixel
    twice are merged into runs, and the others counted tap by tap) and many destination PE
    rows: the oracle's and the engine's traffic."""
    rng = np.random.default_rng(seed)
    spatial = 3 if seed == 7 else 2
    attrs = random_attrs(rng, spatial, channels_last=last)
    attrs["kernel"] = [int(rng.integers(2, 6)) for _ in range(spatial)]
    attrs["strides"][-1] = stride
    k, d, pads = attrs["kernel"], attrs["dilations"], attrs["pads"]
    sizes = [  # the matrix axes longer, a leading one short
        max(1, d[i] * (k[i] - 1) + 1 - pads[i] - pads[spatial + i])
        + int(rng.integers(4, 16) if i >= spatial - 2 else rng.integers(0, 3))
        for i in range(spatial)
    ]
    batch, channels = int(rng.integers(1, 3)), int(rng.integers(2, 5))
    image = (batch, *sizes, channels) if last else (batch, channels, *sizes)
    patches = reference.im2col_sources(image, attrs).shape
    _, rows, cols = matrix_dims(image, fold=last)
    spread = (rows // int(rng.integers(1, 3)), cols) if last else (rows, cols // 2)
    src = Layout(image, "float32", 1, 2, *map(grid_extent, (rows, cols), spread), fold=last)
    taps_per_pe = int(rng.integers(2, prod(k) + 2))
    _, rows, cols = matrix_dims(patches)
    out = Layout(
        patches,
        "float32",
        0,
        int(rng.integers(0, 3)),
        grid_extent(rows, int(rng.integers(8, 40))),
        grid_extent(cols, -(-cols // taps_per_pe)),
    )
    got = counted(attrs, src, out)
    assert fields(got) == fields(oracle(attrs, src, out))
    assert fields(got) == fields(flows.movement_traffic("im2col", attrs, [src], out))


def test_ranges_of_both_kinds_on_one_image():
    """Single taps counted tap by tap and ranges of taps that read one pixel twice counted by
    runs, in one im2col, with flows staying on their PE rows in both: a tap held only by the
    latter does not shift the weights of the former (a bug found on random cases)."""
    attrs = {
        "kernel": [3, 1],
        "strides": [1, 2],
        "pads": [0, 1, 1, 2],
        "dilations": [1, 1],
        "group": 1,
        "channels_last": False,
    }
    src = Layout((2, 3, 5, 5), "float32", 2, 3, 2, 3)
    out = Layout((1, 32, 9), "float32", 3, 2, 3, 5)
    got = counted(attrs, src, out)
    assert got.max_eject == 10
    assert fields(got) == fields(oracle(attrs, src, out))
    assert fields(got) == fields(flows.movement_traffic("im2col", attrs, [src], out))


def test_taps_collide_where_windows_a_stride_apart_read_one_pixel():
    """Two taps read one pixel from two windows where their offset is a whole number of
    strides along every axis, within the windows there are."""
    attrs = {"kernel": [3, 3], "strides": [2, 2], "dilations": [1, 1]}
    assert not collide(attrs, [5, 5], 0, 2)  # one position apart: other pixels
    assert collide(attrs, [5, 5], 0, 3)  # two apart: one stride
    assert not collide(attrs, [5, 1], 0, 3)  # ... but one window along the axis
    assert collide({**attrs, "dilations": [1, 2]}, [5, 5], 0, 2)
    assert not collide(attrs, [5, 5], 2, 4)  # the first two taps of two kernel rows


@pytest.mark.parametrize(
    ("image", "attrs", "fold"),
    [
        ((1, 3, 9), {"kernel": [3], "strides": [1], "pads": [1, 1], "dilations": [1]}, False),
    ],
)
def test_elsewhere_the_engine_answers(image, attrs, fold):
    """Where a channel would sit on the pixel side of a PE coordinate (a 1-D channels-first
    image, unfolded), the tap ranges do not apply, and ``im2col_traffic`` is the engine's (and
    the oracle's). Groups and folded channels-first images apply (``test_window_groups``)."""
    spatial = len(image) - 2
    attrs = {
        "kernel": [3] * spatial,
        "strides": [1] * spatial,
        "pads": [1] * 2 * spatial,
        "dilations": [1] * spatial,
        "group": 1,
        **attrs,
    }
    rng = np.random.default_rng(0)
    patches = reference.im2col_sources(image, attrs).shape
    src = random_layout(rng, image, "float32", fold)
    out = random_layout(rng, patches, "float32", fold=False)
    assert not window_flows.tap_ranges_apply(attrs, src)
    got = window_flows.im2col_traffic(attrs, src, out)
    assert fields(got) == fields(flows.movement_traffic("im2col", attrs, [src], out))
    assert fields(got) == fields(oracle(attrs, src, out))


def test_a_movement_by_whole_pes_is_remembered():
    """Both layouts moved by the same whole PEs: one count, the same traffic."""
    attrs = {
        "kernel": [3, 3],
        "strides": [1, 1],
        "pads": [1, 1, 1, 1],
        "dilations": [1, 1],
        "group": 1,
        "channels_last": True,
    }
    placed = [
        (Layout.on((1, 8, 8, 4), "float32", (x, y, 3, 5), fold=True),
         Layout.on((1, 64, 36), "float32", (x, y, 3, 5), fold=True))
        for x, y in ((0, 0), (7, 2))
    ]  # fmt: skip
    first, second = (window_flows.im2col_traffic(attrs, *pair) for pair in placed)
    assert first == second
    assert window_flows._window_traffic.cache_info().misses == 1
    assert fields(first) == fields(oracle(attrs, *placed[1]))


def test_a_large_batch_is_left_to_the_engine():
    """Counting 64 images by segments would cost by the data: the engine counts those."""
    attrs = {
        "kernel": [3, 3],
        "strides": [1, 1],
        "pads": [1] * 4,
        "dilations": [1, 1],
        "group": 1,
        "channels_last": True,
    }
    rect = (0, 0, 100, 100)
    src = Layout.on((64, 56, 56, 256), "float32", rect, fold=True)
    assert not window_flows.tap_ranges_apply(attrs, src)
    single = Layout.on((1, 56, 56, 256), "float32", rect, fold=True)
    assert window_flows.tap_ranges_apply(attrs, single)
