"""Generation's cost (issue 32): timing-only serving at real size, and numeric generation
against ``transformers``' ``generate``.

* Timing-only: Llama 3.1 405B, a prompt of 2,048 tokens and 1,024 new tokens, on the wse3
  systems it needs, in auto mode (both ways of serving compiled and timed): wall time and peak
  memory of the process (goal: 10 s, 2 GiB); 32 systems, the fewest it fits (cgc says so
  when given fewer). Then Llama 3.1 8B on 4 wse2 (whole wafer) at contexts of 1k, 32k and
  128k tokens: the cost is the program's, so the wall time and the memory stay flat while the
  context grows 128 times.
* Numeric: a GPT-2 of 2 blocks of width 128 (GPT-2's vocabulary, 1,024 positions, random
  weights) generating 64 tokens after a 16-token prompt, ``cgc.generate`` (compile and run,
  auto mode) against ``generate(do_sample=False)`` of the same module, one thread each, the
  tokens checked equal (goal: at most 3x); by each route: the module read as params
  (``hf_config``), its dynamo ONNX export (a decoder graph, positions built in it), and
  the module through ``torch.export`` (``causal_decoder``).
* Decoder graphs as users bring them (``--only graphs``): every causal LM of the corpus
  (``corpus_models``' tiny GPT-2, Llama, Qwen2 and Mistral with a window of 8) in
  transformers' ``eager`` and ``sdpa`` attention, through every exporter (``ts``, ``tsnv``,
  ``dyn``, ``dyn23``, the sequence axis symbolic) and ``torch.export``, and GPT-NeoX, Gemma,
  OPT and Phi through ``torch.export``: how many generate transformers' tokens (a batch of two
  prompts of 12 and 7 tokens, 8 new), and why the others are refused.

Every case runs in a fresh subprocess with one thread (OMP/OPENBLAS/MKL_NUM_THREADS=1 and
``torch.set_num_threads(1)``); a numeric time is the median of ``--repeat`` runs after a
warm-up.

    python benchmarks/bench_generation.py [--repeat 3] [--only SUBSTRING]
    (SUBSTRING: a serving case, ``numeric``, or ``graphs``)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from child import median_seconds, peak_rss_mib

THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SERVING = (
    ("llama-3.1-405b", "wse3", 2048, 1024, 32, "auto"),
    ("llama-3.1-8b", "wse2", 1024, 16, 4, "whole_wafer"),
    ("llama-3.1-8b", "wse2", 32768, 16, 4, "whole_wafer"),
    ("llama-3.1-8b", "wse2", 131056, 16, 4, "whole_wafer"),
)
"""Timing-only cases: model, target, prompt tokens, new tokens, systems, mode (128k tokens of
8B's cache need more than one wse2: its caches' capacity there is 82,502 tokens)."""


def serving(name: str, target: str, prompt: int, new: int, systems: int, mode: str) -> dict:
    """A timing-only generation's wall time, memory and figures (in this process)."""
    import cgc

    start = time.perf_counter()
    generated = cgc.generate(f"zoo:{name}", timing_only=True, prompt_len=prompt,
                             max_new_tokens=new, target=target, num_csx=systems,
                             mode=mode)  # fmt: skip
    seconds = time.perf_counter() - start
    figures = generated.serving.to_json()
    keep = ("mode", "ttft_seconds", "tpot_seconds", "tokens_per_second", "kv_capacity_tokens")
    return {"wall_seconds": seconds, "peak_rss_mib": peak_rss_mib(),
            **{k: figures[k] for k in keep}}  # fmt: skip


def numeric(repeat: int, route: str) -> dict:
    """``cgc.generate`` by ``route`` (``NUMERIC_ROUTES``) against ``transformers``'
    ``generate`` on the same small GPT-2."""
    import tempfile

    import numpy as np
    import torch
    import transformers

    import cgc
    from cgc.frontends.torch.causal import causal_decoder

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=128, n_layer=2, n_head=4, n_positions=1024, activation_function="gelu",
        attn_implementation="eager",
    )  # fmt: skip
    module = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 16))

    def reference() -> np.ndarray:
        with torch.no_grad():
            return module.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=0).numpy()

    model: object = module
    if route == "onnx":
        model = _exported(module, "dyn", Path(tempfile.mkdtemp()) / "gpt2.onnx")
    elif route == "torch":
        model = causal_decoder(module)

    def ours() -> np.ndarray:
        tokens = cgc.generate(model, ids.numpy(), max_new_tokens=64).tokens
        assert tokens is not None
        return tokens

    if not (ours() == reference()).all():
        raise AssertionError("cgc's tokens differ from transformers'")
    cgc_seconds = median_seconds(ours, repeat)
    reference_seconds = median_seconds(reference, repeat)
    return {"cgc_seconds": cgc_seconds, "transformers_seconds": reference_seconds,
            "ratio": cgc_seconds / reference_seconds}  # fmt: skip


NUMERIC_ROUTES = ("params", "onnx", "torch")
"""How the numeric case's module reaches cgc: read as params, exported to ONNX, or through
``torch.export``."""
GRAPH_ARCHS = ("gpt2", "llama", "qwen2", "mistral")
"""The corpus's causal LMs."""
TORCH_ONLY = ("gpt_neox", "gemma", "opt", "phi")
"""transformers causal LMs cgc reads no params of: through ``torch.export`` alone."""


