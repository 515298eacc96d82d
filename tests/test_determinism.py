"""Same inputs, same artifact bytes, same outputs: whatever the hash seed or the process."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import cgc
from cgc.frontends import zoo

SCRIPT = """
import hashlib, sys
import cgc
from cgc.frontends import zoo
model = zoo.MODELS[sys.argv[1]]()
art = cgc.compile(model, mode=sys.argv[2], target="mesh8x8", batch_size=4, num_csx=2)
print(hashlib.sha256(art.to_bytes()).hexdigest())
"""


def compile_digest(name: str, mode: str, seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, name, mode],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
def test_artifact_bytes_do_not_depend_on_hash_seed(mode: str) -> None:
    digests = {compile_digest("transformer", mode, seed) for seed in ("0", "1", "4242")}
    assert len(digests) == 1
    local = cgc.compile(
        zoo.MODELS["transformer"](), mode=mode, target="mesh8x8", batch_size=4, num_csx=2
    )
    assert digests == {hashlib.sha256(local.to_bytes()).hexdigest()}


def test_runs_repeat_exactly() -> None:
    model = zoo.MODELS["cnn"]()
    artifact = cgc.compile(model, target="mesh8x8", batch_size=2)
    inputs = zoo.sample_inputs(model, 4, seed=9)
    first, stats_first = cgc.run_with_stats(artifact, inputs)
    reloaded = cgc.Artifact.from_bytes(artifact.to_bytes())
    second, stats_second = cgc.run_with_stats(reloaded, inputs)
    np.testing.assert_array_equal(first["logits"], second["logits"])
    assert stats_first.to_json() == stats_second.to_json()
