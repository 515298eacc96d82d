"""The compile driver: frontend, pass pipeline, mode choice, lowering, artifact.

The pipelines are specs (``cgc.compiler.pipelines.PIPELINES``), run by xDSL's
``PassPipeline`` after the folding of an ONNX model's lifted constants: the ``front`` stage,
then the path's (``pipelined``, after ``sparse`` if asked for a sparsity;
``weight_streaming``; ``training`` or ``training_recomputing``); a callback dumps the IR
after every pass (``--dump-ir``) and tells the progress of each.

``auto`` runs the placement and routing and keeps them if the model fits on the wafer;
otherwise it compiles for weight streaming and records why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from cgc.compiler.dumps import IRDumps, OnPass, Steps
from cgc.compiler.fixed_weights import positions_constants_inline, program_constants
from cgc.compiler.memory import MemoryPlan, Planner
from cgc.compiler.pipelines import pass_spec, pipeline, stage_passes, stage_spec
from cgc.compiler.sources import ParamsSource, Source, WithWeights, source_of
from cgc.compiler.sparse_choice import checked_threshold, sparsity_record
from cgc.compiler.training import (
    STREAMED_FOR_TRAINING,
    Training,
    fold_lifted_constants,
    front,
    frozen_patterns,
    loss_scale,
)
from cgc.dialects import context, print_module, verify
from cgc.dialects.ir import (
    module_sparse_weights,
    set_module_sparse_weights,
    set_module_target,
)
from cgc.dialects.lowering import lower
from cgc.errors import CgcError, CgcWarning, DoesNotFitError, OptionError
from cgc.frontends.hf_weights import is_hugging_face, weights_from_hugging_face
from cgc.frontends.imported import ImportedModel
from cgc.frontends.params import ModelConfig, ModelParams
from cgc.machine.hardware.target import Target, checked_batch, checked_systems, resolve
from cgc.machine.hardware.units import human_bytes
from cgc.machine.program.artifact import DECLARED, FORMAT_VERSION, Artifact
from cgc.machine.program.bytecode import LayerInfo, Opcode, Program
from cgc.machine.program.caches import cache_entries
from cgc.machine.program.mode import Mode
from cgc.machine.sparse.sparsity import Sparsity, live_bytes
from cgc.machine.sparse.tiles import SparseWeight, sparse_weights
from cgc.machine.timing.cost import LayerCost, Profile, profile, program_costs
from cgc.machine.training import optimizers
from cgc.options import Chosen, CompileOptions, SparsityOptions
from cgc.passes.autodiff import AutodiffPass
from cgc.passes.cache_keys_values import CacheKeysValuesPass
from cgc.passes.fuse_attention import AttentionCensus, FuseAttentionPass
from cgc.passes.place_layers import PlaceLayersPass
from cgc.passes.recompute_activations import RecomputeActivationsPass
from cgc.passes.schedule_streams import ScheduleStreamsPass
from cgc.passes.select_sparse_weights import SelectSparseWeightsPass
from cgc.version import __version__


class Compilation:
    """One compile: the module as it moves through the pipeline, and what was decided."""

    def __init__(
        self, imported: ImportedModel, target: Target, dumps: IRDumps, steps: Steps | None = None
    ):
        self.imported = imported
        self.module = imported.module
        self.target = target
        self.dumps = dumps
        self.steps = steps or Steps(None)
        self.ctx = context()
        self.applied: list[str] = []
        self.program: Program | None = None
        """The lowered program, once lowered."""
        self.profiles: dict[tuple[object, ...], Profile] = {}
        """The lowered program's SRAM per sparsity asked for, once the memory plan asked."""
        self.costs: list[LayerCost] | None = None
        """Every layer's cost, once the manifest asked for them."""
        self.attention: AttentionCensus | None = None
        """The attention blocks found and fused, once ``fuse-attention`` ran."""
        self.loss: tuple[float, str | None] = (1.0, None)
        """For training: the backward seed and the loss's batch reduction (``loss_scale``)."""
        self.sparse: dict[tuple[object, ...], tuple[dict, dict[str, SparseWeight]]] = {}
        """Per sparsity asked for, its manifest record and sparse weights (``sparse_for``)."""
        set_module_target(self.module, target)
        # verifying a large module costs as much as a pass: after every pass only when the IR
        # is dumped for reading, otherwise once at the end (the importer checks each op)
        self.verify_each = dumps.active
        self.verified = False
        if self.verify_each:
            verify(self.module, imported.source)
        dumps("import", self.module)

    def run(self, spec: str) -> None:
        """Runs the pipeline ``spec``, dumping after each pass (``between_passes``)."""
        pipeline(spec, self.between_passes).apply(self.ctx, self.module)

    def between_passes(
        self, done: ModulePass | None, module: ModuleOp, following: ModulePass | None
    ) -> None:
        """The pipeline's callback: records the pass ``done`` and dumps the IR after it, and
        tells the progress that ``following`` begins."""
        if done is not None:
            if isinstance(done, FuseAttentionPass):
                self.attention = done.census(module)
            if self.verify_each:
                verify(module, f"{self.imported.source} after {done.name}")
            self.applied.append(pass_spec(done))
            self.dumps(done.name, module)
        if following is not None:
            self.steps.begin(following.name)

    def verify(self) -> None:
        """Checks the IR the pipeline produced (once). Only dumping verifies after every pass,
        so a failure here names the whole pipeline and how to find the pass that broke it."""
        if self.verify_each or self.verified:
            return
        self.verified = True
        passes = ", ".join(spec.split("{")[0] for spec in self.applied)
        verify(
            self.module,
            f"{self.imported.source} after the passes {passes}"
            " (--print-ir-after-all verifies after each pass)",
        )

    def sparse_for(self, request: CompileRequest) -> tuple[dict, dict[str, SparseWeight]] | None:
        """The manifest's sparsity record of ``request`` and its sparse weights (None: it
        asks for none), chosen among the weights the module trains, or else reads."""
        if request.sparsity is None and request.detect_sparsity is None:
            return None
        key = (request.sparsity, request.detect_sparsity)
        if key not in self.sparse:
            found = sparsity_record(
                request.sparsity,
                request.detect_sparsity,
                self.imported,
                self.module,
                request.training is not None,
            )
            shapes = {name: spec.shape for name, spec in self.imported.weight_specs.items()}
            self.sparse[key] = found, sparse_weights(found, shapes, self.imported.weights)
        return self.sparse[key]

    def lowered(self) -> Program:
        """The lowered program (lowered once)."""
        if self.program is None:
            self.steps.begin("lower")
            self.program = lower(self.module, self.target.whole)
        return self.program

    def program_for(self, request: CompileRequest) -> Program:
        """The lowered program, with ``request``'s sparse weights."""
        program = self.lowered()
        sparse = self.sparse_for(request)
        return program if sparse is None else replace(program, sparse=sparse[1])

    def try_place(self) -> str | None:
        """Places the layers if the model fits; returns why not otherwise."""
        trial = self.module.clone()
        done: list[tuple[ModulePass, ModuleOp]] = []

        def between_passes(
            step: ModulePass | None, module: ModuleOp, following: ModulePass | None
        ) -> None:
            if step is not None:  # its IR is dumped if the placement succeeds
                done.append((step, module.clone() if self.dumps.active else module))
            if following is not None:
                self.steps.begin(following.name)

        try:
            pipeline(stage_spec("pipelined"), between_passes).apply(self.ctx, trial)
        except DoesNotFitError as e:
            return str(e)
        self.module = trial
        for step, after in done:
            self.applied.append(pass_spec(step))
            self.dumps(step.name, after)
        return None


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


