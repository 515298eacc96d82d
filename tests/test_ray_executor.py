"""``--executor ray``: systems and MemoryX as Ray actors give the local run's numbers and
statistics bit for bit, for every K and SwarmX fan-out and for products wide enough that the
number of BLAS threads changes their rounding; a dead actor is a one-line error and a resumed
run ends as an uninterrupted one; without Ray, or when its local instance does not start,
the option is a one-line error."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import ray
import threadpoolctl
from click.testing import CliRunner
from conftest import mlp_train_data, mlp_training_fixtures
from onnx import numpy_helper

import cgc
from cgc.cli import main
from cgc.errors import CgcError
from cgc.files import npz_bytes
from cgc.frontends import zoo

TARGET = "mesh16x16"
SAMPLES, BATCH = 40, 8

WIDTHS: dict[str, dict] = {
    "mlp": {},
    "narrow": {"in_features": 20, "hidden": (12,)},
    "784": {"in_features": 784, "hidden": (128,)},
}
"""The widths of the MLPs the executors are compared on (``zoo.mlp``'s keywords): the zoo's
64 -> 32 -> 32 -> 10, a narrower one, and MNIST's 784 inputs, whose first product for 16
samples (16 x 784 by 784 x 128) rounds otherwise on one BLAS thread than on two."""
WIDE = 16
"""Samples a system takes at once in the runs of the 784-input MLP: rows enough for BLAS to
share that product among its threads."""


def features(width: str) -> int:
    """The inputs of the MLP of ``width``."""
    return WIDTHS[width].get("in_features", 64)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """A Ray instance of two CPUs on the loopback interface, for the whole module."""
    ray.init(
        address="local",  # never another session's instance
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def two_blas_threads():
    """Two BLAS threads in this process whatever the machine's cores, where Ray alone would
    give each actor one: the executors must agree all the same."""
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        yield


model, data = mlp_training_fixtures(SAMPLES, seed=11)


def compiled(mode: str, width: str = "mlp"):
    """The inference MLP of ``width`` and a batch of 8 chunks: of 2 samples (the artifact is
    compiled for 4 systems of 2), or of ``WIDE`` for the 784-input one."""
    model = zoo.MODELS["mlp"](**WIDTHS[width])
    chunk = WIDE if width == "784" else 2
    artifact = cgc.compile(model, mode=mode, target=TARGET, batch_size=4 * chunk, num_csx=4)
    return artifact, zoo.sample_inputs(model, 8 * chunk, seed=3)


@pytest.fixture(scope="module")
def forward():
    return compiled("weight_streaming")


@pytest.fixture(scope="module")
def wide():
    return compiled("weight_streaming", "784")


def train(model, data, model_dir, **options):
    return cgc.train(
        model,
        data,
        model_dir=model_dir,
        **{"batch_size": BATCH, "steps": 3, "target": TARGET, "lr": 0.1, "momentum": 0.9,
           **options},
    )  # fmt: skip


def identical(got, want) -> None:
    """Two training runs' metrics and final weights, bit for bit."""
    assert list(got.metrics) == list(want.metrics)
    assert got.weights.keys() == want.weights.keys()
    for name, value in want.weights.items():
        np.testing.assert_array_equal(got.weights[name], value, err_msg=name)
        assert got.weights[name].flags.writeable == value.flags.writeable, name


def written(directory: Path) -> tuple[list[dict], bytes]:
    """What a training run wrote: its metrics lines, each with a loss and a gradient norm,
    and its final weights' bytes."""
    lines = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(isinstance(line["loss"], float) for line in lines)
    assert all(isinstance(line["grad_norm"], float) for line in lines)
    return lines, (directory / "weights.safetensors").read_bytes()


@pytest.mark.parametrize(
    ("width", "mode", "num_csx"),
    [
        ("mlp", "weight_streaming", 1),
        ("mlp", "weight_streaming", 4),
        ("mlp", "pipelined", 2),
        ("narrow", "weight_streaming", 2),
        ("784", "weight_streaming", 3),
        ("784", "weight_streaming", 8),
    ],
)
def test_inference_is_the_local_run(forward, wide, width, mode, num_csx) -> None:
    made = {("mlp", "weight_streaming"): forward, ("784", "weight_streaming"): wide}
    artifact, inputs = made.get((width, mode)) or compiled(mode, width)
    want, want_stats = cgc.run_with_stats(artifact, inputs, num_csx=num_csx)
    got, stats = cgc.run_with_stats(artifact, inputs, num_csx=num_csx, executor="ray")
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
    assert stats.to_json() == want_stats.to_json()
    assert stats.spans == want_stats.spans


@pytest.mark.parametrize(
    ("width", "per_system", "options"),
    [
        ("mlp", 8, {"num_csx": 1}),
        ("mlp", 4, {"num_csx": 2, "micro_batch_size": 2, "ray_placement": "spread"}),
        ("784", WIDE, {"num_csx": 2, "swarmx_fanout": 4}),
        ("narrow", 4, {"num_csx": 3, "swarmx_fanout": 2}),
        ("mlp", 2, {"num_csx": 4, "swarmx_fanout": 2}),
        ("784", WIDE, {"num_csx": 4, "swarmx_fanout": 4}),
        ("784", WIDE, {"num_csx": 8, "swarmx_fanout": 2}),
    ],
    ids=["mlp-k1", "mlp-k2-micro-batches-spread", "784-k2-fanout4", "narrow-k3-fanout2",
         "mlp-k4-fanout2", "784-k4-fanout4", "784-k8-fanout2"],
)  # fmt: skip
def test_training_is_the_local_run(width, per_system, options, tmp_path) -> None:
    model = zoo.MODELS["mlp_train"](**WIDTHS[width])
    batch = per_system * options["num_csx"]
    data = mlp_train_data(2 * batch, seed=11, features=features(width))
    local = {key: value for key, value in options.items() if key != "ray_placement"}
    want = train(model, data, tmp_path / "local", batch_size=batch, **local)
    got = train(model, data, tmp_path / "ray", batch_size=batch, executor="ray", **options)
    identical(got, want)
    assert written(tmp_path / "ray") == written(tmp_path / "local")
    initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert all(not np.array_equal(want.weights[n], value) for n, value in initial.items())


def test_train_command_takes_the_executor(tmp_path) -> None:
    data = mlp_train_data(4 * WIDE, seed=5, features=784)
    (tmp_path / "data.npz").write_bytes(npz_bytes(data))
    zoo.save(zoo.MODELS["mlp_train"](**WIDTHS["784"]), tmp_path / "mlp.onnx")
    for executor in ("local", "ray"):
        args = ["train", tmp_path / "mlp.onnx", "--data", tmp_path / "data.npz",
                "--steps", 2, "--batch-size", 2 * WIDE, "--num-csx", 2, "--target", TARGET,
                "--lr", 0.05, "--momentum", 0.9, "--model-dir", tmp_path / executor,
                "--executor", executor,
                *(["--ray-placement", "spread"] if executor == "ray" else [])]  # fmt: skip
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
    assert written(tmp_path / "ray") == written(tmp_path / "local")
    result = CliRunner().invoke(
        main, ["train", str(tmp_path / "mlp.onnx"), "--steps", "1", "--ray-address", "auto"]
    )
    assert result.exit_code == 2
    assert result.output == "error: --ray-address 'auto' needs --executor ray\n"
    result = CliRunner().invoke(
        main, ["train", str(tmp_path / "mlp.onnx"), "--steps", "1", "--ray-placement", "spread"]
    )
    assert result.exit_code == 2
    assert result.output == "error: --ray-placement 'spread' needs --executor ray\n"


def test_run_command_takes_the_executor(wide, tmp_path) -> None:
    artifact, inputs = wide
    artifact.save(tmp_path / "mlp.cgc")
    (tmp_path / "x.npz").write_bytes(npz_bytes(inputs))
    for executor in ("local", "ray"):
        args = ["run", tmp_path / "mlp.cgc", "--inputs", tmp_path / "x.npz", "--num-csx", 2,
                "--output", tmp_path / f"{executor}.npz",
                "--stats-json", tmp_path / f"{executor}.json", "--executor", executor]  # fmt: skip
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
    with np.load(tmp_path / "local.npz") as want, np.load(tmp_path / "ray.npz") as got:
        assert sorted(got.files) == sorted(want.files) == ["logits"]
        np.testing.assert_array_equal(got["logits"], want["logits"])
    stats = {e: json.loads((tmp_path / f"{e}.json").read_text()) for e in ("local", "ray")}
    assert stats["ray"] == stats["local"]


def kill_actor(who: str) -> None:
    """Kills the actor ``who`` (``system 1``, ``MemoryX``) of the run under way, and waits
    for its end."""
    (name,) = [n for n in ray.util.list_named_actors() if n.endswith(f"/{who}")]
    actor = ray.get_actor(name)
    ray.kill(actor)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the kill takes effect a moment later
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.01)
    pytest.fail(f"{who} outlived its kill")


