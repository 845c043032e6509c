"""Mixture-of-experts routing and expert computation against transformers' own
routers and experts, on the same inputs (ties included)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeSparseMoeBlock,
    Qwen3MoeTopKRouter,
)

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.small_batch import load_small_batch_kernels
from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.quantization import FEW_ROWS_MAX, Quantization
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import ArchConfig
from radixlm.runtime.models.moe import Routing, SparseMoE, route
from tests.kernels.cpu.test_small_batch_quant import product_reference

HIDDEN, EXPERTS, TOP_K, INTER = 32, 8, 2, 24


def _qwen3_config(**overrides: Any) -> transformers.Qwen3MoeConfig:
    return transformers.Qwen3MoeConfig(
        hidden_size=HIDDEN,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=INTER,
        **overrides,
    )


@pytest.mark.parametrize("normalize", [False, True])
def test_routing_equals_transformers_including_ties(normalize: bool) -> None:
    """Random router inputs, and inputs whose logits tie (two, three or every expert
    equal): the same experts with the same weights as transformers' router."""
    router = Qwen3MoeTopKRouter(_qwen3_config(norm_topk_prob=normalize))
    torch.manual_seed(0)
    router.weight.data.normal_(0, HIDDEN**-0.5)
    x = torch.randn(64, HIDDEN)
    tied = router.weight.data.clone()
    tied[3] = tied[5]  # experts 3 and 5 always tie
    tied[[1, 2, 6]] = tied[0].clone()  # and 0, 1, 2, 6
    for weight in (router.weight.data, tied, torch.zeros(EXPERTS, HIDDEN)):
        router.weight.data = weight
        _, want_weights, want_ids = router(x)
        got = route(torch.nn.functional.linear(x, weight), TOP_K, normalize)
        assert torch.equal(got.ids, want_ids)
        assert torch.equal(got.weights.to(want_weights.dtype), want_weights)


def test_mixtral_routing_renormalises_like_transformers() -> None:
    config = transformers.MixtralConfig(
        hidden_size=HIDDEN, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K
    )
    router = MixtralTopKRouter(config)
    router.weight.data.normal_(0, HIDDEN**-0.5, generator=torch.Generator().manual_seed(1))
    x = torch.randn(40, HIDDEN, generator=torch.Generator().manual_seed(2))
    _, want_weights, want_ids = router(x)
    got = route(torch.nn.functional.linear(x, router.weight), TOP_K, normalize=True)
    assert torch.equal(got.ids, want_ids) and torch.equal(got.weights, want_weights)
    assert torch.allclose(got.weights.sum(-1), torch.ones(40))


