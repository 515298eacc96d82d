"""The optimizers MemoryX runs, learning-rate schedules and gradient clipping.

Each update follows torch.optim's single-tensor code path (what it uses for CPU tensors)
operation by operation: float32 tensors; a Python-number factor rounded to float32 where
torch multiplies a float32 tensor by it; fused multiply-adds where torch's vectorized kernels
use them (``add`` with ``alpha``, ``lerp``, ``addcmul``); bias corrections and step sizes in
Python floats, as torch computes them. Defaults are torch's. SGD matches torch bit for bit
(gradient clipping may differ in the last bit: torch sums the norms in another order);
Adam and AdamW within an ulp per step, because torch's vectorized CPU ``sqrt`` is not
correctly rounded (it differs from IEEE ``sqrt`` in about one element in six).

``OPTIMIZERS`` and ``SETTINGS`` are the one table of the optimizers, their settings and their
defaults: ``cgc train``'s options, the API's keywords, the ``schedule-streams`` pass's options,
the IR's verifier and MemoryX are all built from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cgc.errors import CgcError, OptionError

State = dict[str, np.ndarray]
Update = Callable[[np.ndarray, np.ndarray, State, Mapping[str, float]], np.ndarray]


def _f32(value: float) -> np.float32:
    return np.float32(value)


def _fma(a: np.ndarray | np.floating | float, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` rounded once to float32, as the fused multiply-add of torch's vectorized
    CPU kernels (the float64 product of two float32 values is exact)."""
    exact = np.float64(a) * b.astype(np.float64) + c.astype(np.float64)
    return exact.astype(np.float32)


def _lerp(start: np.ndarray, end: np.ndarray, weight: float) -> np.ndarray:
    """torch's ``lerp``: from the nearer end, so that a weight of 1 gives ``end`` exactly."""
    if abs(weight) < 0.5:
        return _fma(_f32(weight), end - start, start)
    return _fma(-(np.float32(1) - _f32(weight)), end - start, end)