@dataclass(frozen=True)
class CompileRequest:
    """What a compile was asked for, resolved against the model's own defaults."""

    source: Source
    target: Target
    num_csx: int
    per_system_batch: int | None
    training: Training | None
    micro_batch_size: int | None
    recompute: bool | None
    sparsity: Sparsity | None = None
    """The sparse weights (a training's are its options'; ``cgc.machine.sparse.sparsity``)."""
    detect_sparsity: float | None = None
    """Weights with at least this fraction of zeros are sparse, their zeros dead."""
    caches: CacheKeysValuesPass | None = None
    """Gives an imported decoder's attention its key-value caches (a generation's program of
    a decoder graph)."""

    @property
    def front_stage(self) -> str:
        """The front stage's pipeline: with the caches, or without."""
        return "front" if self.caches is None else "front_cached"

    def front_passes(self, imported: ImportedModel, training: Training | None) -> str:
        """The front stage's spec for ``imported``, configured."""
        cached = () if self.caches is None else (self.caches,)
        return stage_spec(self.front_stage, *front(imported, training), *cached)

    def imported(self, batch: int | None, blocks: int | None = None) -> ImportedModel:
        """The model imported with what the compile holds fixed folded (``batch`` samples,
        ``blocks`` blocks); for a decoder graph given caches, what its masks are built of
        inline and its constants its program's own (``cgc.compiler.fixed_weights``)."""
        imported = self.source.imported(batch, blocks)
        if self.caches is not None:
            return cacheable(imported)
        fold_lifted_constants(imported, self.training)
        return imported


