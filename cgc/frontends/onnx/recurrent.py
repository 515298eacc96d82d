"""ONNX recurrent ops: RNN, GRU and LSTM, unrolled over their (static) sequence length.

Each direction multiplies the whole input sequence by its input weights at once (one matmul
``[seq * batch, input] x [input, gates * hidden]`` with the biases added), then unrolls the
recurrence: per step one matmul of the hidden state by the recurrence weights and the gate
arithmetic. The reverse direction runs over the sequence reversed. ``sequence_lens`` masks
the steps past each batch entry's length (the state stops, the output is zero there) and
reverses each entry within its own length; when the lengths are constants the masks and
indices fold into constants, and lengths that all equal the sequence length need none.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.ir import SSAValue

from cgc.dialects import wse
from cgc.frontends.builders import (
    NodeError,
    add,
    affine,
    clamp,
    dtype_of,
    mul,
    require_float,
    reshape,
    shape_of,
    transpose,
)
from cgc.frontends.onnx.activations import (
    elu,
    hard_sigmoid,
    leaky_relu,
    softplus,
    softsign,
    thresholded_relu,
)
from cgc.frontends.onnx.importer import Importer, register
from cgc.frontends.onnx.nodes import Node, bad_attr

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def columns(im: Importer, x: SSAValue, begin: int, end: int) -> SSAValue:
    """``x[:, begin:end]`` of a matrix; no op for all columns."""
    rows, width = shape_of(x)
    if (begin, end) == (0, width):
        return x
    return im.emit(wse.SliceOp(x, [0, begin], [rows, end], [1, 1]))


def row(im: Importer, x: SSAValue, index: int) -> SSAValue:
    """``x[index]``: the leading axis dropped."""
    shape = shape_of(x)
    rest = len(shape) - 1
    piece = im.emit(wse.SliceOp(x, [index] + [0] * rest, [index + 1, *shape[1:]], [1] * (rest + 1)))
    return reshape(im, piece, shape[1:])


def stack(im: Importer, values: Sequence[SSAValue], axis: int) -> SSAValue:
    """``values`` (of one shape) stacked along a new ``axis``."""
    shape = list(shape_of(values[0]))
    expanded = [reshape(im, v, [*shape[:axis], 1, *shape[axis:]]) for v in values]
    if len(expanded) == 1:
        return expanded[0]
    return im.emit(wse.ConcatOp(expanded, axis))


# ---------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------

ACTIVATION_PARAMETERS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None),
    "tanh": (None, None),
    "sigmoid": (None, None),
    "affine": (1.0, 0.0),
    "leakyrelu": (0.01, None),
    "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0),
    "hardsigmoid": (0.2, 0.5),
    "elu": (1.0, None),
    "softsign": (None, None),
    "softplus": (None, None),
}
"""Each activation (lower case) with the default of its alpha and beta, None for a parameter
it does not take. The defaults are those of the ONNX ops of the same names (ScaledTanh has
none there: 1 and 1 make it a plain tanh)."""


@dataclass(frozen=True)
class Activation:
    """An activation function of a recurrent op with its parameters."""

    name: str
    alpha: float = 0.0
    beta: float = 0.0


def parse_activations(node: Node, defaults: Sequence[str], directions: int) -> list[list]:
    """The activations of each direction: ``activations`` (or the op's defaults), their alpha
    and beta values taken in order by the functions that use them."""
    names = node.attr("activations", None)
    names = list(defaults) * directions if names is None else [str(n) for n in names]
    per_direction = len(defaults)
    if len(names) not in (per_direction, per_direction * directions):
        raise bad_attr("activations", names, f" ({per_direction} per direction expected)")
    alphas = iter(float(a) for a in node.attr("activation_alpha", []))
    betas = iter(float(b) for b in node.attr("activation_beta", []))
    parsed = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATION_PARAMETERS:
            raise bad_attr("activations", names, f" (unknown activation {name})")
        alpha, beta = ACTIVATION_PARAMETERS[key]
        alpha = next(alphas, alpha) if alpha is not None else 0.0
        beta = next(betas, beta) if beta is not None else 0.0
        parsed.append(Activation(key, alpha, beta))
    if len(parsed) == per_direction:
        parsed = parsed * directions
    return [parsed[d * per_direction : (d + 1) * per_direction] for d in range(directions)]


def scaled_tanh(im: Importer, x: SSAValue, alpha: float, beta: float) -> SSAValue:
    """``alpha * tanh(beta * x)``."""
    inner = im.emit(wse.TanhOp(mul(im, x, im.scalar(beta, x))))
    return mul(im, inner, im.scalar(alpha, x))


FORMULAS: dict[str, Callable[[Importer, SSAValue, Activation], SSAValue]] = {
    "relu": lambda im, x, act: im.emit(wse.ReluOp(x)),
    "tanh": lambda im, x, act: im.emit(wse.TanhOp(x)),
    "sigmoid": lambda im, x, act: im.emit(wse.SigmoidOp(x)),
    "affine": lambda im, x, act: affine(im, x, act.alpha, act.beta, skip_identities=False),
    "leakyrelu": lambda im, x, act: leaky_relu(im, x, act.alpha),
    "thresholdedrelu": lambda im, x, act: thresholded_relu(im, x, act.alpha),
    "scaledtanh": lambda im, x, act: scaled_tanh(im, x, act.alpha, act.beta),
    "hardsigmoid": lambda im, x, act: hard_sigmoid(im, x, act.alpha, act.beta),
    "elu": lambda im, x, act: elu(im, x, act.alpha),
    "softsign": lambda im, x, act: softsign(im, x),
    "softplus": lambda im, x, act: softplus(im, x),
}
"""The formula of each activation (those of the ONNX ops of the same names)."""


def activate(im: Importer, act: Activation, x: SSAValue) -> SSAValue:
    """``act`` applied to ``x`` elementwise."""
    return FORMULAS[act.name](im, x, act)


# ---------------------------------------------------------------------------------------------
# The common frame of RNN, GRU and LSTM
# ---------------------------------------------------------------------------------------------


@dataclass
class Direction:
    """The weights of one direction, as the unrolled steps use them."""

    reverse: bool
    input_weights: SSAValue
    """``W^T``: ``[input, gates * hidden]``."""
    recurrence_weights: SSAValue
    """``R^T``: ``[hidden, gates * hidden]``."""
    input_bias: SSAValue | None
    """``Wb``: ``[gates * hidden]``."""
    recurrence_bias: SSAValue | None
    """``Rb``: ``[gates * hidden]``."""
    activations: list[Activation]
    initial_h: SSAValue
    initial_c: SSAValue | None
    peepholes: SSAValue | None
    """``P``: ``[3 * hidden]`` (LSTM)."""


class Recurrence(abc.ABC):
    """One recurrent node: its inputs in layout 0, per-direction weights, the sequence masks,
    and the unrolling shared by the three ops."""

    def __init__(self, im: Importer, node: Node, gates: int, default_activations: list[str]):
        self.im, self.node, self.gates = im, node, gates
        self.layout = int(node.attr("layout", 0)) if im.opset >= 14 else 0
        if self.layout not in (0, 1):
            raise bad_attr("layout", self.layout)
        x = im.value(node, 0)
        if len(shape_of(x)) != 3:
            raise NodeError(f"the input X {shape_of(x)} must have rank 3")
        require_float(x)
        self.x = transpose(im, x, (1, 0, 2)) if self.layout else x
        self.seq, self.batch, self.input_size = shape_of(self.x)
        self.directions = self._directions()
        self.hidden = self._hidden_size()
        clip = node.attr("clip", None)
        self.clip = None if clip is None else float(clip)
        if self.clip is not None and self.clip <= 0:
            raise bad_attr("clip", clip, " (must be positive)")
        self.valid, self.reversed_order = self._sequence_masks()
        self.activations = parse_activations(node, default_activations, len(self.directions))

    # -- inputs -------------------------------------------------------------------------------

    def _directions(self) -> list[bool]:
        """Whether each direction runs in reverse."""
        direction = self.node.attr("direction", "forward")
        options = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
        if direction not in options:
            raise bad_attr("direction", direction, " (forward, reverse or bidirectional)")
        return options[direction]

    def _hidden_size(self) -> int:
        r = self.im.value(self.node, 2)
        hidden = shape_of(r)[-1]
        declared = self.node.attr("hidden_size", None)
        if declared is not None and int(declared) != hidden:
            raise bad_attr("hidden_size", declared, f" (R {shape_of(r)} has {hidden})")
        return hidden

    def operand(self, index: int, shape: Sequence[int], name: str) -> SSAValue | None:
        """Input ``index`` checked against ``shape``; None when absent."""
        return self.required(index, shape, name) if self.node.has_input(index) else None

    def required(self, index: int, shape: Sequence[int], name: str) -> SSAValue:
        """Input ``index``, which the node must have, checked against ``shape``."""
        value = self.im.value(self.node, index)
        if shape_of(value) != tuple(shape):
            raise NodeError(f"input {name} {shape_of(value)} must have shape {tuple(shape)}")
        return value

    def state_input(self, index: int, name: str) -> SSAValue | None:
        """``initial_h`` or ``initial_c`` as ``[directions, batch, hidden]``."""
        count = len(self.directions)
        if self.layout:
            value = self.operand(index, (self.batch, count, self.hidden), name)
            return None if value is None else transpose(self.im, value, (1, 0, 2))
        return self.operand(index, (count, self.batch, self.hidden), name)

    def _sequence_masks(self) -> tuple[SSAValue | None, SSAValue | None]:
        """``[seq, batch]`` whether each step is inside its entry's length, and the order of
        steps that reverses each entry within its length; both None without masking."""
        lengths = self.operand(4, (self.batch,), "sequence_lens")
        if lengths is None:
            return None, None
        known = self.im.known_value(self.node, 4)
        if known is not None:
            if np.any(known < 0) or np.any(known > self.seq):
                raise NodeError(f"sequence_lens {known.tolist()} must lie in [0, {self.seq}]")
            if np.all(known == self.seq):
                return None, None
        im = self.im
        steps = im.const(np.arange(self.seq, dtype=dtype_of(lengths)).reshape(self.seq, 1))
        lengths = reshape(im, lengths, (1, self.batch))
        valid = im.emit(wse.GreaterOp(lengths, steps))
        last = im.emit(wse.SubOp(lengths, im.scalar(1, lengths)))
        mirrored = im.emit(wse.SubOp(last, steps))
        everywhere = im.emit(wse.BroadcastToOp(steps, (self.seq, self.batch)))
        return valid, im.emit(wse.SelectOp(valid, mirrored, everywhere))

    def direction(self, index: int) -> Direction:
        """The weights, biases, initial state and activations of direction ``index``."""
        im, g, h = self.im, self.gates, self.hidden
        count = len(self.directions)
        w = self.required(1, (count, g * h, self.input_size), "W")
        r = self.required(2, (count, g * h, h), "R")
        b = self.operand(3, (count, 2 * g * h), "B")
        initial_h = self.state_input(5, "initial_h")
        zeros = im.const(np.zeros((self.batch, h), dtype=dtype_of(self.x)))
        return Direction(
            reverse=self.directions[index],
            input_weights=transpose(im, row(im, w, index), (1, 0)),
            recurrence_weights=transpose(im, row(im, r, index), (1, 0)),
            input_bias=None if b is None else self._half(row(im, b, index), 0),
            recurrence_bias=None if b is None else self._half(row(im, b, index), 1),
            activations=self.activations[index],
            initial_h=zeros if initial_h is None else row(im, initial_h, index),
            initial_c=None,
            peepholes=None,
        )

    def _half(self, bias: SSAValue, which: int) -> SSAValue:
        size = self.gates * self.hidden
        return self.im.emit(wse.SliceOp(bias, [which * size], [(which + 1) * size], [1]))

    # -- the unrolled sequence ----------------------------------------------------------------

    def ordered(self, sequence: SSAValue, reverse: bool) -> SSAValue:
        """``[seq, batch, ...]`` in the order a direction visits it (its own inverse)."""
        if not reverse:
            return sequence
        if self.reversed_order is None:
            return self.im.emit(wse.ReverseOp(sequence, [0]))
        shape = shape_of(sequence)
        order = reshape(self.im, self.reversed_order, (self.seq, self.batch, 1))
        order = self.im.emit(wse.BroadcastToOp(order, shape))
        return self.im.emit(wse.GatherElementsOp(sequence, order, 0))

    def projected_inputs(self, d: Direction, extra_bias: SSAValue | None) -> SSAValue:
        """``X W^T + Wb (+ extra_bias)`` for every step, ``[seq, batch, gates * hidden]``."""
        im = self.im
        x = reshape(im, self.ordered(self.x, d.reverse), (self.seq * self.batch, self.input_size))
        projected = add(im, im.emit(wse.MatmulOp(x, d.input_weights)), d.input_bias)
        projected = add(im, projected, extra_bias)
        return reshape(im, projected, (self.seq, self.batch, self.gates * self.hidden))

    def clipped(self, x: SSAValue) -> SSAValue:
        """``x`` bounded to ``[-clip, clip]`` when the node has a clip."""
        if self.clip is None:
            return x
        return clamp(self.im, x, -self.clip, self.clip)

    def step_mask(self, step: int) -> SSAValue | None:
        """``[batch, 1]`` whether ``step`` lies inside each entry's length; None without masks."""
        if self.valid is None:
            return None
        return reshape(self.im, row(self.im, self.valid, step), (self.batch, 1))

    def keep(self, mask: SSAValue | None, new: SSAValue, old: SSAValue) -> SSAValue:
        """``new`` where the step is valid, else ``old``."""
        return new if mask is None else self.im.emit(wse.SelectOp(mask, new, old))

    def keep_cell(
        self, mask: SSAValue | None, new: SSAValue | None, old: SSAValue | None
    ) -> SSAValue | None:
        """``keep`` for the cell state, which only LSTM has (None for RNN and GRU)."""
        if new is None:
            return None
        assert old is not None, "a step that gives a cell state takes one"
        return self.keep(mask, new, old)

    @abc.abstractmethod
    def cell(self, d: Direction, projected: SSAValue, h: SSAValue, c: SSAValue | None) -> tuple:
        """One step: the new ``(h, c)`` from the projected inputs of the step and the state."""

    def run(self, d: Direction) -> tuple[SSAValue, SSAValue, SSAValue | None]:
        """Unrolls ``cell`` over the sequence: ``(Y [seq, batch, hidden], Y_h, Y_c)`` with
        ``Y`` in the original order of the steps; an entry of length 0 ends in a zero state
        (as in onnxruntime)."""
        im = self.im
        projected = self.projected_inputs(d, self.extra_bias(d))
        h, c, outputs = d.initial_h, d.initial_c, []
        zero = im.scalar(0.0, h)
        for step in range(self.seq):
            new_h, new_c = self.cell(d, row(im, projected, step), h, c)
            mask = self.step_mask(step)
            outputs.append(self.keep(mask, new_h, zero))
            h = self.keep(mask, new_h, h)
            c = self.keep_cell(mask, new_c, c)
        nonempty = self.step_mask(0)
        h = self.keep(nonempty, h, zero)
        c = None if c is None else self.keep(nonempty, c, zero)
        return self.ordered(stack(im, outputs, 0), d.reverse), h, c

    def extra_bias(self, d: Direction) -> SSAValue | None:
        """The recurrence bias folded into the projected inputs (all of it by default)."""
        return d.recurrence_bias

    def outputs(self) -> list:
        """``Y``, ``Y_h`` (and ``Y_c``) of all directions, in the node's layout."""
        im = self.im
        results = [self.run(self.direction(i)) for i in range(len(self.directions))]
        y = stack(im, [r[0] for r in results], 1)
        states = [stack(im, [r[1] for r in results], 0)]
        cells = [r[2] for r in results if r[2] is not None]
        if cells:
            states.append(stack(im, cells, 0))
        if self.layout:
            y = transpose(im, y, (2, 0, 1, 3))
            states = [transpose(im, s, (1, 0, 2)) for s in states]
        return [y, *states]


# ---------------------------------------------------------------------------------------------
# RNN
# ---------------------------------------------------------------------------------------------


class RnnRecurrence(Recurrence):
    """The simple RNN: one gate."""

    def __init__(self, im: Importer, node: Node):
        super().__init__(im, node, 1, ["Tanh"])

    def cell(self, d: Direction, projected: SSAValue, h: SSAValue, c) -> tuple:
        """``H = f(X W^T + H R^T + Wb + Rb)``."""
        im = self.im
        total = im.emit(wse.AddOp(projected, im.emit(wse.MatmulOp(h, d.recurrence_weights))))
        return activate(im, d.activations[0], self.clipped(total)), None


@register("RNN")
def _rnn(im: Importer, node: Node) -> list:
    return RnnRecurrence(im, node).outputs()


# ---------------------------------------------------------------------------------------------
# GRU
# ---------------------------------------------------------------------------------------------


class GruRecurrence(Recurrence):
    """GRU: gates z (update), r (reset) and h (hidden); ``linear_before_reset`` applies the
    reset gate after the recurrence matmul (and its bias)."""

    def __init__(self, im: Importer, node: Node):
        super().__init__(im, node, 3, ["Sigmoid", "Tanh"])
        self.linear_before_reset = bool(node.attr("linear_before_reset", 0))

    def extra_bias(self, d: Direction) -> SSAValue | None:
        """The recurrence bias but, with ``linear_before_reset``, its hidden-gate part."""
        if d.recurrence_bias is None or not self.linear_before_reset:
            return d.recurrence_bias
        # Rbh stays with the recurrence (it is scaled by the reset gate)
        h = self.hidden
        mask = np.concatenate([np.ones(2 * h), np.zeros(h)]).astype(dtype_of(self.x))
        return self.im.emit(wse.MulOp(d.recurrence_bias, self.im.const(mask)))

    def cell(self, d: Direction, projected: SSAValue, h: SSAValue, c) -> tuple:
        """``z, r = f(..)``, ``h~ = g(..)``, ``H = (1 - z) h~ + z H``."""
        im, size = self.im, self.hidden
        f, g = d.activations
        weights = d.recurrence_weights
        if not self.linear_before_reset:
            weights = columns(im, weights, 0, 2 * size)
        recurrent = im.emit(wse.MatmulOp(h, weights))
        gates = im.emit(
            wse.AddOp(columns(im, projected, 0, 2 * size), columns(im, recurrent, 0, 2 * size))
        )
        gates = activate(im, f, self.clipped(gates))
        z, r = columns(im, gates, 0, size), columns(im, gates, size, 2 * size)
        candidate = activate(im, g, self.clipped(self.candidate(d, projected, recurrent, r, h)))
        one_minus_z = im.emit(wse.SubOp(im.scalar(1.0, z), z))
        new_h = im.emit(wse.AddOp(mul(im, one_minus_z, candidate), mul(im, z, h)))
        return new_h, None

    def candidate(self, d: Direction, projected, recurrent, r: SSAValue, h: SSAValue):
        """The input of ``g``: ``Xh + (r H) Rh^T (+ biases)``, or with linear_before_reset
        ``Xh + r (H Rh^T + Rbh) (+ Wbh)``."""
        im, size = self.im, self.hidden
        x_part = columns(im, projected, 2 * size, 3 * size)
        if self.linear_before_reset:
            h_part = columns(im, recurrent, 2 * size, 3 * size)
            if d.recurrence_bias is not None:
                bias = im.emit(wse.SliceOp(d.recurrence_bias, [2 * size], [3 * size], [1]))
                h_part = im.emit(wse.AddOp(h_part, bias))
            return im.emit(wse.AddOp(x_part, mul(im, r, h_part)))
        weights = columns(im, d.recurrence_weights, 2 * size, 3 * size)
        return im.emit(wse.AddOp(x_part, im.emit(wse.MatmulOp(mul(im, r, h), weights))))


@register("GRU")
def _gru(im: Importer, node: Node) -> list:
    return GruRecurrence(im, node).outputs()


# ---------------------------------------------------------------------------------------------
# LSTM
# ---------------------------------------------------------------------------------------------


class LstmRecurrence(Recurrence):
    """LSTM: gates i (input), o (output), f (forget) and c (cell), optional peepholes ``P``
    (i, o, f) and ``input_forget`` (``f = 1 - i``)."""

    def __init__(self, im: Importer, node: Node):
        super().__init__(im, node, 4, ["Sigmoid", "Tanh", "Tanh"])
        self.input_forget = bool(node.attr("input_forget", 0))

    def direction(self, index: int) -> Direction:
        """A direction as for any recurrence, plus its initial cell state and peepholes."""
        d = super().direction(index)
        initial_c = self.state_input(6, "initial_c")
        peepholes = self.operand(7, (len(self.directions), 3 * self.hidden), "P")
        if initial_c is not None:
            d.initial_c = row(self.im, initial_c, index)
        else:
            d.initial_c = self.im.const(np.zeros((self.batch, self.hidden), dtype_of(self.x)))
        d.peepholes = None if peepholes is None else row(self.im, peepholes, index)
        return d

    def peephole(self, d: Direction, which: int, c: SSAValue) -> SSAValue | None:
        """``P[which] * c`` (which: 0 input, 1 output, 2 forget); None without peepholes."""
        if d.peepholes is None:
            return None
        size = self.hidden
        weights = self.im.emit(wse.SliceOp(d.peepholes, [which * size], [(which + 1) * size], [1]))
        return mul(self.im, weights, c)

    def cell(self, d: Direction, projected: SSAValue, h: SSAValue, c: SSAValue | None) -> tuple:
        """``C = f C + i g(..)``, ``H = o h(C)`` with the gates ``f(.. + P c)``."""
        assert c is not None, "direction() gives every LSTM direction an initial cell state"
        im, size = self.im, self.hidden
        f, g, h_act = d.activations
        gates = im.emit(wse.AddOp(projected, im.emit(wse.MatmulOp(h, d.recurrence_weights))))
        gate = [columns(im, gates, k * size, (k + 1) * size) for k in range(4)]
        input_gate = activate(im, f, self.clipped(add(im, gate[0], self.peephole(d, 0, c))))
        if self.input_forget:
            forget = im.emit(wse.SubOp(im.scalar(1.0, input_gate), input_gate))
        else:
            forget = activate(im, f, self.clipped(add(im, gate[2], self.peephole(d, 2, c))))
        cell_input = activate(im, g, self.clipped(gate[3]))
        new_c = im.emit(wse.AddOp(mul(im, forget, c), mul(im, input_gate, cell_input)))
        output = activate(im, f, self.clipped(add(im, gate[1], self.peephole(d, 1, new_c))))
        return mul(im, output, activate(im, h_act, new_c)), new_c


@register("LSTM")
def _lstm(im: Importer, node: Node) -> list:
    return LstmRecurrence(im, node).outputs()
