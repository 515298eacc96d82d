"""Fused attention, its gradient and rotary embeddings: the kernels' numbers against PyTorch
(scaled_dot_product_attention and autograd), the ops in the IR, and the plans' costs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_kernels import RECT, T, execute

from cgc.dialects import parse_module, print_module, wse
from cgc.errors import CgcError
from cgc.machine import plans
from cgc.machine.hardware.target import get_target
from cgc.machine.movement.layout import Layout
from cgc.machine.plans import WAFER, Operand
from cgc.runtime import kernels
from cgc.runtime.tiles import DistTensor

SEQ, HEADS, D = 6, 4, 3


def heads_attrs(heads=HEADS, kv_heads=HEADS, causal=True, scale=0.5, seq=SEQ) -> dict:
    return {"sequence": seq, "heads": heads, "kv_heads": kv_heads, "causal": causal,
            "scale": scale}  # fmt: skip


def qkv(batch: int, kv_heads: int, seed: int = 0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    tokens = batch * SEQ
    q = rng.standard_normal((tokens, HEADS * D)).astype(dtype)
    k = rng.standard_normal((tokens, kv_heads * D)).astype(dtype)
    v = rng.standard_normal((tokens, kv_heads * D)).astype(dtype)
    return q, k, v


def torch_attention(q, k, v, attrs):
    """The reference: torch's fused attention on [B, heads, S, d] heads."""
    heads, kv_heads, seq = attrs["heads"], attrs["kv_heads"], attrs["sequence"]

    def split(x, count):
        return x.reshape(-1, seq, count, D).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        split(q, heads),
        split(k, kv_heads).repeat_interleave(heads // kv_heads, dim=1),
        split(v, kv_heads).repeat_interleave(heads // kv_heads, dim=1),
        is_causal=attrs["causal"],
        scale=attrs["scale"],
    )
    return out.transpose(1, 2).reshape(q.shape[0], heads * D)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("rect", [RECT, (1, 2, 3, 5)])
def test_attention_matches_torch(kv_heads, causal, rect):
    q, k, v = qkv(batch=2, kv_heads=kv_heads)
    attrs = heads_attrs(kv_heads=kv_heads, causal=causal)
    got, plan = execute("attention", [q, k, v], attrs, q.shape, "float32", rect=rect)
    want = torch_attention(*(torch.from_numpy(a) for a in (q, k, v)), attrs)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    assert plan.cost.flops > 0 and plan.cost.cycles > 0


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_grad_matches_autograd(kv_heads):
    q, k, v = qkv(batch=2, kv_heads=kv_heads, seed=1)
    attrs = heads_attrs(kv_heads=kv_heads)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch_attention(tq, tk, tv, attrs)
    dout = np.random.default_rng(2).standard_normal(out.shape).astype(np.float32)
    out.backward(torch.from_numpy(dout))
    grads, plan, forward = kernel_grads([q, k, v, out.detach().numpy(), dout], attrs)
    for got, want in zip(grads, (tq.grad, tk.grad, tv.grad), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    assert plan.cost.flops == pytest.approx(2.5 * forward.cost.flops)


def kernel_grads(args: list[np.ndarray], attrs: dict):
    """``attention_grad`` run on ``args`` (q, k, v, out, dout), with its plan and the
    forward kernel's."""
    operands = [Operand(a.shape, "float32", WAFER, Layout.on(a.shape, "float32", RECT))
                for a in args]  # fmt: skip
    results = [(a.shape, "float32") for a in args[:3]]
    plan = plans.plan("attention_grad", T, RECT, operands, attrs, results)
    values = [DistTensor.scatter(a, at) for a, at in zip(args, plan.inputs, strict=True)]
    grads = [g.gather() for g in kernels.run("attention_grad", plan, values, attrs)]
    return grads, plan, plans.plan("attention", T, RECT, operands[:3], attrs, results[:1])


def masked_reference(q, k, v, attrs, keys: int):
    """torch's attention with the mask spelled out: a causal sliding window, or ``keys`` keys
    per sample (no mask)."""
    heads, kv_heads, seq = attrs["heads"], attrs["kv_heads"], attrs["sequence"]
    group = heads // kv_heads
    qh = q.reshape(-1, seq, heads, D).transpose(1, 2)
    kh, vh = (x.reshape(-1, keys, kv_heads, D).transpose(1, 2).repeat_interleave(group, dim=1)
              for x in (k, v))  # fmt: skip
    mask = None
    if attrs.get("window"):
        offset = torch.arange(seq)[:, None] - torch.arange(seq)
        mask = (offset >= 0) & (offset < attrs["window"])
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=attrs["scale"])
    return out.transpose(1, 2).reshape(q.shape[0], heads * D)


@pytest.mark.parametrize(
    ("extra", "keys"), [({"window": 2}, SEQ), ({"causal": False, "key_sequence": 4}, 4)]
)
def test_windowed_and_cross_attention_and_their_gradients_match_autograd(extra, keys):
    """A causal sliding window (Mistral's), and queries attending to keys of another length
    (an encoder-decoder's cross-attention), forward and backward."""
    attrs = {**heads_attrs(kv_heads=2), **extra}
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2 * SEQ, HEADS * D)).astype(np.float32)
    k, v = (rng.standard_normal((2 * keys, 2 * D)).astype(np.float32) for _ in range(2))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = masked_reference(tq, tk, tv, attrs, keys)
    got, _ = execute("attention", [q, k, v], attrs, q.shape, "float32")
    np.testing.assert_allclose(got, out.detach().numpy(), rtol=1e-5, atol=1e-6)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    out.backward(torch.from_numpy(dout))
    grads, _, _ = kernel_grads([q, k, v, out.detach().numpy(), dout], attrs)
    for grad, want in zip(grads, (tq.grad, tk.grad, tv.grad), strict=True):
        np.testing.assert_allclose(grad, want.numpy(), rtol=1e-4, atol=1e-5)