def cacheable(imported: ImportedModel) -> ImportedModel:
    """A decoder graph's program (an inference) with what it holds fixed folded, what its
    masks are built of inline and its constants its own (``cgc.compiler.fixed_weights``):
    what ``cache-keys-values`` reads."""
    fold_lifted_constants(imported, None)
    return program_constants(positions_constants_inline(imported))


def _renamed_checkpoint(
    tensors: Mapping[str, np.ndarray], config: ModelConfig
) -> dict[str, np.ndarray]:
    """A Hugging Face checkpoint's tensors as the params-file model's weights."""
    try:
        return weights_from_hugging_face(tensors, config)
    except CgcError as e:
        raise CgcError(f"--weights: {e}") from None


@_cyclic_gc_paused()
def compile_model(
    model: str | os.PathLike | onnx.ModelProto | ImportedModel | ModelParams,
    *records: CompileOptions | SparsityOptions,
    training: Training | None = None,
    values: Mapping[str, np.ndarray] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    dump_ir: str | os.PathLike | None = None,
    print_ir_after_all: Callable[[str], None] | None = None,
    on_pass: OnPass | None = None,
    placement: PlaceLayersPass | None = None,
    caches: CacheKeysValuesPass | None = None,
    **fields: Any,
) -> Artifact:
    """Compiles a model (an ONNX file or ModelProto, a params file, ``zoo:NAME`` or a
    ``ModelParams``) into an artifact, by the records of options ``records`` (a
    ``cgc.options.CompileOptions`` and a ``SparsityOptions``) completed by ``fields`` by name.
    ``batch_size`` is the global batch, split evenly over ``num_csx`` systems (both default to
    a params file's, else to the model's declared batch and 1); ``micro_batch_size`` and
    ``recompute`` fix what the weight-streaming memory plan would choose
    (``cgc.compiler.memory``); a training's sparsity is its ``training``'s, an inference's
    its ``SparsityOptions``'. ``values`` fixes graph inputs to compile-time arrays (see
    ``import_model``); ``weights`` replaces weights of the model by name (a ``--weights``
    file); ``print_ir_after_all`` receives the IR text after every pass; ``on_pass`` is told
    of every step as it begins (``OnPass``; a progress bar); ``placement`` (pipelined mode)
    is the placement pass configured otherwise than a search (the rectangles of another
    program of the same artifact, or bands). Mode ``whole_wafer`` (generation's) runs every
    layer on the whole wafer with its weights resident. ``caches`` gives an imported decoder's
    attention its key-value caches (a generation's program of a graph's decoder)."""
    chosen = Chosen("compile_model", (CompileOptions, SparsityOptions), records, fields)
    options, sparse = chosen[CompileOptions], chosen[SparsityOptions]
    mode = options.mode
    sparsity = sparse.chosen()  # bad settings fail first, before the model is read
    source = source_of(
        model, options.shapes, values, options.no_weights, training is not None, options.init_seed
    )
    given = source.params.sparsity if isinstance(source, ParamsSource) else None
    if weights is not None:
        if isinstance(source, ParamsSource) and is_hugging_face(weights):
            weights = _renamed_checkpoint(weights, source.params.model)
        source = WithWeights(source, weights, "--weights")
    systems = checked_systems(
        options.num_csx if options.num_csx is not None else (source.num_csx or 1)
    )
    batch = options.batch_size if options.batch_size is not None else source.batch_size
    if batch is not None:
        checked_batch(batch, systems)
    if training is not None and mode in (Mode.PIPELINED, Mode.WHOLE_WAFER):
        raise OptionError(
            "training runs in weight-streaming mode; use mode weight_streaming", "mode"
        )
    if mode == "pipelined" and (
        options.micro_batch_size is not None or options.recompute is not None
    ):
        raise OptionError(
            "micro_batch_size and recompute apply to weight-streaming mode",
            "micro_batch_size",
            "recompute",
        )
    if training is not None and sparsity is not None:
        raise CgcError("a training says its sparsity in its options (Training)")
    if sparsity is None and sparse.detect_sparsity is None and given is not None:
        sparsity = given.sparsity(0)
    request = CompileRequest(
        source,
        resolve(options.target),
        systems,
        None if batch is None else batch // systems,
        training,
        options.micro_batch_size,
        options.recompute,
        training.sparsity if training is not None else sparsity,
        checked_threshold(sparse.detect_sparsity, sparsity or (training and training.sparsity)),
        caches,
    )
    dumps = IRDumps(dump_ir, print_ir_after_all)
    if mode == "weight_streaming" or training is not None:
        # the manifest's reason, in the command line's words as artifacts have always had it
        asked = STREAMED_FOR_TRAINING if training else f"requested with --mode {mode}"
        return StreamingCompiler(on_pass=on_pass).artifact(request, asked, dumps)
    return _placed(request, mode, dumps, on_pass, placement)


