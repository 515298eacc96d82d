"""``cgc.torch``: a PyTorch training loop run on the simulator against the same loop in eager.

Each model is trained twice from the same initial weights on the same batches: once by
torch.optim in eager mode, once by a ``cgc.torch`` session (weight streaming on K systems).
The per-step losses and the final parameters must agree to the tolerances of
tests/test_training.py.
"""

from __future__ import annotations

import copy
import json
import sys

import numpy as np
import pytest
import safetensors.numpy
import torch
import torch.nn.functional as F
from torch import nn

import cgc
from cgc.errors import CgcError
from cgc.machine.sparse.sparsity import mask
from cgc.torch_api import schedule_of

TARGET = "mesh16x16"
V, D, T = 16, 16, 8


# -- models ----------------------------------------------------------------------------------


class Attention(nn.Module):
    """Single-head self-attention, causal or not."""

    def __init__(self, causal: bool):
        super().__init__()
        # no key bias: its gradient is zero up to rounding, which Adam would blow up to +-lr
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.proj = nn.Linear(D, D)
        self.causal = causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(D, dim=-1)
        scores = (q @ k.transpose(-2, -1)) / D**0.5
        if self.causal:
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
            scores = scores.masked_fill(~mask, float("-inf"))
        return self.proj(scores.softmax(-1) @ v)


class GPT(nn.Module):
    """A GPT-2-style LM (pre-norm block, tied head) whose forward returns the loss."""

    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.ln1, self.attn = nn.LayerNorm(D), Attention(causal=True)
        self.ln2, self.fc, self.out = nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(T))
        x = x + self.attn(self.ln1(x))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


class Bert(nn.Module):
    """A BERT-style encoder (post-norm block) classifying its first token; the session's
    ``loss_fn`` makes the loss."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(V, D), nn.Embedding(T, D)
        self.attn, self.ln1 = Attention(causal=False), nn.LayerNorm(D)
        self.fc, self.out, self.ln2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D), nn.LayerNorm(D)
        self.classifier = nn.Linear(D, 3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(T))
        x = self.ln1(x + self.attn(x))
        x = self.ln2(x + self.out(F.gelu(self.fc(x))))
        return self.classifier(torch.tanh(x[:, 0]))


class CNN(nn.Module):
    """Convolution, batch norm, pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 5)
        with torch.no_grad():  # statistics unlike the defaults, so that they matter
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


def decay_groups(model: nn.Module) -> list[dict]:
    """GPT-2's param groups: weight decay on matrices only, a lower lr on the rest."""
    params = list(model.parameters())
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr": 1e-3},
    ]


# -- the two loops ---------------------------------------------------------------------------


def lm_batches(steps=4, batch=8, seed=1):
    data = torch.randint(
        0, V, (steps * batch, T + 1), generator=torch.Generator().manual_seed(seed)
    )
    return [
        (data[i : i + batch, :-1].contiguous(), data[i : i + batch, 1:].contiguous())
        for i in range(0, steps * batch, batch)
    ]


def eager(
    model, make_optimizer, batches, loss_fn=None, make_scheduler=None, micro_batches=1, masks=None
):
    """Per-step losses of the loop in eager; trains ``model`` in place. Each batch is split
    into ``micro_batches`` whose gradients add up (what K systems running their share of the
    batch do; the same as one pass unless the model has batch statistics). ``masks`` (by
    parameter name) apply to the weights at the start and to the gradients and the weights at
    every step."""
    params = dict(model.named_parameters())
    masks = masks or {}

    def mask(grads: bool = False) -> None:
        with torch.no_grad():
            for name, m in masks.items():
                (params[name].grad if grads else params[name]).mul_(m)

    optimizer = make_optimizer(model)
    scheduler = make_scheduler(optimizer) if make_scheduler else None
    mask()
    losses = []
    for batch in batches:
        optimizer.zero_grad()
        total = 0.0
        for part in zip(*(t.chunk(micro_batches) for t in batch), strict=True):
            out = model(*part) if loss_fn is None else loss_fn(model(*part[:-1]), part[-1])
            loss = out / micro_batches
            loss.backward()
            total += loss.item()
        mask(grads=True)
        optimizer.step()
        mask()
        if scheduler is not None:
            scheduler.step()
        losses.append(total)
    return losses


def on_cgc(model, make_optimizer, batches, tmp_path, make_scheduler=None, **options):
    """Per-step losses of the loop in a ``cgc.torch`` session; trains ``model`` in place."""
    model = cgc.torch.module(model)
    optimizer = make_optimizer(model)
    # a scheduler made on the optimizer is found by cgc.torch.optimizer, as in a torch loop
    scheduler = make_scheduler(optimizer) if make_scheduler is not None else None
    wrapped = cgc.torch.optimizer(optimizer)
    assert (scheduler is None) == (
        wrapped.schedule.kind == "constant" and not wrapped.schedule.warmup_steps
    )
    options = {"target": TARGET, "model_dir": tmp_path, **options}
    with cgc.torch.session(**options) as s:
        return [s.step(batch) for batch in cgc.torch.dataloader(batches)]