@pytest.mark.parametrize("who", ["system 1", "MemoryX"])
def test_killed_actor_fails_the_run_and_resume_finishes_it(model, data, tmp_path, who) -> None:
    options = {"num_csx": 2, "steps": 4, "checkpoint_every": 1}
    want = train(model, data, tmp_path / "whole", **options)

    def on_step(line: dict) -> None:
        if line["step"] == 2:
            kill_actor(who)

    with pytest.raises(CgcError, match=rf"^{who} died \(its Ray actor ended\).*with resume$"):
        train(model, data, tmp_path / "cut", executor="ray", on_step=on_step, **options)
    # the failed run ended its other actors, and gave back its placement
    assert not ray.util.list_named_actors()
    assert {g["state"] for g in ray.util.placement_group_table().values()} <= {"REMOVED"}
    resumed = train(model, data, tmp_path / "cut", executor="ray", resume=True, **options)
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3, 4]
    identical(resumed, want)


def test_without_ray_the_option_is_a_one_line_error(forward, monkeypatch, tmp_path) -> None:
    artifact, inputs = forward
    want = cgc.run(artifact, inputs)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    message = "--executor ray needs Ray: pip install 'cgc[ray]'"
    with pytest.raises(CgcError, match=f"^{message}$".replace("[", r"\[").replace("]", r"\]")):
        cgc.run(artifact, inputs, executor="ray")
    artifact.save(tmp_path / "mlp.cgc")
    (tmp_path / "x.npz").write_bytes(npz_bytes(inputs))
    args = ["run", tmp_path / "mlp.cgc", "--inputs", tmp_path / "x.npz", "--executor", "ray"]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 2
    assert result.output == f"error: {message}\n"
    got = cgc.run(artifact, inputs)  # the local path needs no Ray
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A web server's answers, without its log on stderr."""

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:1", "no Ray cluster answers there (Connection refused)"),
        ("head-node", "expected auto, HOST:PORT or ray://HOST:PORT"),
        ("web", "what answers there is not a Ray cluster"),
    ],
)
def test_an_address_where_no_cluster_answers_is_a_one_line_error(
    forward, tmp_path, monkeypatch, address, message
) -> None:
    artifact, inputs = forward
    artifact.save(tmp_path / "mlp.cgc")
    (tmp_path / "x.npz").write_bytes(npz_bytes(inputs))
    args = ["run", tmp_path / "mlp.cgc", "--inputs", tmp_path / "x.npz", "--executor", "ray"]
    if address == "web":  # a web server, where Ray alone would retry for minutes
        server = http.server.HTTPServer(("127.0.0.1", 0), QuietHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        address = f"127.0.0.1:{server.server_address[1]}"
    asked: list[dict] = []
    before_ray(monkeypatch, lambda **options: asked.append(options))
    result = CliRunner().invoke(main, [str(a) for a in [*args, "--ray-address", address]])
    assert not asked, "the address was left to ray.init, which retries it for minutes"
    assert result.exit_code == 2
    assert result.output == f"error: --ray-address {address!r}: {message}\n"


def before_ray(monkeypatch: pytest.MonkeyPatch, init: Callable[..., object]) -> None:
    """Makes this process one that has not initialised Ray yet (as a ``cgc`` command is),
    whose ``ray.init`` is ``init``."""
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)


