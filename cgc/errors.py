"""The one exception type for problems a user can cause, and the one warning category.

The command line prints a ``CgcError`` as one line and exits with code 2; anything else is an
internal error (exit code 1). Messages name the culprit: the file, the ONNX node and op, the
option, or the layer and its shortfall. It prints a ``CgcWarning`` as one ``warning:`` line,
and other packages' warnings (torch's, numpy's) only with ``--debug``.
"""

import re
from collections.abc import Callable


class CgcError(Exception):
    """A problem with the user's input: a bad file, an unsupported op, a model that does not fit.

    An option its message names is named by its field in the records of options
    (``cgc.options``: ``batch_size``, ``num_csx``), as the Python API takes them; ``fields``
    lists those it names, which the command line shows as its flags (``worded``)."""

    def __init__(self, message: str = "", *fields: str):
        super().__init__(message)
        self.fields = fields

    def worded(self, word: Callable[[str], str]) -> str:
        """The message with each field it names (as a whole word) written as ``word`` says."""
        text = str(self)
        for name in sorted(self.fields, key=len, reverse=True):
            text = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", word(name), text)
        return text


class OptionError(CgcError):
    """A problem with options a user gave; ``fields`` names them."""


class DoesNotFitError(CgcError):
    """A model whose weights and buffers do not fit in the wafer's SRAM in pipelined mode."""


class NeedsInputValuesError(CgcError):
    """A shape (or another compile-time quantity) depends on the values of graph inputs fed
    at run time. ``inputs`` names them, in graph order, so that a caller who has their values
    (the ONNX backend) can compile again with them fixed."""

    def __init__(self, message: str, inputs: tuple[str, ...]):
        super().__init__(message)
        self.inputs = inputs


class CgcWarning(UserWarning):
    """Something a user should know that does not stop the work (a batch's statistics split
    over micro-batches, a damaged checkpoint skipped)."""


class DataError(CgcError):
    """A value that comes with the data makes an op fail at run time (an index outside its
    axis, an integer divisor that is 0), as it makes onnxruntime and torch fail. The numpy
    semantics of the op raise it without the node, which they do not know; the VM and the
    interpreter, which do, raise ``located`` instead, and the frontends prefix the node when
    the value is known at compile time."""

    def located(self, node: str | None, op: str, layer: str | None = None) -> CgcError:
        """The same error naming the node (the op's source location) and the op it happened
        in; an op without a location is named by its layer, if known."""
        if node:
            return CgcError(f"node '{node}' ({op}): {self}")
        return CgcError(f"layer '{layer}' ({op}): {self}" if layer else f"{op}: {self}")
