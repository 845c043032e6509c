"""RoPE frequencies, attention factors and rotations against transformers."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from radixlm.runtime.errors import ModelLoadError, UnsupportedArchitectureError
from radixlm.runtime.models import ArchConfig, RopeScaling, RotaryEmbedding, apply_rope
from radixlm.runtime.models.rope import compute_rope_frequencies
from tests import numerics as num

HEAD_DIM, MAX_POS, THETA = 32, 64, 10000.0

# Relative error of one float32 evaluation of a (scaled) inv_freq: the exponent 2i/D
# rounds once, moving base^(-2i/D) by up to ln(base) u (dynamic NTK raises the base to
# ~7.9 theta here); pow is within 1 ulp (2u), the reciprocal u; the scalings (a
# factor; llama3's band blend; yarn's ramp and blend) add at most 8 operations of at
# most 2u each. Ours and transformers' evaluate the same expressions, each its way.
INV_FREQ_ERROR = (math.log(8 * THETA) + 3 + 16) * num.U
# The attention factor: at most 10 float64 operations (log within 1 ulp) per side.
ATTENTION_FACTOR_ERROR = 2 * 20 * num.unit_roundoff(torch.float64)

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
    bound = 2 * INV_FREQ_ERROR * hf_inv_freq.double().abs()
    num.assert_within(ours.inv_freq, hf_inv_freq, bound)
    assert ours.attention_factor == pytest.approx(hf_factor, rel=ATTENTION_FACTOR_ERROR, abs=0)


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
    half = HEAD_DIM // 2
    c, s = cos[0, :, None, :half], sin[0, :, None, :half]  # HF's: each half repeats
    # A table entry: the angle p f rounds once after f's error; cos and sin within
    # 1 ulp; times the attention factor (<= 1.5 here) once more.
    factor = rope.cos.double().abs().max().item()
    angle = positions.double()[:, None, None] * hf_rope.inv_freq.double()
    table_error = factor * (angle * (INV_FREQ_ERROR + num.U) + 3 * num.U)
    for x, want in ((q, hf_q), (k, hf_k)):
        bound = num.between_two(num.rope(num.exact(x), c, s, table_error))
        num.assert_within(apply_rope(x, cos_ours, sin_ours), want, bound)


def test_apply_rope_accepts_strided_views_and_keeps_the_input() -> None:
    qkv = torch.randn(5, 8, 16)  # (T, H+2Hkv, D) as the fused projection produces it
    freqs = compute_rope_frequencies(16, THETA, RopeScaling(), 32)
    rope = RotaryEmbedding(freqs, 32, torch.float32)
    cos, sin = rope(torch.tensor([0, 3, 1, 31, 7]))
    before = qkv.clone()
    out = apply_rope(qkv[:, :6], cos, sin)
    assert torch.equal(qkv, before)
    # the same products and sums, though a strided and a contiguous loop may fuse them
    # differently (FMA)
    bound = num.between_two(num.rope(num.exact(qkv[:, :6]), cos[:, None], sin[:, None]))
    num.assert_within(out, apply_rope(qkv[:, :6].contiguous(), cos, sin), bound)
    assert torch.equal(out[0], qkv[0, :6])  # position 0: x1 * 1 - x2 * 0 is x1, exactly


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
    with pytest.raises(UnsupportedArchitectureError, match="mrope"):
        RopeScaling.from_dict({"rope_type": "mrope", "factor": 2.0}, 64)


def test_longrope_without_its_factors_is_rejected() -> None:
    with pytest.raises(ModelLoadError, match="short_factor and long_factor"):
        RopeScaling.from_dict({"rope_type": "longrope", "factor": 2.0}, 64)
