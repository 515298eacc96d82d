"""Shared fixtures: run an ONNX model through the frontend and onnxruntime and compare; a tiny
params-file GPT for the timing and planning tests; the model and data of the training tests."""

from __future__ import annotations

import io
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp, NameLoc
from xdsl.dialects.func import Func, ReturnOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from cgc.dialects.interpreter import Interpreter
from cgc.dialects.ir import main_function
from cgc.dialects.wse import WSE
from cgc.frontends import zoo
from cgc.frontends.onnx import ImportedModel, import_model


def print_module(module: ModuleOp) -> str:
    stream = io.StringIO()
    Printer(stream=stream, print_debuginfo=True).print_op(module)
    return stream.getvalue()


def parse_module(text: str) -> ModuleOp:
    ctx = Context()
    for dialect in (Builtin, Func, WSE):
        ctx.load_dialect(dialect)
    return Parser(ctx, text).parse_module()


def node_names(model: onnx.ModelProto) -> set[str]:
    return {n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node)}


def check_ir(imported: ImportedModel, model: onnx.ModelProto) -> None:
    """The module verifies, every op carries a node's location, and the text round-trips."""
    imported.module.verify()
    fn = main_function(imported.module)
    for arg, spec in zip(fn.body.block.args, imported.inputs, strict=True):
        assert isinstance(arg.location, NameLoc) and arg.location.desc.data == spec.name
    names = node_names(model) | {o.name for o in model.graph.output}
    for op in fn.body.block.ops:
        if isinstance(op, ReturnOp):
            continue
        assert isinstance(op.location, NameLoc), f"{op.name} has location {op.location}"
        assert op.location.desc.data in names, f"{op.name} has location {op.location}"
    text = print_module(imported.module)
    assert print_module(parse_module(text)) == text


def run_onnxruntime(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    outputs: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """onnxruntime's outputs of ``model`` (all of them, or the ones named in ``outputs``, in
    that order) on ``feeds``: arrays by input name, or a sequence in the order of the inputs
    onnxruntime asks for (the graph inputs that are not initializers)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    if not isinstance(feeds, Mapping):
        names = [i.name for i in session.get_inputs()]
        feeds = dict(zip(names, feeds, strict=True))
    return session.run(None if outputs is None else list(outputs), dict(feeds))


def runs_exactly_and_times_alike(model: onnx.ModelProto, art) -> None:
    """Runs the artifact ``art`` compiled from ``model`` on random inputs: onnxruntime's
    outputs, and a timing-only run's time and peak SRAM."""
    from cgc.runtime.cluster import Cluster

    rng = np.random.default_rng(0)
    feeds = {
        spec["name"]: rng.standard_normal(spec["shape"]).astype(spec["dtype"])
        for spec in art.manifest["inputs"]
    }
    outputs, full = Cluster(art).infer(feeds)
    for got, want in zip(outputs.values(), run_onnxruntime(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    _, timed = Cluster(art, numerics=False).infer(feeds)
    assert timed.layers == full.layers and timed.simulated_seconds == full.simulated_seconds
    assert timed.peak_pe_sram_bytes == full.peak_pe_sram_bytes > 0


def run_imported(imported: ImportedModel, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    args = [feeds[spec.name] for spec in imported.inputs]
    return Interpreter(imported.weights).run_function(main_function(imported.module), args)


def mlp_train_data(samples: int, seed: int, features: int = 64) -> dict[str, np.ndarray]:
    """``samples`` random inputs and labels for ``zoo.MODELS["mlp_train"]`` (10 classes, 64
    features unless its ``in_features`` is another number)."""
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((samples, features)).astype(np.float32),
        "labels": rng.integers(0, 10, samples),
    }


def mlp_training_fixtures(samples: int, seed: int) -> tuple[object, object]:
    """The ``model`` and ``data`` fixtures of a test module that trains
    ``zoo.MODELS["mlp_train"]``: the model, and ``samples`` of its inputs and labels drawn from
    ``seed``, each made once per module. A module binds them by name:
    ``model, data = mlp_training_fixtures(SAMPLES, seed=11)``."""

    @pytest.fixture(scope="module")
    def model() -> onnx.ModelProto:
        return zoo.MODELS["mlp_train"]()

    @pytest.fixture(scope="module")
    def data() -> dict[str, np.ndarray]:
        return mlp_train_data(samples, seed=seed)

    return model, data


def random_feeds(imported: ImportedModel, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in imported.inputs:
        if spec.dtype == "bool":
            feeds[spec.name] = rng.random(spec.shape) < 0.5
        elif np.dtype(spec.dtype).kind in "iu":
            feeds[spec.name] = rng.integers(0, 5, spec.shape).astype(spec.dtype)
        else:
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    return feeds


def compare_with_onnxruntime(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray] | None = None,
    batch_size: int | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> ImportedModel:
    """Imports ``model``, checks its IR, and compares the interpreter with onnxruntime."""
    imported = import_model(model, batch_size=batch_size, shapes=shapes)
    check_ir(imported, model)
    feeds = random_feeds(imported) if feeds is None else feeds
    got = run_imported(imported, feeds)
    want = run_onnxruntime(model, feeds)
    assert len(got) == len(want) == len(imported.outputs)
    for spec, g, w in zip(imported.outputs, got, want, strict=True):
        assert g.shape == w.shape == spec.shape, spec.name
        assert g.dtype == w.dtype, spec.name
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=spec.name)
    return imported


@pytest.fixture
def onnx_check():
    """``onnx_check(model, feeds=None, batch_size=None, ...)``: see compare_with_onnxruntime."""
    return compare_with_onnxruntime


TINY = Path(__file__).resolve().parent.parent / "examples" / "tiny-gpt.yaml"
"""A two-block GPT's params file, shipped as an example."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A params file of a two-block GPT small enough to run with numbers."""
    path = tmp_path_factory.mktemp("params") / "tiny.yaml"
    shutil.copyfile(TINY, path)
    return path


def token_batch(samples: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, (samples, 16)).astype(np.int32)
    return {"input_ids": ids, "labels": np.roll(ids, -1, axis=1)}
