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
  tokens checked equal (goal: at most 3x).

Every case runs in a fresh subprocess with one thread (OMP/OPENBLAS/MKL_NUM_THREADS=1 and
``torch.set_num_threads(1)``); a numeric time is the median of ``--repeat`` runs after a
warm-up.

    python benchmarks/bench_generation.py [--repeat 3] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

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


def numeric(repeat: int) -> dict:
    """``cgc.generate`` against ``transformers``' ``generate`` on the same small GPT-2."""
    import numpy as np
    import torch
    import transformers

    import cgc

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

    def ours() -> np.ndarray:
        tokens = cgc.generate(module, ids.numpy(), max_new_tokens=64).tokens
        assert tokens is not None
        return tokens

    if not (ours() == reference()).all():
        raise AssertionError("cgc's tokens differ from transformers'")
    cgc_seconds = median_seconds(ours, repeat)
    reference_seconds = median_seconds(reference, repeat)
    return {"cgc_seconds": cgc_seconds, "transformers_seconds": reference_seconds,
            "ratio": cgc_seconds / reference_seconds}  # fmt: skip


def _child(case: str, repeat: int) -> dict:
    """Runs ``case`` in a fresh process with one thread."""
    command = [sys.executable, __file__, "--case", case, "--repeat", str(repeat)]
    env = {**os.environ, **THREADS}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    result: dict = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case is not None:  # in the child
        if args.case == "numeric":
            print(json.dumps(numeric(args.repeat)))
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
    if args.only in "numeric":
        r = _child("numeric", args.repeat)
        print(
            f"GPT-2 2x128, 64 new tokens: cgc {r['cgc_seconds']:.3f} s, transformers "
            f"{r['transformers_seconds']:.3f} s, ratio {r['ratio']:.2f}"
        )


if __name__ == "__main__":
    main()