def same_training(got, want, trained, reference) -> None:
    """Equal losses and final parameters, and the loss went down (step 2 sees step 0's data
    again, or as good as)."""
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(trained.named_parameters(), reference.parameters(), strict=True):
        np.testing.assert_allclose(a.detach(), b.detach(), rtol=1e-4, atol=1e-6, err_msg=name)
    assert want[2] < want[0]


def next_token_training_matches_eager(model, vocab: int, tokens: int, tmp_path) -> None:
    """Three Adam steps of next-token prediction on ``model`` (its forward takes ids and
    targets and returns the loss) in a ``cgc.torch`` session equal the same loop in eager."""
    reference = copy.deepcopy(model)
    data = torch.randint(0, vocab, (24, tokens + 1), generator=torch.Generator().manual_seed(1))
    batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data.split(8)]

    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=1e-2)

    want = eager(reference, adam, batches)
    got = on_cgc(model, adam, batches, tmp_path / "run")
    same_training(got, want, model, reference)


def warmup_cosine(optimizer):
    lr = torch.optim.lr_scheduler
    warmup = lr.LinearLR(optimizer, start_factor=0.5, total_iters=1)
    return lr.SequentialLR(optimizer, [warmup, lr.CosineAnnealingLR(optimizer, T_max=4)], [2])


# -- the three models on K = 1 and 4 ---------------------------------------------------------


@pytest.mark.parametrize("num_csx", [1, 4])
def test_gpt_adamw_param_groups(num_csx, tmp_path):
    torch.manual_seed(0)
    model, reference = GPT(), None
    reference = copy.deepcopy(model)
    batches = lm_batches()

    def adamw(m):
        return torch.optim.AdamW(decay_groups(m), lr=3e-3)

    want = eager(reference, adamw, batches, make_scheduler=warmup_cosine)
    got = on_cgc(model, adamw, batches, tmp_path, warmup_cosine, num_csx=num_csx)
    same_training(got, want, model, reference)
    lines = [json.loads(t) for t in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    np.testing.assert_allclose([m["lr"] for m in lines], [1.5e-3, 3e-3, 3e-3, 3e-3 * 0.85355339])
    assert (tmp_path / "weights.safetensors").exists()


@pytest.mark.parametrize(("num_csx", "bn_training"), [(1, True), (4, True), (4, False)])
def test_cnn_batch_norm_sgd(num_csx, bn_training, tmp_path):
    """Batch norm in train() mode normalizes each run of the program (a system's share of the
    batch) by its own statistics and moves the running ones after each run in sample order,
    as eager does over the same micro-batches; in eval() mode its statistics stay frozen."""
    torch.manual_seed(0)
    model = CNN()
    model.bn.train(bn_training)
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(8, 2, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g))
               for _ in range(2)] * 2  # fmt: skip

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    def step_lr(o):
        return torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)

    want = eager(reference, sgd, batches, F.cross_entropy, step_lr, micro_batches=num_csx)
    got = on_cgc(model, sgd, batches, tmp_path, step_lr, num_csx=num_csx, loss_fn=F.cross_entropy)
    same_training(got, want, model, reference)
    for name, buffer in reference.bn.named_buffers():
        torch.testing.assert_close(getattr(model.bn, name), buffer, msg=name)
    assert int(model.bn.num_batches_tracked) == (4 * num_csx if bn_training else 0)
    if bn_training:  # the buffers the steps updated are saved with the weights
        saved = safetensors.numpy.load_file(tmp_path / "weights.safetensors")
        np.testing.assert_array_equal(saved["model.bn.running_var"], model.bn.running_var.numpy())


@pytest.mark.parametrize("num_csx", [1, 4])
def test_bert_frozen_embeddings(num_csx, tmp_path):
    torch.manual_seed(0)
    model = Bert()
    for p in (*model.tokens.parameters(), *model.positions.parameters()):
        p.requires_grad_(False)
    reference, initial = copy.deepcopy(model), copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, V, (8, T), generator=g), torch.randint(0, 3, (8,), generator=g))
               for _ in range(2)] * 2  # fmt: skip

    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=1e-2)

    want = eager(reference, adam, batches, F.cross_entropy)
    got = on_cgc(model, adam, batches, tmp_path, num_csx=num_csx, loss_fn=F.cross_entropy)
    same_training(got, want, model, reference)
    assert torch.equal(model.tokens.weight, initial.tokens.weight)
    assert not torch.equal(model.classifier.weight, initial.classifier.weight)


