"""Decoder-only model families in plain torch, their safetensors loader and
random-weight checkpoints of any served family (tests, benchmarks)."""

from radixlm.runtime.models.config import (
    REFUSED_ARCHITECTURES,
    ROPE_TYPES,
    SUPPORTED_ARCHITECTURES,
    ArchConfig,
    MoEConfig,
    RopeScaling,
    architecture_features,
)
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.loader import load_model, load_weights, parse_dtype
from radixlm.runtime.models.random_model import write_random_model
from radixlm.runtime.models.rope import (
    RopeFrequencies,
    RotaryEmbedding,
    apply_rope,
    compute_rope_frequencies,
)

__all__ = [
    "ArchConfig",
    "MoEConfig",
    "architecture_features",
    "RopeScaling",
    "SUPPORTED_ARCHITECTURES",
    "REFUSED_ARCHITECTURES",
    "ROPE_TYPES",
    "DecoderForCausalLM",
    "load_model",
    "load_weights",
    "parse_dtype",
    "RopeFrequencies",
    "RotaryEmbedding",
    "apply_rope",
    "compute_rope_frequencies",
    "write_random_model",
]
