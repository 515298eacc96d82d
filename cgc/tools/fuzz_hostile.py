"""The fuzzer's hostile-content families: files that are well-formed enough to be read, and
then attack the reader.

- ``yaml``: params files (from ``fuzz_seeds.TINY_PARAMS``) and sweep specs with control
  characters, invalid UTF-8, byte-order marks, CRLF, tabs, very long lines, deep nesting,
  aliases that expand exponentially ("billion laughs"), integers and floats past any
  machine's, tags that would build Python objects, duplicate keys, several documents; as the
  model of ``compile``, ``train --timing-only``, ``scale`` and ``inspect``, as a sweep's spec
  and as a sweep's model.
- ``factory``: ``file.py:factory`` PyTorch factories that exit (``SystemExit`` 0, 3 or a
  message), are interrupted, recurse for ever, run out of memory, return the wrong things,
  print or warn, fail as they are imported, or return a model ``torch.export`` cannot capture.
  Only an exit 2 with one line is right for a factory that gives no model (``sys.exit(0)``
  included: exit 0 would claim an artifact that is not there); the ones that give a model
  despite their noise must compile.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from cgc.tools.fuzz_cases import DIR, FuzzCase, SetupFiles, Step
from cgc.tools.fuzz_seeds import TINY_PARAMS

# ------------------------------------------------------------------------------- yaml

TextMutator = Callable[[str, random.Random], tuple[str, str]]


def _valued_line(text: str, rng: random.Random) -> tuple[list[str], int]:
    """The text's lines and the index of one that gives a key a value (one added if another
    mutation left none)."""
    lines = text.splitlines() or [""]
    valued = [i for i, line in enumerate(lines) if ": " in line]
    if not valued:
        lines.append("extra: 1")
        valued = [len(lines) - 1]
    return lines, rng.choice(valued)


def _control(text: str, rng: random.Random) -> tuple[str, str]:
    char = rng.choice(["\x00", "\x07", "\x1b", "\x7f", "\x1b[31m", "\x0c", "\x85", "\u2028"])
    lines, i = _valued_line(text, rng)
    at = rng.randrange(len(lines[i]) + 1)
    lines[i] = lines[i][:at] + char + lines[i][at:]
    return "\n".join(lines) + "\n", f"control character {char!r} in line {i + 1}"


def _crlf(text: str, rng: random.Random) -> tuple[str, str]:
    ending = rng.choice(["\r\n", "\r", "\n\r"])
    return text.replace("\n", ending), f"line endings {ending!r}"


def _tabs(text: str, rng: random.Random) -> tuple[str, str]:
    return text.replace("  ", "\t"), "indented with tabs"


def _long_line(text: str, rng: random.Random) -> tuple[str, str]:
    size = rng.choice([10_000, 1_000_000])
    lines, i = _valued_line(text, rng)
    key = lines[i].split(":")[0]
    choice = rng.randrange(3)
    if choice == 0:
        lines[i] = f"{key}: {'x' * size}"
    elif choice == 1:
        lines[i] = f"{key}: {'9' * size}"  # an integer of `size` digits
    else:
        lines.insert(i, "#" + "c" * size)
    return "\n".join(
        lines
    ) + "\n", f"a line of {size} characters ({['text', 'digits', 'a comment'][choice]})"


def _deep(text: str, rng: random.Random) -> tuple[str, str]:
    depth = rng.choice([100, 1000, 20_000, 200_000])
    lines, i = _valued_line(text, rng)
    key = lines[i].split(":")[0]
    if rng.random() < 0.5:
        lines[i] = f"{key}: {'[' * depth}{']' * depth}"
        return "\n".join(lines) + "\n", f"{key.strip()} nested {depth} deep in flow style"
    depth = min(depth, 5000)
    nested = "\n".join(" " * k + "a:" for k in range(depth)) + " 1"
    return f"{text}deep:\n{nested}\n", f"a mapping nested {depth} deep by indentation"


def _laughs(text: str, rng: random.Random) -> tuple[str, str]:
    """Aliases of aliases: nine levels of nine, 9^9 strings if expanded."""
    levels = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for k in range(1, 9):
        levels.append(f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]")
    lines, i = _valued_line(text, rng)
    key = lines[i].split(":")[0]
    where = rng.choice(["value", "key"])
    if where == "value":
        lines[i] = f"{key}: *l8"
    else:
        lines.append("extra: *l8")
    return "\n".join(levels + lines) + "\n", f"billion laughs as {where}"


def _huge(text: str, rng: random.Random) -> tuple[str, str]:
    value = rng.choice(["1000000000000000000000000000000", "1e400", "-1e400", ".inf", "-.inf",
                        ".nan", "0x7fffffffffffffff", "18446744073709551617", "1_000_000_000",
                        "9" * 5000, "1e-400", "0o777777777777777777777", "-0"])  # fmt: skip
    lines, i = _valued_line(text, rng)
    key = lines[i].split(":")[0]
    lines[i] = f"{key}: {value}"
    return "\n".join(lines) + "\n", f"{key.strip()} = {value[:30]}"


def _tag(text: str, rng: random.Random) -> tuple[str, str]:
    tag = rng.choice(["!!python/object/apply:os.getpid []", "!!python/name:os.system",
                      "!!python/object:argparse.Namespace {a: 1}", "!!binary aGVsbG8=",
                      "!!set {a, b}", "!!timestamp 2001-12-14", "!!float '1'", "!custom 3",
                      "!!str 64", "!!int '0x40'", "!<tag:yaml.org,2002:int> 64"])  # fmt: skip
    lines, i = _valued_line(text, rng)
    key = lines[i].split(":")[0]
    lines[i] = f"{key}: {tag}"
    return "\n".join(lines) + "\n", f"{key.strip()} tagged {tag.split()[0]}"


def _duplicate(text: str, rng: random.Random) -> tuple[str, str]:
    lines, i = _valued_line(text, rng)
    if rng.random() < 0.5:
        key = lines[i].split(":")[0]
        lines.insert(i + 1, f"{key}: {rng.choice(['7', '-1', 'abc', '[]'])}")
        return "\n".join(lines) + "\n", f"{key.strip()} twice, another value"
    return text + text, "every section twice"


def _structure(text: str, rng: random.Random) -> tuple[str, str]:
    choice = rng.choice(["documents", "empty", "comment", "complex key", "number key", "list",
                         "merge", "scalar", "null key"])  # fmt: skip
    out = {
        "documents": f"---\n{text}---\n{text}",
        "empty": "",
        "comment": "# nothing but a comment\n",
        "complex key": f"{text}? [a, b]\n: 1\n",
        "number key": f"{text}1: 2\n",
        "list": "- " + text.replace("\n", "\n  "),
        "merge": "base: &base {hidden_size: 64}\n"
        + text.replace("model:\n", "model:\n  <<: *base\n", 1),
        "scalar": "just a string\n",
        "null key": f"{text}~: x\n",
    }[choice]
    return out, f"structure: {choice}"


TEXT_MUTATORS: list[TextMutator] = [_control, _crlf, _tabs, _long_line, _deep, _laughs, _huge,
                                    _tag, _duplicate, _structure]  # fmt: skip


def _encode(text: str, rng: random.Random) -> tuple[bytes, str]:
    """The text's bytes: UTF-8 mostly, else with a byte-order mark, as UTF-16, or with bytes
    that are no UTF-8 spliced in."""
    choice = rng.choices(["utf-8", "bom", "utf-16", "invalid"], [6, 1, 1, 2])[0]
    data = text.encode("utf-8", errors="surrogatepass")
    if choice == "bom":
        return b"\xef\xbb\xbf" + data, "a UTF-8 byte-order mark"
    if choice == "utf-16":
        codec = rng.choice(["utf-16", "utf-16-le", "utf-16-be"])
        return text.encode(codec, errors="surrogatepass"), f"encoded {codec}"
    if choice == "invalid":
        junk = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\x80", b"\xed\xa0\x80", b"\xf8\x88"])
        at = rng.randrange(len(data) + 1)
        return data[:at] + junk + data[at:], f"invalid UTF-8 {junk!r} at byte {at}"
    return data, ""


def hostile_yaml(text: str, rng: random.Random) -> tuple[bytes, str]:
    """``text`` attacked by one or two text mutators, then encoded (``_encode``)."""
    notes = []
    for _ in range(rng.choice([1, 1, 1, 2])):
        text, what = rng.choice(TEXT_MUTATORS)(text, rng)
        notes.append(what)
    data, how = _encode(text, rng)
    return data, "; ".join(notes + ([how] if how else []))


SPEC = "models: [mlp.onnx]\nmeasure: inference\ntargets: [mesh8x8]\nnum_csx: [1]\n"
"""A sweep spec of one cheap point, the seed of the hostile specs."""


def yaml_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """A hostile params file or sweep spec where a command reads one."""
    use = rng.choices(["compile", "train", "scale", "inspect", "spec", "sweep model"],
                      [5, 1, 0.5, 1, 1.5, 0.5])[0]  # fmt: skip
    files: dict[str, bytes] = {}
    if use == "spec":
        files["mlp.onnx"] = setup.models["mlp"].SerializeToString()
        files["spec.yaml"], what = hostile_yaml(SPEC, rng)
        args = ["sweep", f"{DIR}/spec.yaml", "-o", f"{DIR}/sw", "--jobs", "1"]
        return FuzzCase(index, "yaml", f"sweep spec: {what}", [Step(args)], files,
                    inputs=["spec.yaml"])  # fmt: skip
    files["model.yaml"], what = hostile_yaml(TINY_PARAMS, rng)
    model = f"{DIR}/model.yaml"
    outputs = []
    if use == "compile":
        args = ["compile", model, "-o", f"{DIR}/out.cgc"]
        outputs = [("out.cgc", "artifact")]
    elif use == "train":
        args = ["train", model, "--timing-only", "--steps", "1"]
    elif use == "scale":
        args = ["scale", model, "--num-csx", "1"]
    elif use == "inspect":
        args = ["inspect", model]
    else:
        files["spec.yaml"] = json.dumps({"models": ["model.yaml"], "num_csx": [1]}).encode()
        args = ["sweep", f"{DIR}/spec.yaml", "-o", f"{DIR}/sw", "--jobs", "1"]
    step = Step(args, outputs=outputs)
    return FuzzCase(index, "yaml", f"{use}: {what}", [step], files, inputs=["model.yaml"])


# ------------------------------------------------------------------------------- factory

USER_LINE = "factory says hi"
"""What a noisy factory prints: the user's own line, not part of cgc's message."""

FACTORY_HEAD = """\
import sys
import warnings

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


