"""The compile driver: frontend, pass pipeline, mode choice, lowering, artifact.

Pipelines (every pass dumps its result with ``--dump-ir``):

* pipelined: ``decompose, fold-constants, form-layers, place-layers, route-tensors``;
* weight streaming: ``decompose, fold-constants, form-layers, schedule-streams``;
* training (weight streaming): ``decompose, fold-constants, form-layers, autodiff,
  fold-constants, schedule-streams{optimizer=...}``.

``auto`` runs the placement and routing and keeps them if the model fits on the wafer;
otherwise it compiles for weight streaming and records why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from cgc.dialects import context, print_module, verify, wse
from cgc.dialects.ir import main_function, set_module_target
from cgc.dialects.lowering import lower
from cgc.errors import CgcError, DoesNotFitError
from cgc.frontends.onnx import ImportedModel, import_model, import_onnx
from cgc.machine import optimizers
from cgc.machine.artifact import FORMAT_VERSION, Artifact
from cgc.machine.bytecode import Opcode
from cgc.machine.cost import program_costs
from cgc.machine.target import Target, resolve
from cgc.machine.units import human_bytes
from cgc.passes.autodiff import AutodiffPass
from cgc.passes.channels_last import ChannelsLastPass
from cgc.passes.decompose import DecomposePass
from cgc.passes.fold_constants import FoldConstantsPass
from cgc.passes.form_layers import FormLayersPass
from cgc.passes.place_layers import PlaceLayersPass
from cgc.passes.route_tensors import RouteTensorsPass
from cgc.passes.schedule_streams import ScheduleStreamsPass
from cgc.version import __version__

MODES = ("pipelined", "weight_streaming", "auto")


class TrainingOptions:
    """How a training artifact's steps update the weights: the optimizer MemoryX runs, the
    settings chosen for it by their API keywords (``lr``, ``betas``, ...: see
    ``cgc.machine.optimizers``; a setting left out or None takes torch.optim's default for the
    optimizer), and which initializers train: regular expressions matched in full against
    their names (none: all float initializers that reach the loss)."""

    def __init__(
        self, optimizer: str = "sgd", trainable: Sequence[str] = (), **settings: optimizers.Choice
    ):
        self.optimizer = optimizer
        self.trainable = tuple(trainable)
        self.chosen = optimizers.chosen_settings(optimizer, settings)
        """The settings chosen (a CgcError naming the option if one is bad)."""

    def step_options(self) -> dict:
        """The options of ``schedule-streams`` that choose MemoryX's optimizer."""
        return {"optimizer": self.optimizer, **optimizers.with_flags(self.chosen)}

    def manifest(self) -> dict:
        """The optimizer and every one of its settings, as the artifact records them."""
        full = optimizers.settings(self.optimizer, self.chosen)
        return {"optimizer": self.optimizer, **optimizers.with_flags(full)}


def pass_spec(p: ModulePass) -> str:
    """``name{option=value ...}`` with only the options that differ from their defaults,
    strings quoted and escaped so that the text parses back."""
    args = []
    for f in dataclasses.fields(p):
        value = getattr(p, f.name)
        if value != f.default:
            args.append(f"{f.name}={_spec_value(value)}")
    return p.name + ("{" + " ".join(args) + "}" if args else "")


