"""Unit tests of cgc.runtime.memoryx and its optimizers (torch.optim's arithmetic, schedules and
clipping) and of cgc.runtime.swarmx."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from cgc.errors import CgcError
from cgc.machine.hardware.target import Target
from cgc.machine.program.artifact import WeightSpec
from cgc.machine.timing.streaming import tree_depth
from cgc.machine.training import optimizers
from cgc.runtime.memoryx import Derived, MemoryX
from cgc.runtime.swarmx import SwarmX

T = Target("t", 8, 8, 48 * 1024, 850e6)

SGD_CONFIGS = [
    {"momentum": m, "dampening": d, "nesterov": n, "weight_decay": wd}
    for m, d, n, wd in itertools.product((0.0, 0.9), (0.0, 0.3), (False, True), (0.0, 0.01))
    if not n or (m > 0 and d == 0)
]


def config_id(c):
    return "m{momentum}-d{dampening}-n{nesterov:d}-wd{weight_decay}".format(**c)


# --------------------------------------------------------------------------- MemoryX


def same_random_gradients(rng, shapes, memoryx, params) -> None:
    """Gives MemoryX and the torch parameters the same random gradient of every weight."""
    for key, shape in shapes.items():
        grad = rng.standard_normal(shape).astype(np.float32)
        memoryx.receive(key, grad, None)
        params[key].grad = torch.from_numpy(grad.copy())


@pytest.mark.parametrize("config", SGD_CONFIGS, ids=config_id)
def test_sgd_matches_torch(config):
    rng = np.random.default_rng(0)
    shapes = {"a.weight": (5, 7), "a.bias": (7,), "b": (3, 2, 4)}
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    lr = 0.05
    mx = MemoryX(weights, T)
    params = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in weights.items()}
    opt = torch.optim.SGD(list(params.values()), lr=lr, **config)
    cfg = {"lr": lr, **config, "nesterov": float(config["nesterov"])}
    for _ in range(5):
        same_random_gradients(rng, shapes, mx, params)
        opt.step()
        mx.apply("sgd", cfg)
        for name, p in params.items():
            got = mx.weights[name]
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, p.detach().numpy())  # bit for bit
    assert mx.steps == 5
    assert mx.gradients == {}
    if config["momentum"]:
        for name, p in params.items():
            buf = opt.state[p]["momentum_buffer"].numpy()
            np.testing.assert_array_equal(mx.state[name]["momentum_buffer"], buf)
    else:
        assert mx.state == {}


ADAM_CONFIGS = [
    ("adam", {}),
    ("adam", {"weight_decay": 0.1, "amsgrad": True}),
    ("adamw", {}),
    ("adamw", {"weight_decay": 0.3, "amsgrad": True, "betas": (0.8, 0.99), "eps": 1e-6}),
    ("adam", {"betas": (0.5, 0.999)}),  # torch's lerp works from the other end
]


@pytest.mark.parametrize(
    ("name", "config"),
    ADAM_CONFIGS,
    ids=["adam", "adam-wd-ams", "adamw", "adamw-all", "adam-beta1-half"],
)
def test_adam_matches_torch(name, config):
    """Within an ulp per step: torch's vectorized sqrt is not correctly rounded."""
    rng = np.random.default_rng(3)
    shapes = {"a.weight": (33, 7), "b": (5,)}
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    mx = MemoryX(weights, T)
    params = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in weights.items()}
    kind = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    opt = kind(list(params.values()), lr=0.01, **config)
    ours = {k: float(v) for k, v in config.items() if k != "betas"}
    if "betas" in config:
        ours["beta1"], ours["beta2"] = config["betas"]
    for _ in range(25):
        same_random_gradients(rng, shapes, mx, params)
        opt.step()
        mx.apply(name, {"lr": 0.01, **ours})
    for key, p in params.items():
        np.testing.assert_allclose(mx.weights[key], p.detach().numpy(), rtol=2e-6, atol=1e-7)
        for slot in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if slot in opt.state[p]:
                want = opt.state[p][slot].numpy()
                np.testing.assert_allclose(mx.state[key][slot], want, rtol=2e-6, atol=1e-12)
        assert float(mx.state[key]["step"]) == float(opt.state[p]["step"]) == 25