class Nonzero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x)


def good():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(4, 6),)


"""
"""What every factory file holds: a module that compiles, two that ``torch.export`` cannot
capture (a branch on data, an output shaped by data)."""

FACTORIES: dict[str, tuple[str, bool]] = {
    "sys.exit(0)": ("raise SystemExit(0)", False),
    "sys.exit(3)": ("raise SystemExit(3)", False),
    "sys.exit('msg')": ("raise SystemExit('the factory gives up')", False),
    "sys.exit()": ("sys.exit()", False),
    "KeyboardInterrupt": ("raise KeyboardInterrupt", False),
    "RecursionError": ("def down(n):\n        return down(n + 1)\n    return down(0)", False),
    "MemoryError": ("raise MemoryError('the factory ran out of memory')", False),
    "returns None": ("return None", False),
    "returns a tuple of 1": ("return (Net(),)", False),
    "returns a module alone": ("return Net()", False),
    "returns a number": ("return 5", False),
    "non-tensor args": ("return Net(), ('not a tensor',)", False),
    "args not a tuple": ("return Net(), torch.randn(4, 6)", False),
    "bad kwargs": ("return Net(), (torch.randn(4, 6),), {'bogus': 1}", False),
    "too many args": ("return Net(), (torch.randn(4, 6), torch.randn(4, 6))", False),
    "wrong input shape": ("return Net(), (torch.randn(4, 5),)", False),
    "data-dependent branch": ("return Branchy(), (torch.ones(2, 3),)", False),
    "data-dependent shape": ("return Nonzero(), (torch.ones(2, 3),)", False),
    "prints, then a model": (f"print({USER_LINE!r})\n    return good()", True),
    "prints to stderr, then a model": (
        f"print({USER_LINE!r}, file=sys.stderr)\n    return good()", True),
    "prints to stderr, then None": (
        f"print({USER_LINE!r}, file=sys.stderr)\n    return None", False),
    "FutureWarning, then a model": (
        "warnings.warn('old ways', FutureWarning)\n    return good()", True),
    "UserWarning, then None": ("warnings.warn('careful', UserWarning)\n    return None", False),
    "logs, then fails": (
        "import logging\n    logging.getLogger('torch').warning('torch says')\n"
        "    raise ValueError('no model today')", False),
}  # fmt: skip
"""Factory bodies by behaviour, and whether they give a model (then only exit 0 is right)."""

MODULE_LEVEL: dict[str, str] = {
    "import of a missing module": "import no_such_module_for_cgc\n",
    "raises as it is imported": "raise RuntimeError('broken at import')\n",
    "a syntax error": "def broken(:\n",
    "exits as it is imported": "raise SystemExit(0)\n",
    "interrupted as it is imported": "raise KeyboardInterrupt\n",
    "factory not callable": "factory = 3\n",
}
"""Files that fail before the factory is called, by what is appended to the head."""


def factory_case(index: int, rng: random.Random, setup: SetupFiles) -> FuzzCase:
    """``cgc compile file.py:factory`` of a misbehaving (or merely noisy) factory."""
    planted = None
    if rng.random() < 0.25:
        what = rng.choice(sorted(MODULE_LEVEL))
        source, gives = FACTORY_HEAD + MODULE_LEVEL[what], False
    else:
        what = rng.choice(sorted(FACTORIES))
        body, gives = FACTORIES[what]
        source = FACTORY_HEAD + f"def factory():\n    {body}\n"
        planted = "MemoryError" if what == "MemoryError" else None
    name = "factory" if rng.random() < 0.9 else "missing"
    args = ["compile", f"{DIR}/f.py:{name}", "-o", f"{DIR}/out.cgc", "--target", "mesh8x8"]
    step = Step(args, outputs=[("out.cgc", "artifact")], planted=planted, user_lines=[USER_LINE])
    described = what + ("" if name == "factory" else ", the wrong name asked for")
    files = {"f.py": source.encode()}
    return FuzzCase(index, "factory", f"{described} ({'a model' if gives else 'no model'})", [step],
                files, inputs=["f.py"])  # fmt: skip
