"""A PyTorch causal language model as a decoder graph (``cgc.frontends.decoder``): its
``forward`` called on token ids and their positions by the names it gives them, without its
cache (``use_cache=False`` where it takes one), its logits captured by ``torch.export`` at the
shapes of each program of a generation.

A module's ``forward`` names its token ids ``input_ids`` (else its first parameter) and takes
the positions by ``position_ids`` or another parameter that names positions but a cache's
(``cgc.frontends.decoder.position_names``):
a generation feeds each token's position, which a module that computes its own (from
``arange``) cannot take.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from cgc.errors import CgcError
from cgc.frontends.decoder import GraphDecoder, position_names
from cgc.frontends.imported import ImportedModel
from cgc.frontends.torch import capture, import_program


class CausalLogits(torch.nn.Module):
    """``module`` called on ``input_ids`` and ``position_ids`` by its own names for them,
    giving its logits alone."""

    def __init__(self, module: torch.nn.Module, ids: str, positions: str, cached: bool):
        super().__init__()
        self.module, self.ids, self.positions = module, ids, positions
        self.options = {"use_cache": False} if cached else {}

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> Any:
        named = {self.ids: input_ids, self.positions: position_ids}
        out = self.module(**named, **self.options)
        logits = getattr(out, "logits", out)
        return logits[0] if isinstance(logits, tuple | list) else logits


def causal_logits(module: torch.nn.Module, source: str) -> CausalLogits:
    """``module`` wrapped as ``CausalLogits``; a CgcError if its ``forward`` takes no
    positions or is not a causal LM's."""
    head: Any = getattr(module, "get_output_embeddings", None)
    if getattr(module, "config", None) is not None and callable(head) and head() is None:
        raise CgcError(f"{source} has no causal LM head (load the model with "
                       "transformers.AutoModelForCausalLM)")  # fmt: skip
    parameters = inspect.signature(module.forward).parameters
    names = [n for n, p in parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not names:
        raise CgcError(f"{source}.forward takes no token ids")
    ids = "input_ids" if "input_ids" in names else names[0]
    positions = position_names(names, ids)
    if not positions:
        raise CgcError(
            f"{source}.forward takes no positions (a position_ids parameter): a generation "
            "feeds each token's position; give forward one, or export the model to ONNX"
        )
    return CausalLogits(module, ids, positions[0], "use_cache" in names)


def causal_importer(wrapped: CausalLogits, source: str) -> Callable[[int, int], ImportedModel]:
    """Imports ``wrapped`` for ``batch`` sequences of ``tokens``, each shape captured once."""
    captured: dict[tuple[int, int], Any] = {}

    def imported(batch: int, tokens: int) -> ImportedModel:
        if (batch, tokens) not in captured:
            ids = torch.zeros((batch, tokens), dtype=torch.int64)
            where = torch.arange(tokens).expand(batch, tokens).contiguous()
            with torch.no_grad():
                captured[batch, tokens] = capture(wrapped.eval(), (ids, where), {}, False)
        return import_program(captured[batch, tokens], None, source)

    return imported


def causal_decoder(module: torch.nn.Module) -> GraphDecoder:
    """The decoder graph of a PyTorch causal LM, captured by ``torch.export``."""
    source = type(module).__name__
    return GraphDecoder.probed(source, causal_importer(causal_logits(module, source), source))