def rotary_tables(seq: int, dims: int) -> tuple[np.ndarray, np.ndarray]:
    inverse = 10000.0 ** (-np.arange(0, dims, 2) / dims)
    angles = np.outer(np.arange(seq), inverse)
    both = np.concatenate([angles, angles], axis=1)
    return np.cos(both).astype(np.float32), np.sin(both).astype(np.float32)


@pytest.mark.parametrize("dims", [2, D - 1, 4])
def test_rotary_rotates_each_head_and_its_inverse_undoes_it(dims):
    width = 4 if dims == 4 else D  # heads of 4 dimensions fully rotated, or of 3 in part
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2 * SEQ, HEADS * width)).astype(np.float32)
    cos, sin = rotary_tables(SEQ, dims)
    got, _ = execute("rotary", [x, cos, sin], {"heads": HEADS}, x.shape, "float32")
    heads = x.reshape(2, SEQ, HEADS, width)
    part = heads[..., :dims]
    half = dims // 2
    turned = np.concatenate([-part[..., half:], part[..., :half]], axis=-1)
    rotated = part * cos[None, :, None] + turned * sin[None, :, None]
    want = np.concatenate([rotated, heads[..., dims:]], axis=-1).reshape(x.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    back, _ = execute("rotary", [got, cos, sin], {"heads": HEADS, "inverse": True}, x.shape,
                      "float32")  # fmt: skip
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)


