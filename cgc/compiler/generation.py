"""Compiles a generation: a causal language model's prompt program (prefill) and its decode
step, two programs of one artifact that share the weights and the key-value caches.

The params-file frontend builds both (``cgc.frontends.transformer.build_generation``): a
chunk of the prompt's tokens of ``S`` sequences at once, and one token of each; every
attention layer writes its keys and values into its caches of ``C = P + N - 1`` tokens a
sequence (the last new token is never fed back; ``wse.kv_cache``, ``wse.cached_attention``)
and reads them back. The decode step is compiled first, in pipelined mode its layers placed
in bands of the mesh's full width, each with rows by its share of the bytes kept and of the
time (``PlaceLayersPass.bands``: a decode step's layers read their resident weights); the
prompts' program keeps its rectangles (``PlaceLayersPass.rects``), so the two find the
weights and the caches on the same PEs. Pipelined, the layers' times are those of one
sequence (the same programs for a batch of one, on the same rectangles): the sequences pass
the layers one after another.

Each way of serving (``Mode.PIPELINED``, ``Mode.WHOLE_WAFER``, and ``Mode.WEIGHT_STREAMING``
when asked for) is timed by the floor's serving model (``cgc.machine.timing.serving``) from
one timing run of each program; ``auto`` compiles the first two and keeps the one with more
tokens a second for the sequences served, saying why.

A timing-only generation of a model split over ``K`` systems compiles one system's share:
the embedding, ``ceil(L / K)`` blocks and the head, on one wafer; every system holds at most
that many blocks, so the share's SRAM bounds them all, and the serving model places the
model's ``L`` blocks over the systems with the share's per-block costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from xdsl.passes import PassPipeline

from cgc.compiler.driver import cacheable, compile_model
from cgc.compiler.training import front
from cgc.dialects import context
from cgc.errors import CgcError, DoesNotFitError, OptionError
from cgc.frontends import transformer
from cgc.frontends.decoder import GraphDecoder
from cgc.frontends.hf_weights import is_hugging_face, weights_from_hugging_face
from cgc.frontends.params import ModelParams, parameter_count
from cgc.machine.hardware import dtypes
from cgc.machine.hardware.target import Target
from cgc.machine.hardware.units import human_bytes
from cgc.machine.movement.layout import Rect
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.bytecode import Program
from cgc.machine.program.caches import cache_entries
from cgc.machine.program.mode import Mode
from cgc.machine.timing.cost import CACHE_KEY, LayerRecord, SimulationError, Sram, Timing
from cgc.machine.timing.serving import Pass, Serving, block_of, make_pass, renamed
from cgc.options import CompileOptions
from cgc.passes.cache_keys_values import CacheKeysValuesPass, attention_masks
from cgc.passes.place_layers import PlaceLayersPass, placement_spec

SERVING_MODES = (Mode.PIPELINED, Mode.WHOLE_WAFER)
"""The ways ``auto`` chooses between."""
PIPELINED_CHUNK = 128
"""Prompt tokens a run of the prompts' program takes: the prompts flow through the layers in
chunks of this many tokens, on the decode step's rectangles (sized for one token a
sequence), so that the activations on the wafer stay a chunk's. A pipeline's rate per token
hardly depends on the chunk: a chunk of ``c`` tokens holds each stage ``c`` times as long."""


Decoder = ModelParams | GraphDecoder
"""A model a generation compiles: a params file's (built with its caches by the params-file
frontend), or a decoder graph (imported, its attention given caches by
``cache-keys-values``)."""


@dataclass(frozen=True)
class GenerationRequest:
    """What to compile: the model, the sequences served at once, the prompt's and the
    generation's lengths (tokens a sequence), where, and the weights (None: declared, for a
    timing-only generation; a decoder graph carries its own)."""

    params: Decoder
    sequences: int
    prompt_tokens: int
    new_tokens: int
    target: Target
    num_csx: int
    weights: Mapping[str, np.ndarray] | None

    def prompt_chunk(self, mode: Mode) -> int:
        """Prompt tokens a run of the prompts' program takes: the whole prompt, or in
        pipelined mode at most ``PIPELINED_CHUNK``."""
        limit = PIPELINED_CHUNK if mode == Mode.PIPELINED else self.prompt_tokens
        return max(min(self.prompt_tokens, limit), 1)

    @property
    def capacity(self) -> int:
        """Cache tokens a sequence needs: its prompt and its generation but the last token,
        which is never fed back."""
        return max(self.prompt_tokens + self.new_tokens - 1, 1)

    @property
    def layers(self) -> int:
        """The model's blocks; a decoder graph is compiled whole, as one."""
        params = self.params
        return params.model.num_hidden_layers if isinstance(params, ModelParams) else 1

    @property
    def blocks(self) -> int:
        """The blocks compiled: all of them with numbers, else one system's share."""
        layers = self.layers
        return layers if self.weights is not None else -(-layers // self.num_csx)


@dataclass(frozen=True)
class CompiledGeneration:
    """A generation's two programs, how they run and what serving them takes."""

    prefill: Artifact
    decode: Artifact
    mode: Mode
    reason: str
    """Why this mode: asked for, or what ``auto`` compared."""
    serving: Serving

    @classmethod
    def of(cls, artifact: Artifact) -> CompiledGeneration:
        """The generation an artifact of both programs holds (``artifact``); a CgcError if it
        holds one program."""
        generation = artifact.manifest.get("generation")
        if generation is None or artifact.decode is None:
            raise CgcError(
                f"{artifact.program.source}: not a generation's artifact (cgc generate "
                "--artifact writes one)"
            )
        own = {k: v for k, v in artifact.manifest.items() if k != "generation"}
        step = {**own, **generation["decode"]}
        prefill = Artifact(own, artifact.program, artifact.ir_text, artifact.weights)
        decode = Artifact(step, artifact.decode, artifact.decode_ir, artifact.weights)
        serving = Serving.from_record(generation["timing"])
        return cls(prefill, decode, artifact.mode, own["mode_reason"], serving)

    def artifact(self) -> Artifact:
        """Both programs as one artifact: the prompts' program its own, the decode step's in
        its ``decode`` section and ``generation`` entry, with the serving figures."""
        step = self.decode.manifest
        figures = {
            k: v for k, v in self.serving.to_json().items() if isinstance(v, str | int | float)
        }
        generation = {
            "decode": {
                **{key: step[key] for key in ("inputs", "outputs", "pipeline", "layers")},
                "caches": step.get("caches", []),
            },
            "serving": figures,
            "timing": self.serving.record(),
        }
        manifest = {**self.prefill.manifest, "mode_reason": self.reason, "generation": generation}
        prefill, weights = self.prefill, {**self.decode.weights, **self.prefill.weights}
        return Artifact(manifest, prefill.program, prefill.ir_text, weights,
                        self.decode.program, self.decode.ir)  # fmt: skip


def check_lengths(params: Decoder, prompt_tokens: int, new_tokens: int) -> None:
    """A CgcError naming both numbers if the prompt and the generation run past the model's
    positions."""
    if isinstance(params, ModelParams):
        positions, where = params.model.max_position_embeddings, "model.max_position_embeddings"
    elif params.positions is not None:
        positions, where = params.positions, "the rows of its position table"
    else:
        return
    fed = prompt_tokens + new_tokens - 1  # the last new token is never fed back
    if fed > positions:
        raise CgcError(
            f"{params.source}: a prompt of {prompt_tokens} tokens and {new_tokens} new tokens "
            f"feed {fed} positions, past the model's {positions} ({where})"
        )


def named_weights(
    params: ModelParams, weights: Mapping[str, np.ndarray]
) -> Mapping[str, np.ndarray]:
    """``weights`` by the params-file model's names (a Hugging Face checkpoint's renamed)."""
    if is_hugging_face(weights):
        try:
            return weights_from_hugging_face(weights, params.model)
        except CgcError as e:
            raise CgcError(f"--weights: {e}") from None
    return weights


def drawn_weights(params: ModelParams, seed: int) -> dict[str, np.ndarray]:
    """The model's weights drawn from ``seed`` (as ``cgc.compile(..., init_seed=seed)`` draws
    them), its rotary tables left to each program."""
    drawn = transformer.build(params, 1, False, materialize=True, seed=seed)
    return {k: v for k, v in drawn.weights.items() if not k.startswith("rotary.")}


def compile_generation(request: GenerationRequest, options: CompileOptions) -> CompiledGeneration:
    """Compiles ``request`` in ``options.mode`` (``auto``: the faster way of serving its
    sequences); a model whose weights do not fit its systems is a CgcError saying how many
    it needs, caches that do not fit one naming the tokens asked for and those that fit."""
    check_lengths(request.params, request.prompt_tokens, request.new_tokens)
    _check_systems(request)
    asked = Mode(options.mode) if options.mode != "auto" else None
    modes = (asked,) if asked is not None else SERVING_MODES
    _check_graph(request)
    windows = _windows(request.params, request.capacity)
    compiled, refusals = _each_mode(request, options, modes, windows)
    if not compiled:
        needed = _systems_needed(request, options, modes)
        more = f"; it fits {needed} systems (num_csx)" if needed else ""
        raise DoesNotFitError("; ".join(refusals) + more)
    if asked is not None:
        return compiled[0]
    best = max(compiled, key=lambda c: c.serving.tokens_per_second)
    return dataclasses.replace(best, reason=_why(best, compiled, refusals, request.sequences))


def _each_mode(
    request: GenerationRequest,
    options: CompileOptions,
    modes: tuple[Mode, ...],
    windows: tuple[int, ...] = (),
) -> tuple[list[CompiledGeneration], list[str]]:
    """The request compiled in each of ``modes`` that it fits (a decoder graph's attention
    with ``windows``), and why not in the others."""
    compiled: list[CompiledGeneration] = []
    refusals: list[str] = []
    for mode in modes:
        try:
            compiled.append(_compiled(request, options, mode, windows))
        except DoesNotFitError as e:
            refusals.append(f"{mode}: {e}" if len(modes) > 1 else str(e))
    return compiled, refusals


def _systems_needed(
    request: GenerationRequest, options: CompileOptions, modes: tuple[Mode, ...]
) -> int | None:
    """The fewest systems a timing-only request fits, each holding fewer blocks than now
    (None with numbers, whose whole model is compiled on one wafer, or if even one block a
    system does not fit)."""
    if request.weights is not None or not isinstance(request.params, ModelParams):
        return None
    layers = request.layers
    for blocks in range(request.blocks - 1, 0, -1):
        systems = -(-layers // blocks)
        fewer = dataclasses.replace(request, num_csx=systems)
        if fewer.blocks == blocks and _each_mode(fewer, options, modes)[0]:
            return systems
    return None


def _why(
    best: CompiledGeneration,
    compiled: list[CompiledGeneration],
    refusals: list[str],
    sequences: int,
) -> str:
    """Why ``auto`` took ``best``: every way's tokens a second, or why it could not run."""
    rates = [
        f"{c.mode} {c.serving.tokens_per_second:,.0f} tokens/s" for c in compiled
    ]  # fmt: skip
    served = f"{sequences} sequence{'s' if sequences > 1 else ''} at once"
    return f"the faster for {served}: " + ", ".join(rates + refusals)


def _check_graph(request: GenerationRequest) -> None:
    """An OptionError if a decoder graph is asked for more than one system: it is compiled
    whole, and only a params model's blocks are split over systems."""
    params = request.params
    if not isinstance(params, ModelParams) and request.num_csx != 1:
        raise OptionError(f"num_csx {request.num_csx}: {params.source}, a decoder graph, is "
                          "served whole by one system", "num_csx")  # fmt: skip


def _check_systems(request: GenerationRequest) -> None:
    """A CgcError saying how many systems the weights need, if the request has fewer: a
    system holds its share of the blocks, and the share compiled (``blocks``) holds the
    embedding and the head besides (a decoder graph: ``_check_graph``)."""
    params = request.params
    if not isinstance(params, ModelParams):
        return
    model, precision = params.model, params.runconfig.precision
    itemsize = dtypes.dtype(precision).itemsize
    one = parameter_count(dataclasses.replace(model, num_hidden_layers=1))
    block = (parameter_count(dataclasses.replace(model, num_hidden_layers=2)) - one) * itemsize
    ends = (one * itemsize) - block
    room = request.target.sram_bytes - ends
    per_system = room // block if room > 0 else 0
    if per_system < 1:
        raise DoesNotFitError(
            f"{request.params.source}: its embedding, head and one block "
            f"({human_bytes(ends + block)} at {precision}) exceed the SRAM of a "
            f"{request.target.name} system ({human_bytes(request.target.sram_bytes)})"
        )
    needed = -(-model.num_hidden_layers // per_system)
    if needed > request.num_csx:
        raise DoesNotFitError(
            f"{request.params.source}: its weights "
            f"({human_bytes(ends + model.num_hidden_layers * block)} at {precision}) do not "
            f"fit {request.num_csx} {request.target.name} "
            f"system{'s' if request.num_csx > 1 else ''}: a system holds at most {per_system} "
            f"of its {model.num_hidden_layers} blocks ({human_bytes(block)} each) beside the "
            f"embedding and the head; it needs at least {needed} (num_csx)"
        )


def _compiled(
    request: GenerationRequest, options: CompileOptions, mode: Mode, windows: tuple[int, ...]
) -> CompiledGeneration:
    """Both programs in ``mode`` and their serving figures; caches that do not fit are a
    CgcError naming the tokens asked for and those that fit."""
    try:
        return _programs(request, options, mode, request.capacity, windows)
    except DoesNotFitError:
        if request.capacity == 1:
            raise
        # the model without room for the caches asked for: how many tokens would fit
        # caches of one token: no window binds
        probe = _programs(dataclasses.replace(request, new_tokens=1, prompt_tokens=0), options,
                          mode, 1, ())  # fmt: skip
        fits = probe.serving.kv_capacity_tokens
        if fits >= request.sequences * request.capacity:  # it is not the caches
            raise
    raise DoesNotFitError(
        f"{request.params.source}: {request.sequences} sequence(s) of {request.capacity} "
        f"tokens (a prompt of {request.prompt_tokens} and {request.new_tokens} new) need "
        f"{request.sequences * request.capacity} tokens of key-value cache; in {mode} mode "
        f"the SRAM left beside the model holds at most {fits} (as placed for the shortest "
        "caches)"
    )


def _no_fit(request: GenerationRequest, mode: Mode, error: Exception) -> DoesNotFitError:
    return DoesNotFitError(f"{request.params.source} does not fit in {mode} mode: {error}")


def _programs(
    request: GenerationRequest,
    options: CompileOptions,
    mode: Mode,
    capacity: int,
    windows: tuple[int, ...],
) -> CompiledGeneration:
    """The prompt's and the decode step's programs with caches of ``capacity`` tokens (a
    decoder graph's attention with ``windows``: ``_windows``)."""
    compiled = dataclasses.replace(options, mode=str(mode), num_csx=1, batch_size=None)
    step = transformer.Generation(1, capacity, False)
    decode = _program(request, compiled, step, PlaceLayersPass(bands=True), windows)
    rects = {layer["name"]: _rect(layer["rect"]) for layer in decode.manifest["layers"]}
    chunk = request.prompt_chunk(mode)
    prompts = transformer.Generation(chunk, capacity, True)
    prefill = _program(request, compiled, prompts, PlaceLayersPass(placement_spec(rects)),
                       windows)  # fmt: skip
    _check_caches(request, prefill, decode)
    target = request.target
    # the SRAM a generation holds is the decode step's; the prompts' kernels are timed in
    # the layouts they would lay the weights out in, not checked against it
    sram = Sram(target)
    timed = (prefill, decode)
    if mode == Mode.PIPELINED and request.sequences > 1:
        # the sequences pass the layers one after another: a layer's time is one sequence's
        one = dataclasses.replace(request, sequences=1)
        placed = PlaceLayersPass(placement_spec(rects))
        timed = (_program(one, compiled, prompts, placed, windows),
                 _program(one, compiled, step, placed, windows))  # fmt: skip
    try:
        held = timed_run(decode.program, target, mode, sram)  # fills the ledger the caches count
        prefill_records = timed_run(timed[0].program, target, mode, Sram(target, strict=False))
        decode_records = (
            held
            if timed[1] is decode
            else timed_run(timed[1].program, target, mode, Sram(target, strict=False))
        )
    except SimulationError as e:
        raise _no_fit(request, mode, e) from None
    serving = _serving(request, mode, chunk, (prefill_records, decode_records), decode.program,
                       sram)  # fmt: skip
    return CompiledGeneration(prefill, decode, mode, f"requested with --mode {mode}", serving)


def _check_caches(request: GenerationRequest, prefill: Artifact, decode: Artifact) -> None:
    """A CgcError unless the two programs keep the same caches, and some: a decoder graph's
    attention that one of its imports fuses and the other does not would leave a cache that
    nothing reads."""
    names = [{entry["name"] for entry in a.manifest.get("caches", [])} for a in (prefill, decode)]
    if not names[1] or names[0] != names[1]:
        raise CgcError(
            f"{request.params.source}: its prompts' program keeps {len(names[0])} key-value "
            f"caches and its decode step {len(names[1])}; generation needs every attention "
            "found and fused in both (cgc compile --dump-ir shows which is not)"
        )


def _program(
    request: GenerationRequest,
    options: CompileOptions,
    generation: transformer.Generation,
    placement: PlaceLayersPass,
    windows: tuple[int, ...],
) -> Artifact:
    """One program of the generation; ``placement`` places it in pipelined mode; a decoder
    graph's attention gets its caches with ``windows`` (``_windows``)."""
    if isinstance(request.params, GraphDecoder):
        imported = request.params.program(request.sequences, generation)
        caches = CacheKeysValuesPass(generation.capacity, windows)
        return compile_model(imported, options, placement=placement, caches=caches)
    imported = transformer.build_generation(
        request.params,
        request.sequences,
        generation,
        blocks=request.blocks,
        buffers=request.weights is not None,
    )
    return compile_model(imported, options, weights=request.weights, placement=placement)


def _windows(decoder: Decoder, capacity: int) -> tuple[int, ...]:
    """Each attention's sliding window in a decoder graph over contexts of ``capacity``
    tokens, as its masks show them on a prompt of that length (a window that long or longer
    never binds: 0); nothing where none binds, and for a params model, which states its
    window."""
    if not isinstance(decoder, GraphDecoder):
        return ()
    imported = cacheable(decoder.program(1, transformer.Generation(capacity, capacity, True)))
    PassPipeline(front(imported, None)).apply(context(), imported.module)
    windows = tuple(mask.window for mask in attention_masks(imported.module))
    return windows if any(windows) else ()


def _rect(values: list[int]) -> Rect:
    x, y, w, h = values
    return (x, y, w, h)


def timed_run(program: Program, target: Target, mode: Mode, sram: Sram) -> list[LayerRecord]:
    """Every layer's record of one timing run of ``program`` in ``mode`` on a system whose
    SRAM is ``sram`` (which then holds the run's weights and caches where their kernels laid
    them out: ``Sram.pinned_share``)."""
    timing = Timing(program, target, sram, deliver=mode == Mode.PIPELINED)
    for ins in program.instructions:
        timing.step(ins)
    return timing.records


def _serving(
    request: GenerationRequest,
    mode: Mode,
    chunk: int,
    records: tuple[list[LayerRecord], list[LayerRecord]],
    program: Program,
    sram: Sram,
) -> Serving:
    """The serving figures of the prompts' and the decode step's records (the prompts' in
    ``chunk`` tokens a run; pipelined, of one sequence, else of all of them), their blocks
    placed as the whole model's over the request's systems; the caches' capacity from the
    decode step's ``program`` and ``sram``."""
    prefill, decode = records
    layers = request.layers
    per_token = sum(entry["bytes_per_token"] for entry in cache_entries(program))
    per_token //= request.blocks  # a token of a sequence, a block
    capacity = _cache_capacity(request, program, sram)
    sequences = request.sequences

    together = 1 if mode == Mode.PIPELINED else sequences  # the sequences a run carries

    def whole(records: list[LayerRecord], tokens: int) -> Pass:
        return make_pass(
            _whole_model(records, request.blocks, layers),
            request.target,
            mode,
            request.num_csx,
            sequences,
            _crossing_bytes(request) * tokens * together,
        )

    return Serving(
        whole(prefill, chunk),
        whole(decode, 1),
        request.prompt_tokens,
        -(-max(request.prompt_tokens, 1) // chunk),
        request.new_tokens,
        capacity * request.sequences,
        per_token * layers,
    )


def _crossing_bytes(request: GenerationRequest) -> int:
    """The bytes of a token's activations between two blocks (the residual stream's)."""
    params = request.params
    if isinstance(params, ModelParams):
        itemsize = dtypes.dtype(params.runconfig.precision).itemsize
        return params.model.hidden_size * itemsize
    return params.width * dtypes.dtype(params.dtype).itemsize


def _cache_capacity(request: GenerationRequest, program: Program, sram: Sram) -> int:
    """The most tokens a sequence's caches can hold, PE by PE: the rows of each cache a PE of
    its tiles holds, grown until the fullest of them has no room left beside what else it
    holds (and the most scratch a kernel of the run took), over every mesh row of its layer's
    rectangle (a longer cache spreads down them), shared by the sequences."""
    pins = sram.pinned_share(CACHE_KEY)
    if not pins.cells:
        return 0
    rows = {entry["name"]: entry["rect"][3] for entry in cache_entries(program)}
    scratch = max(sram.peak - int(pins.held.max()), 0)
    room = request.target.sram_bytes_per_pe - scratch - (pins.held - pins.share)
    fits = [
        int((room[span] // np.maximum(pins.row_bytes[span], 1)).min()) * rows[name]
        for name, _, span in pins.cells
    ]
    return max(min(fits) // request.sequences, 0)


def _whole_model(records: list[LayerRecord], compiled: int, layers: int) -> list[LayerRecord]:
    """The whole model's layers from a program of its first ``compiled`` blocks: the blocks
    after them repeat the compiled blocks' records, in turn (they are the same layers)."""
    if compiled >= layers:
        return records
    blocks = [[r for r in records if block_of(r.name) == b] for b in range(compiled)]
    first = records.index(blocks[0][0])
    last = records.index(blocks[-1][-1])
    repeated = [
        dataclasses.replace(r, name=renamed(r.name, b))
        for b in range(layers)
        for r in blocks[b % compiled]
    ]
    return records[:first] + repeated + records[last + 1 :]