def test_optimizer_defaults_are_torchs():
    for name, kind in (
        ("sgd", torch.optim.SGD),
        ("adam", torch.optim.Adam),
        ("adamw", torch.optim.AdamW),
    ):
        defaults = kind([torch.zeros(1, requires_grad=True)]).defaults
        ours = optimizers.OPTIMIZERS[name].defaults
        # the API's keywords are torch.optim's
        keywords = {optimizers.SETTINGS[key].keyword for key in ours}
        assert keywords <= set(defaults), (name, keywords - set(defaults))
        for key, value in ours.items():
            theirs = (
                defaults["betas"][int(key[-1]) - 1] if key.startswith("beta") else defaults[key]
            )
            assert float(theirs) == value, (name, key)


def test_optimizer_settings_errors():
    with pytest.raises(ValueError, match="adam has no setting momentum"):
        optimizers.settings("adam", {"momentum": 0.9})
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        optimizers.settings("lamb", {})
    with pytest.raises(ValueError, match=r"beta2 1: must be in \[0, 1\)"):
        optimizers.settings("adam", {"beta2": 1.0})
    with pytest.raises(ValueError, match="nesterov needs momentum > 0 and dampening 0"):
        optimizers.settings("sgd", {"nesterov": 1.0})


def test_one_table_builds_the_options_everywhere():
    """The schedule-streams pass, `cgc train` and the API take the table's settings, and a
    setting left out takes the table's default wherever it is left out."""
    from click.testing import CliRunner

    from cgc.cli import main
    from cgc.passes.schedule_streams import ScheduleStreamsPass

    fields = [f.name for f in dataclasses.fields(ScheduleStreamsPass)]
    assert fields == ["optimizer", *optimizers.SETTINGS]
    text = CliRunner().invoke(main, ["train", "--help"]).output
    for keyword in optimizers.KEYWORDS:
        assert f"--{keyword.replace('_', '-')}" in text
    assert "[default: 0; adamw: 0.01]" in " ".join(text.split())
    chosen = optimizers.chosen_settings("adam", {"betas": (0.8, 0.9), "lr": None, "amsgrad": True})
    assert chosen == {"beta1": 0.8, "beta2": 0.9, "amsgrad": 1.0}
    assert optimizers.settings("adamw", {})["weight_decay"] == 0.01
    with pytest.raises(CgcError, match=r"^betas 0.9: expected 2 numbers"):
        optimizers.chosen_settings("adam", {"betas": (0.9,)})
    with pytest.raises(CgcError, match=r"warmup: not an optimizer setting \(lr, momentum"):
        optimizers.chosen_settings("adam", {"warmup": 3})


def torch_lrs(kind, warmup, steps, step_size=3, gamma=0.5):
    """The learning rate torch's schedulers give each step, base 1."""
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=1.0)
    after = {
        "constant": lambda: torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0),
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps - warmup),
        "step": lambda: torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma),
    }[kind]()
    if warmup:
        start = torch.optim.lr_scheduler.LinearLR(opt, 1 / warmup, 1.0, total_iters=warmup - 1)
        scheduler = torch.optim.lr_scheduler.SequentialLR(opt, [start, after], [warmup])
    else:
        scheduler = after
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("warmup", [0, 1, 4])
@pytest.mark.parametrize("kind", ["constant", "cosine", "step"])
def test_schedules_match_torch(kind, warmup):
    schedule = optimizers.Schedule(kind, warmup, 12, step_size=3, gamma=0.5)
    ours = [schedule.factor(step) for step in range(12)]
    np.testing.assert_allclose(ours, torch_lrs(kind, warmup, 12), rtol=1e-12, atol=1e-15)


