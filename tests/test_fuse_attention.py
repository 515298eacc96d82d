"""``fuse-attention``: attention written as matmuls and a softmax runs as ``wse.attention``.

The masks the pass accepts, the ONNX decoder (its causal mask a weight) against onnxruntime in
both modes, and a multi-head model trained through a ``cgc.torch`` session against the same
loop in eager: the fused kernel's gradient stands in for the matmuls' and the softmax's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from xdsl.context import Context

import cgc
from cgc.compiler.sources import source_of
from cgc.compiler.training import Training, front
from cgc.dialects import parse_module
from cgc.frontends import zoo
from cgc.machine.reference.attention import CAUSAL, MASK_ROWS, OPEN, Mask, mask_kind
from cgc.passes.fuse_attention import FuseAttentionPass, fixed_masks
from cgc.tools.report import summary_text

CAUSAL_ADDITIVE = np.triu(np.full((4, 4), -1e9, np.float32), 1)


@pytest.mark.parametrize(
    ("mask", "kind"),
    [
        (CAUSAL_ADDITIVE, CAUSAL),
        (np.triu(np.full((2, 1, 4, 4), -np.inf, np.float32), 1), CAUSAL),
        (np.tri(4, dtype=bool)[None, None], CAUSAL),
        (np.zeros((2, 1, 4, 4), np.float32), OPEN),
        (np.ones((4, 4), bool), OPEN),
        (np.triu(np.full((4, 4), -1e3, np.float32), 1), None),  # exp(-1e3 + s) need not vanish
        (np.triu(np.full((4, 4), np.finfo(np.float16).min, np.float16), 1), CAUSAL),
        (np.triu(np.full((4, 4), -1e4, np.float16), 1), None),
        (np.tri(4, k=1, dtype=bool), None),  # one later key let through
        (np.stack([CAUSAL_ADDITIVE, np.zeros((4, 4), np.float32)]), None),  # slices differ
        (np.zeros((4, 3), np.float32), OPEN),  # cross-attention: more keys than queries
        (np.zeros((2, 1, 1, 4), np.float32), OPEN),  # a padding mask that pads nothing
        (np.array([[[[0, 0, 0, -np.inf]]]], np.float32), None),  # ... and one that pads
        (np.tri(4, k=1, dtype=bool)[:3], None),  # not square, not open
        (np.tri(5, dtype=bool) & ~np.tri(5, k=-2, dtype=bool), Mask(causal=True, window=2)),
        (np.tri(5, dtype=bool) & ~np.tri(5, k=-5, dtype=bool), CAUSAL),  # as wide as it is
        (np.tri(5, dtype=bool) & ~np.tri(5, k=-2, dtype=bool) | np.eye(5, k=-4, dtype=bool), None),
        (np.triu(np.ones((4, 4), np.int64), 1), None),  # integers add, but mask nothing
    ],
)
def test_mask_kinds(mask, kind):
    assert mask_kind(mask) == kind


def test_a_mask_taller_than_a_read_is_classified_by_all_its_rows():
    """Masks are read ``MASK_ROWS`` rows at a time: a difference in a later block counts."""
    size = 2 * MASK_ROWS + 3
    causal = np.triu(np.full((2, 1, size, size), -np.inf, np.float32), 1)
    assert mask_kind(causal) == CAUSAL
    late = causal.copy()
    late[1, 0, size - 1, 0] = -5.0  # one slice differs, in the last block
    assert mask_kind(late) is None
    assert mask_kind(np.zeros((size, size), np.float32)) == OPEN
    assert mask_kind(np.tri(size, k=-1, dtype=bool)) is None  # the diagonal blocked


def _fused(dump: Path) -> int:
    return (dump / "02-fuse-attention.mlir").read_text().count("wse.attention ")


@pytest.mark.parametrize("mode", ["pipelined", "weight_streaming"])
def test_onnx_decoder_matches_onnxruntime(mode, tmp_path):
    """Sixteen tokens: the causal mask is a weight (too large to be inline), found causal."""
    model = zoo.decoder(blocks=2, seq=16, width=32, heads=4)
    artifact = cgc.compile(
        model, mode=mode, target="mesh32x32", batch_size=2, dump_ir=tmp_path / "ir"
    )
    assert _fused(tmp_path / "ir") == 2
    assert artifact.manifest["attention"] == {"found": 2, "fused": 2, "first_unfused": None}
    assert "attention: 2 of 2 blocks fused\n" in summary_text(artifact)
    inputs = zoo.sample_inputs(model, 2, seed=1)
    (got,) = cgc.run(artifact, inputs).values()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, inputs)[0], rtol=1e-4, atol=1e-5)


WEIGHT_MASK = """
func.func @main(%s: tensor<1x2x4x4xf32>) -> tensor<1x2x4x4xf32> {
  %mask = wse.weight "mask" : tensor<4x4xf32>
  %masked = wse.add %s, %mask : (tensor<1x2x4x4xf32>, tensor<4x4xf32>) -> tensor<1x2x4x4xf32>
  func.return %masked : tensor<1x2x4x4xf32>
}
"""


@pytest.mark.parametrize("trained", [False, True])
def test_a_trained_mask_is_not_held(trained):
    """A mask a training changes is not a mask the compile may rely on."""
    module = parse_module(WEIGHT_MASK, "mask.mlir")
    fuse = fixed_masks(module, {"mask": CAUSAL_ADDITIVE}, lambda op: trained)
    assert fuse.causal_masks == (() if trained else ("mask",))


@pytest.mark.parametrize("trainable", [None, (), (r"b0\.q\.weight",)])
def test_the_decoders_mask_is_held(trainable):
    """The ONNX importer makes the decoder's mask a frozen constant: an inference and a
    training alike hold it fixed."""
    model = zoo.decoder(blocks=1, seq=16, width=32, heads=4)
    imported = source_of(model, None, None, False, trainable is not None, None).imported(2)
    training = None if trainable is None else Training("sgd", trainable, lr=0.1)
    fuse = front(imported, training)[1]
    assert isinstance(fuse, FuseAttentionPass)
    assert fuse.causal_masks == ("causal_mask",)


OVER_QUERIES = """
func.func @main(%q: tensor<1x4x16xf32>) -> tensor<1x4x16xf32> {
  %h = wse.reshape %q : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32>
  %a = wse.transpose %h {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32>
  %b = wse.transpose %h {perm = array<i64: 0, 2, 3, 1>} : tensor<1x4x2x8xf32> -> tensor<1x2x8x4xf32>
  %s = wse.matmul %a, %b : (tensor<1x2x4x8xf32>, tensor<1x2x8x4xf32>) -> tensor<1x2x4x4xf32>
  %p = wse.softmax %s {axis = 2 : i64} : tensor<1x2x4x4xf32> loc("odd_softmax")
  %o = wse.matmul %p, %a : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  %t = wse.transpose %o {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32>
  %y = wse.reshape %t : tensor<1x4x2x8xf32> -> tensor<1x4x16xf32>
  func.return %y : tensor<1x4x16xf32>
}
"""


def test_the_census_names_the_block_left_unfused_and_why():
    """A softmax over the queries is no attention the fused op computes: the census counts
    the block, found and not fused, and says why."""
    module = parse_module(OVER_QUERIES, "odd.mlir")
    fuse = FuseAttentionPass()
    fuse.apply(Context(), module)
    census = fuse.census(module)
    reason = "the softmax is not over the keys (the last axis)"
    assert census.to_json() == {
        "found": 1,
        "fused": 0,
        "first_unfused": {"name": "odd_softmax", "reason": reason},
    }


torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
from test_torch_training import TARGET, next_token_training_matches_eager  # noqa: E402

HEADS, WIDTH, TOKENS, VOCAB = 2, 16, 8, 16


class MultiHead(torch.nn.Module):
    """A GPT-2-style attention block on embeddings, as transformers writes it: heads split by
    ``view`` and ``transpose``, a boolean causal buffer, the lowest float where it is false."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)
        # no key bias: its gradient is zero up to rounding, which Adam would blow up to +-lr
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        self.register_buffer("keep", torch.tril(torch.ones(TOKENS, TOKENS, dtype=torch.bool)))

    def forward(self, idx, targets):
        x = self.wte(idx)
        b, t, c = x.shape
        q, k, v = (
            part.view(b, t, HEADS, c // HEADS).transpose(1, 2)
            for part in self.qkv(x).split(WIDTH, dim=-1)
        )
        scores = torch.where(self.keep, self.scores(q, k), torch.finfo(q.dtype).min)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        logits = self.head(x + self.proj(y))
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    def scores(self, q, k):
        return q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5


class BiasedHeads(MultiHead):
    """``MultiHead`` with T5's kind of score bias: a learned ``[1, heads, T, T]`` table added
    to the scores, beside the causal mask: the fused op takes it as its bias operand, and its
    gradient trains it."""

    def __init__(self):
        super().__init__()
        self.position = torch.nn.Parameter(0.5 * torch.randn(1, HEADS, TOKENS, TOKENS))

    def scores(self, q, k):
        return q @ k.transpose(-2, -1) + self.position


@pytest.mark.parametrize("kind", [MultiHead, BiasedHeads])
def test_multi_head_training_matches_eager(kind, tmp_path):
    """The fused kernel's gradient stands in for the matmuls' and the softmax's, and with a
    learned bias, the bias's own gradient trains it."""
    torch.manual_seed(0)
    next_token_training_matches_eager(kind(), VOCAB, TOKENS, tmp_path)
    idx = targets = torch.zeros(8, TOKENS, dtype=torch.int64)
    artifact = cgc.compile(
        kind(), args=(idx, targets), mode="weight_streaming", target=TARGET,
        dump_ir=tmp_path / "ir",
    )  # fmt: skip
    assert _fused(tmp_path / "ir") == 1
    assert artifact.manifest["attention"] == {"found": 1, "fused": 1, "first_unfused": None}
