"""``cgc generate`` and ``cgc.generate``: a causal language model's tokens, and how fast the
wafer would serve them.

The model is a params file, ``zoo:NAME`` or a ``ModelParams`` (weights from ``init_seed`` or
a checkpoint), a ``transformers`` causal LM (a module, or ``file.py:factory`` returning
one and its example arguments), read by ``cgc.frontends.hf_config``, or a decoder graph with
its weights (an ``.onnx`` file, ``cgc.frontends.decoder``). ``generate`` compiles
the prompts' program and the decode step (``cgc.compiler.generation``), runs them greedily on
the simulator (``cgc.runtime.generation``) and gives the tokens with each step's simulated
time; a timing-only generation compiles with the weights declared and runs nothing but the
floor's timing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cgc.compiler.generation import (
    CompiledGeneration,
    Decoder,
    GenerationRequest,
    check_lengths,
    compile_generation,
    drawn_weights,
    named_weights,
)
from cgc.errors import CgcError, OptionError
from cgc.frontends.decoder import GraphDecoder
from cgc.frontends.params import ModelParams, is_params_source, load_params
from cgc.machine.hardware.target import checked_systems, resolve
from cgc.machine.hardware.units import human_bytes
from cgc.machine.program.artifact import Artifact
from cgc.machine.program.mode import Mode
from cgc.machine.timing.serving import Pass, Serving
from cgc.machine.timing.streaming import Span
from cgc.options import CompileOptions, GenerationOptions
from cgc.runtime.generation import Generator, Prompts, joined, prompts_of
from cgc.tools.report import human_seconds

PROMPT = "the prompt"
ARTIFACT_SUFFIX = ".cgc"
"""A MODEL named so is a generation's artifact."""
"""How a prompt is named in errors, unless the door names it otherwise."""


@dataclass(frozen=True)
class Generated:
    """What a generation gave: the tokens (``[B, P + N]``, left-padded as ``transformers``'
    ``generate`` returns them, with their ``attention_mask``), the new tokens alone, every
    step's logits ``[N, B, V]`` and the compiled programs with their serving figures. A
    timing-only generation has no tokens."""

    compiled: CompiledGeneration
    tokens: np.ndarray | None = None
    attention_mask: np.ndarray | None = None
    new_tokens: np.ndarray | None = None
    logits: np.ndarray | None = None

    @property
    def serving(self) -> Serving:
        return self.compiled.serving

    def steps(self) -> list[dict[str, Any]]:
        """A record per step (JSON lines): its new tokens and its simulated time."""
        elapsed = 0.0
        out = []
        count = None if self.new_tokens is None else self.new_tokens.shape[1]
        for step, seconds in enumerate(self.serving.step_seconds(count)):
            elapsed += seconds
            record: dict[str, Any] = {"step": step, "seconds": seconds, "elapsed": elapsed}
            if self.new_tokens is not None:
                record["tokens"] = [int(t) for t in self.new_tokens[:, step]]
            out.append(record)
        return out


def model_of(model: object) -> tuple[Decoder, dict[str, np.ndarray] | None, Any]:
    """The params (or decoder graph) of ``model``, the weights it carries (a ``transformers``
    module's; None otherwise: a graph holds its own) and its example token ids (a factory's;
    None otherwise)."""
    if isinstance(model, ModelParams | GraphDecoder):
        return model, None, None
    if isinstance(model, str | os.PathLike):
        spec = os.fspath(model)
        if is_params_source(spec):
            return load_params(spec), None, None
        if spec.endswith(".onnx"):
            return GraphDecoder.from_onnx(spec), None, None
        return _from_factory(spec)
    if callable(getattr(model, "state_dict", None)) and callable(model):
        params, weights = _of_module(model)
        return params, weights, None
    raise CgcError(
        f"cannot generate with a {type(model).__name__}: give a params file, zoo:NAME, a "
        "ModelParams, an ONNX decoder or a PyTorch causal LM"
    )


def _of_module(module: Any) -> tuple[Decoder, dict[str, np.ndarray] | None]:
    """A PyTorch causal LM's params and weights (a transformers model whose config cgc
    reads, ``cgc.frontends.hf_config``), or else (or where the params refuse it) its decoder
    graph."""
    from cgc.frontends.hf_config import causal_lm, reads

    if not reads(getattr(module, "config", None)):
        return _graph_of(module), None
    try:
        return causal_lm(module)
    except CgcError as refused:  # a switch the params cannot say: the graph may
        try:
            return _graph_of(module), None
        except CgcError:
            raise refused from None


def _graph_of(module: Any) -> GraphDecoder:
    from cgc.frontends.torch.causal import causal_decoder

    return causal_decoder(module)


def vocab_size(params: Decoder) -> int:
    """The tokens of ``params``' vocabulary."""
    return params.model.vocab_size if isinstance(params, ModelParams) else params.vocab_size


