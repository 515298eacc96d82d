"""Generation from decoder graphs as users bring them.

ONNX: transformers' GPT-2 and Llama (sdpa attention, the default), exported without their
cache by the TorchScript exporter and the dynamo one, with the positions an input or built in
the graph (``Range``), and an attention mask input or none. PyTorch, through ``torch.export``:
transformers models cgc has no params reader for (GPT-NeoX's partial rotary and parallel
residual, Gemma's scaled embedding and GeGLU, OPT's offset learned positions) and a module
written here. Greedy tokens and every step's logits equal ``transformers``' ``generate`` (or
recomputing the whole prefix) on the same weights, for a batch of prompts of different
lengths; the command line writes and reads a generation's artifact of a decoder; what is not
a decoder is refused in one line."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_exported_attention import _vmap_free_masks  # noqa: E402
from test_generation import NEW, VOCAB, _model, _prompts, _reference  # noqa: E402

import cgc  # noqa: E402
from cgc.cli import main  # noqa: E402
from cgc.machine.hardware.target import Target  # noqa: E402
from cgc.machine.program.artifact import Artifact  # noqa: E402
from cgc.machine.timing.cost import Sram  # noqa: E402
from cgc.runtime.memoryx import MemoryX  # noqa: E402
from cgc.runtime.vm import Executor, System  # noqa: E402

EXPORTS = {
    # the positions built in the graph (cache_position), no mask input
    "gpt2-torchscript": ("gpt2", "torchscript", ("input_ids",)),
    # a packed-sequence mask computed from the positions at run time
    "llama-dynamo": ("llama", "dynamo", ("input_ids",)),
    # a sliding window (6) shorter than the generation, found on a prompt as long as it
    "mistral-dynamo": ("mistral", "dynamo", ("input_ids",)),
    # the positions an input, and an attention mask input held at ones
    "llama-torchscript-inputs": ("llama", "torchscript",
                                 ("input_ids", "attention_mask", "position_ids")),
}  # fmt: skip


class _Logits(torch.nn.Module):
    """The causal LM called with its inputs by name, without its cache, giving its logits."""

    def __init__(self, module: Any, names: tuple[str, ...], caches: bool):
        super().__init__()
        self.module, self.names = module, names
        self.options = {"use_cache": False} if caches else {}

    def forward(self, *args: Any) -> Any:
        named = dict(zip(self.names, args, strict=True))
        return self.module(**named, **self.options).logits


def export(
    module: Any, names: tuple[str, ...], exporter: str, path: Path, caches: bool = True
) -> Path:
    """``module`` exported to ``path`` with the batch and sequence axes symbolic (without its
    cache if it ``caches``)."""
    ids = torch.randint(1, VOCAB, (2, 6))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
               "position_ids": torch.arange(6).expand(2, 6).contiguous()}  # fmt: skip
    args = tuple(example[name] for name in names)
    wrapped = _Logits(module, names, caches).eval()
    quiet = (warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()),
             torch.no_grad())  # fmt: skip
    with contextlib.ExitStack() as stack:
        for context in quiet:
            stack.enter_context(context)
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes = {name: {0: "batch", 1: "sequence"} for name in (*names, "logits")}
            with _vmap_free_masks():
                torch.onnx.export(wrapped, args, str(path), dynamo=False, opset_version=17,
                                  input_names=list(names), output_names=["logits"],
                                  dynamic_axes=axes)  # fmt: skip
        else:
            batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=64)
            torch.onnx.export(wrapped, args, str(path), dynamo=True, opset_version=18,
                              input_names=list(names), output_names=["logits"],
                              dynamic_shapes=(tuple({0: batch, 1: sequence} for _ in names),),
                              optimize=True, verify=False, report=False)  # fmt: skip
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    """Each export's module and file."""
    where = tmp_path_factory.mktemp("decoders")
    made = {}
    for key, (arch, exporter, names) in EXPORTS.items():
        module = _model(arch)
        made[key] = (module, export(module, names, exporter, where / f"{key}.onnx"))
    return made


