"""The options of a request, as typed, frozen records: a compile's (``CompileOptions``), the
weights' sparsity (``SparsityOptions``), a training run's (``TrainingOptions``) and where a
simulation runs (``SimulationOptions``). Each field's name, default, help and check are
written once, here: every door (``cgc.compile`` and the other functions of the API, the
``cgc`` commands, ``cgc.torch`` sessions, sweep points) builds the records once and hands
them whole down, and the command line's options and help are generated from them
(``cgc.cli_options``), as the optimizer's are from its table
(``cgc.machine.training.optimizers``).

The records stand on the machine floor alone (the target, the mode, the sparsity and the
optimizer table), below the compiler and the runtime, which both take them. An error about
an option, raised at whatever depth, is an ``OptionError`` naming it by its field; the
command line shows the field's flag instead (``Option.flag``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from cgc.errors import CgcError, OptionError
from cgc.machine.program.mode import REQUESTS
from cgc.machine.sparse.sparsity import CHOSEN_INITS, Sparsity
from cgc.machine.training.optimizers import KEYWORDS, OPTIMIZERS, Choice

if TYPE_CHECKING:
    from cgc.machine.hardware.target import Target

LOCAL, RAY = "local", "ray"
EXECUTORS = (LOCAL, RAY)
"""The executors a user may name (``executor``): where a numeric run's systems run, here or
each as a Ray actor (``cgc.runtime.executors``)."""
PLACEMENTS = ("pack", "spread")
"""How the actors of one run sit on a Ray cluster (``ray_placement``): packed on as few
nodes as will hold them, or spread over as many."""


@dataclass(frozen=True)
class Option:
    """What the command line makes of a field of a record."""

    help: str
    flag: str = ""
    """The command line's flag, if not the field's name with ``--`` and dashes."""
    choices: tuple[str, ...] = ()
    """The values allowed, if only some (the record checks them)."""
    kind: type | None = None
    """The command line's type of a value, if not a string."""
    bounds: tuple[int, int] | None = None
    """The least and the largest whole number allowed, if bounded (the record checks them)."""
    show_default: bool = False
    command_line: bool = True
    """False: the field is the Python API's alone, or the command line reads it its own way
    (``--shape``, ``--target``)."""


def option(default: Any, help: str, **how: Any) -> Any:
    """A field of a record: its default and its ``Option``."""
    return field(default=default, metadata={"option": Option(help, **how)})


def flag(name: str) -> str:
    """The command-line flag of the field ``name`` of any record."""
    for kind in RECORDS:
        found = {f.name: f for f in dataclasses.fields(kind)}.get(name)
        if found is not None and found.metadata["option"].flag:
            return found.metadata["option"].flag
    return "--" + name.replace("_", "-")


def _of_kind(value: object, kind: type) -> bool:
    """Whether ``value`` is a ``kind`` (a whole number is a float too; a bool is neither)."""
    if isinstance(value, bool) or kind is bool:
        return isinstance(value, bool) and kind is bool
    if kind is float:
        return isinstance(value, int | float | np.integer | np.floating)
    if kind is int:
        return isinstance(value, int | np.integer)
    return isinstance(value, kind)


@dataclass(frozen=True)
class Options:
    """A record of options: ``dataclasses.fields`` each with an ``Option``."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata["option"].choices
            value = getattr(self, f.name)
            if value is None:
                continue
            kind = f.metadata["option"].kind
            if kind is not None and not _of_kind(value, kind):
                raise OptionError(f"{f.name} {value!r}: expected {kind.__name__}", f.name)
            if choices and value not in choices:
                raise OptionError(f"{f.name} {value}: expected one of {', '.join(choices)}", f.name)
            bounds = f.metadata["option"].bounds
            if bounds is not None and not bounds[0] <= value <= bounds[1]:
                raise OptionError(
                    f"{f.name} {value}: must be in [{bounds[0]}, {bounds[1]}]", f.name
                )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def option_of(cls, name: str) -> Option:
        """The ``Option`` of the field ``name``."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        return fields[name].metadata["option"]