def _placed(
    request: CompileRequest,
    mode: str,
    dumps: IRDumps,
    on_pass: OnPass | None,
    placement: PlaceLayersPass | None = None,
) -> Artifact:
    """An inference ``request`` placed on the wafer (``mode`` pipelined, by ``placement`` if
    given), or in auto mode placed if the model fits and streamed otherwise, or run layer
    after layer on the whole wafer (``mode`` whole_wafer)."""
    steps = Steps(on_pass)
    steps.begin("import")
    imported = request.imported(request.per_system_batch)
    c = Compilation(imported, request.target, dumps, steps)
    sparse = len(stage_passes("sparse")) if request.sparsity is not None else 0
    placing = len(stage_passes("whole_wafer" if mode == Mode.WHOLE_WAFER else "pipelined"))
    steps.expect(len(stage_passes(request.front_stage)) + sparse + placing)
    c.run(request.front_passes(imported, None))
    saved = _mark_sparse(c, request)
    held = sum(spec.nbytes for spec in imported.weight_specs.values()) - saved
    tgt = request.target
    too_many = (
        f"the weights ({human_bytes(held)}) exceed the SRAM of {tgt.name} "
        f"({human_bytes(tgt.sram_bytes)})"
    )
    if mode in (Mode.PIPELINED, Mode.WHOLE_WAFER):
        if held > tgt.sram_bytes:  # no placement to search: say so with both sizes
            raise DoesNotFitError(
                f"model does not fit on {tgt.name} in {mode} mode: its weights alone "
                f"({human_bytes(held)}) exceed the SRAM of the whole wafer "
                f"({human_bytes(tgt.sram_bytes)}); use --mode weight_streaming"
            )
        if mode == Mode.WHOLE_WAFER:
            c.run(stage_spec("whole_wafer"))
            return _artifact(c, request, mode, "requested with --mode whole_wafer", None)
        c.run(stage_spec("pipelined", *(() if placement is None else (placement,))))
        return _artifact(c, request, "pipelined", "requested with --mode pipelined", None)
    if held > tgt.sram_bytes:
        why: str | None = too_many
    else:
        why = c.try_place()
    if why is None:
        reason = (
            f"the weights ({human_bytes(held)}) and buffers fit in the SRAM of "
            f"{tgt.name} ({human_bytes(tgt.sram_bytes)})"
        )
        return _artifact(c, request, "pipelined", reason, None)
    reason = why.replace("; use --mode weight_streaming", "")
    return StreamingCompiler(on_pass=on_pass).artifact(request, reason, dumps)


