"""RoPE frequencies, attention factors and rotations against transformers."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from radixlm.runtime.errors import UnsupportedArchitectureError
from radixlm.runtime.models import ArchConfig, RopeScaling, RotaryEmbedding, apply_rope
from radixlm.runtime.models.rope import compute_rope_frequencies

HEAD_DIM, MAX_POS, THETA = 32, 64, 10000.0

CASES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 16,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "beta_slow": 2,
    },
    "yarn-attention-factor-untruncated": {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 32,
        "attention_factor": 1.5,
        "truncate": False,
    },
}


def _hf_config(case: str) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=4 * HEAD_DIM,
        num_attention_heads=4,
        max_position_embeddings=MAX_POS,
        rope_parameters={"rope_theta": THETA, **CASES[case]},
    )


def _arch_config(case: str) -> ArchConfig:
    d = _hf_config(case).to_dict() | {"architectures": ["LlamaForCausalLM"]}
    return ArchConfig.from_dict(d)


def _hf_frequencies(case: str, config: LlamaConfig) -> tuple[torch.Tensor, float]:
    rope_type = CASES[case]["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    if rope_type == "dynamic":  # radixlm fixes dynamic NTK at its extended length
        factor = CASES[case]["factor"]
        return ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=int(MAX_POS * factor))
    return ROPE_INIT_FUNCTIONS[rope_type](config)


@pytest.mark.parametrize("case", CASES)
def test_frequencies_and_attention_factor_match_transformers(case: str) -> None:
    config = _arch_config(case)
    ours = compute_rope_frequencies(
        config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
    )
    hf_inv_freq, hf_factor = _hf_frequencies(case, _hf_config(case))
    torch.testing.assert_close(ours.inv_freq, hf_inv_freq.float(), atol=0, rtol=1e-6)
    assert ours.attention_factor == pytest.approx(hf_factor, rel=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_rotation_matches_transformers_at_any_positions(case: str) -> None:
    config = _arch_config(case)
    rope = RotaryEmbedding.from_config(config, torch.float32)
    # Includes the last position: HF's dynamic NTK then uses the same extended length.
    positions = torch.randperm(config.rope_context_len, generator=torch.Generator().manual_seed(0))
    q = torch.randn(positions.numel(), 4, HEAD_DIM)  # (T, H, D)
    k = torch.randn(positions.numel(), 2, HEAD_DIM)
    hf_rope = LlamaRotaryEmbedding(_hf_config(case))
    cos, sin = hf_rope(q, positions[None])  # (1, T, D)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos[0], sin[0], unsqueeze_dim=1)
    cos_ours, sin_ours = rope(positions)
    torch.testing.assert_close(apply_rope(q, cos_ours, sin_ours), hf_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rope(k, cos_ours, sin_ours), hf_k, atol=1e-5, rtol=1e-5)


def test_apply_rope_accepts_strided_views_and_keeps_the_input() -> None:
    qkv = torch.randn(5, 8, 16)  # (T, H+2Hkv, D) as the fused projection produces it
    freqs = compute_rope_frequencies(16, THETA, RopeScaling(), 32)
    rope = RotaryEmbedding(freqs, 32, torch.float32)
    cos, sin = rope(torch.tensor([0, 3, 1, 31, 7]))
    before = qkv.clone()
    out = apply_rope(qkv[:, :6], cos, sin)
    assert torch.equal(qkv, before)
    torch.testing.assert_close(out, apply_rope(qkv[:, :6].contiguous(), cos, sin))
    torch.testing.assert_close(out[0], qkv[0, :6])  # position 0 is the identity


def test_dynamic_rope_serves_its_extended_length() -> None:
    config = _arch_config("dynamic")
    assert config.rope_context_len == config.max_context_len == 3 * MAX_POS


def test_legacy_rope_scaling_keys_are_read() -> None:
    """transformers 4.x configs: top-level rope_theta and rope_scaling with 'type'."""
    d = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 10,
        "hidden_size": 64,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
        "rope_theta": 500000.0,
        "rope_scaling": {"type": "yarn", "factor": 2.0},
    }
    config = ArchConfig.from_dict(d)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling.rope_type == "yarn" and config.rope_scaling.factor == 2.0
    assert config.rope_scaling.original_max_position_embeddings == 128  # HF's fallback


def test_yarn_factor_defaults_to_the_context_ratio_like_transformers() -> None:
    scaling = RopeScaling.from_dict(
        {"rope_type": "yarn", "original_max_position_embeddings": 16}, max_position_embeddings=64
    )
    assert scaling.factor == 4.0


def test_unknown_rope_type_is_rejected() -> None:
    with pytest.raises(UnsupportedArchitectureError, match="longrope"):
        RopeScaling.from_dict({"rope_type": "longrope", "factor": 2.0}, 64)