@dataclass(frozen=True)
class CompileOptions(Options):
    """What a compile is asked for (``cgc.compile``, ``cgc compile``)."""

    mode: str = option(
        "auto",
        "Execution mode; auto picks pipelined when the model fits in SRAM (generate: the "
        "faster way to serve the sequences).",
        choices=REQUESTS,
        show_default=True,
    )
    """``pipelined``, ``weight_streaming`` or ``auto`` (``cgc.machine.program.mode``)."""
    target: str | Target = option("wse2", "The target.", command_line=False)  # noqa: RUF009
    """A target's name, or any ``cgc.machine.hardware.target.Target``."""
    batch_size: int | None = option(None, "Global batch: the leading dim of every input.", kind=int)
    """The global batch, split evenly over ``num_csx`` systems (both default to a params
    file's, else to the model's declared batch, or a PyTorch example's, and 1): it binds the
    symbolic batch dimension of the inputs."""
    shapes: Mapping[str, Sequence[int]] | None = option(
        None, "NAME=D0xD1...: an input's shape.", flag="--shape", command_line=False
    )
    """Whole input shapes by name."""
    num_csx: int | None = option(
        None, "Systems to split over  [default: the model's, or 1]", kind=int
    )
    micro_batch_size: int | None = option(
        None, "Samples per run of the program (default: the largest that fits).", kind=int
    )
    """Weight streaming: fixes the memory plan's micro-batch (``cgc.compiler.memory``)."""
    recompute: bool | None = option(
        None, "Recompute activations per transformer block (default: if faster).", kind=bool
    )
    """Weight streaming: fixes whether the plan recomputes activations."""
    no_weights: bool = option(
        False,
        "Read an ONNX model's graph without its weights (timing-only artifact).",
        kind=bool,
    )
    """Its external data may be absent."""
    init_seed: int | None = option(
        None, "Draw a params-file model's weights from this seed.", kind=int, bounds=(0, 2**63 - 1)
    )
    dynamic_batch: bool = option(
        True, "A PyTorch example's axis 0 is a symbolic batch.", command_line=False
    )


@dataclass(frozen=True)
class SparsityOptions(Options):
    """Which weights are sparse and how (``cgc.machine.sparse.sparsity``)."""

    sparsity: float | None = option(
        None, "Fraction of zeros of the sparse weights, e.g. 0.75 (0: dense).", kind=float
    )
    """The fraction of zeros, in [0, 1), of the weights ``sparse_params`` match, their live
    values drawn from ``seed`` or, with ``sparsity_init="magnitude"``, the largest initial
    ones. MemoryX streams a sparse weight's live values and their indices, and the wafer
    multiplies by those alone (``cgc.machine.sparse.tiles``). A training without it takes a
    params file's ``sparsity`` section."""
    sparse_params: tuple[str, ...] = option(
        (), "Regex over the sparse weights' names (repeatable)."
    )
    """Regular expressions matched in full against weight names (none: every matrix but the
    embeddings)."""
    sparsity_init: str = option(
        "random",
        "Which values live: drawn from --seed, or the largest initial ones.",
        choices=CHOSEN_INITS,
        show_default=True,
    )
    seed: int = option(0, "Seed of the masks.", kind=int, show_default=True)
    """The live values of ``sparsity_init="random"`` are drawn from it."""
    sparsity_schedule: str | None = option(None, "static, or dynamic: the masks move.")
    """``dynamic`` moves the masks every ``sparsity_update_every`` steps (until
    ``sparsity_end_step``), dropping a ``sparsity_drop_fraction`` of the live values
    (``sparsity_decay``: ``constant`` or ``cosine``) and regrowing as many by
    ``sparsity_regrow``: ``gradient`` (RigL) or ``random`` (SET)."""
    sparsity_update_every: int | None = option(None, "Steps per mask update [100]", kind=int)
    sparsity_drop_fraction: float | None = option(None, "Live share dropped [0.3]", kind=float)
    sparsity_regrow: str | None = option(None, "By gradient (RigL) or random (SET) [gradient]")
    sparsity_decay: str | None = option(None, "Drop fraction constant or cosine [constant]")
    sparsity_end_step: int | None = option(None, "Masks stop moving at this step.", kind=int)
    detect_sparsity: float | None = option(
        None,
        "Weights with this fraction of zeros are sparse, their zeros dead.",
        kind=float,
    )
    """Instead of ``sparsity``: the matrices with at least this fraction of zeros are sparse,
    their zeros dead (a pruned model's stay dead through its training)."""

    def chosen(self) -> Sparsity | None:
        """The sparsity these options choose (None: none; an error names a bad option)."""
        return Sparsity.of(
            self.sparsity, self.sparse_params, self.sparsity_init, self.seed,
            self.sparsity_schedule, update_every=self.sparsity_update_every,
            drop_fraction=self.sparsity_drop_fraction, regrow=self.sparsity_regrow,
            decay=self.sparsity_decay, end_step=self.sparsity_end_step,
        )  # fmt: skip