def _spec_value(value) -> str:
    if isinstance(value, tuple):
        return ",".join(_spec_value(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


class IRDumps:
    """Writes ``NN-<pass>.mlir`` after every step and/or echoes the IR."""

    def __init__(self, directory: str | os.PathLike | None, echo: Callable[[str], None] | None):
        self.directory = Path(directory) if directory is not None else None
        self.echo = echo
        self.count = 0
        if self.directory is not None:
            if self.directory.exists() and not self.directory.is_dir():
                raise CgcError(f"--dump-ir {self.directory}: exists and is not a directory")
            self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def active(self) -> bool:
        """Whether anyone reads the IR between passes."""
        return self.directory is not None or self.echo is not None

    def __call__(self, step: str, module: ModuleOp) -> None:
        if not self.active:
            return
        text = print_module(module)
        if self.directory is not None:
            (self.directory / f"{self.count:02d}-{step}.mlir").write_text(text)
        if self.echo is not None:
            self.echo(f"// -----// IR Dump After {step} //----- //\n{text}")
        self.count += 1


class Compilation:
    """One compile: the module as it moves through the pipeline, and what was decided."""

    def __init__(self, imported: ImportedModel, target: Target, dumps: IRDumps):
        self.imported = imported
        self.module = imported.module
        self.target = target
        self.dumps = dumps
        self.ctx = context()
        self.applied: list[str] = []
        set_module_target(self.module, target)
        # verifying a large module costs as much as a pass: after every pass only when the IR
        # is dumped for reading, otherwise once at the end (the importer checks each op)
        self.verify_each = dumps.active
        if self.verify_each:
            verify(self.module, imported.source)
        dumps("import", self.module)

    def run(self, *passes: ModulePass) -> None:
        """Applies passes one by one, dumping after each."""
        for p in passes:
            p.apply(self.ctx, self.module)
            if self.verify_each:
                verify(self.module, f"{self.imported.source} after {p.name}")
            self.applied.append(pass_spec(p))
            self.dumps(p.name, self.module)

    def verify(self) -> None:
        """Checks the IR the pipeline produced. Only dumping verifies after every pass, so a
        failure here names the whole pipeline and how to find the pass that broke it."""
        if self.verify_each:
            return
        passes = ", ".join(spec.split("{")[0] for spec in self.applied)
        verify(
            self.module,
            f"{self.imported.source} after the passes {passes}"
            " (--print-ir-after-all verifies after each pass)",
        )

    def try_place(self) -> str | None:
        """Places the layers if the model fits; returns why not otherwise."""
        trial = self.module.clone()
        done: list[tuple[ModulePass, ModuleOp]] = []
        try:
            steps: tuple[ModulePass, ...] = (PlaceLayersPass(), RouteTensorsPass())
            for step in steps:
                step.apply(self.ctx, trial)
                done.append((step, trial.clone() if self.dumps.active else trial))
        except DoesNotFitError as e:
            return str(e)
        self.module = trial
        for step, after in done:
            self.applied.append(pass_spec(step))
            self.dumps(step.name, after)
        return None


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


def loss_scale(imported: ImportedModel, num_csx: int) -> tuple[float, str | None]:
    """The backward seed for ``num_csx`` systems, and the loss's batch reduction (None when it
    cannot tell, which only one system can live with)."""
    loss = main_function(imported.module).body.block.last_op.operands[0]  # type: ignore[union-attr]
    kind = batch_reduction(loss)
    if kind is None:
        if num_csx > 1:
            owner = loss.owner
            where = (
                wse.location_name(owner) or owner.name
                if isinstance(owner, Operation)
                else f"graph input {imported.outputs[0].name}"
            )
            raise CgcError(
                f"cannot tell whether the loss '{imported.outputs[0].name}' (from node {where}) "
                "averages or sums over the batch, so its gradients cannot be split across "
                "systems; end the loss with ReduceMean, ReduceSum or SoftmaxCrossEntropyLoss, "
                "or train with --num-csx 1"
            )
        return 1.0, None
    return (1.0 / num_csx if kind == "mean" else 1.0), kind


def _import(model, per_system_batch, shapes, values) -> ImportedModel:
    if isinstance(model, ImportedModel):
        return model
    if isinstance(model, onnx.ModelProto):
        return import_model(model, per_system_batch, shapes, values=values)
    return import_onnx(model, per_system_batch, shapes, values)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pauses Python's cyclic garbage collector: a compile builds a large graph of long-lived
    IR objects, which every full collection would walk again (15 % of a 10,000-node
    compile); reference counting still frees what is dropped."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@_cyclic_gc_paused()
def compile_model(
    model: str | os.PathLike | onnx.ModelProto | ImportedModel,
    mode: str = "auto",
    target: str | Target = "wse2",
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    num_csx: int = 1,
    dump_ir: str | os.PathLike | None = None,
    print_ir_after_all: Callable[[str], None] | None = None,
    training: TrainingOptions | None = None,
    values: Mapping[str, np.ndarray] | None = None,
) -> Artifact:
    """Compiles a model into an artifact. ``batch_size`` is the global batch, split evenly
    over ``num_csx`` systems; ``print_ir_after_all`` receives the IR text after every pass;
    ``values`` fixes graph inputs to compile-time arrays (see ``import_model``)."""
    if mode not in MODES:
        raise CgcError(f"--mode {mode}: expected one of {', '.join(MODES)}")
    if num_csx < 1:
        raise CgcError(f"--num-csx {num_csx}: must be at least 1")
    if batch_size is not None and (batch_size < 1 or batch_size % num_csx):
        raise CgcError(
            f"--batch-size {batch_size} does not split evenly over --num-csx {num_csx} systems"
        )
    if training is not None and mode == "pipelined":
        raise CgcError("training runs in weight-streaming mode; use --mode weight_streaming")
    tgt = resolve(target)
    per_system = None if batch_size is None else batch_size // num_csx
    imported = _import(model, per_system, shapes, values)
    c = Compilation(imported, tgt, IRDumps(dump_ir, print_ir_after_all))
    scale, reduction = loss_scale(imported, num_csx) if training else (1.0, None)
    c.run(
        DecomposePass(),
        FoldConstantsPass(),
        ChannelsLastPass(),
        FoldConstantsPass(),
        FormLayersPass(),
    )
    if training is not None:
        c.run(AutodiffPass(training.trainable, scale), FoldConstantsPass())
    chosen, reason = _choose_mode(c, mode, training)
    c.verify()
    program = lower(c.module, tgt.whole)
    costs = program_costs(program, tgt)
    manifest = {
        "format_version": FORMAT_VERSION,
        "cgc_version": __version__,
        "source": Path(imported.source).name,
        "mode": chosen,
        "mode_reason": reason,
        "target": tgt.to_json(),
        "num_csx": num_csx,
        "per_system_batch": _per_system_batch(imported),
        "inputs": [dataclasses.asdict(s) for s in imported.inputs],
        "outputs": [dataclasses.asdict(s) for s in imported.outputs],
        "pipeline": ",".join(c.applied),
        "layers": [
            {
                "name": cost.name,
                "rect": list(cost.rect),
                "weights": list(info.weights),
                "weight_bytes": cost.weight_bytes,
                "cycles": cost.cycles,
                "compute_cycles": cost.compute_cycles,
                "movement_cycles": cost.movement_cycles,
                "arrival_cycles": cost.arrival_cycles,
                "link_wavelets": cost.link_wavelets,
                "flops": cost.flops,
                "sram_bytes_per_pe": cost.sram_bytes_per_pe,
                "stream_in_bytes": cost.stream_in_bytes,
                "stream_out_bytes": cost.stream_out_bytes,
                "host_bytes": cost.host_bytes,
                "activation_in_bytes": cost.activation_in_bytes,
                "activation_out_bytes": cost.activation_out_bytes,
            }
            for cost, info in zip(costs, program.layers, strict=True)
        ],
        "training": None,
    }
    if training is not None:
        trained = sorted(
            {i.attrs["name"] for i in program.instructions if i.opcode == Opcode.STREAM_GRADIENT}
        )
        manifest["training"] = {
            "loss": imported.outputs[0].name,
            "loss_scale": scale,
            "batch_reduction": reduction,
            "optimizer": training.manifest(),
            "trainable": trained,
            "initializers": list(imported.initializers),
        }
    used = {name for layer in program.layers for name in layer.weights}
    weights = {k: v for k, v in imported.weights.items() if k in used}
    # the manifest a loaded artifact has: plain JSON values (lists, not tuples)
    manifest = json.loads(json.dumps(manifest))
    return Artifact(manifest, program, print_module(c.module), weights)


def _choose_mode(c: Compilation, mode: str, training: TrainingOptions | None):
    tgt = c.target
    if mode == "pipelined":
        c.run(PlaceLayersPass(), RouteTensorsPass())
        return "pipelined", "requested with --mode pipelined"
    if mode == "auto" and training is None:
        why_not = c.try_place()
        if why_not is None:
            weights = sum(v.nbytes for v in c.imported.weights.values())
            return "pipelined", (
                f"the weights ({human_bytes(weights)}) and buffers fit in the SRAM of "
                f"{tgt.name} ({human_bytes(tgt.sram_bytes)})"
            )
        reason = why_not.replace("; use --mode weight_streaming", "")
    elif training is not None:
        reason = "training streams weights from MemoryX"
    else:
        reason = "requested with --mode weight_streaming"
    c.run(ScheduleStreamsPass(**(training.step_options() if training else {})))
    return "weight_streaming", reason


def _per_system_batch(imported: ImportedModel) -> int | None:
    batched = [s.shape[0] for s in imported.inputs if s.batch_axis == 0]
    return batched[0] if batched else None