# -- checkpoints and resume ------------------------------------------------------------------


def cnn_batches():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(8, 2, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g))
            for _ in range(4)]  # fmt: skip


@pytest.mark.parametrize("kind", ["gpt", "cnn"])
def test_resume_ends_as_an_uninterrupted_run(kind, tmp_path):
    """The optimizer state and the running statistics of batch norm come back."""
    torch.manual_seed(0)
    whole = GPT() if kind == "gpt" else CNN()
    first, again = copy.deepcopy(whole), copy.deepcopy(whole)
    batches = lm_batches() if kind == "gpt" else cnn_batches()
    options = {} if kind == "gpt" else {"loss_fn": F.cross_entropy}

    def adamw(m):
        return torch.optim.AdamW(decay_groups(m), lr=3e-3)

    losses = on_cgc(whole, adamw, batches, tmp_path / "a", **options)
    on_cgc(first, adamw, batches[:3], tmp_path / "b", checkpoint_every=2, **options)
    resumed = on_cgc(again, adamw, batches, tmp_path / "b", resume=True, **options)
    assert resumed == losses
    for a, b in zip(again.state_dict().values(), whole.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(t)["loss"] for t in lines] == losses


# -- the loss ops ----------------------------------------------------------------------------


class WideCNN(nn.Module):
    """A convolution of 64 channels on 32 x 32 images and batch norm in train() mode: too
    large for a mesh16x16 system to run a batch of 8 at once."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def test_batch_statistics_over_micro_batches_are_said(tmp_path):
    """Where a system's batch must run as micro-batches, batch norm's statistics are each
    run's, not the batch's as in the user's loop: the compile says so, and the steps equal
    eager's over the same micro-batches."""
    torch.manual_seed(0)
    model, reference = WideCNN(), None
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 5, (8,), generator=g))]

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.1)

    with pytest.warns(UserWarning, match=r"batch statistics .* per run of 4 samples"):
        got = on_cgc(model, sgd, batches, tmp_path, loss_fn=F.cross_entropy)
    want = eager(reference, sgd, batches, F.cross_entropy, micro_batches=2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_cross_entropy_decomposed_and_whole():
    """``F.cross_entropy`` as torch's default decompositions leave it (gather) through
    ``cgc.compile``, and kept whole (one softmax cross-entropy) by ``cgc.torch``."""
    torch.manual_seed(0)
    model = GPT()
    idx, targets = lm_batches(1, 4)[0]
    want = model(idx, targets).item()
    artifact = cgc.compile(model, args=(idx, targets), target=TARGET, mode="weight_streaming")
    got = cgc.run(artifact, {"idx": idx.numpy(), "targets": targets.numpy()})["output"]
    assert abs(float(got) - want) < 1e-5


# -- what is refused -------------------------------------------------------------------------


def test_refusals():
    model = GPT()
    with pytest.raises(CgcError, match="RMSprop is not supported"):
        cgc.torch.optimizer(torch.optim.RMSprop(model.parameters()))
    with pytest.raises(CgcError, match="maximize=True"):
        cgc.torch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1, maximize=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    exponential = torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.9)
    with pytest.raises(CgcError, match="ExponentialLR is not supported"):
        cgc.torch.optimizer(optimizer, exponential)
    with pytest.raises(CgcError, match="eta_min"):
        schedule_of(torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 4, eta_min=1e-3))


class RunningMax(nn.Module):
    """A linear layer that keeps the largest input it has seen: a buffer update that is
    neither a running average nor a counter."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.copy_(torch.maximum(self.seen, x.max()))
        return self.fc(x)


def test_other_buffer_updates_are_refused(tmp_path):
    model = RunningMax()
    cgc.torch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    s = cgc.torch.session(model, target=TARGET, model_dir=tmp_path, loss_fn=F.cross_entropy)
    with pytest.raises(CgcError, match=r"updates buffer 'model\.seen' .* only running averages"):
        s.step((torch.randn(4, 4), torch.randint(0, 3, (4,))))


def test_schedules_match_torch():
    """The schedules read off torch's schedulers give torch's learning rates."""
    for make in (
        warmup_cosine,
        lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.3),
        lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.25, total_iters=3),
    ):
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
        scheduler = make(optimizer)
        schedule = schedule_of(scheduler)
        for step in range(7):
            assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * schedule.factor(step))
            optimizer.step()
            scheduler.step()


def test_without_torch_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(CgcError, match=r"pip install cgc\[torch\]"):
        cgc.torch  # noqa: B018


# -- sparse weights --------------------------------------------------------------------------


@pytest.mark.parametrize("num_csx", [1, 4])
def test_sparse_weights_match_a_masked_eager_loop(num_csx, tmp_path):
    """A session with ``sparsity`` equals eager with the same masks applied to the weights and
    their gradients at every step; biases stay dense."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
    reference = copy.deepcopy(model)
    names = {"0.weight": reference[0].weight, "2.weight": reference[2].weight}
    masks = {
        n: torch.tensor(mask(f"model.{n}", p.detach().numpy(), 0.5, "random", 9))
        for n, p in names.items()
    }
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g))
               for _ in range(2)] * 2  # fmt: skip

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9)

    want = eager(reference, sgd, batches, F.cross_entropy, masks=masks)
    got = on_cgc(
        model, sgd, batches, tmp_path, num_csx=num_csx, loss_fn=F.cross_entropy,
        sparsity=0.5, seed=9,
    )  # fmt: skip
    same_training(got, want, model, reference)
    assert int((model[0].weight == 0).sum()) == 12 * 16 // 2
    assert bool((model[0].bias != 0).all())