def test_schedule_errors():
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        optimizers.Schedule("linear")
    with pytest.raises(ValueError, match="step size >= 1"):
        optimizers.Schedule("step", step_size=0)
    for gamma in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"--lr-gamma\) must be positive"):
            optimizers.Schedule("step", gamma=gamma)


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clipping_matches_torch(max_norm):
    rng = np.random.default_rng(5)
    grads = {k: rng.standard_normal(s).astype(np.float32) for k, s in (("a", (40, 3)), ("b", (7,)))}
    params = [torch.zeros(g.shape, requires_grad=True) for g in grads.values()]
    for p, g in zip(params, grads.values(), strict=True):
        p.grad = torch.from_numpy(g.copy())
    want = torch.nn.utils.clip_grad_norm_(params, max_norm)
    ours = dict(grads)
    norm = optimizers.clip_by_global_norm(ours, max_norm)
    assert norm == pytest.approx(float(want), rel=1e-6)
    for p, key in zip(params, grads, strict=True):
        np.testing.assert_allclose(ours[key], p.grad.numpy(), rtol=1e-6)
    clipped = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in ours.values()))
    assert clipped == pytest.approx(min(max_norm, norm), rel=1e-5)


def test_sgd_plain_step_by_hand():
    mx = MemoryX({"w": np.array([1.0, -2.0], np.float32)}, T)
    mx.receive("w", np.array([0.5, 4.0], np.float32), None)
    mx.apply("sgd", {"lr": 0.25})
    np.testing.assert_array_equal(mx.weights["w"], np.array([0.875, -3.0], np.float32))


def test_weights_without_gradient_are_untouched():
    w = {"a": np.ones(3, np.float32), "b": np.full(2, 2.0, np.float32)}
    mx = MemoryX(w, T)
    mx.receive("a", np.ones(3, np.float32), None)
    mx.apply("sgd", {"lr": 0.1, "weight_decay": 0.5, "momentum": 0.9})
    np.testing.assert_array_equal(mx.weights["b"], w["b"])
    assert not np.array_equal(mx.weights["a"], w["a"])
    assert "b" not in mx.state


def test_memoryx_holds_its_weights_read_only():
    """The given arrays themselves, read-only (a write raises, rather than change a weight
    under what runs made of it), replaced by an update, never changed."""
    w = {"a": np.ones(3, np.float32)}
    mx = MemoryX(w, T)
    assert mx.weights["a"] is w["a"]
    with pytest.raises(ValueError, match="read-only"):
        w["a"][:] = 5
    mx.receive("a", np.ones(3, np.float32), None)
    mx.apply("sgd", {"lr": 0.5})
    np.testing.assert_array_equal(w["a"], np.ones(3))
    np.testing.assert_array_equal(mx.weights["a"], np.full(3, 0.5))


def test_a_kept_value_serves_every_memoryx_of_the_weights_until_an_update():
    """What runs made from a weight as given is kept for the MemoryX of every later run;
    once an optimizer step replaced the weight, it is made anew from the new one."""
    derived = Derived()
    w = {"w": np.ones(3, np.float32)}
    mx = MemoryX(w, T, derived=derived)
    made = []

    def doubled():
        made.append(1)
        return mx.weights["w"] * 2

    kept = mx.kept("w", "doubled", doubled)
    other = MemoryX(w, T, derived=derived)  # the next run's
    assert other.kept("w", "doubled", doubled) is kept and len(made) == 1
    mx.receive("w", np.ones(3, np.float32), None)
    mx.apply("sgd", {"lr": 0.5})
    np.testing.assert_array_equal(mx.kept("w", "doubled", doubled), np.ones(3))
    assert len(made) == 2
    np.testing.assert_array_equal(kept, np.full(3, 2.0))
    assert other.kept("w", "doubled", doubled) is kept  # its weight is still as given


def test_unknown_optimizer():
    mx = MemoryX({"a": np.ones(3, np.float32)}, T)
    with pytest.raises(ValueError, match="rmsprop"):
        mx.apply("rmsprop", {"lr": 0.1})


@pytest.mark.parametrize(("stored", "perm"), [((3, 5), (1, 0)), ((2, 3, 4), (2, 0, 1))])
def test_receive_maps_the_gradient_of_a_view_back(stored, perm):
    rng = np.random.default_rng(1)
    w = rng.standard_normal(stored).astype(np.float32)
    mx = MemoryX({"w": w}, T)
    view = mx.stream("w", [stored[p] for p in perm], perm, "float32")
    np.testing.assert_array_equal(view, np.transpose(w, perm))
    upstream = rng.standard_normal(view.shape).astype(np.float32)
    # reference: torch's gradient of sum(permute(W) * G) with respect to W
    t = torch.tensor(w, requires_grad=True)
    (t.permute(*perm) * torch.from_numpy(upstream)).sum().backward()
    mx.receive("w", upstream, perm)
    assert mx.gradients["w"].shape == stored
    np.testing.assert_array_equal(mx.gradients["w"], t.grad.numpy())


