"""cgc.machine.movement.window_flows on grouped convolutions and folded channels-first images: their
im2col counted by tap ranges equals the per-element oracle (traffic.gather_traffic) and the
general engine (flows.movement_traffic)."""

from __future__ import annotations

import numpy as np
import pytest
from test_window_flows import count_afresh, counted, fields, oracle, random_attrs, random_layout

from cgc.machine import reference
from cgc.machine.movement import flows, window_flows
from cgc.machine.movement.layout import Layout

__all__ = ["count_afresh"]  # every test counts afresh

SEEDS = range(80)


def random_case(rng, last: bool, group: int | None, spatial: int, fold_src: bool, fold_dst: bool):
    """A random grouped im2col: ``group`` groups (``None``: one per channel) of a few
    channels each, windows of random strides, padding and dilation, layouts anywhere."""
    attrs = random_attrs(rng, spatial, last)
    k, d, pads = attrs["kernel"], attrs["dilations"], attrs["pads"]
    sizes = [
        max(1, d[i] * (k[i] - 1) + 1 - pads[i] - pads[spatial + i]) + int(rng.integers(0, 5))
        for i in range(spatial)
    ]
    per = int(rng.integers(1, 4))
    groups = int(rng.integers(2, 6)) if group is None else group
    attrs["group"] = groups
    channels = groups * (1 if group is None else per)
    batch = int(rng.integers(1, 3))
    image = (batch, *sizes, channels) if last else (batch, channels, *sizes)
    patches = reference.im2col_sources(image, attrs).shape
    dtype = str(rng.choice(["float32", "float16"]))
    return (
        attrs,
        random_layout(rng, image, dtype, fold_src),
        random_layout(rng, patches, dtype, fold_dst),
    )


def assert_exact(attrs: dict, src: Layout, out: Layout) -> None:
    got = counted(attrs, src, out)
    assert fields(got) == fields(oracle(attrs, src, out))
    assert fields(got) == fields(flows.movement_traffic("im2col", attrs, [src], out))


@pytest.mark.parametrize("seed", SEEDS)
def test_grouped_channels_last(seed):
    """A channels-last image, folded or not, into a result folded or not (a folded one
    stacks the groups along its rows): groups of 2, 3 or one channel each, 1-D to 3-D."""
    rng = np.random.default_rng(seed)
    group = (2, 3, None)[seed % 3]
    spatial = int(rng.integers(1, 4))
    fold_src, fold_dst = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
    assert_exact(*random_case(rng, True, group, spatial, fold_src, fold_dst))


@pytest.mark.parametrize("seed", SEEDS)
def test_grouped_channels_first(seed):
    """A channels-first image, folded (every channel on rows of its own) or not, into an
    unfolded result: groups of 2, 3 or one channel each, 2-D or 3-D."""
    rng = np.random.default_rng(1000 + seed)
    group = (2, 3, None)[seed % 3]
    spatial = int(rng.integers(2, 4))
    assert_exact(*random_case(rng, False, group, spatial, bool(rng.random() < 0.5), False))


@pytest.mark.parametrize("seed", range(40))
def test_folded_channels_first_in_one_group(seed):
    """Every channel of a folded channels-first image on rows of its own, one group, into a
    result folded or not."""
    rng = np.random.default_rng(2000 + seed)
    attrs, src, out = random_case(rng, False, 1, int(rng.integers(2, 4)), True, False)
    out = random_layout(rng, out.shape, out.dtype, bool(rng.random() < 0.5))
    assert_exact(attrs, src, out)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_grouped_on_thin_spread_images(stride, seed):
    """Larger folded images, a pixel row or two per source PE, several taps of a channel on
    each destination PE column (so that taps reading one pixel twice are merged into runs),
    as AlexNet's second convolution (two groups) and a depthwise one (a group a channel)."""
    rng = np.random.default_rng(3000 + seed)
    last = bool(seed % 2)
    attrs = random_attrs(rng, 2, last)
    attrs["kernel"] = [int(rng.integers(2, 5)) for _ in range(2)]
    attrs["strides"] = [stride, stride]
    channels = int(rng.integers(2, 5)) * 2
    attrs["group"] = 2 if seed < 3 else channels
    sizes = [int(rng.integers(6, 12)) for _ in range(2)]
    image = (1, *sizes, channels) if last else (1, channels, *sizes)
    patches = reference.im2col_sources(image, attrs).shape
    src = Layout.on(image, "float32", (1, 2, 3, int(rng.integers(5, 20))), fold=True)
    taps_per_pe = int(rng.integers(2, 6))
    rows = patches[0] * patches[1] if last else patches[1]
    out = Layout(
        patches,
        "float32",
        0,
        int(rng.integers(0, 3)),
        min(rows, int(rng.integers(4, 16))),
        -(-patches[2] // taps_per_pe),
        fold=last,
    )
    assert_exact(attrs, src, out)


def test_alexnets_grouped_convolution_is_counted_by_tap_ranges():
    """AlexNet's second convolution (96 channels in two groups, 5x5 windows over a folded
    27x27 image) is counted by tap ranges, not by the engine, and to the engine's traffic."""
    attrs = {
        "kernel": [5, 5],
        "strides": [1, 1],
        "pads": [2, 2, 2, 2],
        "dilations": [1, 1],
        "group": 2,
    }
    src = Layout.on((1, 96, 27, 27), "float32", (0, 0, 30, 40), fold=True)
    out = Layout.on(reference.im2col_sources(src.shape, attrs).shape, "float32", (0, 0, 30, 40))
    assert window_flows.tap_ranges_apply(attrs, src)
    assert fields(counted(attrs, src, out)) == fields(
        flows.movement_traffic("im2col", attrs, [src], out)
    )


def test_a_grouped_channels_first_into_folded_rows_is_left_to_the_engine():
    """A folded result stacks a channels-first image's groups along its rows, each group's
    windows on rows of their own: the engine counts those."""
    attrs = {
        "kernel": [3, 3],
        "strides": [1, 1],
        "pads": [1] * 4,
        "dilations": [1, 1],
        "group": 2,
    }
    src = Layout.on((1, 4, 5, 5), "float32", (0, 0, 3, 3))
    out = Layout.on((2, 25, 18), "float32", (0, 0, 3, 3), fold=True)
    assert window_flows._window_traffic(window_flows.Windows(attrs, src, out)) is None
    got = window_flows.im2col_traffic(attrs, src, out)
    assert fields(got) == fields(oracle(attrs, src, out))