def _array(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    # numpy turns 0-d arithmetic into scalars; a weight stays an array of its type
    return np.asarray(value, dtype=like.dtype)


def sgd(
    param: np.ndarray, grad: np.ndarray, state: State, config: Mapping[str, float]
) -> np.ndarray:
    """torch.optim.SGD's update of one parameter (momentum, dampening, nesterov, weight
    decay)."""
    momentum, weight_decay = config["momentum"], config["weight_decay"]
    if weight_decay:
        grad = _fma(_f32(weight_decay), param, grad)
    if momentum:
        if "momentum_buffer" in state:
            decayed = state["momentum_buffer"] * _f32(momentum)
            buf = _fma(_f32(1 - config["dampening"]), grad, decayed)
        else:
            buf = grad.copy()
        state["momentum_buffer"] = _array(buf, param)
        grad = _fma(_f32(momentum), buf, grad) if config["nesterov"] else buf
    return _array(_fma(_f32(-config["lr"]), grad, param), param)


def adam(
    param: np.ndarray,
    grad: np.ndarray,
    state: State,
    config: Mapping[str, float],
    decoupled: bool = False,
) -> np.ndarray:
    """torch.optim.Adam's update of one parameter; ``decoupled`` weight decay is AdamW's."""
    lr, beta1, beta2 = config["lr"], config["beta1"], config["beta2"]
    weight_decay = config["weight_decay"]
    if not state:
        state["step"] = np.zeros((), np.float32)
        state["exp_avg"] = np.zeros_like(param)
        state["exp_avg_sq"] = np.zeros_like(param)
        if config["amsgrad"]:
            state["max_exp_avg_sq"] = np.zeros_like(param)
    state["step"] = state["step"] + np.float32(1)
    if weight_decay and decoupled:
        param = _array(param * _f32(1 - lr * weight_decay), param)
    elif weight_decay:
        grad = _fma(_f32(weight_decay), param, grad)
    exp_avg = _lerp(state["exp_avg"], grad, 1 - beta1)
    exp_avg_sq = _fma(_f32(1 - beta2) * grad, grad, state["exp_avg_sq"] * _f32(beta2))
    state["exp_avg"], state["exp_avg_sq"] = exp_avg, exp_avg_sq
    step = float(state["step"])
    step_size = lr / (1 - beta1**step)
    correction = (1 - beta2**step) ** 0.5
    second = exp_avg_sq
    if config["amsgrad"]:
        second = state["max_exp_avg_sq"] = np.maximum(state["max_exp_avg_sq"], exp_avg_sq)
    denom = np.sqrt(second) / _f32(correction) + _f32(config["eps"])
    return _array(param + _f32(-step_size) * exp_avg / denom, param)


def adamw(
    param: np.ndarray, grad: np.ndarray, state: State, config: Mapping[str, float]
) -> np.ndarray:
    """torch.optim.AdamW's update of one parameter."""
    return adam(param, grad, state, config, decoupled=True)


# ---------------------------------------------------------------------------------------------
# The table: every optimizer, its settings and their defaults
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One hyper-parameter, as the IR, the artifact and MemoryX name it."""

    name: str
    help: str
    flag: bool = False
    """On or off (held as 1.0 or 0.0 like every setting)."""
    low: float = 0.0
    """The least value allowed."""
    above_low: bool = False
    """Values must be above ``low``, not equal to it (Adam's eps: 0 divides by zero)."""
    high: float | None = None
    """The bound values must stay below, if any."""
    option: str = ""
    """The keyword of the Python API (and ``cgc train`` option) that sets it, if not its name:
    ``betas`` sets ``beta1`` and ``beta2`` together, as torch.optim's keyword does."""

    @property
    def keyword(self) -> str:
        """The API keyword (and, with ``--`` and dashes, the command-line option)."""
        return self.option or self.name

    def problem(self, value: float) -> str | None:
        """Why ``value`` is not allowed, if it is not."""
        if self.flag:
            return None if value in (0.0, 1.0) else "must be on or off"
        too_low = value <= self.low if self.above_low else value < self.low
        if not math.isfinite(value) or too_low or (self.high is not None and value >= self.high):
            bracket, relation = ("(", ">") if self.above_low else ("[", ">=")
            if self.high:
                return f"must be in {bracket}{self.low:g}, {self.high:g})"
            return f"must be {relation} {self.low:g}"
        return None


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("lr", "Learning rate."),
        Setting("momentum", "SGD momentum."),
        Setting("dampening", "SGD dampening of the momentum."),
        Setting("weight_decay", "Weight decay (decoupled from the gradient in AdamW)."),
        Setting("nesterov", "SGD with Nesterov momentum.", flag=True),
        Setting("beta1", "Adam's decay of the gradients' mean.", high=1.0, option="betas"),
        Setting("beta2", "Adam's decay of the squared gradients' mean.", high=1.0, option="betas"),
        Setting("eps", "Adam's term added to the denominator.", above_low=True),
        Setting("amsgrad", "Adam with the AMSGrad maximum.", flag=True),
    )
}
"""Every setting of every optimizer."""

KEYWORDS: dict[str, tuple[str, ...]] = {}
"""Every API keyword (``cgc train`` option), and the settings it sets."""
for _setting in SETTINGS.values():
    KEYWORDS[_setting.keyword] = (*KEYWORDS.get(_setting.keyword, ()), _setting.name)


@dataclass(frozen=True)
class Optimizer:
    """An optimizer MemoryX runs: its settings with torch.optim's defaults, and its update."""

    name: str
    defaults: Mapping[str, float]
    update: Update
    state: Callable[[Mapping[str, float]], int]
    """Tensors of state it keeps per parameter tensor under the given settings (SGD's
    momentum buffer, Adam's two moments and AMSGrad's maximum)."""


def _adam_state(config: Mapping[str, float]) -> int:
    return 2 + int(config["amsgrad"] != 0)


_ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "amsgrad": 0.0}
OPTIMIZERS: dict[str, Optimizer] = {
    o.name: o
    for o in (
        Optimizer(
            "sgd",
            {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": 0.0},
            sgd,
            lambda config: int(config["momentum"] != 0),
        ),
        Optimizer("adam", {**_ADAM, "weight_decay": 0.0}, adam, _adam_state),
        Optimizer("adamw", {**_ADAM, "weight_decay": 1e-2}, adamw, _adam_state),
    )
}
"""Every optimizer by name: the one home of the settings and defaults that the command line,
the Python API, the ``schedule-streams`` pass, the IR's verifier and MemoryX use."""


def _check(optimizer: str, full: Mapping[str, float], named: Callable[[str], str]) -> None:
    """Raises a ValueError if a setting of ``full`` is out of range or the settings do not go
    together; ``named`` says how the message calls a setting."""
    for name, value in full.items():
        problem = SETTINGS[name].problem(value)
        if problem is not None:
            raise ValueError(f"{named(name)} {value:g}: {problem}")
    if full.get("nesterov") and (full["momentum"] <= 0 or full["dampening"] != 0):
        raise ValueError(
            f"{named('nesterov')} needs {named('momentum')} > 0 and {named('dampening')} 0"
        )


def _optimizer(name: str) -> Optimizer:
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r} (expected one of {tuple(OPTIMIZERS)})")
    return OPTIMIZERS[name]


def settings(optimizer: str, given: Mapping[str, float]) -> dict[str, float]:
    """The full settings of ``optimizer``: ``given`` over its defaults. A setting it does not
    have, or a value out of range, is a ValueError naming the setting."""
    defaults = _optimizer(optimizer).defaults
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"{optimizer} has no setting {', '.join(unknown)}")
    full = {**defaults, **{k: float(v) for k, v in given.items()}}
    _check(optimizer, full, str)
    return full


Choice = float | Sequence[float] | None
"""A value given by API keyword: a number (a flag as a bool), a pair for ``betas``, None."""


def chosen_settings(optimizer: str, keywords: Mapping[str, Choice]) -> dict[str, float]:
    """The settings a user chose with API keywords (``cgc train`` options) for
    ``optimizer``: ``betas`` as a pair, flags as booleans, None for "the default". A problem
    is an OptionError naming the option by its keyword."""
    if optimizer not in OPTIMIZERS:
        raise OptionError(
            f"optimizer {optimizer}: expected one of {', '.join(OPTIMIZERS)}", "optimizer"
        )
    chosen: dict[str, float] = {}
    for keyword, value in keywords.items():
        if keyword not in KEYWORDS:
            raise CgcError(f"{keyword}: not an optimizer setting ({', '.join(KEYWORDS)})")
        if value is None:
            continue
        names = KEYWORDS[keyword]
        if not set(names) <= set(OPTIMIZERS[optimizer].defaults):
            raise OptionError(
                f"{keyword}: not a setting of optimizer {optimizer}", keyword, "optimizer"
            )
        values = tuple(value) if isinstance(value, Sequence) else (value,)
        if len(values) != len(names):
            shown = ",".join(f"{v:g}" for v in values)
            raise OptionError(f"{keyword} {shown}: expected {len(names)} numbers", keyword)
        chosen.update(zip(names, (float(v) for v in values), strict=True))
    try:
        _check(optimizer, {**OPTIMIZERS[optimizer].defaults, **chosen}, _keyword)
    except ValueError as e:
        raise OptionError(str(e), *KEYWORDS) from None
    return chosen


def with_flags(values: Mapping[str, float]) -> dict[str, float | bool]:
    """``values`` with the on/off settings as booleans, as people read them."""
    return {k: bool(v) if SETTINGS[k].flag else v for k, v in values.items()}


def _keyword(setting: str) -> str:
    """The API keyword (``cgc.options.TrainingOptions``' setting) of a setting."""
    return SETTINGS[setting].keyword