def test_stream_reshaped_view():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    mx = MemoryX({"w": w}, T)
    np.testing.assert_array_equal(mx.stream("w", (1, 12), None, "float32"), w.reshape(1, 12))
    mx.receive("w", np.ones((1, 12), np.float32), None)
    assert mx.gradients["w"].shape == (3, 4)


def test_repeated_receive_sums_and_does_not_alias():
    mx = MemoryX({"w": np.zeros((2, 3), np.float32)}, T)
    g1 = np.arange(6, dtype=np.float32).reshape(2, 3)
    g2 = np.full((3, 2), 10.0, np.float32)
    mx.receive("w", g1, None)
    g1[:] = -100  # the store keeps its own copy
    mx.receive("w", g2, [1, 0])
    mx.receive("w", np.ones((2, 3), np.float32), None)
    want = np.arange(6, dtype=np.float32).reshape(2, 3) + 10 + 1
    np.testing.assert_array_equal(mx.gradients["w"], want)


def test_stream_casts_the_master_copy_to_the_wafer_type():
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    mx = MemoryX({"w": w}, T)
    view = mx.stream("w", (3, 4), None, "bfloat16")
    assert view.dtype.name == "bfloat16"
    np.testing.assert_array_equal(view.astype(np.float32), w.astype("bfloat16").astype(np.float32))
    mx.receive("w", view, None)  # a 16-bit gradient accumulates in the master's float32
    assert mx.gradients["w"].dtype == np.float32


def test_footprint_counts_weights_gradients_and_optimizer_state():
    specs = {"a": WeightSpec((10, 10), "float32"), "b": WeightSpec((5,), "float32")}
    mx = MemoryX({}, T, specs)
    assert mx.footprint([], None, {}).total == 105 * 4
    adam = mx.footprint(["a"], "adam", {})
    assert (adam.weights, adam.gradients, adam.optimizer_state) == (420, 400, 800)
    assert mx.footprint(["a", "b"], "sgd", {"momentum": 0.9}).optimizer_state == 420
    assert mx.footprint(["a", "b"], "sgd", {}).optimizer_state == 0
    assert mx.footprint(["a"], "adam", {"amsgrad": 1.0}).optimizer_state == 1200


def test_memoryx_seconds():
    t = replace(T, memoryx_bytes_per_s=2e9, memoryx_update_params_per_s=4e9)
    mx = MemoryX({}, t)
    assert mx.update_seconds(2 * 10**9) == pytest.approx(0.5)


# --------------------------------------------------------------------------- SwarmX

DEPTHS = {
    2: {1: 0, 2: 1, 3: 2, 4: 2, **dict.fromkeys(range(5, 9), 3), **dict.fromkeys(range(9, 17), 4),
        **dict.fromkeys(range(17, 21), 5)},
    4: {1: 0, **dict.fromkeys(range(2, 5), 1), **dict.fromkeys(range(5, 17), 2),
        **dict.fromkeys(range(17, 21), 3)},
}  # fmt: skip


@pytest.mark.parametrize("fanout", [2, 4])
def test_tree_depth(fanout):
    for systems in range(1, 21):
        assert tree_depth(systems, fanout) == DEPTHS[fanout][systems], systems
        assert SwarmX(systems, replace(T, swarmx_fanout=fanout)).depth == DEPTHS[fanout][systems]


def test_tree_depth_other_fanouts():
    assert tree_depth(8, 8) == 1 and tree_depth(9, 8) == 2 and tree_depth(64, 8) == 2
    assert tree_depth(1, 3) == 0 and tree_depth(10, 3) == 3


def swarm(fanout):
    return SwarmX(0, replace(T, swarmx_fanout=fanout))


def f32(*values):
    return np.array(values, dtype=np.float32)


