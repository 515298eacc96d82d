"""The fuzzer's file-system families: where a command's files go, rather than what they hold.

- ``alias``: an output path that names an input of the same command (directly, through a
  symlink, through a hard link): ``compile m.onnx -o m.onnx``, ``--trace`` onto the artifact,
  a model directory that holds the data file under the name of what training writes there, a
  sweep's output directory that holds its spec as ``sweep.json``; and two outputs onto one
  file. The input's bytes must survive, whatever the exit.
- ``special``: named pipes without a writer or reader, character devices (``/dev/zero``,
  ``/dev/urandom``, ``/dev/full``, ``/dev/null``), a directory and a socket where a command
  takes or writes a file: each ends in a result or one line, never a hang on a pipe or a read
  of an endless device to the memory cap.
- ``fulldisk``: writes that fail part-way (a small ``RLIMIT_FSIZE``; ``/dev/full``) and names
  too long for the file system: one line, and no half-written file or temporary left.
- ``concurrent``: two trainings, or two sweeps, into one directory at once, one in the
  background as a second process: each ends in a result or one line, and the directory as
  one whole run left it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cgc.tools.fuzz_cases import DIR, Fills, FuzzCase, SetupFiles, Step, npz
from cgc.tools.fuzz_seeds import TINY_PARAMS

TRAIN = ["--batch-size", "8"]
"""The training options every case shares: the setup's data holds 32 samples."""
SWEEP_SPEC = {"models": ["mlp.onnx"], "measure": "inference", "targets": ["mesh8x8"],
              "num_csx": [1, 2]}  # fmt: skip
"""A sweep of two cheap points: the seed MLP's inference on one and two systems."""
SWEEP_POINTS = 2


class Files:
    """The files of a case being made, and the notes that describe it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.files: dict[str, bytes] = {}
        self.specials: dict[str, tuple[str, str]] = {}
        self.dirs: list[str] = []
        self.inputs: list[str] = []
        self.notes: list[str] = []

    def put(self, name: str, data: bytes, is_input: bool = True) -> str:
        """Writes ``name`` (an input of the command unless told) and gives its path."""
        self.files[name] = data
        if is_input:
            self.inputs.append(name)
        return f"{DIR}/{name}"

    def again(self, name: str, hard: bool = True) -> str:
        """A path that names file ``name`` again: itself, a symlink to it, or (if ``hard``
        and it exists) a hard link of it, with ``name``'s suffix (commands tell files by
        it)."""
        how = self.rng.choice(["itself", "symlink", "hard link"] if hard else ["itself", "symlink"])
        self.notes.append(how)
        if how == "itself":
            return f"{DIR}/{name}"
        link = f"again{len(self.specials)}{Path(name).suffix}"
        self.specials[link] = ("symlink" if how == "symlink" else "hardlink", name)
        return f"{DIR}/{link}"

    def case(
        self, index: int, family: str, what: str, steps: list[Step], fsize: int | None = None,
        timeout: float | None = None,
    ) -> FuzzCase:  # fmt: skip
        """The case of these files."""
        description = f"{what} ({', '.join(self.notes)})" if self.notes else what
        return FuzzCase(
            index, family, description, steps, self.files, self.dirs, self.specials,
            self.inputs, fsize, timeout,
        )  # fmt: skip


def _draw(rng: random.Random, weights: dict[str, float]) -> str:
    """A key of ``weights``, drawn by its weight."""
    names = sorted(weights)
    (name,) = rng.choices(names, [weights[n] for n in names])
    return name


def _data(setup: SetupFiles) -> bytes:
    return npz(setup.train_data)


def _train(f: Files, setup: SetupFiles, data: str | None = None) -> list[str]:
    """``cgc train`` of the setup's training model, two steps into ``run``."""
    model = f.put("train.onnx", setup.train_model)
    data = data or f.put("data.npz", _data(setup))
    return ["train", model, "--data", data, "--model-dir", f"{DIR}/run", *TRAIN, "--steps", "2"]


def _run(f: Files, setup: SetupFiles) -> list[str]:
    """``cgc run`` of the setup's pipelined MLP on its inputs."""
    artifact = f.put("model.cgc", setup.artifacts["mlp"])
    return ["run", artifact, "--inputs", f.put("in.npz", setup.inputs["mlp"])]