@pytest.mark.parametrize("key", list(EXPORTS))
def test_an_onnx_decoder_generates_as_transformers(key: str, exported: dict) -> None:
    module, path = exported[key]
    ids, mask = _prompts(True)
    generated = cgc.generate(str(path), ids, attention_mask=mask, max_new_tokens=NEW)
    tokens, logits = _reference(module, ids, mask)
    np.testing.assert_array_equal(generated.tokens, tokens)
    assert generated.logits is not None
    np.testing.assert_allclose(generated.logits, logits, rtol=1e-4, atol=1e-5)
    caches = generated.compiled.decode.manifest["caches"]
    assert len(caches) == 4  # a key and a value cache for each of the 2 attention layers


@pytest.mark.parametrize("mode", ["pipelined", "whole_wafer", "weight_streaming"])
def test_every_way_of_serving_a_decoder_gives_its_tokens(mode: str, exported: dict) -> None:
    module, path = exported["llama-dynamo"]
    ids, mask = _prompts(False)
    generated = cgc.generate(str(path), ids, attention_mask=mask, max_new_tokens=4, mode=mode)
    assert generated.compiled.mode == mode
    tokens, _ = _reference(module, ids, mask)
    np.testing.assert_array_equal(generated.tokens, tokens[:, : ids.shape[1] + 4])
    serving = generated.serving
    assert serving.kv_bytes_per_token == 2 * 2 * (2 * 16) * 4  # layers, k and v, kv width, f32
    assert serving.kv_capacity_tokens > 0


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_the_command_line_generates_from_a_decoder_and_its_artifact(
    exported: dict, tmp_path: Path
) -> None:
    module, path = exported["gpt2-torchscript"]
    ids, mask = _prompts(True)
    prompt, out = tmp_path / "prompt.npz", tmp_path / "out.npz"
    np.savez(prompt, input_ids=ids, attention_mask=mask)
    artifact = tmp_path / "gen.cgc"
    code, output = _invoke("generate", str(path), "--prompt", str(prompt), "--max-new-tokens",
                           str(NEW), "--output", str(out), "--artifact", str(artifact))  # fmt: skip
    assert code == 0, output
    tokens, _ = _reference(module, ids, mask)
    np.testing.assert_array_equal(np.load(out)["tokens"], tokens)
    twice = tmp_path / "twice.cgc"  # deterministic: the same bytes from the same inputs
    code, output = _invoke("generate", str(path), "--prompt", str(prompt), "--max-new-tokens",
                           str(NEW), "--artifact", str(twice))  # fmt: skip
    assert code == 0 and twice.read_bytes() == artifact.read_bytes(), output
    again = tmp_path / "again.npz"
    code, output = _invoke("generate", str(artifact), "--prompt", str(prompt),
                           "--max-new-tokens", str(NEW), "--output", str(again))  # fmt: skip
    assert code == 0, output
    np.testing.assert_array_equal(np.load(again)["tokens"], tokens)
    code, output = _invoke("inspect", str(artifact))
    assert code == 0 and "attn/MatMul#0.key_cache" in output, output


def _refused(*args: str) -> str:
    code, output = _invoke("generate", *args)
    assert code == 2, output
    assert output.count("\n") == 1, output
    return output


def test_what_is_not_a_cacheable_decoder_is_refused_naming_it(
    exported: dict, tmp_path: Path
) -> None:
    _, path = exported["gpt2-torchscript"]
    prompt = tmp_path / "prompt.npz"
    np.savez(prompt, input_ids=np.array([[1, 2, 3]]))
    run = (str(path), "--prompt", str(prompt), "--max-new-tokens", "2")
    assert "--num-csx 2: " in _refused(*run, "--num-csx", "2")
    assert "--init-seed: " in _refused(*run, "--init-seed", "1")
    line = _refused(*run[:-1], "70")
    assert "feed 72 positions, past the model's 64 (the rows of its position table)" in line
    cached = tmp_path / "cached.onnx"
    graph = helper.make_graph(
        [helper.make_node("Identity", ["past_key_values.0.key"], ["logits"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 4])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph), cached)
    line = _refused(str(cached), "--prompt", str(prompt), "--max-new-tokens", "2")
    assert "input 'past_key_values.0.key' is neither" in line and "use_cache=False" in line
    fixed = tmp_path / "fixed.onnx"  # an exporter wrote the example's 16 tokens in a shape
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["x"], to=TensorProto.FLOAT),
         helper.make_node("Reshape", ["x", "shape"], ["logits"])], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 16, 1])],
        [helper.make_tensor("shape", TensorProto.INT64, [3], [1, 16, 1])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), fixed)
    line = _refused(str(fixed), "--prompt", str(prompt), "--max-new-tokens", "2")
    assert "(Reshape)" in line and "is its sequence axis symbolic?" in line, line


