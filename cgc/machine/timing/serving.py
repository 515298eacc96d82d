"""Serving's timing: a generation's prompt (prefill) and its tokens (decode) through K systems.

A generation runs two programs of one artifact: the prompts', once per chunk of the prompts'
tokens, and the decode step's, once per new token, both sharing the weights and the key-value
caches. Each program's cost per layer is what the machine's timing engine gives for one run
of it (the compiler's cost queries and the simulator ask the same engine): this module only
arranges the layers in time. The cost is by the program, never by the data: a run of a
thousand steps times each program once.

The model is split at layer boundaries over the ``K`` systems, the transformer blocks evenly
(the embedding with the first system, the head with the last); only activations cross between
systems, through the systems' I/O (``io_bytes_per_s``) and one SwarmX hop
(``swarmx_hop_seconds``). The two ways a wafer serves:

- **pipelined** (``Mode.PIPELINED``): every layer on its own rectangle, weights resident, the
  sequences flowing through the layers one after another, each layer taking one sequence's
  token at a time (the layers' times are a run of one sequence's). A sequence's step takes
  the sum of the layers' times (its latency), and a new sequence can enter every slowest
  layer's time (the period). With ``S`` sequences in flight, a sequence's next token waits
  for its last: one token per sequence every ``max(latency, S x period)``.
- **whole wafer** (``Mode.WHOLE_WAFER``): every layer over the whole wafer in turn, its
  weights on every PE, all ``S`` sequences of a step together (the layers' times are a run
  of all of them); a step takes the sum of its layers (and a system waits while another
  works on the same step).

Time to first token is the prompt's pass for every sequence, in the chunks the prompts'
program takes (the pipelined way lets the sequences and the chunks follow one another, one
period apart); time per output token is the decode step's
token time, the same for every step: the cached attention reads its sequence's whole cache,
masked past its position (``cgc.machine.plans.attention.CachedAttention``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cgc.machine.hardware.target import Target
from cgc.machine.plans.kernel import binding
from cgc.machine.program.mode import Mode
from cgc.machine.timing.cost import LayerRecord

BLOCK_PREFIX = "h."
"""Layers whose names start with this belong to a transformer block (``h.N.``)."""


@dataclass(frozen=True)
class LayerTime:
    """One layer in a pass: on which system, how long it holds a step of every sequence, and
    how that time splits."""

    name: str
    system: int
    seconds: float
    compute_seconds: float
    arrival_seconds: float
    """Bringing operands where its kernels need them (weights and relaid tensors)."""
    movement_seconds: float
    """The rest of its data movement: broadcasts, reductions, gathers."""

    @property
    def bound(self) -> str:
        """What takes most of its time."""
        return binding(
            {
                "compute": self.compute_seconds,
                "arrival": self.arrival_seconds,
                "data movement": self.movement_seconds,
            }
        )

    def to_json(self) -> dict[str, Any]:
        """The layer's row of a report."""
        return {**dataclasses.asdict(self), "bound": self.bound}


