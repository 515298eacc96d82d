"""The fuzzer's cases: what a case is, the valid files every case starts from, and the maker of
the third door's cases, random options and bad files for every command.

A case is files to write into a fresh directory and ``cgc`` commands to run there; ``{dir}``
in an argument stands for that directory, so a kept case replays anywhere. Besides plain files
a case may hold special ones (FIFOs, sockets, character devices, symlinks, hard links), name
files no command may change, limit the size of the files its commands write, and run a
command in the background, as a second user would.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import cgc.tools.fuzz_mutators as mut
from cgc.frontends import zoo
from cgc.machine.program.artifact import weights_to_bytes
from cgc.machine.program.mode import Mode
from cgc.tools.fuzz_artifacts import unpack_artifact
from cgc.tools.fuzz_seeds import TINY_PARAMS, seed_models

DIR = "{dir}"
"""Stands for the case's directory in a step's arguments."""


@dataclass(frozen=True)
class Fills:
    """A directory a command fills, for the check that it ends as one whole run left it."""

    kind: str
    """``train`` (a model directory) or ``sweep`` (a sweep's output directory)."""
    dir: str
    """Relative to the case's directory."""
    count: int
    """train: its ``--steps``; sweep: the points of its grid."""
    every: int = 0
    """train: its ``--checkpoint-every`` (0: none)."""


@dataclass
class Step:
    """One ``cgc`` command of a case."""

    args: list[str]
    after_success: bool = True
    """Run only if the step before exited 0 (else: always)."""
    make_inputs: str | None = None
    """Before running: write random inputs for this artifact (relative) to ``inputs.npz``."""
    edge_seed: int | None = None
    """With ``make_inputs``: inputs of edge values drawn from this seed (``edge_inputs``)."""
    compare_with: str | None = None
    """After an exit 0: compare ``outputs.npz`` with this reference's outputs: an ONNX file
    (onnxruntime) or ``FILE.py:FACTORY`` (the module in torch eager)."""
    exact: bool = False
    """Integer outputs must equal the reference's exactly, and inputs the reference rejects
    (an index out of range, a division by zero in torch) must not give outputs."""
    outputs: list[tuple[str, str]] = field(default_factory=list)
    """Files (relative) the command writes, each with its kind (``fuzz_worker.OUTPUT_KINDS``):
    after an exit 0 each is there and of its kind; after an exit 2 none that was not there
    before is."""
    background: bool = False
    """Start the installed ``cgc`` command as a process and go on; the case waits for it."""
    wait_for: str | None = None
    """Before the command starts: wait until this file (relative) exists, or every command in
    the background has ended (so that two runs overlap, whatever the second's start-up)."""
    delay: float = 0.0
    """Seconds to wait before the command starts (after ``wait_for``)."""
    fills: Fills | None = None
    planted: str | None = None
    """An exception the user's code raises on purpose (a factory's ``MemoryError``): its name
    in the message is no memory-cap hit."""
    user_lines: list[str] = field(default_factory=list)
    """Lines the user's own code prints to stderr: theirs, not part of cgc's one line."""


SPECIAL_KINDS = ("fifo", "socket", "device", "symlink", "hardlink")
"""Kinds of ``FuzzCase.specials``: a named pipe, a Unix socket, a character device (its target a
``/dev`` file; made in the case's directory, so that a command replacing or removing it harms
nothing else), a symbolic link to its target, a hard link of it (both relative)."""


@dataclass
class FuzzCase:
    """A test case: files to write into a fresh directory and the commands to run there."""

    id: int
    family: str
    description: str
    steps: list[Step]
    files: dict[str, bytes] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    specials: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Made after ``files``, in order: name -> (kind, target), kind one of ``SPECIAL_KINDS``."""
    inputs: list[str] = field(default_factory=list)
    """Files (relative) whose bytes no command may change, whatever its exit."""
    fsize: int | None = None
    """The largest file the commands may write (RLIMIT_FSIZE; writes past it fail, EFBIG)."""
    timeout: float | None = None
    """Seconds the case may take (default: the run's per-case timeout)."""

    def write(self, root: Path, specials: bool = True) -> None:
        """Creates the case's directory ``root`` with its directories, files and (unless a
        kept copy is written, which ``replay`` completes) specials."""
        root.mkdir(parents=True)
        for name in self.dirs:
            (root / name).mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        for name, (kind, target) in self.specials.items() if specials else ():
            _make_special(root, name, kind, target)

    def commands(self, root: str) -> list[str]:
        """The steps as shell command lines, the case directory written as ``root``."""
        lines = []
        for step in self.steps:
            line = " ".join(["cgc", *(_quote(a.replace(DIR, root)) for a in step.args)])
            if self.fsize is not None:  # sh counts 512-byte blocks; writes past it: EFBIG
                line = f"(trap '' XFSZ; ulimit -f {-(-self.fsize // 512)}; {line})"
            if step.delay:
                line = f"sleep {step.delay}; {line}"
            if step.wait_for:
                path = _quote(f"{root}/{step.wait_for}")
                line = f"until [ -e {path} ]; do sleep 0.01; done; {line}"
            lines.append(f"{line} &" if step.background else line)
        return lines

    def replay(self) -> str:
        """A shell script that makes the case's specials again beside its kept files (a copy
        keeps none of them) and runs its commands, printing each exit code."""
        here = '"$D"'
        comment = " ".join(self.description.splitlines())
        lines = ["#!/bin/sh", f"# {comment}", 'D="$(cd "$(dirname "$0")" && pwd)"']
        for name, (kind, target) in self.specials.items():
            lines.append(_remake(kind, f'"$D"/{_quote(name)}', target))
        for step, line in zip(self.steps, self.commands(here), strict=True):
            lines.append(line if step.background else f"{line} ; echo exit $?")
        if any(step.background for step in self.steps):
            lines.append("wait")
        return "\n".join(lines) + "\n"


def _quote(arg: str) -> str:
    if re.fullmatch(r"[\w./=:,+@-]+", arg) or arg.startswith('"$D"'):
        return arg
    return "'" + arg.replace("'", "'\\''") + "'"


def _remake(kind: str, path: str, target: str) -> str:
    """The shell line that makes a special file of ``FuzzCase.specials`` at ``path`` (quoted)
    unless it is there."""
    if kind == "hardlink":
        return f'ln -f "$D"/{_quote(target)} {path}'
    if kind == "fifo":
        make = f"mkfifo {path}"
    elif kind == "socket":
        bind = "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])"
        make = f"python3 -c '{bind}' {path}"
    elif kind == "device":
        numbers = os.stat(target).st_rdev
        node = f"mknod {path} c {os.major(numbers)} {os.minor(numbers)}"
        make = f"{{ {node} || ln -s {target} {path}; }}"
    else:
        make = f"ln -s {_quote(target)} {path}"
    return f"[ -e {path} ] || [ -L {path} ] || {make}"


def _make_special(root: Path, name: str, kind: str, target: str) -> None:
    """One of ``FuzzCase.specials``. A device is a node of its own when the fuzzer may make one
    (as root, which could otherwise have a faulty command replace ``/dev/null``), else a
    symlink to the real one, which a user who may not make nodes may not replace either."""
    if kind not in SPECIAL_KINDS:
        raise ValueError(f"unknown special file kind {kind!r}")
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(str(path))
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.stat(target).st_rdev)
        except PermissionError:
            if os.geteuid() == 0:
                raise
            os.symlink(target, path)
    elif kind == "symlink":
        os.symlink(target, path)
    else:
        os.link(root / target, path)


def inputs_for(manifest: dict[str, Any], seed: int) -> dict[str, np.ndarray] | None:
    """Random inputs of the shapes and dtypes the manifest lists: normal floats, integers in
    [0, 2) (valid indices of any non-empty axis), or None when they would be too large."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in manifest["inputs"]:
        shape = tuple(int(d) for d in spec["shape"])
        dtype = np.dtype(spec["dtype"])
        if float(np.prod(shape, dtype=np.float64)) > 1 << 22:
            return None
        if dtype.kind == "f":
            arrays[spec["name"]] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iub":
            arrays[spec["name"]] = rng.integers(0, 2, shape).astype(dtype)
        else:
            return None
    return arrays


EDGE_FLOATS = [
    np.nan,
    np.inf,
    -np.inf,
    -0.0,
    0.0,
    1.0,
    -1.0,
    0.5,
    -0.5,
    1.5,
    -2.5,
    3.0,
    1e-40,
    -1e-40,
    1.4e-45,
    1.1754944e-38,
    3.4028235e38,
    -3.4028235e38,
    65504.0,
]
"""Float edge values: NaN, infinities, both zeros, halves (rounding), denormals, the smallest
normal, the largest finite values of float32 and float16."""


def edge_values(dtype: np.dtype) -> list[Any]:
    """The edge values of ``dtype``: for integers its minimum and maximum and their
    neighbours, -1, 0, 1, 2 (those it holds); for floats ``EDGE_FLOATS``."""
    if dtype.kind == "f":
        return EDGE_FLOATS
    if dtype.kind == "b":
        return [False, True]
    info = np.iinfo(dtype)
    candidates = [info.min, info.min + 1, info.max, info.max - 1, -1, 0, 1, 2, -2]
    return [v for v in candidates if info.min <= v <= info.max]


def edge_inputs(manifest: dict[str, Any], seed: int) -> dict[str, np.ndarray] | None:
    """Inputs of the manifest's shapes and dtypes that mix the type's edge values
    (``edge_values``) with ordinary ones, in a share drawn from the seed (so that some cases
    are mostly ordinary, and an index input is sometimes all in range); None when there are
    none to give, as ``inputs_for``."""
    ordinary = inputs_for(manifest, seed)
    if ordinary is None:
        return None
    rng = np.random.default_rng(seed)
    share = rng.choice([0.1, 0.3, 0.6, 0.9])
    arrays = {}
    for name, array in ordinary.items():
        pool = edge_values(array.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            edges = np.array(pool, dtype=np.float64 if array.dtype.kind == "f" else object)
            drawn = edges[rng.integers(0, len(pool), array.shape)].astype(array.dtype)
        small = array if array.dtype.kind in "fb" else rng.integers(-3, 4, array.shape)
        small = np.clip(small, *_range(array.dtype)).astype(array.dtype)
        arrays[name] = np.where(rng.random(array.shape) < share, drawn, small)
    return arrays


def _range(dtype: np.dtype) -> tuple[Any, Any]:
    if dtype.kind in "iu":
        return np.iinfo(dtype).min, np.iinfo(dtype).max
    return -np.inf, np.inf


def npz(arrays: dict[str, Any], compress: bool = False) -> bytes:
    """The bytes of an ``.npz`` of ``arrays`` (object arrays are pickled, as numpy does)."""
    buffer = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buffer, **arrays)
    return buffer.getvalue()


def manifest_of(artifact: bytes) -> dict[str, Any]:
    """The manifest of a well-formed artifact."""
    _, sections = unpack_artifact(artifact)
    manifest: dict[str, Any] = json.loads(dict(sections)[b"manifest"])
    return manifest


Runner = Callable[[str, FuzzCase], list[dict[str, Any]]]


@dataclass
class SetupFiles:
    """Valid files the cases start from: seed models, artifacts compiled from them, inputs, a
    training model and its data, the files of a finished training run, an IR file."""

    models: dict[str, onnx.ModelProto]
    artifacts: dict[str, bytes]
    inputs: dict[str, bytes]
    train_model: bytes
    train_data: dict[str, np.ndarray]
    mlir: bytes
    run_files: dict[str, bytes]
    """``metrics.jsonl`` and ``weights.safetensors`` of two steps of ``train_model``."""

    @classmethod
    def build(cls, where: Path, run: Runner) -> SetupFiles:
        """Writes the seeds to ``where`` and compiles them there with ``run``."""
        models = seed_models()
        train = zoo.mlp(in_features=8, hidden=(8,), classes=4, with_loss=True)
        rng = np.random.default_rng(2)
        samples: dict[str, np.ndarray] = {"x": rng.standard_normal((32, 8)).astype(np.float32),
                   "labels": rng.integers(0, 4, 32).astype(np.int64)}  # fmt: skip
        files = {f"{n}.onnx": models[n].SerializeToString() for n in ("mlp", "conv")}
        files |= {"train.onnx": train.SerializeToString(), "data.npz": npz(samples)}
        steps = [
            Step(["compile", f"{DIR}/mlp.onnx", "-o", f"{DIR}/mlp.cgc", "--mode", Mode.PIPELINED,
                  "--dump-ir", f"{DIR}/ir"]),
            Step(["compile", f"{DIR}/conv.onnx", "-o", f"{DIR}/conv_ws.cgc", "--mode",
                  Mode.WEIGHT_STREAMING]),
            Step(["compile", f"{DIR}/conv.onnx", "-o", f"{DIR}/conv_sparse.cgc", "--mode",
                  Mode.WEIGHT_STREAMING, "--sparsity", "0.75", "--sparse-params", ".*"]),
            Step(["train", f"{DIR}/train.onnx", "--data", f"{DIR}/data.npz", "--model-dir",
                  f"{DIR}/run", "--batch-size", "8", "--steps", "2"]),
        ]  # fmt: skip
        case = FuzzCase(0, "setup", "the fuzzer's setup", steps, files)
        case.write(where)
        results = run(str(where), case)
        if len(results) != len(steps) or any(r.get("exit") != 0 for r in results):
            raise RuntimeError(f"the fuzzer's setup failed: {results}")
        names = ("mlp", "conv_ws", "conv_sparse")
        artifacts = {n: (where / f"{n}.cgc").read_bytes() for n in names}
        inputs = {}
        for name, data in artifacts.items():
            arrays = inputs_for(manifest_of(data), seed=1)
            assert arrays is not None
            inputs[name] = npz(arrays)
        mlir = sorted((where / "ir").iterdir())[0].read_bytes()
        run_files = {n: (where / "run" / n).read_bytes()
                     for n in ("metrics.jsonl", "weights.safetensors")}  # fmt: skip
        return cls(models, artifacts, inputs, files["train.onnx"], samples, mlir, run_files)


# ------------------------------------------------------------------------------- the options door

# values click cannot parse stop a command before cgc sees anything: keep them rare
INTS = ["0", "-1", "1", "2", "3", "8", "16", "99999999999", "-99999999999", "4", "1", "2", "abc"]
FLOATS = ["nan", "inf", "-inf", "0", "-1", "1e308", "1e-45", "0.01", "1", "0.5", "abc"]
SHAPES = ["x=0x8", "x=99999999999x64", "x=", "=2x8", "x=2x", "x=-1x8", "ghost=2x8", "x=2x8",
          "x=1x8", "x=2x8x1", "x=2x3", "x=00002x08", "x 2x8"]  # fmt: skip
TARGETS = ["wse2", "wse3", "mesh4x4", "mesh1x1", "mesh0x4", "mesh99999999x99999999", "mesh-2x2",
           "", "foo", "WSE2", "mesh4x4x4", "wse2@2x2"]  # fmt: skip
MESHES = ["16x16", "0x0", "1x99999999999", "abc", "", "4x", "1x1", "2x3"]
FIGURES = ["clock_hz=0", "clock_hz=-1", "sram_bytes_per_pe=0", "sram_bytes_per_pe=1e30",
           "rows=0", "bogus=1", "=", "clock_hz=nan", "memoryx_bytes_per_s=abc", "clock_hz",
           "swarmx_fanout=0", "colors=0", "io_bytes_per_s=inf", "fmacs_32bit=-3"]  # fmt: skip
MODES = ["pipelined", "weight_streaming", "auto", "bogus", ""]
BAD_PATHS = [f"{DIR}/missing.x", f"{DIR}/adir", f"{DIR}/empty", f"{DIR}/junk", "",
             "/proc/self/status", f"{DIR}/nodir/sub/file", "/", f"{DIR}/adir/"]  # fmt: skip
OUT_PATHS = [f"{DIR}/adir", "", "/proc/nope/x", f"{DIR}/nodir/f", "/", f"{DIR}/empty",
             f"{DIR}/junk/x", "/proc/self/status"]  # fmt: skip


Arrays = dict[str, Any]


def _renamed(arrays: Arrays, name: str, rng: random.Random) -> tuple[Arrays, str]:
    arrays[rng.choice(["ghost", "", "X", name + " "])] = arrays.pop(name)
    return arrays, f"npz without '{name}'"


def _retyped(arrays: Arrays, name: str, rng: random.Random) -> tuple[Arrays, str]:
    dtype = rng.choice(["float64", "int32", "bool", "complex64", "float16", "uint8", "U3"])
    arrays[name] = arrays[name].astype(dtype)
    return arrays, f"'{name}' as {dtype}"


def _reshaped(arrays: Arrays, name: str, rng: random.Random) -> tuple[Arrays, str]:
    a = arrays[name]
    arrays[name] = rng.choice([a[..., None], a.reshape(-1), a[:0], a[..., :1], a.T])
    return arrays, f"'{name}' of shape {arrays[name].shape}"


def _extra(arrays: Arrays, name: str, rng: random.Random) -> tuple[Arrays, str]:
    arrays["extra"] = np.ones(3, np.float32)
    return arrays, "npz with an extra array"


def _objects(arrays: Arrays, name: str, rng: random.Random) -> tuple[Arrays, str]:
    arrays[name] = np.array([None, {"a": 1}], dtype=object)
    return arrays, f"'{name}' an object array"


def _nans(arrays: Arrays, name: str, rng: random.Random) -> tuple[Arrays, str]:
    a = arrays[name]
    arrays[name] = np.full(a.shape, np.nan, a.dtype) if a.dtype.kind == "f" else a
    return arrays, f"'{name}' all NaN"


def _scalar(arrays: Arrays, name: str, rng: random.Random) -> tuple[Arrays, str]:
    arrays[name] = np.float32(1.0)
    return arrays, f"'{name}' a 0-d array"


def _bad_label(arrays: Arrays, name: str, rng: random.Random) -> tuple[Arrays, str]:
    bad = rng.choice([4, 10, -1, -(1 << 40), 1 << 40])
    arrays["labels"] = arrays["labels"].copy()
    arrays["labels"][rng.randrange(len(arrays["labels"]))] = bad
    return arrays, f"a class label {bad} out of range"


BREAKERS: dict[str, Callable[[Arrays, str, random.Random], tuple[Arrays, str]]] = {
    "npy": lambda a, n, r: (a, "a .npy, not an .npz"),
    "truncated": lambda a, n, r: (a, "truncated npz"),
    "renamed": _renamed,
    "dtype": _retyped,
    "shape": _reshaped,
    "extra": _extra,
    "empty": lambda a, n, r: ({}, "empty npz"),
    "object": _objects,
    "nan": _nans,
    "zero": lambda a, n, r: ({k: v[:0] for k, v in a.items()}, "zero samples"),
    "scalar": _scalar,
    "labels": _bad_label,
}
"""Ways to break the arrays of an .npz, each with its description."""


class Draw:
    """Draws one command's arguments and the files they name."""

    def __init__(self, rng: random.Random, setup: SetupFiles) -> None:
        self.rng, self.setup = rng, setup
        self.files: dict[str, bytes] = {"empty": b"", "junk": rng.randbytes(rng.randrange(1, 300))}
        self.notes: list[str] = []

    def path(self, valid: str, data: bytes, bad: list[str] = BAD_PATHS, p: float = 0.7) -> str:
        """The valid file (written) with probability ``p``, else a bad path."""
        if self.rng.random() < p:
            self.files[valid] = data
            return f"{DIR}/{valid}"
        choice = self.rng.choice(bad)
        self.notes.append(f"path {choice!r}")
        return choice

    def npz(self, valid: str, arrays: dict[str, np.ndarray], labels: bool = False) -> str:
        """An .npz path: valid, or one of many kinds of broken data."""
        if self.rng.random() < 0.4:
            return self.path(valid, npz(arrays), p=0.6)
        arrays, what = self._bad_arrays(dict(arrays), labels)
        self.notes.append(what)
        if what == "a .npy, not an .npz":
            buffer = io.BytesIO()
            np.save(buffer, next(iter(arrays.values())))
            self.files[valid] = buffer.getvalue()
        elif what.startswith("truncated"):
            data = npz(arrays)
            self.files[valid] = data[: self.rng.randrange(len(data))]
        else:
            self.files[valid] = npz(arrays, compress=self.rng.random() < 0.2)
        return f"{DIR}/{valid}"

    def _bad_arrays(self, arrays: dict[str, Any], labels: bool) -> tuple[dict[str, Any], str]:
        kinds = sorted(BREAKERS) + (["labels"] * 4 if labels else [])
        kind = self.rng.choice([k for k in kinds if labels or k != "labels"])
        return BREAKERS[kind](arrays, self.rng.choice(sorted(arrays)), self.rng)

    def maybe(self, args: list[str], option: str, values: list[str], p: float = 0.3) -> None:
        """Appends ``option`` with a random value, with probability ``p``."""
        if self.rng.random() < p:
            value = self.rng.choice(values)
            args += [option, value]
            self.notes.append(f"{option} {value!r}")

    def target(self, args: list[str]) -> None:
        """Random target, mesh and figure options."""
        self.maybe(args, "--target", TARGETS, 0.25)
        self.maybe(args, "--mesh", MESHES, 0.15)
        self.maybe(args, "--set", FIGURES, 0.2)


def _model(d: Draw, train: bool = False) -> str:
    rng = d.rng
    r = rng.random()
    if r < 0.1:
        text, what = mut.mutate_params(TINY_PARAMS, rng)
        d.files["model.yaml"] = text.encode()
        d.notes.append(what)
        return f"{DIR}/model.yaml"
    if r < 0.15:
        spec = rng.choice(["zoo:nope", "zoo:", "zoo:../x", f"{DIR}/f.py:factory", f"{DIR}/m.txt"])
        d.files["f.py"] = b"def factory():\n    return 1\n"
        d.notes.append(f"model {spec}")
        return spec
    data = d.setup.train_model if train else d.setup.models["mlp"].SerializeToString()
    return d.path("model.onnx", data)


def _compile(d: Draw) -> list[str]:
    args = ["compile", _model(d), "-o", f"{DIR}/out.cgc"]
    if d.rng.random() < 0.25:
        args[-1] = d.rng.choice(OUT_PATHS)
        d.notes.append(f"-o {args[-1]!r}")
    d.maybe(args, "--mode", MODES)
    d.maybe(args, "--batch-size", INTS)
    d.maybe(args, "--shape", SHAPES, 0.4)
    d.maybe(args, "--num-csx", INTS)
    d.maybe(args, "--micro-batch-size", INTS, 0.15)
    d.maybe(args, "--init-seed", INTS, 0.1)
    d.maybe(args, "--dump-ir", [f"{DIR}/ir", *OUT_PATHS], 0.15)
    if d.rng.random() < 0.1:
        args.append(d.rng.choice(["--no-weights", "--recompute", "--print-ir-after-all"]))
    _sparsity(d, args)
    d.maybe(args, "--detect-sparsity", FLOATS, 0.08)
    if d.rng.random() < 0.05:
        weights = {"fc1.weight": np.zeros(d.rng.choice([(32, 16), (16, 32), (3,)]), np.float32)}
        args += ["--weights", d.path("w.safetensors", weights_to_bytes(weights))]
        d.notes.append("--weights")
    d.target(args)
    return args


def _sparsity(d: Draw, args: list[str]) -> None:
    """Sparsity options: levels, patterns, mask choices."""
    d.maybe(args, "--sparsity", [*FLOATS, "0.75", "0.9", "0.999999"], 0.12)
    d.maybe(args, "--sparse-params", ["(", ".*", "fc1.*", "nothing", ".*bias"], 0.06)
    d.maybe(args, "--sparsity-init", ["random", "magnitude", "detected", ""], 0.05)


def _artifact(d: Draw) -> tuple[str, str]:
    name = d.rng.choice(sorted(d.setup.artifacts))
    return d.path("model.cgc", d.setup.artifacts[name]), name


def _run(d: Draw) -> list[str]:
    path, name = _artifact(d)
    arrays = dict(np.load(io.BytesIO(d.setup.inputs[name])))
    args = ["run", path, "--inputs", d.npz("inputs.npz", arrays)]
    if d.rng.random() < 0.1:
        args = ["run", path, "--timing-only"]
    d.maybe(args, "--output", [f"{DIR}/out.npz", *OUT_PATHS], 0.4)
    d.maybe(args, "--num-csx", INTS)
    d.maybe(args, "--set", FIGURES, 0.2)
    d.maybe(args, "--stats-json", [f"{DIR}/s.json", *OUT_PATHS], 0.2)
    d.maybe(args, "--trace", [f"{DIR}/t.json", *OUT_PATHS], 0.2)
    return args


def _train(d: Draw) -> list[str]:
    model = _model(d, train=True)
    data = d.npz("data.npz", d.setup.train_data, labels=True)
    out = f"{DIR}/run"
    if d.rng.random() < 0.2:
        out = d.rng.choice(OUT_PATHS)
        d.notes.append(f"--model-dir {out!r}")
    args = ["train", model, "--data", data, "--model-dir", out, "--batch-size", "8"]
    args += ["--steps", d.rng.choice(["1", "2", "3", "1", "2", "0", "-1", "abc"])]
    d.notes.append(f"--steps {args[-1]}")
    if d.rng.random() < 0.1:
        args = ["train", model, "--timing-only", "--steps", "1"]
    d.maybe(args, "--batch-size", INTS)
    d.maybe(args, "--optimizer", ["sgd", "adam", "adamw", "lamb", ""])
    for option in ("--lr", "--momentum", "--weight-decay", "--eps", "--lr-gamma",
                   "--max-grad-norm", "--dampening"):  # fmt: skip
        d.maybe(args, option, FLOATS, 0.08)
    d.maybe(args, "--betas", ["0.9", "a,b", "1,1,1", "0.9,0.999", ",", "2,-1", "nan,nan"], 0.1)
    d.maybe(args, "--lr-schedule", ["constant", "cosine", "step", "linear"], 0.15)
    for option in ("--warmup-steps", "--lr-step-size", "--checkpoint-every", "--eval-every",
                   "--seed", "--num-csx", "--swarmx-fanout", "--micro-batch-size"):  # fmt: skip
        d.maybe(args, option, INTS, 0.08)
    d.maybe(args, "--trainable", ["(", "fc1.*", "", "nothing-matches", "[a-"], 0.15)
    if d.rng.random() < 0.15:
        args += ["--eval-data", d.npz("eval.npz", d.setup.train_data, labels=True)]
    if d.rng.random() < 0.1:
        args.append(d.rng.choice(["--resume", "--shuffle", "--nesterov", "--amsgrad"]))
    d.maybe(args, "--trace", [f"{DIR}/t.json", *OUT_PATHS], 0.1)
    _sparsity(d, args)
    d.maybe(args, "--sparsity-schedule", ["static", "dynamic", "x"], 0.06)
    for option in ("--sparsity-update-every", "--sparsity-end-step"):
        d.maybe(args, option, INTS, 0.04)
    d.maybe(args, "--sparsity-drop-fraction", FLOATS, 0.04)
    d.maybe(args, "--sparsity-regrow", ["gradient", "random", "x"], 0.04)
    d.target(args)
    return args


def _scale(d: Draw) -> list[str]:
    args = ["scale", _model(d, train=True)]
    d.maybe(args, "--num-csx", ["", "0", "-1", "1,2", "a", "1,,2", "99999999", "1,2,4", "3"], 0.6)
    d.maybe(args, "--per-system-batch", INTS, 0.2)
    d.maybe(args, "--global-batch", INTS, 0.2)
    d.maybe(args, "--optimizer", ["sgd", "adam", "adamw", "x"], 0.1)
    for option, name in (("--json", "s.json"), ("--csv", "s.csv"), ("--png", "s.png")):
        d.maybe(args, option, [f"{DIR}/{name}", *OUT_PATHS], 0.1)
    d.maybe(args, "--sparsity", ["0,0.5", "0.9", "1", "a", "0,0", "-1", ",", "nan"], 0.15)
    d.target(args)
    return args


def _inspect(d: Draw) -> list[str]:
    path, _ = _artifact(d)
    args = ["inspect", path if d.rng.random() < 0.85 else _model(d)]
    args += d.rng.sample(["--json", "--disasm", "--ir"], d.rng.randint(0, 2))
    d.maybe(args, "--placement", ["-", f"{DIR}/p.png", *OUT_PATHS], 0.3)
    return args


def _opt(d: Draw) -> list[str]:
    text = d.setup.mlir
    if d.rng.random() < 0.3:
        text, what = mut.mutate_bytes(text, d.rng)
        d.notes.append(f"mlir: {what}")
    args = ["opt", d.path("in.mlir", text)]
    pipelines = ["", "bogus", "decompose", "decompose,,form-layers", "form-layers{x=1}",
                 "fold-constants,channels-last", ",", "place-layers", "route-tensors"]  # fmt: skip
    d.maybe(args, "-p", pipelines, 0.7)
    d.maybe(args, "-o", [f"{DIR}/o.mlir", *OUT_PATHS], 0.2)
    d.maybe(args, "--target", TARGETS, 0.3)
    d.maybe(args, "--mesh", MESHES, 0.15)
    if d.rng.random() < 0.2:
        args.append(d.rng.choice(["--split-input-file", "--verify-diagnostics"]))
    return args


COMMANDS: dict[str, Callable[[Draw], list[str]]] = {
    "compile": _compile, "run": _run, "train": _train, "scale": _scale, "inspect": _inspect,
    "opt": _opt,
}  # fmt: skip


def options_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """One command with random option values and good or bad files."""
    draw = Draw(rng, setup)
    command = rng.choice(sorted(COMMANDS))
    args = COMMANDS[command](draw)
    what = "; ".join(draw.notes) or "valid options"
    return FuzzCase(index, "options", f"{command}: {what}", [Step(args)], draw.files, ["adir"])