def _streaming_compilation(
    request: CompileRequest,
    micro_batch: int | None,
    recompute: bool,
    blocks: int | None,
    dumps: IRDumps,
    steps: Steps,
) -> Compilation:
    """The weight-streaming pipeline on the model at ``micro_batch`` samples per run."""
    steps.begin("import")
    imported = request.imported(micro_batch, blocks)
    training = request.training
    c = Compilation(imported, request.target, dumps, steps)
    if training is not None:
        per_system = request.per_system_batch or 1
        runs = request.num_csx * (per_system // (micro_batch or per_system))
        c.loss = loss_scale(imported, runs)
    stage = "weight_streaming"
    if training is not None:
        stage = "training_recomputing" if recompute else "training"
    steps.expect(len(stage_passes(request.front_stage)) + len(stage_passes(stage)))
    c.run(request.front_passes(imported, training))
    if training is None:
        c.run(stage_spec(stage))
        return c
    # the weights held fixed are those left after the front's folding
    frozen = frozen_patterns(imported, training)
    configured: list[ModulePass] = [
        AutodiffPass(training.trainable, c.loss[0], frozen),
        ScheduleStreamsPass(**training.step_options()),
    ]
    if recompute:
        configured.append(RecomputeActivationsPass(segments=imported.recompute_segments or ""))
    c.run(stage_spec(stage, *configured))
    return c


def _recompute_choices(request: CompileRequest) -> tuple[bool, ...]:
    """Whether the plan may, must or must not recompute activations."""
    segmented = request.training is not None and request.source.segments is not None
    if request.recompute and not segmented:
        raise OptionError(
            "recompute: the model has no segments to recompute (training of a params-file "
            "model has: its transformer blocks)",
            "recompute",
        )
    if request.recompute is not None:
        return (request.recompute,)
    return (False, True) if segmented else (False,)


class StreamingCompiler:
    """Compiles one model for weight streaming: plans how it fits the wafer
    (``cgc.compiler.memory``) and compiles it by the plan, remembering every program it
    builds by micro-batch, recomputing or not, and blocks.

    A compiler ``shared`` between requests (a scaling study of one model on several cluster
    sizes) builds each program once for all of them: the programs of two cluster sizes differ
    only in the value of the backward pass's seed (``loss_scale``), which changes no timing;
    the artifacts it makes are for timing-only runs. ``on_pass`` is told of every step of
    every program it builds (``OnPass``).
    """

    def __init__(self, shared: bool = False, on_pass: OnPass | None = None):
        self.shared = shared
        self.on_pass = on_pass
        self.compiled: dict[tuple[object, ...], Compilation] = {}

    def build(
        self, request: CompileRequest, micro_batch: int | None, recompute: bool, blocks: int | None
    ) -> Compilation:
        """The compilation of the model at ``micro_batch`` samples per run (cached)."""
        key: tuple[object, ...] = (micro_batch, recompute, blocks)
        if not self.shared:
            key += (request.num_csx, request.per_system_batch)
        if key not in self.compiled:
            steps = Steps(self.on_pass, _trial(micro_batch, recompute, blocks))
            c = _streaming_compilation(
                request, micro_batch, recompute, blocks, IRDumps(None, None), steps
            )
            c.lowered()
            self.compiled[key] = c
        return self.compiled[key]

    def planner(self, request: CompileRequest) -> Planner:
        """The memory planner of ``request``, building through this compiler."""

        def program(micro_batch: int | None, recompute: bool, blocks: int | None) -> Profile:
            built = self.build(request, micro_batch, recompute, blocks)
            key = (request.sparsity, request.detect_sparsity)
            if key not in built.profiles:
                built.profiles[key] = profile(built.program_for(request), request.target)
            return built.profiles[key]

        batch = request.per_system_batch
        choices = _recompute_choices(request)
        if batch is None or not request.source.rebatchable:
            fixed = batch or 1
            return Planner(
                lambda _m, r, b: program(batch, r, b), request.target, fixed, None, choices, fixed
            )
        return Planner(
            program,
            request.target,
            batch,
            request.source.blocks,
            choices,
            request.micro_batch_size,
            request.source.segments,
        )

    def artifact(
        self, request: CompileRequest, reason: str, dumps: IRDumps | None = None
    ) -> Artifact:
        """The artifact of ``request`` by its memory plan."""
        plan = self.planner(request).plan()
        batch = request.per_system_batch
        micro_batch = (
            plan.micro_batch if batch is not None and request.source.rebatchable else batch
        )
        final = self.build(request, micro_batch, plan.recompute, None)
        split = plan.micro_batches > 1 and request.micro_batch_size is None
        if final.imported.buffer_updates and split:
            warnings.warn(  # the user's loop takes them over the whole batch
                f"batch statistics (batch norm training) are per run of {micro_batch} samples: "
                f"a system's {batch} do not fit at once (fewer per system keep them whole)",
                CgcWarning,
                stacklevel=3,
            )
        if dumps is not None and dumps.active:  # again, with the IR written after every pass
            dumps.count = 0  # an auto-mode trial of placement may have dumped before
            steps = Steps(self.on_pass)
            final = _streaming_compilation(request, micro_batch, plan.recompute, None, dumps, steps)
            final.lowered()
        return _artifact(final, request, "weight_streaming", reason, plan)


def _trial(micro_batch: int | None, recompute: bool, blocks: int | None) -> str:
    """What a program the memory plan builds is of, for its steps' names."""
    parts = [f"micro-batch {micro_batch}"] if micro_batch is not None else []
    parts += [f"{blocks} block{'s' if blocks != 1 else ''}"] if blocks is not None else []
    parts += ["recomputing"] if recompute else []
    return f" (weight streaming, {', '.join(parts)})" if parts else " (weight streaming)"


def _artifact(
    c: Compilation, request: CompileRequest, mode: str, reason: str, plan: MemoryPlan | None
) -> Artifact:
    """The artifact of a finished compilation."""
    c.verify()
    tgt = request.target
    program = c.program_for(request)
    imported = c.imported
    used = {name for layer in program.layers for name in layer.weights}
    training = None
    if request.training is not None:
        scale, reduction = c.loss
        training = _training_entry(imported, program, request.training, scale, reduction)
    sparse = c.sparse_for(request)
    if sparse is not None:
        costs = program_costs(program, tgt)
    else:
        if c.costs is None:
            c.costs = program_costs(program, tgt)
        costs = c.costs
    manifest: dict = {
        "format_version": FORMAT_VERSION,
        "cgc_version": __version__,
        "source": Path(imported.source).name,
        "mode": mode,
        "mode_reason": "; ".join([reason, *([plan.reason] if plan and plan.reason else [])]),
        "target": tgt.to_json(),
        "num_csx": request.num_csx,
        **_batches(imported, plan),
        "memory_plan": plan.to_json() if plan is not None else None,
        "tokens_per_sample": imported.tokens_per_sample,
        "inputs": [dataclasses.asdict(s) for s in imported.inputs],
        "outputs": [dataclasses.asdict(s) for s in imported.outputs],
        "pipeline": ",".join(c.applied),
        "attention": c.attention.to_json() if c.attention is not None else None,
        "layers": [
            _layer_entry(cost, info) for cost, info in zip(costs, program.layers, strict=True)
        ],
        "training": training,
    }
    if sparse is not None:
        manifest["sparsity"] = sparse[0]
    caches = cache_entries(program)
    if caches:
        manifest["caches"] = caches
    if request.training is not None:  # MemoryX keeps the buffers a step updates
        used |= {update.buffer for update in imported.buffer_updates}
        # and every initializer a checkpoint lists, also those the compile folded away
        used |= set(imported.initializers)
    weights = {k: v for k, v in imported.weights.items() if k in used}
    declared = {k: v.to_json() for k, v in sorted(imported.declared.items()) if k in used}
    if declared:
        manifest[DECLARED] = declared
    _check_memoryx(imported, manifest, tgt, program)
    # the manifest a loaded artifact has: plain JSON values (lists, not tuples)
    manifest = json.loads(json.dumps(manifest))
    module = c.module
    return Artifact(manifest, program, lambda: print_module(module), weights)


def _layer_entry(cost: LayerCost, info: LayerInfo) -> dict:
    return {
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


def _training_entry(
    imported: ImportedModel,
    program: Program,
    training: Training,
    scale: float,
    reduction: str | None,
) -> dict:
    trained = sorted(
        {i.attrs["name"] for i in program.instructions if i.opcode == Opcode.STREAM_GRADIENT}
    )
    return {
        "loss": imported.outputs[0].name,
        "loss_scale": scale,
        "batch_reduction": reduction,
        "optimizer": training.manifest(),
        "trainable": trained,
        "initializers": list(imported.initializers),
        "buffers": [update.to_json() for update in imported.buffer_updates],
    }


def _mark_sparse(c: Compilation, request: CompileRequest) -> int:
    """Records the live values of ``request``'s sparse weights in the module, for the
    placement: those of a sparsity by the ``sparse`` stage, those detected by their values
    (which the IR does not hold); returns the bytes of SRAM they save against dense
    weights."""
    if request.sparsity is not None:
        chosen = SelectSparseWeightsPass(request.sparsity.density, request.sparsity.patterns)
        c.run(stage_spec("sparse", chosen))
        live = module_sparse_weights(c.module)
    else:
        found = c.sparse_for(request)
        if found is None:
            return 0
        live = {name: w.live for name, w in found[1].items()}
        set_module_sparse_weights(c.module, live)
    specs = c.imported.weight_specs
    return sum(specs[n].nbytes * (specs[n].size - k) // specs[n].size for n, k in live.items())


def _check_memoryx(
    imported: ImportedModel, manifest: dict, target: Target, program: Program
) -> None:
    """A model whose weights, gradients and optimizer state (a sparse weight's by the live
    values of ``program``'s) exceed MemoryX is an error naming the bytes and the largest
    weight."""
    specs = imported.weight_specs
    training = manifest["training"]
    stored = {name: spec.nbytes for name, spec in specs.items()}
    if training is None:
        need = optimizers.footprint(stored, [], None, {})
    else:
        optimizer = training["optimizer"]
        config = {k: v for k, v in optimizer.items() if k != "optimizer"}
        live = live_bytes({n: w.live for n, w in program.sparse.items()}, specs)
        need = optimizers.footprint(
            stored, training["trainable"], optimizer["optimizer"], config, live
        )
    capacity = target.memoryx_capacity_bytes
    if need.total <= capacity:
        return
    largest = max(specs, key=lambda name: specs[name].nbytes)
    raise CgcError(
        f"{imported.source} does not fit MemoryX: it needs {human_bytes(need.total)} "
        f"(weights {human_bytes(need.weights)}, gradients {human_bytes(need.gradients)}, "
        f"optimizer state {human_bytes(need.optimizer_state)}), {target.name}'s MemoryX holds "
        f"{human_bytes(capacity)} (memoryx_capacity_bytes); the largest weight is '{largest}' "
        f"({human_bytes(specs[largest].nbytes)})"
    )


def _batches(imported: ImportedModel, plan: MemoryPlan | None) -> dict[str, int | None]:
    """The manifest's batch entries: a system's samples per step or batch, the program's
    samples per run (``None`` for both when the model has no batch axis) and its runs."""
    batched = [s.shape[0] for s in imported.inputs if s.batch_axis == 0]
    runs = plan.micro_batches if plan is not None else 1
    micro = batched[0] if batched else None
    return {
        "per_system_batch": None if micro is None else micro * runs,
        "micro_batch": micro,
        "micro_batches": runs,
    }
