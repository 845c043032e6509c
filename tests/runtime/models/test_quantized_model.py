"""A model loaded with quantized weights holds the quantization of its checkpoint's
tensors (fused parts in place, a tied vocabulary once) and computes with them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import Int8Weight, Quantization, QuantizedLinear
from radixlm.runtime.models import ArchConfig, load_model
from tests.runtime.models.helpers import KVHarness, build_hf_model, save_hf

# int4 groups of 32 need every input width a multiple of 32 (TINY's MLP is 112 wide)
SHAPE = {"intermediate_size": 128}
QUANTIZATIONS = [Quantization("int8"), Quantization("int4", 32)]


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    hf = build_hf_model("qwen2", tie_word_embeddings=request.param, **SHAPE)  # biases too
    return save_hf(hf, tmp_path_factory.mktemp("ckpt") / "qwen2")


def _load(path: Path, dtype: torch.dtype, quantization: Quantization | None = None):
    harness = KVHarness(ArchConfig.from_model_dir(path), dtype=dtype)
    model = load_model(path, harness.backend, dtype, quantization=quantization)
    return harness, model


def _quantized(quantization: Quantization, *parts: torch.Tensor) -> torch.Tensor:
    """What the quantization of the stacked parts dequantizes to."""
    whole = torch.cat(parts)
    weight = quantization.weight(whole.shape[0], whole.shape[1], torch.bfloat16, "cpu")
    weight.rows(0, whole.shape[0]).copy_(whole)
    weight.pack()
    return weight.dequantize(torch.float32)


@pytest.mark.parametrize("quantization", QUANTIZATIONS, ids=lambda q: q.method)
def test_every_layer_holds_the_quantization_of_its_checkpoint_parts(
    checkpoint: Path, quantization: Quantization
) -> None:
    _, model = _load(checkpoint, torch.bfloat16, quantization)
    hf = load_file(checkpoint / "model.safetensors")
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        expected = {
            attn.qkv_proj: [hf[prefix + f"self_attn.{p}_proj.weight"] for p in "qkv"],
            attn.o_proj: [hf[prefix + "self_attn.o_proj.weight"]],
            mlp.gate_up_proj: [hf[prefix + f"mlp.{p}_proj.weight"] for p in ("gate", "up")],
            mlp.down_proj: [hf[prefix + "mlp.down_proj.weight"]],
        }
        for linear, parts in expected.items():
            assert isinstance(linear, QuantizedLinear)
            got = linear.qweight.dequantize(torch.float32)
            assert torch.equal(got, _quantized(quantization, *parts))
        bias = torch.cat([hf[prefix + f"self_attn.{p}_proj.bias"] for p in "qkv"])
        assert torch.equal(attn.qkv_proj.bias, bias.to(torch.bfloat16))
    # the vocabulary is int8 in either method, one matrix when tied
    head, embedding = model.lm_head.qweight, model.model.embed_tokens.qweight
    assert isinstance(head, Int8Weight) and isinstance(embedding, Int8Weight)
    tied = model.config.tie_word_embeddings
    assert (head is embedding) == tied
    head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    want = _quantized(Quantization("int8"), hf[head_name])
    assert torch.equal(head.dequantize(torch.float32), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("quantization", QUANTIZATIONS, ids=lambda q: q.method)
def test_logits_are_those_of_the_dequantized_weights(
    checkpoint: Path, quantization: Quantization, dtype: torch.dtype
) -> None:
    """Against a float32 model holding the dequantized values: what is left is bf16
    activations through two layers, or (a float32 model) the products' inputs rounded
    to bf16 (measured at most 0.8% of the logits' range; a misplaced part or a
    transposed weight is off by the whole range)."""
    harness, model = _load(checkpoint, dtype, quantization)
    ref_harness, reference = _load(checkpoint, torch.float32)
    quantized = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    for name, linear in reference.named_modules():
        if isinstance(linear, Linear) and name != "lm_head":
            linear.weight.data.copy_(quantized[name].qweight.dequantize(torch.float32))
            linear.prepare()
    embedding = model.model.embed_tokens.qweight.dequantize(torch.float32)
    reference.model.embed_tokens.weight.data.copy_(embedding)
    if not model.config.tie_word_embeddings:
        reference.lm_head.weight.data.copy_(model.lm_head.qweight.dequantize(torch.float32))
    reference.lm_head.prepare()
    prompt = [5, 17, 3, 60, 2, 44, 9, 81]
    got = harness.run(model, [("a", prompt)])[0]
    want = ref_harness.run(reference, [("a", prompt)])[0]
    spread = want.max() - want.min()
    assert (got - want).abs().max() <= 0.02 * spread
    # decode rows take the packed kernels: the same logits as the prompt's last row
    step = harness.run(model, [("b", prompt[:-1])]) and harness.run(model, [("b", prompt[-1:])])
    assert (step[0][0] - want[-1]).abs().max() <= 0.02 * spread