def test_attention_costs_fit_the_machine():
    """Per PE the work is the products of a block of queries with every block of keys; the
    causal mask halves it; nothing runs faster than the peak."""
    wse2 = get_target("wse2")
    shape = (4 * 2048, 12288)

    def cost(causal: bool, sequence: int = 2048):
        attrs = heads_attrs(heads=96, kv_heads=96, causal=causal, seq=sequence, scale=1.0)
        operands = [Operand(shape, "float16", WAFER, Layout.on(shape, "float16", wse2.whole))]
        return plans.plan("attention", wse2, wse2.whole, operands * 3, attrs,
                          [(shape, "float16")]).cost  # fmt: skip

    full, causal = cost(False), cost(True)
    assert full.flops == 4 * 4 * 12288 * 2048 * 2048
    assert causal.flops == pytest.approx(full.flops * 2049 / 4096)
    assert causal.cycles < 0.6 * full.cycles
    peak = wse2.pes * wse2.peak_flops_per_pe_per_cycle("float16")
    for c in (full, causal):
        assert c.cycles >= c.flops / peak
        assert c.compute_cycles <= c.cycles
    assert cost(True, 1024).cycles < causal.cycles  # shorter samples, fewer blocks to pass


def test_attention_ops_in_the_ir():
    text = """
func.func @main(%q: tensor<12x12xf32>, %k: tensor<12x6xf32>, %c: tensor<6x2xf32>) -> tensor<12x12xf32> {
  %r = wse.rotary %k, %c, %c {heads = 2 : i64} : (tensor<12x6xf32>, tensor<6x2xf32>, tensor<6x2xf32>) -> tensor<12x6xf32>
  %a = wse.attention %q, %r, %r {causal = true, heads = 4 : i64, kv_heads = 2 : i64, scale = 5.000000e-01 : f64, sequence = 6 : i64} : (tensor<12x12xf32>, tensor<12x6xf32>, tensor<12x6xf32>) -> tensor<12x12xf32>
  func.return %a : tensor<12x12xf32>
}
"""  # noqa: E501
    module = parse_module(text)  # parsing verifies
    again = parse_module(print_module(module))
    ops = [op.name for op in again.walk()]
    assert "wse.attention" in ops and "wse.rotary" in ops
    bad = text.replace("kv_heads = 2", "kv_heads = 3")
    with pytest.raises(CgcError, match="kv_heads 3 must divide heads 4"):
        parse_module(bad)
    odd = text.replace("sequence = 6", "sequence = 5")
    with pytest.raises(CgcError, match="12 tokens are not samples of 5"):
        parse_module(odd)
    assert wse.AttentionOp.name == "wse.attention"


@pytest.mark.parametrize("name", ["broadcast_to", "one_hot"])
def test_replication_is_multicast_not_one_copy_per_pe(name):
    """A row vector broadcast over the rows (or labels made one-hot) costs one stream a link,
    not one copy per destination PE."""
    wse2 = get_target("wse2")
    if name == "one_hot":
        source, result, attrs = (24576,), (24576, 50257), {"depth": 50257}
        dtype = "int32"
    else:
        source, result, attrs, dtype = (24576, 1), (24576, 768), {}, "float32"
    operand = Operand(source, dtype, WAFER, Layout.on(source, dtype, wse2.whole))
    out_dtype = "float32"
    cost = plans.plan(name, wse2, wse2.whole, [operand], attrs, [(result, out_dtype)]).cost
    out = Layout.on(result, out_dtype, wse2.whole)
    assert cost.cycles < 20 * out.tile_elements + 4 * (wse2.rows + wse2.cols)
    assert math.isfinite(cost.traffic.max_link)


