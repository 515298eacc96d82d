"""The one exception type for problems a user can cause.

The command line prints a ``CgcError`` as one line and exits with code 2; anything else is an
internal error (exit code 1). Messages name the culprit: the file, the ONNX node and op, the
option, or the layer and its shortfall.
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
