"""The one exception type for problems a user can cause, and the one warning category.

The command line prints a ``CgcError`` as one line and exits with code 2; anything else is an
internal error (exit code 1). Messages name the culprit: the file, the ONNX node and op, the
option, or the layer and its shortfall. It prints a ``CgcWarning`` as one ``warning:`` line,
and other packages' warnings (torch's, numpy's) only with ``--debug``.
"""


class CgcError(Exception):
    """A problem with the user's input: a bad file, an unsupported op, a model that does not fit."""


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