@dataclass(frozen=True)
class Pass:
    """One program's pass over the systems: a step of every sequence."""

    layers: list[LayerTime]
    link_seconds: float
    """Activations crossing from one system to the next, per crossing and sequence."""
    systems: int
    sequences: int
    mode: Mode

    def record(self) -> dict[str, Any]:
        """The pass as an artifact keeps it (``from_record`` reads it back)."""
        return {
            "layers": [dataclasses.asdict(t) for t in self.layers],
            "link_seconds": self.link_seconds,
            "systems": self.systems,
            "sequences": self.sequences,
            "mode": str(self.mode),
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Pass:
        """The pass of ``record``."""
        layers = [LayerTime(**layer) for layer in data["layers"]]
        return cls(layers, data["link_seconds"], data["systems"], data["sequences"],
                   Mode(data["mode"]))  # fmt: skip

    @property
    def latency_seconds(self) -> float:
        """A sequence's step (the whole wafer: every sequence's), from entering the first
        system to leaving the last."""
        return sum(t.seconds for t in self.layers) + (self.systems - 1) * self.link_seconds

    @property
    def period_seconds(self) -> float:
        """Pipelined, how often another sequence can begin the step: the slowest layer's
        time, or a link's."""
        return max([*(t.seconds for t in self.layers), self.link_seconds], default=0.0)

    @property
    def latency_bound(self) -> bool:
        """Whether a step waits on the sum of the layers rather than on the slowest."""
        return self.mode != Mode.PIPELINED or self.latency_seconds >= self.filled_seconds

    @property
    def filled_seconds(self) -> float:
        """Pipelined: every sequence's turn at the slowest layer."""
        return self.sequences * self.period_seconds

    @property
    def bound(self) -> str:
        """What bounds the pass: the sum of its layers (naming the slowest), the slowest
        layer, or the links."""
        if not self.layers:
            return "nothing"
        slowest = max(self.layers, key=lambda t: t.seconds)
        if self.latency_bound:
            return f"the sum of its layers' times (the slowest: {slowest.name}, {slowest.bound})"
        if self.link_seconds > slowest.seconds:
            return "system-to-system links"
        return f"{slowest.name}: {slowest.bound}"

    @property
    def token_seconds(self) -> float:
        """How often each sequence gets a step done when every sequence steps in turn."""
        if self.mode == Mode.PIPELINED:
            return max(self.latency_seconds, self.filled_seconds)
        return self.latency_seconds

    def done_seconds(self, runs: int) -> float:
        """From the first sequence's start to the last one's end of ``runs`` runs each, one
        after another (a prompt's chunks)."""
        if self.mode == Mode.PIPELINED:
            return self.latency_seconds + (self.sequences * runs - 1) * self.period_seconds
        return runs * self.latency_seconds


def systems_of(names: Sequence[str], systems: int) -> list[int]:
    """The system of each layer of a model (in program order) split at layer boundaries over
    ``systems``: the blocks evenly, in order, the layers before them with the first system and
    those after with the last."""
    blocks = [block_of(name) for name in names]
    order = sorted({b for b in blocks if b is not None})
    per = -(-len(order) // systems) if order else 1
    place = {block: min(i // per, systems - 1) for i, block in enumerate(order)}
    last = max((i for i, b in enumerate(blocks) if b is not None), default=len(names))
    out: list[int] = []
    for index, block in enumerate(blocks):
        if block is not None:
            out.append(place[block])
        elif index > last:
            out.append(systems - 1)
        else:
            out.append(out[-1] if out else 0)
    return out


def block_of(name: str) -> int | None:
    """The block a layer belongs to (``h.N.``), or None."""
    if not name.startswith(BLOCK_PREFIX):
        return None
    head = name[len(BLOCK_PREFIX) :].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def renamed(name: str, block: int) -> str:
    """A block's layer ``name`` as the same layer of block ``block``."""
    rest = name[len(BLOCK_PREFIX) :].split(".", 1)[1]
    return f"{BLOCK_PREFIX}{block}.{rest}"


def make_pass(
    records: Sequence[LayerRecord],
    target: Target,
    mode: Mode,
    systems: int,
    sequences: int,
    crossing_bytes: float,
) -> Pass:
    """The pass of a program whose run made ``records`` (one per layer, the whole model's),
    split over ``systems``; ``crossing_bytes`` are the activations of one run that cross
    from one system to the next."""
    placed = systems_of([r.name for r in records], systems)
    layers = [
        LayerTime(
            r.name,
            system,
            target.seconds(r.cycles),
            target.seconds(r.compute_cycles),
            target.seconds(r.arrival_cycles),
            target.seconds(r.movement_cycles),
        )
        for r, system in zip(records, placed, strict=True)
    ]
    link = crossing_bytes / target.io_bytes_per_s + target.swarmx_hop_seconds
    return Pass(layers, link if systems > 1 else 0.0, systems, sequences, mode)


COUNTS = ("prompt_tokens", "prompt_runs", "new_tokens", "kv_capacity_tokens",
          "kv_bytes_per_token")  # fmt: skip
"""The whole numbers of a ``Serving``, in its fields' order."""


@dataclass(frozen=True)
class Serving:
    """How fast ``sequences`` sequences generate: their prompt, then ``new_tokens`` each."""

    prefill: Pass
    decode: Pass
    prompt_tokens: int
    prompt_runs: int
    """Runs of the prompts' program: the prompt's chunks."""
    new_tokens: int
    kv_capacity_tokens: int
    """Cache tokens that fit in the SRAM left after weights and activations, summed over the
    sequences (a sequence's longest context times the sequences served at once), on the
    layers' rectangles as placed for the caches compiled: pipelined, a longer context placed
    anew gives its attention layers more rows, and more room."""
    kv_bytes_per_token: int

    def record(self) -> dict[str, Any]:
        """The figures' sources as an artifact keeps them (``from_record`` reads them)."""
        return {
            "prefill": self.prefill.record(),
            "decode": self.decode.record(),
            **{name: getattr(self, name) for name in COUNTS},
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Serving:
        """The serving of ``record``."""
        passes = Pass.from_record(data["prefill"]), Pass.from_record(data["decode"])
        return cls(*passes, *(data[name] for name in COUNTS))

    @property
    def ttft_seconds(self) -> float:
        """Time to first token: every sequence's prompt through the model, chunk after
        chunk."""
        return self.prefill.done_seconds(self.prompt_runs)

    @property
    def tpot_seconds(self) -> float:
        """Time per output token after the first, per sequence."""
        return self.decode.token_seconds

    @property
    def tokens_per_second_per_sequence(self) -> float:
        return 1 / self.tpot_seconds if self.tpot_seconds else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Every sequence's tokens together, in the steady decode."""
        return self.decode.sequences * self.tokens_per_second_per_sequence

    @property
    def seconds(self) -> float:
        """The whole generation: the prompts, then the rest of the tokens."""
        return self.ttft_seconds + max(self.new_tokens - 1, 0) * self.tpot_seconds

    def step_seconds(self, tokens: int | None = None) -> list[float]:
        """Each of ``tokens`` new tokens' time (default: ``new_tokens``), the first's being
        the prompt's."""
        count = self.new_tokens if tokens is None else tokens
        return [self.ttft_seconds] + [self.tpot_seconds] * max(count - 1, 0)

    def to_json(self) -> dict[str, Any]:
        """The figures ``--stats-json`` writes."""
        return {
            "mode": str(self.decode.mode),
            "num_csx": self.decode.systems,
            "concurrent": self.decode.sequences,
            "prompt_tokens": self.prompt_tokens,
            "prompt_chunks": self.prompt_runs,
            "new_tokens": self.new_tokens,
            "ttft_seconds": self.ttft_seconds,
            "tpot_seconds": self.tpot_seconds,
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_second_per_sequence": self.tokens_per_second_per_sequence,
            "seconds": self.seconds,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "decode_bound": self.decode.bound,
            "prefill_bound": self.prefill.bound,
            "system_link_seconds": self.decode.link_seconds,
            "decode_layers": [t.to_json() for t in self.decode.layers],
        }