def _exported(module: Any, exporter: str, path: Path) -> Path:
    """``module`` (a causal LM) exported to ONNX without its cache by ``exporter`` (``ts``,
    ``tsnv``, ``dyn``, ``dyn23``), its logits alone, batch and sequence symbolic."""
    import torch
    from corpus_models import EXAMPLE_BATCH, Built, Case, Wrapped, export_onnx

    vocab = module.config.vocab_size
    case = Case("decoder", module.config.model_type, "small", {"vocab_size": vocab}, 16)
    wrapped = Wrapped(module, ("input_ids",), "logits").eval()
    args = (torch.randint(3, vocab, (EXAMPLE_BATCH, case.seq)),)
    return export_onnx(Built(case, "", wrapped, args, ("input_ids",)), exporter, path, True)


def _torch_only(arch: str) -> Any:
    """A small random-weight transformers causal LM of ``arch`` (``TORCH_ONLY``)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=64)  # fmt: skip
    if arch == "gpt_neox":
        return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(rotary_pct=0.5, **common)).eval()
    if arch == "gemma":
        config = tf.GemmaConfig(num_key_value_heads=2, head_dim=16, **common)
        return tf.GemmaForCausalLM(config).eval()
    if arch == "phi":
        return tf.PhiForCausalLM(tf.PhiConfig(partial_rotary_factor=0.5, **common)).eval()
    config = tf.OPTConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, ffn_dim=128, max_position_embeddings=64,
                          word_embed_proj_dim=64)  # fmt: skip
    return tf.OPTForCausalLM(config).eval()


def graphs() -> list[dict]:
    """Every corpus decoder by every route: generated as transformers does, or refused."""
    import tempfile

    import numpy as np
    import torch
    from corpus_models import CASES, build

    import cgc
    from cgc.frontends.torch.causal import causal_decoder

    plan: list[tuple[str, str, str, Any]] = []
    for arch in GRAPH_ARCHS:
        for impl in ("eager", "sdpa"):
            module = build(CASES[f"{arch}-tiny"], impl).module.model
            for route in ("ts", "tsnv", "dyn", "dyn23", "torch"):
                plan.append((arch, impl, route, module))
    plan += [(arch, "sdpa", "torch", _torch_only(arch)) for arch in TORCH_ONLY]
    rng = np.random.default_rng(0)
    rows = []
    for arch, impl, route, module in plan:
        ids = rng.integers(3, 128, (2, 12))
        mask = np.ones_like(ids)
        mask[1, :5] = 0
        start = time.perf_counter()
        row = {"arch": arch, "impl": impl, "route": route}
        try:
            with torch.no_grad():
                want = module.generate(
                    torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    max_new_tokens=8, do_sample=False, pad_token_id=0,
                )  # fmt: skip
            if route == "torch":
                model: object = causal_decoder(module)
            else:
                row["stage"] = "export"
                model = _exported(module, route, Path(tempfile.mkdtemp()) / f"{arch}.onnx")
            row["stage"] = "cgc"
            got = cgc.generate(
                model, ids, attention_mask=mask, max_new_tokens=8, mode="whole_wafer"
            )
            row["result"] = "equal" if np.array_equal(got.tokens, want.numpy()) else "DIFFERENT"
        except Exception as e:  # a refusal or an exporter's failure is a row, not a crash
            row["result"] = f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
        row["seconds"] = time.perf_counter() - start
        rows.append(row)
    return rows


def _child(case: str, repeat: int) -> dict:
    """Runs ``case`` in a fresh process with one thread."""
    command = [sys.executable, __file__, "--case", case, "--repeat", str(repeat)]
    env = {**os.environ, **THREADS}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result: dict = json.loads(done.stdout.splitlines()[-1])
    return result


def _print_graphs(rows: list[dict]) -> None:
    for row in rows:
        print(f"  {row['arch']:9} {row['impl']:6} {row['route']:6} {row['seconds']:6.1f} s  "
              f"{row['result']}")  # fmt: skip
    exported = [row for row in rows if row.get("stage") != "export"]
    equal = sum(row["result"] == "equal" for row in exported)
    print(f"decoder graphs generating transformers' tokens: {equal} of the {len(exported)} "
          f"that torch exported ({len(rows) - len(exported)} exports failed in torch)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case is not None:  # in the child
        if args.case.startswith("numeric-"):
            print(json.dumps(numeric(args.repeat, args.case.removeprefix("numeric-"))))
        elif args.case == "graphs":
            print(json.dumps({"rows": graphs()}))
        else:
            name, target, prompt, new, systems, mode = args.case.split(",")
            print(json.dumps(serving(name, target, int(prompt), int(new), int(systems), mode)))
        return
    for name, target, prompt, new, systems, mode in SERVING:
        case = f"{name},{target},{prompt},{new},{systems},{mode}"
        if args.only in case:
            r = _child(case, args.repeat)
            print(
                f"{name} on {systems} {target}, prompt {prompt}, {new} new: "
                f"{r['wall_seconds']:.2f} s wall, {r['peak_rss_mib']:.0f} MiB; {r['mode']}, "
                f"TTFT {r['ttft_seconds'] * 1e3:.1f} ms, TPOT {r['tpot_seconds'] * 1e3:.3f} ms, "
                f"{r['tokens_per_second']:,.0f} tokens/s, cache {r['kv_capacity_tokens']:,} tokens"
            )
    for route in NUMERIC_ROUTES:
        if args.only in f"numeric-{route}":
            r = _child(f"numeric-{route}", args.repeat)
            print(
                f"GPT-2 2x128, 64 new tokens, by {route}: cgc {r['cgc_seconds']:.3f} s, "
                f"transformers {r['transformers_seconds']:.3f} s, ratio {r['ratio']:.2f}"
            )
    if args.only in "graphs":
        _print_graphs(_child("graphs", 1)["rows"])


if __name__ == "__main__":
    main()