@dataclass(frozen=True)
class TrainingOptions(Options):
    """A training run's options (``cgc.prepare_training``, ``cgc train``)."""

    steps: int = option(1, "Training steps.", kind=int, command_line=False)
    """Steps of the run; a cosine schedule decays towards 0 at the last."""
    optimizer: str | None = option(
        None,
        "The optimizer MemoryX runs  [default: the params file's, or sgd]",
        choices=tuple(OPTIMIZERS),
    )
    settings: Mapping[str, Choice] = field(
        default_factory=dict,
        metadata={"option": Option("The optimizer's settings.", command_line=False)},
    )
    """The optimizer's settings by torch.optim's keywords (``lr``, ``momentum``,
    ``dampening``, ``weight_decay``, ``nesterov``, ``betas``, ``eps``, ``amsgrad``: the table
    ``cgc.machine.training.optimizers.KEYWORDS``), which the doors also take by name; one
    left out or None takes the params file's, else torch.optim's default for the optimizer
    (``sgd``, ``adam`` or ``adamw``; default the params file's, else ``sgd``)."""
    lr_schedule: str = option(
        "constant",
        "After the warm-up: constant, cosine decay towards 0 at --steps, or step decay.",
        choices=("constant", "cosine", "step"),
        show_default=True,
    )
    """After a linear warm-up of ``warmup_steps``: ``constant``, ``cosine`` (towards 0 at
    ``steps``) or ``step`` (times ``lr_gamma`` every ``lr_step_size`` steps)."""
    warmup_steps: int = option(0, "Linear warm-up.", kind=int, show_default=True)
    lr_step_size: int = option(1, "Step decay period.", kind=int, show_default=True)
    lr_gamma: float = option(0.1, "Step decay factor.", kind=float, show_default=True)
    max_grad_norm: float | None = option(
        None, "Clip the gradients' global norm to this.", kind=float
    )
    checkpoint_every: int = option(0, "Checkpoint to DIR/checkpoints every N steps.", kind=int)
    """Writes ``model_dir/checkpoints/step-N/`` every this many steps (0: never); ``resume``
    continues from the newest good one."""
    resume: bool = option(False, "Continue from the newest good checkpoint.", kind=bool)
    shuffle: bool = option(False, "Shuffle the samples of every epoch.", kind=bool)
    seed: int = option(
        0, "Seed of the shuffling (and of sparse weights' masks).", kind=int, show_default=True
    )
    allow_nonfinite: bool = option(
        False,
        "Train on through a NaN or infinite loss or gradient (else the run stops there).",
        kind=bool,
    )
    """Without it, a loss or gradients that are not finite stop the run at that step (a
    ``CgcError`` naming the step and the first weight whose gradient is not finite, the
    weights those of the step before)."""
    eval_every: int | None = option(None, "Measure the held-out loss every N steps.", kind=int)
    """With held-out data, its loss (forward only) is logged every this many steps and after
    the last."""
    swarmx_fanout: int | None = option(None, "Children per SwarmX node  [default: 4]", kind=int)
    trainable: tuple[str, ...] = option(
        (),
        "Regex over initializer names to train (repeatable)  [default: an ONNX model's "
        "parameters, not its exporter's constants]",
    )
    """Regular expressions matched in full against weight names: the weights trained. By
    default an ONNX model's parameters, the weights it reads as a model reads its learned
    tensors, not the constants its exporter lifted into initializers
    (``cgc.dialects.parameters``), and every float weight of another model."""
    frozen: tuple[str, ...] = option((), "Regex over initializer names never trained.")
    """Likewise: weights held fixed whatever ``trainable`` says."""