def _cached_reference(q, kc, vc, positions, heads, kv_heads, scale, window=0):
    """torch's attention of each query over its sequence's cache rows up to its position."""
    sequences, tokens = positions.shape
    capacity = kc.shape[0] // sequences
    rows = torch.arange(capacity)
    offset = torch.from_numpy(positions.astype(np.int64))[:, None, :, None] - rows
    allowed = (offset >= 0) & (offset < window) if window else offset >= 0

    def split(x, count, length):
        return torch.from_numpy(x).reshape(sequences, length, count, D).transpose(1, 2)

    group = heads // kv_heads
    out = F.scaled_dot_product_attention(
        split(q, heads, tokens),
        split(kc, kv_heads, capacity).repeat_interleave(group, dim=1),
        split(vc, kv_heads, capacity).repeat_interleave(group, dim=1),
        attn_mask=allowed,
        scale=scale,
    )
    return out.transpose(1, 2).reshape(sequences * tokens, heads * D).numpy()


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("tokens", [1, 4])
def test_cached_attention_writes_its_rows_and_attends_up_to_each_position(tokens, window):
    """The new keys and values land in the caches at their positions, in place; each query
    sees its sequence's rows up to its own position (the window's latest of them)."""
    from cgc.machine.reference.attention import cached_attention

    rng = np.random.default_rng(5)
    sequences, capacity, heads, kv_heads = 2, 9, 4, 2
    starts = np.array([2, 4])
    positions = (starts[:, None] + np.arange(tokens)).astype(np.int32)
    q = rng.standard_normal((sequences * tokens, heads * D)).astype(np.float32)
    k, v = (rng.standard_normal((sequences * tokens, kv_heads * D)).astype(np.float32)
            for _ in range(2))  # fmt: skip
    kc, vc = (rng.standard_normal((sequences * capacity, kv_heads * D)).astype(np.float32)
              for _ in range(2))  # fmt: skip
    attrs = {"heads": heads, "kv_heads": kv_heads, "scale": 0.5, "window": window}
    caches = kc.copy(), vc.copy()
    got = cached_attention(q, k, v, *caches, positions, attrs)
    rows = (positions + capacity * np.arange(sequences)[:, None]).ravel()
    kc[rows], vc[rows] = k, v
    np.testing.assert_array_equal(caches[0], kc)
    np.testing.assert_array_equal(caches[1], vc)
    want = _cached_reference(q, kc, vc, positions, heads, kv_heads, 0.5, window)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    kernel, plan = execute("cached_attention", [q, k, v, kc, vc, positions], attrs, q.shape,
                           "float32", sources={3: plans.RESIDENT, 4: plans.RESIDENT})  # fmt: skip
    np.testing.assert_allclose(kernel, want, rtol=1e-5, atol=1e-6)
    assert plan.cost.flops > 0 and plan.cost.cycles > 0


def test_a_position_outside_the_cache_is_a_data_error():
    from cgc.errors import DataError
    from cgc.machine.reference.attention import cached_attention

    q = np.zeros((1, 4), np.float32)
    kc = np.zeros((3, 4), np.float32)
    with pytest.raises(DataError, match=r"a position \(3\) is outside the cache's 3 tokens"):
        cached_attention(q, q, q, kc, kc.copy(), np.array([[3]]), {"heads": 1, "kv_heads": 1,
                                                                   "scale": 1.0})  # fmt: skip


def test_a_prompt_through_the_cached_attention_holds_a_block_of_scores_at_a_time():
    """A long prompt's queries pass in blocks: the scratch a PE needs does not grow with
    them, and the cost of a step does not depend on the positions (the program's)."""
    target = get_target("wse2")

    def plan(tokens: int) -> plans.Plan:
        shapes = [(tokens, 4096), (tokens, 1024), (tokens, 1024)]
        operands = [Operand(s, "bfloat16", WAFER, Layout.on(s, "bfloat16", target.whole))
                    for s in shapes]  # fmt: skip
        operands += [Operand((4096, 1024), "bfloat16", plans.RESIDENT)] * 2
        operands.append(Operand((1, tokens), "int32", WAFER,
                                Layout.on((1, tokens), "int32", target.whole)))  # fmt: skip
        attrs = {"heads": 32, "kv_heads": 8, "scale": 0.1}
        return plans.plan("cached_attention", target, target.whole, operands, attrs,
                          [((tokens, 4096), "bfloat16")])  # fmt: skip

    short, long, longer = plan(1), plan(2048), plan(4096)
    assert long.cost.scratch_bytes == longer.cost.scratch_bytes < target.sram_bytes_per_pe / 4
    assert short.cost.scratch_bytes < long.cost.scratch_bytes
    assert short.cost.cycles < long.cost.cycles < longer.cost.cycles
