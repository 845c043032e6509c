"""Llama-family decoders in plain torch and their safetensors loader."""

from radixlm.runtime.models.config import (
    ROPE_TYPES,
    SUPPORTED_ARCHITECTURES,
    ArchConfig,
    RopeScaling,
)
from radixlm.runtime.models.llama import LlamaForCausalLM
from radixlm.runtime.models.loader import load_model, load_weights, parse_dtype
from radixlm.runtime.models.rope import (
    RopeFrequencies,
    RotaryEmbedding,
    apply_rope,
    compute_rope_frequencies,
)

__all__ = [
    "ArchConfig",
    "RopeScaling",
    "SUPPORTED_ARCHITECTURES",
    "ROPE_TYPES",
    "LlamaForCausalLM",
    "load_model",
    "load_weights",
    "parse_dtype",
    "RopeFrequencies",
    "RotaryEmbedding",
    "apply_rope",
    "compute_rope_frequencies",
]