# ------------------------------------------------------------------------------- alias

AliasMaker = Callable[[Files, SetupFiles], tuple[str, list[Step]]]


def _compile_onto_model(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    model = f.put("m.onnx", setup.models["mlp"].SerializeToString())
    if f.rng.random() < 0.3:  # the model through a link, the output its real name
        return "compile -o the model it reads", [
            Step(["compile", f.again("m.onnx"), "-o", model], outputs=[("m.onnx", "artifact")])
        ]
    out = f.again("m.onnx")
    name = out.removeprefix(f"{DIR}/")
    return "compile -o the model", [
        Step(["compile", model, "-o", out], outputs=[(name, "artifact")])
    ]


def _run_onto_input(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    args = _run(f, setup)
    option, kind = f.rng.choice(
        [("--output", "npz"), ("--trace", "json"), ("--stats-json", "json")]
    )
    victim = f.rng.choice(["model.cgc", "in.npz"])
    out = f.again(victim)
    return f"run {option} onto {victim}", [
        Step([*args, option, out], outputs=[(out.removeprefix(f"{DIR}/"), kind)])
    ]


def _two_outputs(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    """Two outputs of one command onto one file: one of them would be lost."""
    f.rng.shuffle(options := [("--output", "npz"), ("--trace", "json"), ("--stats-json", "json")])
    (first, kind1), (second, kind2) = options[:2]
    other = f.again("out.x", hard=False)
    outputs = [("out.x", kind1), (other.removeprefix(f"{DIR}/"), kind2)]
    args = [*_run(f, setup), first, f"{DIR}/out.x", second, other]
    return f"run {first} and {second} onto one file", [Step(args, outputs=outputs)]


def _dump_ir_holding_model(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    """``--dump-ir DIR`` where DIR holds the model: as a pass's file (reached through a
    symlink named .onnx), or under its own name."""
    data = setup.models["mlp"].SerializeToString()
    if f.rng.random() < 0.5:
        f.put("ir/00-import.mlir", data)
        f.specials["m.onnx"] = ("symlink", "ir/00-import.mlir")
        model, what = f"{DIR}/m.onnx", "--dump-ir DIR holding the model as 00-import.mlir"
    else:
        model, what = f.put("ir/m.onnx", data), "--dump-ir the model's directory"
    args = ["compile", model, "-o", f"{DIR}/out.cgc", "--dump-ir", f"{DIR}/ir"]
    return what, [Step(args, outputs=[("out.cgc", "artifact")])]


def _model_dir_holding_input(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    """``train --model-dir D`` where D holds an input under the name of a file training
    writes there: the data, the held-out data or the starting weights."""
    name = f.rng.choice(["metrics.jsonl", "weights.safetensors"])
    option = f.rng.choice(["--data", "--eval-data", "--weights"])
    if option == "--weights":
        name = "weights.safetensors"
        held = f.put(f"run/{name}", setup.run_files["weights.safetensors"])
    else:
        held = f.put(f"run/{name}", _data(setup))
    args = _train(f, setup, data=held if option == "--data" else None)
    if option != "--data":
        args += [option, held] + (["--eval-every", "1"] if option == "--eval-data" else [])
    if f.rng.random() < 0.4:
        f.specials["runlink"] = ("symlink", "run")
        f.notes.append("--model-dir through a symlink")
        args[args.index("--model-dir") + 1] = f"{DIR}/runlink"
    return f"train --model-dir holding {option} as {name}", [
        Step(args, fills=Fills("train", "run", 2))
    ]


def _trace_onto_data(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    args = _train(f, setup)
    return "train --trace onto --data", [Step([*args, "--trace", f.again("data.npz")])]


def _sweep_spec_in_output(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    """``cgc sweep DIR/NAME -o DIR`` where NAME is a file the sweep writes."""
    name = f.rng.choice(["sweep.json", "sweep.csv", "points.jsonl", "scaling.png"])
    f.put("mlp.onnx", setup.models["mlp"].SerializeToString())
    spec = {**SWEEP_SPEC, "models": ["../mlp.onnx"]}
    f.put(f"out/{name}", json.dumps(spec).encode())
    args = ["sweep", f.again(f"out/{name}"), "-o", f"{DIR}/out", "--jobs", "1"]
    return f"sweep -o the directory of its spec, {name}", [
        Step(args, fills=Fills("sweep", "out", SWEEP_POINTS))
    ]


def _placement_onto_artifact(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    artifact = f.put("model.cgc", setup.artifacts["mlp"])
    return "inspect --placement onto the artifact", [
        Step(["inspect", artifact, "--placement", f.again("model.cgc")])
    ]


def _png_onto_params(f: Files, setup: SetupFiles) -> tuple[str, list[Step]]:
    model = f.put("model.yaml", TINY_PARAMS.encode())
    option = f.rng.choice(["--png", "--json", "--csv"])
    return f"scale {option} onto the params file", [
        Step(["scale", model, "--num-csx", "1", option, f.again("model.yaml")])
    ]


ALIASES: dict[str, tuple[float, AliasMaker]] = {
    "compile": (3, _compile_onto_model),
    "run": (3, _run_onto_input),
    "two outputs": (2, _two_outputs),
    "dump-ir": (1, _dump_ir_holding_model),
    "model-dir": (3, _model_dir_holding_input),
    "trace": (1, _trace_onto_data),
    "sweep": (1, _sweep_spec_in_output),
    "placement": (1, _placement_onto_artifact),
    "scale": (0.5, _png_onto_params),
}
"""The ways to alias an input, by weight (scale's, which simulates for seconds, rarest)."""


def alias_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """A command whose output names one of its inputs (or another of its outputs)."""
    f = Files(rng)
    _, make = ALIASES[_draw(rng, {name: w for name, (w, _) in ALIASES.items()})]
    what, steps = make(f, setup)
    return f.case(index, "alias", what, steps)


# ------------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class Output:
    """A command that writes one file or directory whose name the family chooses."""

    weight: float
    """How often it is chosen (commands that simulate for seconds rarely)."""
    kind: str
    """What it writes (``fuzz_worker.OUTPUT_KINDS``)."""
    suffix: str
    """Of the name it is given (commands tell some files by it)."""
    make: Callable[[Files, SetupFiles, str], tuple[list[str], Fills | None]]
    """The command's arguments that write the relative name given, and what it fills."""


def _compile_to(f: Files, setup: SetupFiles, out: str) -> tuple[list[str], Fills | None]:
    model = f.put("m.onnx", setup.models["mlp"].SerializeToString())
    return ["compile", model, "-o", f"{DIR}/{out}"], None


def _dump_ir_to(f: Files, setup: SetupFiles, out: str) -> tuple[list[str], Fills | None]:
    args, _ = _compile_to(f, setup, "out.cgc")
    return [*args, "--dump-ir", f"{DIR}/{out}"], None


def _run_to(option: str) -> Callable[[Files, SetupFiles, str], tuple[list[str], Fills | None]]:
    return lambda f, setup, out: ([*_run(f, setup), option, f"{DIR}/{out}"], None)


def _opt_to(f: Files, setup: SetupFiles, out: str) -> tuple[list[str], Fills | None]:
    return ["opt", f.put("in.mlir", setup.mlir), "-o", f"{DIR}/{out}"], None


def _placement_to(f: Files, setup: SetupFiles, out: str) -> tuple[list[str], Fills | None]:
    artifact = f.put("model.cgc", setup.artifacts["mlp"])
    return ["inspect", artifact, "--placement", f"{DIR}/{out}"], None


def _train_trace_to(f: Files, setup: SetupFiles, out: str) -> tuple[list[str], Fills | None]:
    return [*_train(f, setup), "--trace", f"{DIR}/{out}"], None


def _model_dir_to(f: Files, setup: SetupFiles, out: str) -> tuple[list[str], Fills | None]:
    args = _train(f, setup)
    args[args.index("--model-dir") + 1] = f"{DIR}/{out}"
    args[-1] = "3"
    every = f.rng.choice([0, 1])
    return args + (["--checkpoint-every", "1"] if every else []), Fills("train", out, 3, every)


def _scale_to(option: str) -> Callable[[Files, SetupFiles, str], tuple[list[str], Fills | None]]:
    def make(f: Files, setup: SetupFiles, out: str) -> tuple[list[str], Fills | None]:
        model = f.put("tiny.yaml", TINY_PARAMS.encode())
        return ["scale", model, "--num-csx", "1", option, f"{DIR}/{out}"], None

    return make


def _sweep_to(f: Files, setup: SetupFiles, out: str) -> tuple[list[str], Fills | None]:
    f.put("mlp.onnx", setup.models["mlp"].SerializeToString())
    spec = f.put("spec.yaml", json.dumps(SWEEP_SPEC).encode())
    return ["sweep", spec, "-o", f"{DIR}/{out}", "--jobs", "1"], Fills("sweep", out, SWEEP_POINTS)


OUTPUTS: dict[str, Output] = {
    "compile -o": Output(3, "artifact", ".cgc", _compile_to),
    "compile --dump-ir": Output(1, "dir", "", _dump_ir_to),
    "run --output": Output(2, "npz", ".npz", _run_to("--output")),
    "run --trace": Output(1, "json", ".json", _run_to("--trace")),
    "run --stats-json": Output(1, "json", ".json", _run_to("--stats-json")),
    "opt -o": Output(1, "text", ".mlir", _opt_to),
    "inspect --placement": Output(1, "png", ".png", _placement_to),
    "train --trace": Output(1, "json", ".json", _train_trace_to),
    "train --model-dir": Output(3, "dir", "", _model_dir_to),
    "scale --json": Output(0.2, "json", ".json", _scale_to("--json")),
    "scale --csv": Output(0.2, "text", ".csv", _scale_to("--csv")),
    "scale --png": Output(0.2, "png", ".png", _scale_to("--png")),
    "sweep -o": Output(0.5, "dir", "", _sweep_to),
}
"""The commands the special and fulldisk families point at their files."""


def _output(rng: random.Random, where: dict[str, Output]) -> tuple[str, Output]:
    name = _draw(rng, {n: output.weight for n, output in where.items()})
    return name, where[name]


# ------------------------------------------------------------------------------- special

SPECIALS = ["fifo", "fifo", "/dev/zero", "/dev/urandom", "/dev/full", "/dev/null", "dir",
            "socket"]  # fmt: skip
"""Special files, a FIFO (the likeliest to hang a command) twice as often."""


def _reader(f: Files, setup: SetupFiles, suffix: str, s: str) -> list[str]:
    """A command that reads the special file at ``s``, a file of ``suffix``."""
    rng = f.rng
    if suffix == ".onnx":
        return ["compile", s, "-o", f"{DIR}/out.cgc"]
    if suffix == ".yaml":
        return rng.choice([["compile", s, "-o", f"{DIR}/out.cgc"],
                           ["sweep", s, "-o", f"{DIR}/sw", "--jobs", "1"]])  # fmt: skip
    if suffix == ".py":
        return ["compile", s + ":factory", "-o", f"{DIR}/out.cgc"]
    if suffix == ".cgc":
        return rng.choice(
            [["inspect", s], ["run", s, "--inputs", f.put("in.npz", setup.inputs["mlp"])]]
        )
    if suffix == ".npz":
        return rng.choice([
            lambda: ["run", f.put("model.cgc", setup.artifacts["mlp"]), "--inputs", s],
            lambda: _train(f, setup, data=s),
            lambda: [*_train(f, setup), "--eval-data", s, "--eval-every", "1"],
        ])()  # fmt: skip
    if suffix == ".safetensors":
        args, _ = _compile_to(f, setup, "out.cgc")
        return [*args, "--weights", s]
    return ["opt", s]


READ_SUFFIXES = [".onnx", ".yaml", ".py", ".cgc", ".npz", ".npz", ".safetensors", ".mlir"]
"""What the special family's readers take: models, artifacts, arrays, weights, IR."""


def special_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """A special file where a command reads or writes a file."""
    f = Files(rng)
    special = rng.choice(SPECIALS)
    if rng.random() < 0.55:
        suffix = rng.choice(READ_SUFFIXES)
        name = f"special{suffix}"
        args, outputs, role = _reader(f, setup, suffix, f"{DIR}/{name}"), [], "input"
    else:
        role, output = _output(rng, OUTPUTS)
        name = f"special{output.suffix}"
        args, _ = output.make(f, setup, name)
        outputs = [(name, output.kind)]
    if special == "dir":
        f.dirs.append(name)
    elif special.startswith("/dev/"):
        f.specials[name] = ("device", special)
    else:
        f.specials[name] = (special, "")
    step = Step(args, outputs=outputs)
    return f.case(index, "special", f"{args[0]}: {special} as {role} {name}", [step], timeout=10.0)


# ------------------------------------------------------------------------------- fulldisk

LIMITS = [512, 1024, 1536, 2048, 4096, 8192, 16384, 65536]
"""File sizes past which writes fail: below most outputs' sizes, above a few."""
LONG = {"long name": "n" * 300, "long path": "/".join(["d" * 200] * 25) + "/out"}
"""Names too long for the file system: a 300-byte component, a 5000-byte path."""


def _old_output(f: Files, setup: SetupFiles, name: str, output: Output) -> None:
    """An output from before, which a write that fails must leave as it was."""
    if output.kind == "artifact":
        f.put(name, setup.artifacts["conv_ws"], is_input=False)
    elif output.make is _model_dir_to:
        for file, data in setup.run_files.items():
            f.put(f"{name}/{file}", data, is_input=False)
    elif output.kind != "dir":
        f.put(name, b'{"an": "older output"}\n', is_input=False)
    f.notes.append("over an older output")


def fulldisk_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """A command whose write fails part-way: a small file-size limit (over an older output,
    sometimes), ``/dev/full``, or a name too long for the file system."""
    f = Files(rng)
    how = rng.choices(["limit", "/dev/full", "long name", "long path"], [6, 1, 1, 1])[0]
    files = {k: v for k, v in OUTPUTS.items() if v.kind != "dir"}
    role, output = _output(rng, files if how == "/dev/full" else OUTPUTS)
    name = LONG.get(how, "out") + output.suffix
    args, fills = output.make(f, setup, name)
    fsize = rng.choice(LIMITS) if how == "limit" else None
    if how == "/dev/full":
        f.specials[name] = ("device", "/dev/full")
    elif how == "limit" and rng.random() < 0.4:
        _old_output(f, setup, name, output)
    outputs = [(name, output.kind)] if output.kind != "dir" else []
    what = f"{role}: {how}" + (f" of {fsize} bytes" if fsize else "")
    return f.case(index, "fulldisk", what, [Step(args, outputs=outputs, fills=fills)], fsize=fsize)


# ------------------------------------------------------------------------------- concurrent


def _training(rng: random.Random) -> tuple[list[str], Fills]:
    """A training's own options into ``run``: its steps (a second or so), checkpoints,
    learning rate."""
    steps, every = rng.choice([20, 30, 40, 60]), rng.choice([0, 1, 3, 7])
    args = ["--steps", str(steps), "--lr", rng.choice(["0.01", "0.05"])]
    if every:
        args += ["--checkpoint-every", str(every)]
    return args, Fills("train", "run", steps, every)


def concurrent_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """Two trainings, or two sweeps, into one directory at once: one as a process in the
    background, the other in the worker once the first has begun to write (its first line of
    metrics, its first point), after a further delay drawn from the seed."""
    f = Files(rng)
    delay = rng.choice([0.0, 0.0, 0.05, 0.1, 0.2, 0.5, 1.0])
    if rng.random() < 0.7:
        base = _train(f, setup)[:-2]
        first, fills1 = _training(rng)
        second, fills2 = (first, fills1) if rng.random() < 0.4 else _training(rng)
        what = "two trainings into one --model-dir" + (" (the same)" if first == second else "")
        steps = [Step([*base, *first], background=True, fills=fills1),
                 Step([*base, *second], wait_for="run/metrics.jsonl", delay=delay,
                      fills=fills2)]  # fmt: skip
    else:
        f.put("mlp.onnx", setup.models["mlp"].SerializeToString())
        args = ["sweep", f.put("spec.yaml", json.dumps(SWEEP_SPEC).encode()), "-o",
                f"{DIR}/out", "--jobs", "1"]  # fmt: skip
        fills = Fills("sweep", "out", SWEEP_POINTS)
        what = "two sweeps into one -o"
        steps = [Step(args, background=True, fills=fills),
                 Step(args, wait_for="out/points.jsonl", delay=delay, fills=fills)]  # fmt: skip
    return f.case(index, "concurrent", f"{what}, the second {delay} s after it began", steps)