def test_reduce_order_fanout_2():
    # pairs first: (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0; left to right would give 1
    streams = [f32(1e8, 1), f32(1, -1e8), f32(-1e8, 1e8), f32(1, 1)]
    got = swarm(2).reduce(streams)
    want = (streams[0] + streams[1]) + (streams[2] + streams[3])
    left_to_right = ((streams[0] + streams[1]) + streams[2]) + streams[3]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, f32(0, 0))
    np.testing.assert_array_equal(left_to_right, f32(1, 1))
    assert not np.array_equal(got, left_to_right)
    assert got.dtype == np.float32


def test_reduce_order_fanout_4():
    # one node sums its four children left to right
    streams = [f32(1e8), f32(1), f32(-1e8), f32(1)]
    np.testing.assert_array_equal(swarm(4).reduce(streams), f32(1))
    np.testing.assert_array_equal(swarm(2).reduce(streams), f32(0))


def test_reduce_order_fanout_4_two_levels():
    # five leaves under fanout 4: ((s0 + s1 + s2 + s3) + s4)
    streams = [f32(1), f32(1e8), f32(1), f32(1), f32(-1e8)]
    want = (((streams[0] + streams[1]) + streams[2]) + streams[3]) + streams[4]
    np.testing.assert_array_equal(swarm(4).reduce(streams), want)
    np.testing.assert_array_equal(want, f32(0))
    # the other association, s0 + (s1 + s2 + s3 + s4), would give 1
    assert (streams[0] + (((streams[1] + streams[2]) + streams[3]) + streams[4]))[0] == 1


@pytest.mark.parametrize(("count", "fanout"), [(1, 4), (3, 2), (7, 2), (13, 4), (20, 4)])
def test_reduce_matches_tree_reference_and_is_repeatable(count, fanout):
    rng = np.random.default_rng(count)
    streams = [
        (rng.standard_normal((3, 4)) * 10.0 ** rng.integers(-3, 8)).astype(np.float32)
        for _ in range(count)
    ]
    before = [s.copy() for s in streams]
    level = [s.copy() for s in streams]
    while len(level) > 1:  # independent reference: groups of `fanout`, left to right
        nxt = []
        for i in range(0, len(level), fanout):
            total = level[i]
            for part in level[i + 1 : i + fanout]:
                total = total + part
            nxt.append(total)
        level = nxt
    got = swarm(fanout).reduce(streams)
    np.testing.assert_array_equal(got, level[0])
    np.testing.assert_array_equal(swarm(fanout).reduce([s.copy() for s in before]), got)
    for s, b in zip(streams, before, strict=True):
        np.testing.assert_array_equal(s, b)  # inputs untouched


def test_link_and_latency_seconds():
    t = replace(
        T,
        memoryx_bytes_per_s=100e9,
        swarmx_link_bytes_per_s=50e9,
        io_bytes_per_s=200e9,
        swarmx_hop_seconds=2e-6,
        swarmx_fanout=4,
    )
    sx = SwarmX(5, t)
    assert sx.link_seconds(1e9) == pytest.approx(1e9 / 50e9)
    assert sx.latency_seconds == pytest.approx(3 * 2e-6)  # two levels of nodes + one hop
    assert SwarmX(1, t).latency_seconds == pytest.approx(2e-6)
    slow_io = replace(t, io_bytes_per_s=10e9)
    assert SwarmX(5, slow_io).link_seconds(1e9) == pytest.approx(0.1)
    slow_mx = replace(t, memoryx_bytes_per_s=1e9)
    assert SwarmX(5, slow_mx).link_seconds(3e9) == pytest.approx(3.0)


def test_scalar_weights_stay_arrays() -> None:
    """0-d arithmetic in numpy gives scalars; MemoryX must keep 0-d arrays (safetensors)."""
    memoryx = MemoryX({"s": np.array(0.5, np.float32)}, Target("t", 4, 4, 48 * 1024, 850e6))
    memoryx.receive("s", np.array(2.0, np.float32), None)
    memoryx.apply("sgd", {"lr": 0.1})
    assert isinstance(memoryx.weights["s"], np.ndarray)
    assert memoryx.weights["s"].shape == () and memoryx.weights["s"] == np.float32(0.3)