def sparse_on_cgc(model, make_optimizer, batches, tmp_path, **options):
    """``on_cgc`` at density 0.5 (seed 9); also the sparse weights' masks, by the names of
    ``model``'s parameters."""
    wrapped = cgc.torch.module(model)
    cgc.torch.optimizer(make_optimizer(wrapped))
    options = {"target": TARGET, "model_dir": tmp_path, "sparsity": 0.5, "seed": 9, **options}
    with cgc.torch.session(**options) as s:
        initial = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        losses = [s.step(batch) for batch in cgc.torch.dataloader(batches)]
        sparse = s.artifact.manifest["sparsity"]["weights"]
    prefix = "model." if "loss_fn" in options else ""
    masks = {}
    for name in sparse:
        own = name.removeprefix(prefix)
        masks[own] = torch.tensor(mask(name, initial[own], 0.5, "random", 9))
    return losses, masks


@pytest.mark.parametrize("num_csx", [1, 4])
def test_sparse_gpt_matches_a_masked_eager_loop(num_csx, tmp_path):
    """A GPT-style LM: its matrices sparse, its (tied) embeddings, norms and biases dense."""
    torch.manual_seed(0)
    model = GPT()
    reference = copy.deepcopy(model)
    batches = lm_batches()

    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=1e-2)

    got, masks = sparse_on_cgc(model, adam, batches, tmp_path, num_csx=num_csx)
    assert sorted(masks) == ["attn.proj.weight", "attn.qkv.weight", "fc.weight", "out.weight"]
    want = eager(reference, adam, batches, masks=masks)
    same_training(got, want, model, reference)
    assert int((model.fc.weight == 0).sum()) == model.fc.weight.numel() // 2


@pytest.mark.parametrize("num_csx", [1, 4])
def test_sparse_cnn_matches_a_masked_eager_loop(num_csx, tmp_path):
    """A CNN: its convolution and linear weights sparse, batch norm dense and training."""
    torch.manual_seed(0)
    model = CNN()
    reference = copy.deepcopy(model)
    batches = cnn_batches()[:2] * 2  # step 2 sees step 0's batch again

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    got, masks = sparse_on_cgc(
        model, sgd, batches, tmp_path, num_csx=num_csx, loss_fn=F.cross_entropy
    )
    assert sorted(masks) == ["conv.weight", "fc.weight"]
    want = eager(reference, sgd, batches, F.cross_entropy, micro_batches=num_csx, masks=masks)
    same_training(got, want, model, reference)


def test_a_dynamic_sparse_session_resumes_exactly(tmp_path):
    """A session's masks move (RigL, every step) and come back with a checkpoint."""
    torch.manual_seed(0)
    whole = GPT()
    first, again, initial = (copy.deepcopy(whole) for _ in range(3))
    batches = lm_batches()
    options = {"sparsity": 0.5, "seed": 9, "sparsity_schedule": "dynamic",
               "sparsity_update_every": 1, "sparsity_drop_fraction": 0.25}  # fmt: skip

    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=1e-2)

    losses = on_cgc(whole, adam, batches, tmp_path / "a", **options)
    on_cgc(first, adam, batches[:3], tmp_path / "b", checkpoint_every=2, **options)
    resumed = on_cgc(again, adam, batches, tmp_path / "b", resume=True, **options)
    assert resumed == losses
    for a, b in zip(again.state_dict().values(), whole.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    start = torch.tensor(mask("fc.weight", initial.fc.weight.detach().numpy(), 0.5, "random", 9))
    assert not torch.equal(whole.fc.weight != 0, start)  # the mask moved
    assert int((whole.fc.weight != 0).sum()) <= whole.fc.weight.numel() // 2
    with pytest.raises(CgcError, match=r"^sparsity_regrow needs sparsity$"):
        cgc.torch.session(whole, adam(whole), sparsity_regrow="random")