def _from_factory(spec: str) -> tuple[Decoder, dict[str, np.ndarray] | None, Any]:
    try:
        from cgc.frontends.torch import FACTORY, made_by_factory
    except ImportError:
        raise CgcError(f"{spec}: a PyTorch model needs torch: pip install cgc[torch]") from None
    if not FACTORY.match(spec):
        raise CgcError(f"{spec}: expected a params file, zoo:NAME or file.py:factory")
    module, args, _ = made_by_factory(spec)
    params, weights = _of_module(module)
    example = args[0].detach().cpu().numpy() if args and hasattr(args[0], "detach") else None
    return params, weights, example


def generate(
    model: object,
    prompt: object | None,
    options: CompileOptions,
    generation: GenerationOptions,
    attention_mask: object | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
    prompt_name: str = PROMPT,
) -> Generated:
    """Compiles ``model`` for a generation and runs it (see the module's doc); timing-only
    (``generation.timing_only``) it takes ``prompt_len`` instead of a prompt. A generation's
    artifact (``cgc generate --artifact``) runs as it was compiled."""
    if isinstance(model, Artifact) or str(model).endswith(ARTIFACT_SUFFIX):
        if weights is not None:
            raise CgcError("--weights: a generation's artifact holds its weights")
        artifact = model if isinstance(model, Artifact) else Artifact.load(str(model))
        compiled = CompiledGeneration.of(artifact)
        return _from_compiled(compiled, prompt, attention_mask, options, generation, prompt_name)
    params, carried, example = model_of(model)
    if prompt is None and not generation.timing_only:
        prompt = example
    target = resolve(options.target)
    systems = checked_systems(options.num_csx or 1)
    new = generation.max_new_tokens
    if generation.timing_only:
        if prompt is not None:
            raise OptionError("a timing-only generation takes prompt_len, not a prompt",
                              "prompt_len")  # fmt: skip
        if weights is not None or options.init_seed is not None:
            raise OptionError("init_seed: a timing-only generation declares its weights",
                              "init_seed")  # fmt: skip
        if generation.prompt_len is None:
            raise OptionError("a timing-only generation needs prompt_len", "prompt_len")
        check_lengths(params, generation.prompt_len, new)
        request = GenerationRequest(params, generation.concurrent or 1, generation.prompt_len,
                                    new, target, systems, None)  # fmt: skip
        return Generated(compile_generation(request, options))
    _check_prompt(prompt, prompt_name)
    if generation.prompt_len is not None:
        raise OptionError("prompt_len is for a timing-only generation; the prompt gives it",
                          "prompt_len")  # fmt: skip
    prompts = prompts_of(prompt, attention_mask, vocab_size(params), prompt_name)
    _check_concurrent(prompts, generation.concurrent)
    check_lengths(params, prompts.longest, new)
    chosen = _weights(params, carried, weights, options.init_seed)
    request = GenerationRequest(params, len(prompts.rows), prompts.longest, new, target, systems,
                                chosen)  # fmt: skip
    return _generated(compile_generation(request, options), prompts, new)


def _from_compiled(
    compiled: CompiledGeneration,
    prompt: object | None,
    mask: object | None,
    options: CompileOptions,
    generation: GenerationOptions,
    prompt_name: str,
) -> Generated:
    """A generation's artifact run as compiled: its figures, or its tokens after prompts
    that fit its programs; what would recompile it is a CgcError naming the option."""
    serving = compiled.serving
    given = {
        "mode": options.mode not in ("auto", compiled.mode),
        "num_csx": options.num_csx not in (None, serving.decode.systems),
        "init_seed": options.init_seed is not None,
        "prompt_len": generation.prompt_len not in (None, serving.prompt_tokens),
        "concurrent": generation.concurrent not in (None, serving.decode.sequences),
    }
    changed = [name for name, differs in given.items() if differs]
    if changed:
        raise OptionError(f"{changed[0]}: the generation's artifact was compiled otherwise; "
                          "compile it again to change it", changed[0])  # fmt: skip
    if generation.timing_only:
        return Generated(compiled)
    _check_prompt(prompt, prompt_name)
    vocab = compiled.decode.manifest["outputs"][0]["shape"][-1]
    prompts = prompts_of(prompt, mask, vocab, prompt_name)
    _check_concurrent(prompts, serving.decode.sequences)
    capacity = compiled.decode.manifest["caches"][0]["capacity"]
    fed = prompts.longest + generation.max_new_tokens - 1
    if fed > capacity:
        raise CgcError(
            f"{prompt_name}: a prompt of {prompts.longest} tokens and "
            f"{generation.max_new_tokens} new tokens feed {fed} positions, past the caches' "
            f"{capacity} the artifact was compiled for"
        )
    return _generated(compiled, prompts, generation.max_new_tokens)


def _check_prompt(prompt: object | None, name: str) -> None:
    """A CgcError if a generation with numbers has no prompt."""
    if prompt is None:
        raise CgcError(f"{name}: a generation with numbers needs a prompt (or timing_only)")


