"""``--executor ray``: systems and MemoryX as Ray actors give the local run's numbers and
statistics bit for bit; a dead actor is a one-line error and a resumed run ends as an
uninterrupted one; without Ray the option is a one-line error naming the extra."""

from __future__ import annotations

import http.server
import sys
import threading
import time

import numpy as np
import pytest
import ray
from click.testing import CliRunner
from conftest import mlp_train_data
from onnx import numpy_helper

import cgc
from cgc.cli import main
from cgc.errors import CgcError
from cgc.frontends import zoo
from cgc.machine.files import npz_bytes

TARGET = "mesh16x16"
SAMPLES, BATCH = 40, 8


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


@pytest.fixture(scope="module")
def model():
    return zoo.MODELS["mlp_train"]()


@pytest.fixture(scope="module")
def data():
    return mlp_train_data(SAMPLES, seed=11)


def compiled(mode: str):
    """The inference MLP, compiled for 4 systems of 2 samples (4 chunks in a batch of 8), and
    a batch."""
    model = zoo.MODELS["mlp"]()
    artifact = cgc.compile(model, mode, TARGET, batch_size=8, num_csx=4)
    return artifact, zoo.sample_inputs(model, 8, seed=3)


@pytest.fixture(scope="module")
def forward():
    return compiled("weight_streaming")


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


@pytest.mark.parametrize(
    ("mode", "num_csx"),
    [("weight_streaming", 1), ("weight_streaming", 2), ("weight_streaming", 4), ("pipelined", 2)],
)
def test_inference_is_the_local_run(forward, mode, num_csx) -> None:
    artifact, inputs = forward if mode == "weight_streaming" else compiled(mode)
    want, want_stats = cgc.run_with_stats(artifact, inputs, num_csx)
    got, stats = cgc.run_with_stats(artifact, inputs, num_csx, executor="ray")
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
    assert stats.to_json() == want_stats.to_json()
    assert stats.spans == want_stats.spans


@pytest.mark.parametrize(
    "options",
    [
        {"num_csx": 1},
        {"num_csx": 2, "micro_batch_size": 2, "ray_placement": "spread"},
        {"num_csx": 4, "swarmx_fanout": 2},
    ],
    ids=["k1", "k2-micro-batches-spread", "k4-fanout2"],
)
def test_training_is_the_local_run(model, data, options, tmp_path) -> None:
    local = {key: value for key, value in options.items() if key != "ray_placement"}
    want = train(model, data, tmp_path / "local", **local)
    got = train(model, data, tmp_path / "ray", executor="ray", **options)
    identical(got, want)
    initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert all(not np.array_equal(want.weights[n], value) for n, value in initial.items())


def test_train_command_takes_the_executor(model, data, tmp_path) -> None:
    (tmp_path / "data.npz").write_bytes(npz_bytes(data))
    zoo.save(model, tmp_path / "mlp.onnx")
    written = {}
    for executor in ("local", "ray"):
        directory = tmp_path / executor
        args = ["train", tmp_path / "mlp.onnx", "--data", tmp_path / "data.npz",
                "--steps", 2, "--batch-size", BATCH, "--num-csx", 2, "--target", TARGET,
                "--model-dir", directory, "--executor", executor,
                *(["--ray-placement", "spread"] if executor == "ray" else [])]  # fmt: skip
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        written[executor] = (directory / "weights.safetensors").read_bytes()
    assert written["ray"] == written["local"]
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

    with pytest.raises(CgcError, match=rf"^{who} died \(its Ray actor ended\).*--resume$"):
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
    forward, tmp_path, address, message
) -> None:
    artifact, inputs = forward
    artifact.save(tmp_path / "mlp.cgc")
    (tmp_path / "x.npz").write_bytes(npz_bytes(inputs))
    args = ["run", tmp_path / "mlp.cgc", "--inputs", tmp_path / "x.npz", "--executor", "ray"]
    if address == "web":  # a web server, where Ray alone would retry for minutes
        server = http.server.HTTPServer(("127.0.0.1", 0), QuietHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        address = f"127.0.0.1:{server.server_address[1]}"
    started = time.monotonic()
    result = CliRunner().invoke(main, [str(a) for a in [*args, "--ray-address", address]])
    assert time.monotonic() - started < 10  # Ray alone retries for minutes
    assert result.exit_code == 2
    assert result.output == f"error: --ray-address {address!r}: {message}\n"