def test_an_encoder_is_refused_naming_its_attention(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=VOCAB)  # fmt: skip
    encoder = transformers.BertForMaskedLM(config).eval()
    names = ("input_ids", "position_ids")
    path = export(encoder, names, "torchscript", tmp_path / "bert.onnx", caches=False)
    prompt = tmp_path / "prompt.npz"
    np.savez(prompt, input_ids=np.array([[1, 2, 3]]))
    line = _refused(str(path), "--prompt", str(prompt), "--max-new-tokens", "2")
    assert "attention has no key-value cache to read: it is not causal" in line


def _transformers(arch: str) -> Any:
    """A small random-weight transformers causal LM that cgc reads no params of."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=112, max_position_embeddings=64)  # fmt: skip
    if arch == "gpt_neox":
        module = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(rotary_pct=0.5,
                                                                            **common))  # fmt: skip
    elif arch == "gemma":
        config = transformers.GemmaConfig(num_key_value_heads=2, head_dim=16, **common)
        module = transformers.GemmaForCausalLM(config)
    else:
        config = transformers.OPTConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            ffn_dim=112, max_position_embeddings=64, word_embed_proj_dim=64,
        )  # fmt: skip
        module = transformers.OPTForCausalLM(config)
    with torch.no_grad():
        for key, tensor in module.named_parameters():
            if key.endswith("bias") or "norm" in key:
                tensor.copy_(torch.randn_like(tensor) * 0.3 + (0 if key.endswith("bias") else 1))
    return module.eval()


@pytest.mark.parametrize("arch", ["gpt_neox", "gemma", "opt"])
def test_a_pytorch_causal_lm_generates_through_torch_export(arch: str) -> None:
    module = _transformers(arch)
    ids, mask = _prompts(True)
    generated = cgc.generate(module, ids, attention_mask=mask, max_new_tokens=NEW)
    tokens, logits = _reference(module, ids, mask)
    np.testing.assert_array_equal(generated.tokens, tokens)
    assert generated.logits is not None
    np.testing.assert_allclose(generated.logits, logits, rtol=1e-4, atol=1e-5)
    assert len(generated.compiled.decode.manifest["caches"]) == 4


class TinyGPT(torch.nn.Module):
    """A causal LM as a user writes one: learned positions, one block, its own attention."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.wte, self.wpe = torch.nn.Embedding(VOCAB, 32), torch.nn.Embedding(64, 32)
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)
        self.norm, self.head = torch.nn.LayerNorm(32), torch.nn.Linear(32, VOCAB)

    def forward(self, input_ids: Any, position_ids: Any) -> Any:
        x = self.wte(input_ids) + self.wpe(position_ids)
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        mixed = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(mixed.transpose(1, 2).reshape(b, s, 32))
        return self.head(x)