@dataclass(frozen=True)
class SimulationOptions(Options):
    """Where a numeric run's systems run (``cgc.run``, ``cgc.train``; ``cgc.runtime.executors``)."""

    num_csx: int | None = option(None, "Systems to run on (default: as compiled).", kind=int)
    executor: str = option(
        LOCAL,
        "Run a numeric run's systems here, or each as a Ray actor (pip install "
        "'cgc[ray]'); timing-only runs stay here.",
        choices=EXECUTORS,
        show_default=True,
    )
    ray_address: str | None = option(
        None, "The Ray cluster to join, e.g. auto  [default: a local instance]"
    )
    ray_placement: str | None = option(
        None,
        "Keep the run's actors on few Ray nodes, or spread them over many  [default: pack]",
        choices=PLACEMENTS,
    )


MAX_TOKENS = 2**31 - 1
"""The most tokens a count of tokens may give (token ids and positions are 32-bit)."""


@dataclass(frozen=True)
class GenerationOptions(Options):
    """What a generation is asked for (``cgc.generate``, ``cgc generate``): its prompt's and
    its own lengths and how many sequences it serves at once. Where the model runs is the
    ``CompileOptions``' (``mode``: ``pipelined``, ``whole_wafer``, ``weight_streaming`` or
    ``auto``, which picks the faster of the first two for the sequences served)."""

    max_new_tokens: int = option(
        16, "Tokens to generate after each prompt.", kind=int, bounds=(1, MAX_TOKENS),
        show_default=True,
    )  # fmt: skip
    concurrent: int | None = option(
        None,
        "Sequences generated at once  [default: the prompt's rows, or 1]",
        kind=int,
        bounds=(1, MAX_TOKENS),
    )
    prompt_len: int | None = option(
        None,
        "Tokens of each prompt of a timing-only generation (without --prompt).",
        kind=int,
        bounds=(1, MAX_TOKENS),
    )
    timing_only: bool = option(
        False,
        "Time the generation alone: no prompt's numbers, weights declared, not drawn.",
        kind=bool,
    )


RECORDS: tuple[type[Options], ...] = (
    CompileOptions,
    SparsityOptions,
    TrainingOptions,
    SimulationOptions,
    GenerationOptions,
)
"""Every record of options."""

R = TypeVar("R", bound=Options)


class Chosen:
    """The records a door was given, completed by the fields it was given by name: one record
    of each kind the door takes (its defaults where none was given)."""

    def __init__(
        self,
        door: str,
        kinds: Sequence[type[Options]],
        records: Sequence[object],
        fields: Mapping[str, Any],
    ):
        given: dict[type[Options], Options] = {}
        for record in records:
            if not isinstance(record, Options) or type(record) not in kinds:
                takes = ", ".join(kind.__name__ for kind in kinds)
                raise CgcError(f"{door}: {record!r} is not one of its records ({takes})")
            if type(record) in given:
                raise CgcError(f"{door}: two {type(record).__name__} records")
            given[type(record)] = record
        names = {name for kind in kinds for name in kind.names()}
        settings = {k: v for k, v in fields.items() if k in KEYWORDS}
        if TrainingOptions not in kinds:
            settings = {}
        unknown = sorted(set(fields) - names - set(settings) - {"settings"})
        if unknown:
            known = ", ".join(sorted(names - {"settings"}))
            raise CgcError(f"{door}: {unknown[0]} is not one of its options ({known})")
        self.records: dict[type[Options], Options] = {}
        for kind in kinds:
            own = {k: v for k, v in fields.items() if k in kind.names()}
            if kind is TrainingOptions and settings:
                own["settings"] = {**own.get("settings", {}), **settings}
            record = given.get(kind)
            self.records[kind] = (
                kind(**own) if record is None else dataclasses.replace(record, **own)
            )

    def __getitem__(self, kind: type[R]) -> R:
        record = self.records[kind]
        assert isinstance(record, kind)
        return record