def failing(error: Exception) -> Callable[..., object]:
    """A ``ray.init`` that raises ``error``."""

    def init(**options: object) -> None:
        raise error

    return init


@pytest.mark.parametrize(
    ("error", "reason"),
    [  # what Ray 2.60 raises when the GCS writes no port file in 30 s, and when the
        # raylet does not register in 30 s
        (RuntimeError("Timed out waiting for file /tmp/ray/session_1/gcs_server_port_2"),
         "Timed out waiting for file /tmp/ray/session_1/gcs_server_port_2"),
        (Exception("The current node timed out during startup. This could happen because "
                   "some of the raylet failed to startup or the GCS has become overloaded."),
         "The current node timed out during startup"),
    ],
    ids=["gcs", "raylet"],
)  # fmt: skip
def test_a_local_instance_that_does_not_start_is_a_one_line_error(
    forward, tmp_path, monkeypatch, error, reason
) -> None:
    artifact, inputs = forward
    artifact.save(tmp_path / "mlp.cgc")
    (tmp_path / "x.npz").write_bytes(npz_bytes(inputs))
    before_ray(monkeypatch, failing(error))
    args = ["run", tmp_path / "mlp.cgc", "--inputs", tmp_path / "x.npz", "--executor", "ray"]
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 2
    assert result.output == (
        f"error: --executor ray: a local Ray instance did not start ({reason}); try again on "
        "a less busy machine, or start Ray first (ray start --head) and pass --ray-address "
        "auto\n"
    )


def test_another_error_of_starting_ray_is_raised_as_it_is(forward, monkeypatch) -> None:
    artifact, inputs = forward
    before_ray(monkeypatch, failing(NotImplementedError("a bug")))  # a RuntimeError's subclass
    with pytest.raises(NotImplementedError, match=r"^a bug$"):
        cgc.run(artifact, inputs, executor="ray")