class NoPositions(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyGPT()

    def forward(self, input_ids: Any) -> Any:
        where = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        return self.inner(input_ids, where)


def test_a_module_written_by_hand_generates_as_recomputing_the_prefix() -> None:
    module = TinyGPT().eval()
    ids = np.array([[5, 9, 11, 3, 7], [8, 2, 4, 6, 10]])
    generated = cgc.generate(module, ids, max_new_tokens=NEW)
    rows = torch.from_numpy(ids)
    with torch.no_grad():
        for _ in range(NEW):  # no cache: the whole prefix again at every step
            where = torch.arange(rows.shape[1]).expand_as(rows)
            step = module(rows, where)[:, -1].argmax(-1, keepdim=True)
            rows = torch.cat([rows, step], dim=1)
    np.testing.assert_array_equal(generated.tokens, rows.numpy())


def test_a_module_that_makes_its_own_positions_is_refused(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(
        "import torch, numpy as np\n"
        "from test_generation_graphs import NoPositions\n"
        "def model():\n"
        "    return NoPositions(), (torch.tensor([[1, 2, 3]]),)\n"
    )
    line = _refused(f"{tmp_path / 'models.py'}:model", "--max-new-tokens", "2")
    assert "NoPositions.forward takes no positions (a position_ids parameter)" in line
    # as the refusal says: exported to ONNX, the positions it builds are found
    module, ids = NoPositions().eval(), np.array([[5, 9, 11, 3, 7]])
    path = tmp_path / "nopositions.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.from_numpy(ids),), str(path), dynamo=False,
                          opset_version=17, input_names=["input_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "b", 1: "s"},
                                        "logits": {0: "b", 1: "s"}})  # fmt: skip
    generated = cgc.generate(str(path), ids, max_new_tokens=NEW)
    wanted = cgc.generate(module.inner, ids, max_new_tokens=NEW)
    np.testing.assert_array_equal(generated.tokens, wanted.tokens)


def test_programs_sharing_a_system_keep_their_own_constants(tmp_path: Path) -> None:
    """A generation's programs run on one system; a constant is pinned by its program's
    digest and its register, so one program never reads another's constant that sits in the
    same register."""
    outputs = []
    for scale in (2.0, 3.0):
        graph = helper.make_graph(
            [helper.make_node("Constant", [], ["c"], value=helper.make_tensor(
                "c", TensorProto.FLOAT, [4], [scale] * 4)),
             helper.make_node("Mul", ["x", "c"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        )  # fmt: skip
        path = tmp_path / f"scale{scale}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
        outputs.append(cgc.compile(str(path), target="mesh4x4", mode="pipelined"))
    target = Target.from_json(outputs[0].manifest["target"])
    system, x = System(Sram(target, strict=False)), np.ones((2, 4), np.float32)
    for artifact, scale in zip(outputs, (2.0, 3.0), strict=True):
        assert isinstance(artifact, Artifact)
        executor = Executor(artifact.program, target, system, MemoryX({}, target, {}), True)
        executor.run([x])
        np.testing.assert_array_equal(executor.outputs[0], x * scale)


def test_a_model_cgc_reads_as_params_generates_through_torch_export_too() -> None:
    """transformers' GPT-2 as a graph (``causal_decoder``), over a context long enough that
    its mask builder's index tables are weights: they are inline, and the mask evaluates."""
    from cgc.frontends.torch.causal import causal_decoder

    module = _model("gpt2")
    ids, mask = _prompts(False)
    generated = cgc.generate(causal_decoder(module), ids, attention_mask=mask,
                             max_new_tokens=32, mode="whole_wafer")  # fmt: skip
    with torch.no_grad():
        want = module.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                               max_new_tokens=32, do_sample=False, pad_token_id=0)  # fmt: skip
    np.testing.assert_array_equal(generated.tokens, want.numpy())


class AttendsOnlyOverSeveral(TinyGPT):
    """Skips its attention for a single token: its decode step would keep no cache."""

    def forward(self, input_ids: Any, position_ids: Any) -> Any:
        x = self.wte(input_ids) + self.wpe(position_ids)
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        if s == 1:
            mixed = v
        else:
            mixed = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x + self.out(mixed.transpose(1, 2).reshape(b, s, 32)))


def test_a_decoder_whose_programs_keep_different_caches_is_refused() -> None:
    with pytest.raises(cgc.CgcError, match="keeps 2 key-value caches and its decode step 0"):
        cgc.generate(AttendsOnlyOverSeveral().eval(), np.array([[5, 9, 11]]), max_new_tokens=2,
                     mode="whole_wafer")  # fmt: skip
