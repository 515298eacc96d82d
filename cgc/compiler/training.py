"""What a training compile builds in: the optimizer and its settings (``Training``), the
weights it trains and those it holds fixed, the loss's batch reduction and the backward seed,
and the passes of the front stage configured with the weights a compile holds fixed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from cgc.compiler.fixed_weights import fold_fixed_weights
from cgc.dialects import wse
from cgc.dialects.ir import main_function
from cgc.dialects.parameters import parameter_weights
from cgc.errors import OptionError
from cgc.frontends.imported import ImportedModel
from cgc.frontends.params import ModelParams, optimizer_settings
from cgc.machine.sparse.sparsity import Sparsity
from cgc.machine.training import optimizers
from cgc.options import SparsityOptions, TrainingOptions
from cgc.passes.autodiff import trains
from cgc.passes.fuse_attention import fixed_masks
from cgc.passes.fuse_rotary import fixed_tables


class Training:
    """How a training artifact's steps update the weights: the optimizer MemoryX runs, the
    settings chosen for it by their API keywords (``lr``, ``betas``, ...: see
    ``cgc.machine.training.optimizers``; a setting left out or None takes torch.optim's default
    for the optimizer), and which initializers train: regular expressions matched in full against
    their names (none: an ONNX model's parameters, ``cgc.dialects.parameters``, and every
    float weight of another model, that reach the loss), those never trained (``frozen``,
    likewise), and the ``sparsity`` of the trained weights, if any
    (``cgc.machine.sparse.sparsity``)."""

    def __init__(
        self,
        optimizer: str = "sgd",
        trainable: Sequence[str] = (),
        sparsity: Sparsity | None = None,
        **settings: optimizers.Choice,
    ):
        self.optimizer = optimizer
        self.trainable = tuple(trainable)
        self.frozen: tuple[str, ...] = ()
        """Patterns of the weights never trained, whatever ``trainable`` says (set by the
        API's ``frozen``)."""
        self.sparsity = sparsity
        self.chosen = optimizers.chosen_settings(optimizer, settings)
        """The settings chosen (a CgcError naming the option if one is bad)."""

    def step_options(self) -> dict:
        """The options of ``schedule-streams`` that choose MemoryX's optimizer."""
        return {"optimizer": self.optimizer, **optimizers.with_flags(self.chosen)}

    def manifest(self) -> dict:
        """The optimizer and every one of its settings, as the artifact records them."""
        full = optimizers.settings(self.optimizer, self.chosen)
        return {"optimizer": self.optimizer, **optimizers.with_flags(full)}


def training_options(
    params: ModelParams | None,
    optimizer: str | None = None,
    trainable: Sequence[str] = (),
    sparsity: Sparsity | None = None,
    **settings: optimizers.Choice,
) -> Training:
    """The training of a model: ``optimizer`` (default: a params file's, else SGD) with
    ``settings`` (those left out or None: a params file's for its own optimizer, else
    torch.optim's defaults), and the weights' ``sparsity``."""
    chosen = {k: v for k, v in settings.items() if v is not None}
    if params is not None:
        kind, given = optimizer_settings(params)
        if optimizer is None or optimizer == kind:
            chosen = {**given, **chosen}
        optimizer = optimizer or kind
    return Training(optimizer or "sgd", trainable, sparsity, **chosen)


def training_of(
    params: ModelParams | None, run: TrainingOptions, sparse: SparsityOptions
) -> Training:
    """The training a compile builds in, as a training run's options and the weights'
    sparsity choose it (a params file's sparsity where the options choose none)."""
    sparsity = sparse.chosen()
    if sparsity is None and params is not None and params.sparsity is not None:
        sparsity = params.sparsity.sparsity(sparse.seed)
    training = training_options(params, run.optimizer, run.trainable, sparsity, **run.settings)
    training.frozen = tuple(run.frozen)
    return training


def batch_reduction(value: SSAValue) -> str | None:
    """How the loss combines the samples of a batch, ``mean`` or ``sum``, if it can tell."""
    op = value.owner
    if not isinstance(op, Operation):  # a graph input: nothing reduced it
        return None
    if isinstance(op, wse.SoftmaxCrossEntropyOp):
        return None if op.reduction.data == "none" else op.reduction.data
    if isinstance(op, wse.ReduceMeanOp | wse.ReduceSumOp) and 0 in op.axis_list:
        return "mean" if isinstance(op, wse.ReduceMeanOp) else "sum"
    if isinstance(op, wse.ReshapeOp | wse.CastOp | wse.NegOp):
        return batch_reduction(op.operands[0])
    # constants and weights are the same for every sample of the batch
    varying = [v for v in op.operands if not isinstance(v.owner, wse.ConstantOp | wse.WeightOp)]
    if isinstance(op, wse.MulOp | wse.DivOp) and len(varying) == 1:  # scaled by a constant
        return batch_reduction(varying[0])
    if isinstance(op, wse.AddOp | wse.SubOp):  # a sum of terms that all reduce alike
        kinds = {batch_reduction(v) for v in varying}
        return kinds.pop() if len(kinds) == 1 else None
    return None


def loss_scale(imported: ImportedModel, runs: int) -> tuple[float, str | None]:
    """The backward seed of each of ``runs`` runs of the program that make a step (systems
    times micro-batches), and the loss's batch reduction (None when it cannot tell, which only
    a step of one run can live with)."""
    loss = main_function(imported.module).body.block.last_op.operands[0]  # type: ignore[union-attr]
    kind = batch_reduction(loss)
    if kind is None:
        if runs > 1:
            owner = loss.owner
            where = (
                wse.location_name(owner) or owner.name
                if isinstance(owner, Operation)
                else f"graph input {imported.outputs[0].name}"
            )
            raise OptionError(
                f"cannot tell whether the loss '{imported.outputs[0].name}' (from node {where}) "
                "averages or sums over the batch, so its gradients cannot be split across "
                "systems or micro-batches; end the loss with ReduceMean, ReduceSum or "
                "SoftmaxCrossEntropyLoss, or train with num_csx 1 and a batch that fits",
                "num_csx",
            )
        return 1.0, None
    return (1.0 / runs if kind == "mean" else 1.0), kind


STREAMED_FOR_TRAINING = "training streams weights from MemoryX"
"""Why a training compiles for weight streaming (the manifest's ``mode_reason``)."""


def frozen_patterns(imported: ImportedModel, training: Training) -> tuple[str, ...]:
    """The weights a training holds fixed, as ``AutodiffPass.frozen`` takes them: those the
    user froze and, where no ``trainable`` pattern chose, an ONNX model's float weights that
    are not parameters (``cgc.dialects.parameters``: its exporter's lifted constants)."""
    if training.trainable or not imported.opset:
        return training.frozen
    parameters = parameter_weights(imported.module, imported.weights)
    constants = [
        op.weight_name.data
        for op in main_function(imported.module).walk()
        if isinstance(op, wse.WeightOp) and trains(op, []) and op.weight_name.data not in parameters
    ]
    return (*training.frozen, *(re.escape(name) for name in dict.fromkeys(constants)))


def trained_weights(
    imported: ImportedModel, training: Training | None
) -> Callable[[wse.WeightOp], bool]:
    """Whether a compile trains a weight (never in an inference)."""
    if training is None:
        return lambda op: False
    patterns = [re.compile(p) for p in training.trainable]
    frozen = [re.compile(p) for p in frozen_patterns(imported, training)]
    return lambda op: trains(op, patterns, frozen)


def fold_lifted_constants(imported: ImportedModel, training: Training | None) -> None:
    """Folds what a compile holds fixed (``fold_fixed_weights``): frozen weights (a PyTorch
    model's buffers and lifted constants) and an ONNX model's weights that are no parameters
    (``cgc.dialects.parameters``: its exporter's lifted constants), but no buffer a training
    updates. The import's IR dump shows the module after it."""
    kept = set()
    if training is not None:  # a training's buffers change each step, as parameters do
        kept = {update.buffer for update in imported.buffer_updates}
    lifted: Callable[[wse.WeightOp], bool] = lambda op: False  # noqa: E731
    if imported.opset:
        trained = trained_weights(imported, training)
        parameters = parameter_weights(imported.module, imported.weights)
        lifted = lambda op: not trained(op) and op.weight_name.data not in parameters  # noqa: E731
    fold_fixed_weights(
        imported.module,
        imported.weights,
        lambda op: op.weight_name.data not in kept and (op.frozen is not None or lifted(op)),
    )


def front(imported: ImportedModel, training: Training | None) -> tuple[ModulePass, ...]:
    """The passes of the ``front`` stage a compile configures: the fusions of rotary tables
    and of attention, with the weights the compile holds fixed (all in an inference; in a
    training, those it does not train)."""
    trained = trained_weights(imported, training)
    rotary = fixed_tables(imported.module, imported.weights, trained)
    fuse = fixed_masks(imported.module, imported.weights, trained)
    return (rotary, fuse)
