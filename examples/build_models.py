"""Writes the built-in example models and data for them.

For each model of ``cgc.frontends.zoo`` this writes ``<name>.onnx`` and ``<name>.inputs.npz``
(one array per input, a batch of samples); for the training MLP also ``mlp_train.data.npz``, a
small synthetic classification set (labels from a fixed random linear teacher, so the loss
can fall). Only onnx and numpy are needed.

    python examples/build_models.py --out build/examples --samples 8
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from cgc.frontends import zoo


def training_data(samples: int, features: int, classes: int, seed: int) -> dict[str, np.ndarray]:
    """Inputs and labels from a random linear teacher."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    teacher = rng.standard_normal((features, classes)).astype(np.float32)
    return {"x": x, "labels": np.argmax(x @ teacher, axis=1).astype(np.int64)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/examples", help="output directory")
    parser.add_argument("--samples", type=int, default=8, help="samples per input file")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, build in zoo.MODELS.items():
        model = build()
        zoo.save(model, out / f"{name}.onnx")
        np.savez(out / f"{name}.inputs.npz", **zoo.sample_inputs(model, args.samples, seed=1))
        print(f"wrote {out / name}.onnx and {name}.inputs.npz")
    np.savez(out / "mlp_train.data.npz", **training_data(256, 64, 10, seed=2))
    print(f"wrote {out}/mlp_train.data.npz")
    # two prompts of tiny-gpt.yaml's 50-token vocabulary, the second two tokens shorter
    ids = np.random.default_rng(3).integers(0, 50, (2, 6))
    mask = np.ones_like(ids)
    mask[1, :2] = 0
    np.savez(out / "tiny-gpt.prompt.npz", input_ids=ids * mask, attention_mask=mask)
    print(f"wrote {out}/tiny-gpt.prompt.npz")


if __name__ == "__main__":
    main()