# ---------------------------------------------------------------------------------------------
# Learning-rate schedules and clipping
# ---------------------------------------------------------------------------------------------

SCHEDULES = ("constant", "cosine", "step")


@dataclass(frozen=True)
class Schedule:
    """The learning rate of each step: a linear warm-up over the first ``warmup_steps``
    (from ``lr / warmup_steps`` up to ``lr``, as torch's ``LinearLR`` with ``start_factor``
    ``1 / warmup_steps`` and ``total_iters`` ``warmup_steps - 1``), then ``kind``:
    ``constant``; ``cosine`` decay that would reach 0 at ``total_steps``
    (``CosineAnnealingLR`` over the steps after the warm-up); or
    ``step``, times ``gamma`` every ``step_size`` steps (``StepLR``)."""

    kind: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    step_size: int = 1
    gamma: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.kind!r} (expected one of {SCHEDULES})")
        if self.warmup_steps < 0 or self.step_size < 1:
            raise ValueError("warm-up steps must be >= 0 and the step size >= 1")
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"the decay factor (--lr-gamma) must be positive, got {self.gamma}")

    def factor(self, step: int) -> float:
        """The factor on the base learning rate at ``step`` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        since = step - self.warmup_steps
        if self.kind == "cosine":
            span = max(1, self.total_steps - self.warmup_steps)
            return (1 + math.cos(math.pi * min(since, span) / span)) / 2
        if self.kind == "step":
            return self.gamma ** (since // self.step_size)
        return 1.0


def global_norm(gradients: Mapping[str, np.ndarray]) -> float:
    """The 2-norm of all ``gradients`` together, as ``torch.nn.utils.clip_grad_norm_``
    computes it: the norm of the per-tensor norms, in float32."""
    norms = np.array([np.linalg.norm(gradients[n].ravel()) for n in sorted(gradients)])
    return float(np.float32(np.linalg.norm(norms.astype(np.float32))))


def clip_by_global_norm(
    gradients: dict[str, np.ndarray], max_norm: float, norm: float | None = None
) -> float:
    """Scales ``gradients`` in place so that their global norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` does; returns the norm before clipping (``norm``, if
    the caller has it already)."""
    total = np.float32(global_norm(gradients) if norm is None else norm)
    # torch divides a number by a tensor as the tensor's reciprocal times the number
    reciprocal = np.float32(1) / (total + np.float32(1e-6))
    coefficient = min(reciprocal * np.float32(max_norm), np.float32(1.0))
    for name in sorted(gradients):
        gradients[name] = _array(gradients[name] * np.float32(coefficient), gradients[name])
    return float(total)


@dataclass(frozen=True)
class Footprint:
    """What MemoryX holds for a model, in bytes."""

    weights: int
    gradients: int
    """The gradients of the trained weights, summed over the systems and micro-batches."""
    optimizer_state: int

    @property
    def total(self) -> int:
        """All of it."""
        return self.weights + self.gradients + self.optimizer_state


def footprint(
    master_bytes: Mapping[str, int],
    trained: Sequence[str],
    optimizer: str | None,
    config: Mapping[str, float],
    live_bytes: Mapping[str, int] | None = None,
) -> Footprint:
    """MemoryX's bytes for weights whose master copies take ``master_bytes[name]`` bytes, of
    which ``trained`` receive gradients (kept at the master precision) and the state of
    ``optimizer`` under ``config`` (None: inference, nothing but the weights). A sparse
    weight's gradient and state tensors take the bytes of its live values,
    ``live_bytes[name]`` (``cgc.machine.sparse.sparsity.live_bytes``)."""
    stored = sum(master_bytes.values())
    if optimizer is None:
        return Footprint(stored, 0, 0)
    live = live_bytes or {}
    gradients = sum(live.get(name, master_bytes[name]) for name in trained)
    slots = OPTIMIZERS[optimizer].state(settings(optimizer, config))
    return Footprint(stored, gradients, slots * gradients)
