"""Strict YAML reading: a key given twice, or a value PyYAML cannot build, is an error.

``load_yaml`` reads a params file's text into one document, every problem a one-line
``CgcError`` that names the file and the line.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml

from cgc.errors import CgcError

_YAML_TAG = "tag:yaml.org,2002:"
"""What YAML's standard tags (``!!int``, ``!!merge``) begin with, spelled out."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, stricter: a key given twice in one mapping is an error (PyYAML
    keeps the last silently), and so is a value PyYAML cannot build."""

    def __init__(self, text: bytes, source: str):
        super().__init__(text)
        self.source = source
        self.paths: dict[int, str] = {}
        """The key path of every node met as a mapping's value, by ``id``: a mapping is
        constructed after its parent, which records its path."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """PyYAML's, but a scalar it cannot build is a YAML error at its line: an integer of
        thousands of digits (past Python's conversion limit), a 13th month, or a value unfit
        for its explicit tag (``!!bool maybe``), on which PyYAML fails with a Python error."""
        try:
            return super().construct_object(node, deep=deep)
        except ValueError as error:
            problem = str(error).split(";")[0]  # what follows ";" is advice to programmers
        except (AttributeError, IndexError, KeyError, TypeError):
            problem = f"not a valid {node.tag.replace(_YAML_TAG, '!!')}"
        raise yaml.constructor.ConstructorError(problem=problem, problem_mark=node.start_mark)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        """PyYAML's, after checking that the node is a mapping (``!!map [1]`` is not) and that
        no key comes twice (merged keys ``<<`` may)."""
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                problem=f"expected a mapping, found a {node.id}", problem_mark=node.start_mark
            )
        path = self.paths.get(id(node))
        lines: dict[Hashable, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _YAML_TAG + "merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # PyYAML's own check reports it
            key_path = f"{path}.{key}" if path else str(key)
            line = key_node.start_mark.line + 1
            if key in lines:
                raise CgcError(
                    f"{self.source}: {key_path}: given twice, on lines {lines[key]} and {line}"
                )
            lines[key] = line
            self.paths.setdefault(id(value_node), key_path)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: bytes, source: str) -> object:
    """The YAML document ``text``; any problem is a one-line error naming ``source``."""
    try:
        loader = _Loader(text, source)  # which decodes and checks the first part of the text
    except yaml.reader.ReaderError as error:
        raise _unreadable(error, source) from None
    try:
        return loader.get_single_data()
    except yaml.reader.ReaderError as error:
        raise _unreadable(error, source) from None
    except yaml.MarkedYAMLError as error:
        line = f"line {error.problem_mark.line + 1}: " if error.problem_mark else ""
        raise CgcError(f"{source}: {line}not valid YAML ({error.problem})") from None
    except yaml.YAMLError as error:
        reason = str(error).splitlines()[0]
        raise CgcError(f"{source}: not valid YAML ({reason})") from None
    except RecursionError:
        raise CgcError(f"{source}: not valid YAML (nested too deeply)") from None
    finally:
        loader.dispose()


def _unreadable(error: yaml.reader.ReaderError, source: str) -> CgcError:
    """PyYAML's complaint about a byte that is not UTF-8 or a character YAML does not allow
    (a control character), as one line naming ``source`` and where it is (0-based)."""
    if error.encoding != "unicode":  # a byte that does not decode
        return CgcError(
            f"{source}: not valid {error.encoding.upper()} text (byte {error.position} is "
            f"{error.character:#04x})"
        )
    return CgcError(
        f"{source}: not valid YAML (character {error.position} is U+{error.character:04X}, "
        "which YAML does not allow)"
    )