def _generated(compiled: CompiledGeneration, prompts: Prompts, new: int) -> Generated:
    """``new`` tokens after ``prompts`` from ``compiled``'s programs, on the simulator."""
    generator = Generator(compiled.prefill, compiled.decode, compiled.mode)
    new_tokens, logits = generator.generate(prompts, new)
    tokens, mask = joined(prompts, new_tokens)
    return Generated(compiled, tokens, mask, new_tokens, logits)


def _check_concurrent(prompts: Prompts, concurrent: int | None) -> None:
    if concurrent is not None and concurrent != len(prompts.rows):
        raise OptionError(
            f"concurrent {concurrent}: the prompt has {len(prompts.rows)} sequences; a "
            "generation with numbers serves them all at once",
            "concurrent",
        )


def _weights(
    params: Decoder,
    carried: Mapping[str, np.ndarray] | None,
    given: Mapping[str, np.ndarray] | None,
    seed: int | None,
) -> Mapping[str, np.ndarray]:
    """The weights of a generation with numbers: given, carried by the model, or drawn (a
    decoder graph's are its own: none here)."""
    if given is not None and (carried is not None or isinstance(params, GraphDecoder)):
        raise CgcError("--weights: the model brings its own weights")
    if isinstance(params, GraphDecoder):
        if seed is not None:
            raise OptionError(f"init_seed: {params.source} brings its own weights", "init_seed")
        return {}
    if given is not None:
        return named_weights(params, given)
    if carried is not None:
        return carried
    if seed is None:
        raise OptionError(
            f"{params.source}: a params-file model's weights come from init_seed or weights "
            "(or generate timing_only)",
            "init_seed",
        )
    return drawn_weights(params, seed)


def generation_text(generated: Generated) -> str:
    """The report of a generation: how it was served and where a decode step's time goes."""
    compiled, serving = generated.compiled, generated.serving
    decode = serving.decode
    lines = [
        f"mode: {compiled.mode} ({compiled.reason})",
        f"systems: {decode.systems}, sequences at once: {decode.sequences}, prompt: "
        f"{serving.prompt_tokens} tokens, new: {serving.new_tokens} tokens",
        f"time to first token: {human_seconds(serving.ttft_seconds)}",
        f"time per output token: {human_seconds(serving.tpot_seconds)} "
        f"({serving.tokens_per_second_per_sequence:,.1f} tokens/s a sequence, "
        f"{serving.tokens_per_second:,.1f} in all)",
        f"key-value cache: {human_bytes(serving.kv_bytes_per_token)} a token; "
        f"{serving.kv_capacity_tokens:,} tokens fit (the longest context times the "
        "sequences at once)",
        f"a decode step is bound by {decode.bound}",
        "decode step, the slowest layers:",
        "  layer                              system   time (us)   compute   arrival   movement",
    ]
    slowest = sorted(decode.layers, key=lambda t: -t.seconds)[:12]
    for t in slowest:
        lines.append(
            f"  {t.name[:34]:34} {t.system:6} {t.seconds * 1e6:11.3f} "
            f"{t.compute_seconds * 1e6:9.3f} {t.arrival_seconds * 1e6:9.3f} "
            f"{t.movement_seconds * 1e6:10.3f}  {t.bound}"
        )
    if decode.systems > 1:
        lines.append(f"  system-to-system link: {decode.link_seconds * 1e6:.3f} us a crossing")
    return "\n".join(lines) + "\n"


TRACED_RUNS = 4
"""Runs of a pass (a sequence's, pipelined) a trace draws one by one."""


def generation_spans(generated: Generated, steps: int = 4) -> list[Span]:
    """A trace of the prompts and the first ``steps`` decode steps, as the serving model
    times them: a track per system (pipelined, per system and sequence, the sequences
    entering one period apart), a span per layer and per crossing between systems; the
    first ``TRACED_RUNS`` runs of each pass."""
    serving = generated.serving
    spans = _pass_spans("prompts", serving.prefill, 0.0, serving.prompt_runs)
    end = serving.ttft_seconds
    for step in range(min(steps, serving.new_tokens - 1)):
        spans += _pass_spans(f"token {step + 1}", serving.decode, end, 1)
        end += serving.tpot_seconds
    return spans


def _pass_spans(label: str, one: Pass, start: float, runs: int) -> list[Span]:
    """The spans of ``runs`` runs of ``one`` from ``start`` (pipelined, each sequence's; the
    whole wafer, all of them together)."""
    pipelined = one.mode == Mode.PIPELINED
    every = runs * one.sequences if pipelined else runs
    gap = one.period_seconds if pipelined else one.latency_seconds
    spans: list[Span] = []
    for run in range(min(every, TRACED_RUNS)):
        at, system = start + run * gap, 0
        who = f", sequence {run % one.sequences}" if pipelined else ""
        for layer in one.layers:
            if layer.system != system:
                track = f"system {system} -> {layer.system}{who}"
                spans.append(Span(track, f"{label}: activations", at, at + one.link_seconds))
                at, system = at + one.link_seconds, layer.system
            track = f"system {layer.system}{who}"
            spans.append(Span(track, f"{label}: {layer.name}", at, at + layer.seconds))
            at += layer.seconds
    return spans