def _arch(kind: str) -> ArchConfig:
    base: dict[str, Any] = {
        "vocab_size": 96,
        "hidden_size": HIDDEN,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": INTER,
    }
    if kind == "qwen2_moe":
        return ArchConfig.from_dict(
            {
                **base,
                "architectures": ["Qwen2MoeForCausalLM"],
                "shared_expert_intermediate_size": 40,
            }
        )
    return ArchConfig.from_dict({**base, "architectures": ["Qwen3MoeForCausalLM"]})


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_experts_compute_transformers_block(kind: str) -> None:
    """Our block with transformers' block's weights (its stacked experts split per
    expert): the same output within float32 rounding, for 1 token and for many."""
    arch = _arch(kind)
    if kind == "qwen2_moe":
        hf_config = transformers.Qwen2MoeConfig(
            hidden_size=HIDDEN,
            num_experts=EXPERTS,
            num_experts_per_tok=TOP_K,
            moe_intermediate_size=INTER,
            shared_expert_intermediate_size=40,
        )
        block: torch.nn.Module = Qwen2MoeSparseMoeBlock(hf_config)
    else:
        hf_config = _qwen3_config()
        block = Qwen3MoeSparseMoeBlock(hf_config)
    hf_config._experts_implementation = "eager"
    gen = torch.Generator().manual_seed(3)
    for p in block.parameters():
        p.data.normal_(0, p.shape[-1] ** -0.5, generator=gen)
    ours = SparseMoE(arch, LayerFactory(torch.float32, "cpu"))
    ours.gate.weight.data.copy_(block.gate.weight)
    for e, expert in enumerate(ours.experts):
        expert.gate_up_proj.weight.data.copy_(block.experts.gate_up_proj[e])
        expert.down_proj.weight.data.copy_(block.experts.down_proj[e])
    if ours.shared_expert is not None and ours.shared_expert_gate is not None:
        shared = block.shared_expert
        ours.shared_expert.gate_up_proj.weight.data.copy_(
            torch.cat((shared.gate_proj.weight, shared.up_proj.weight))
        )
        ours.shared_expert.down_proj.weight.data.copy_(shared.down_proj.weight)
        ours.shared_expert_gate.weight.data.copy_(block.shared_expert_gate.weight)
    for tokens in (1, 37):
        x = torch.randn(tokens, HIDDEN, generator=gen)
        with torch.inference_mode():
            want = block(x[None])
            want = (want[0] if isinstance(want, tuple) else want)[0]
            got = ours(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_each_expert_runs_once_per_pass_on_all_its_tokens() -> None:
    arch = _arch("qwen3_moe")
    ours = SparseMoE(arch, LayerFactory(torch.float32, "cpu"))
    for p in ours.parameters():
        p.data.normal_(0, 0.2, generator=torch.Generator().manual_seed(4))
    x = torch.randn(50, HIDDEN, generator=torch.Generator().manual_seed(5))
    rows_seen: dict[int, int] = {}
    for e, expert in enumerate(ours.experts):
        expert.register_forward_hook(
            lambda module, args, out, e=e: rows_seen.__setitem__(e, args[0].shape[0])
        )
    with torch.inference_mode():
        ours(x)
        routing = route(ours.gate(x), TOP_K, False)
    counts = torch.bincount(routing.ids.flatten(), minlength=EXPERTS).tolist()
    assert rows_seen == {e: n for e, n in enumerate(counts) if n}
    assert ours.experts_run == len(rows_seen)


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_stacked_experts_through_the_triton_kernel_equal_the_grouped_loop(kind: str) -> None:
    """The GPU path (stacked experts, Triton's grouped kernel; here under its CPU
    interpreter) computes what the per-expert loop does."""
    pytest.importorskip("triton")
    ours = SparseMoE(_arch(kind), LayerFactory(torch.float32, "cpu"))
    gen = torch.Generator().manual_seed(6)
    for p in ours.parameters():
        p.data.normal_(0, p.shape[-1] ** -0.5, generator=gen)
    x = torch.randn(9, HIDDEN, generator=gen)
    with torch.inference_mode():
        want = ours(x)
        assert ours.stack_experts()
        assert ours.experts[3].gate_up_proj.weight.data_ptr() == ours.stacked[0][3].data_ptr()
        got = ours(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _quantized_block(method: Quantization) -> SparseMoE:
    """A Qwen3-MoE block (64 hidden, 8 experts of 64, top 2) with quantized experts
    filled from random float weights; bfloat16 activations."""
    config = {
        "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_experts": EXPERTS, "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": 64, "architectures": ["Qwen3MoeForCausalLM"],
    }  # fmt: skip
    block = SparseMoE(ArchConfig.from_dict(config), LayerFactory(torch.bfloat16, "cpu", method))
    gen = torch.Generator().manual_seed(8)
    block.gate.weight.data.copy_(torch.randn(EXPERTS, 64, generator=gen))
    for expert in block.experts:
        for linear in (expert.gate_up_proj, expert.down_proj):
            w = torch.randn(linear.out_features, linear.in_features, generator=gen)
            linear.qweight.quantize_rows(0, w * linear.in_features**-0.5)
            linear.prepare()
    return block


def _experts_reference(
    block: SparseMoE, x: torch.Tensor, routing: Routing, dot: bool
) -> torch.Tensor:
    """Each token's experts' weighted sum with every product as the kernels compute
    it (``product_reference``: on dot products each product's inputs rounded to
    int8 per 32), float32."""
    inter = block.experts[0].down_proj.in_features
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(routing.ids.shape[1]):
            expert = block.experts[int(routing.ids[t, j])]
            gate_up = product_reference(x[t : t + 1], expert.gate_up_proj.qweight, dot)
            hidden = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
            down = product_reference(hidden, expert.down_proj.qweight, dot)
            out[t] += float(routing.weights[t, j]) * down[0].double()
    return out.float()


@pytest.mark.parametrize("method", ["int4", "int8g"])
def test_quantized_experts_run_in_one_cpu_call(method: str) -> None:
    """Quantized experts through the one-call C++ kernel: each token's experts'
    weighted sum with every product as the kernels compute it (the float product of
    the dequantized experts, or on VNNI dot products the inputs rounded to 8 bits
    per 32), for 1 and 9 tokens; more than FEW_ROWS_MAX tokens take the loop."""
    group = 32 if method == "int4" else 16
    block = _quantized_block(Quantization(method, group))  # type: ignore[arg-type]
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    assert block.use_cpu_experts(kernels)
    dot = any(kernels.dot_products(up) for up, _ in block.cpu_experts[1].experts)
    gen = torch.Generator().manual_seed(9)
    for tokens in (1, 9):
        x = torch.randn(tokens, 64, generator=gen).to(torch.bfloat16)
        with torch.inference_mode():
            got = block(x)
            routing = route(block.gate(x), TOP_K, False)
        want = _experts_reference(block, x.float(), routing, dot).to(torch.bfloat16)
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)  # bfloat16 output
    assert block.kernel_passes == 2 and block.experts_run == 0
    with torch.inference_mode():
        block(torch.randn(FEW_ROWS_MAX + 1, 64, generator=gen).to(torch.bfloat16))
    assert block.kernel_passes == 2 and block.experts_run > 0


def test_cpu_experts_refuse_what_they_cannot_read() -> None:
    """Float experts, and an id outside the experts, are refused (not misread)."""
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    floats = SparseMoE(_arch("qwen3_moe"), LayerFactory(torch.float32, "cpu"))
    assert not floats.use_cpu_experts(kernels) and floats.cpu_experts is None
    block = _quantized_block(Quantization("int4", 32))
    assert block.use_cpu_experts(kernels)
    table = block.cpu_experts[1]
    ids = torch.tensor([[0, EXPERTS]])
    with pytest.raises(KernelShapeError, match=f"an id outside \\[0, {EXPERTS}\\)"):
        kernels.moe(torch.zeros(1, 64), table, ids, torch.ones(1, 2))
    with pytest.raises(KernelShapeError, match="x must be \\(1, 64\\)"):
        kernels.moe(torch.zeros(2, 64), table, ids, torch.ones(1, 2))
