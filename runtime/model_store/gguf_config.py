"""A GGUF's metadata as the Hugging Face config.json of its family.

llama.cpp's converter writes ``<arch>.*`` keys from config.json; this reads them back
into the keys each family's ``ArchConfig.from_dict`` reads. What the converter does
not write, llama.cpp's own loader assumes per architecture, and so does this::

    Gemma 2          sliding and global layers alternate; softmax scale head_dim^-1/2
                     (hidden / heads for the 46-layer 27B)
    Gemma 3          5 sliding layers per global one (``attention.sliding_window_pattern``
                     when a file has it); sliding layers' RoPE base 10000 (or
                     ``rope.freq_base_swa``); scale as Gemma 2 (62-layer 27B)
    Qwen3-MoE,       the chosen experts' weights renormalised (Qwen2-MoE, OLMoE: not),
      Mixtral        unless ``expert_weights_norm`` says otherwise
    Qwen-MoE         layers without a router tensor are dense (``mlp_only_layers``)

RoPE scaling: ``rope.scaling.type`` linear or yarn with its keys; Phi-3's LongRoPE
factors from the ``rope_factors_long/short`` tensors; Llama 3's from ``rope_freqs``,
which holds the per-frequency divisors only: the llama3 parameters that reproduce
them are recovered (``_llama3_scaling``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.model_store.gguf_arch import GGUFFile

__all__ = ["hf_config"]

Config = dict[str, Any]


def hf_config(file: GGUFFile) -> Config:
    """The config.json of the file's model (float32 weights).

    Raises:
        ModelLoadError: a required key is missing, or the file uses a RoPE scaling or
            rotary width its family does not have.
    """
    config = _common(file)
    config.update(_FAMILY_KEYS[file.family.architecture](file, config))
    return config


def _f32(value: float) -> float:
    # GGUF stores floats as float32; the shortest float32 repr recovers the intended decimal
    # (1e-05 rather than 9.999999747378752e-06).
    return float(str(np.float32(value)))


def _common(file: GGUFFile) -> Config:
    hidden = int(file.require("embedding_length"))
    heads = int(file.require("attention.head_count"))
    head_dim = int(file.key("attention.key_length", hidden // heads))
    meta, tensors = file.meta, file.tensors
    return {
        "architectures": [file.family.architecture],
        "model_type": file.family.model_type,
        "hidden_size": hidden,
        "intermediate_size": int(file.require("feed_forward_length")),
        "num_hidden_layers": int(file.require("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(file.key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(file.require("context_length")),
        "rms_norm_eps": _f32(file.require("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(file.key("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(file, head_dim),
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": False,
        "vocab_size": int(tensors["token_embd.weight"].shape[-1]),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float32",
        "use_cache": True,
    }


# --- each family's own keys ------------------------------------------------------------------


def _full_rotary(file: GGUFFile, config: Config) -> Config:
    rotary = int(file.key("rope.dimension_count", config["head_dim"]))
    if rotary != config["head_dim"]:  # only Phi-3 rotates part of each head
        raise ModelLoadError(
            f"{file.path}: rotary dims {rotary} != head dim {config['head_dim']}: unsupported "
            f"for {file.family.architecture}"
        )
    return {}


def _qwen2(file: GGUFFile, config: Config) -> Config:
    return {**_full_rotary(file, config), "use_sliding_window": False}


def _phi3(file: GGUFFile, config: Config) -> Config:
    rotary = int(file.key("rope.dimension_count", config["head_dim"]))
    window = file.key("attention.sliding_window") or None  # 0: none (Phi-4)
    return {
        "partial_rotary_factor": rotary / config["head_dim"],
        "sliding_window": window,
        "original_max_position_embeddings": file.key("rope.scaling.original_context_length"),
    }


def _gemma(file: GGUFFile, config: Config, pattern: int, big_model_layers: int) -> Config:
    """Gemma 2 and 3: GeGLU, the softmax scale and each layer's type (see the module doc)."""
    layers = config["num_hidden_layers"]
    window = file.key("attention.sliding_window") or None  # 0: every layer global
    big = layers == big_model_layers  # llama.cpp's 27B: the scale from hidden / heads
    scalar = config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"]
    keys: Config = {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": scalar,
        "attn_logit_softcapping": file.key("attn_logit_softcapping"),
        "final_logit_softcapping": file.key("final_logit_softcapping"),
        "sliding_window": window,
    }
    if window:
        sliding = _sliding_layers(file.key("attention.sliding_window_pattern", pattern), layers)
        keys["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    return {**_full_rotary(file, config), **keys}


def _sliding_layers(pattern: int | list[bool], layers: int) -> list[bool]:
    """Whether each layer slides: a period (its last layer global) or one flag a layer."""
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ModelLoadError(f"a sliding window pattern of {len(pattern)} for {layers} layers")
        return [bool(s) for s in pattern]
    return [(i + 1) % int(pattern) != 0 for i in range(layers)]


def _gemma2(file: GGUFFile, config: Config) -> Config:
    return _gemma(file, config, pattern=2, big_model_layers=46)


def _gemma3(file: GGUFFile, config: Config) -> Config:
    return {
        **_gemma(file, config, pattern=6, big_model_layers=62),
        "rope_theta": _f32(file.key("rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": _f32(file.key("rope.freq_base_swa", 10000.0)),
    }


def _experts(file: GGUFFile, config: Config) -> Config:
    """The keys every mixture-of-experts family shares."""
    return {
        **_full_rotary(file, config),
        "num_experts_per_tok": int(file.require("expert_used_count")),
        "norm_topk_prob": bool(file.key("expert_weights_norm", file.family.normalize_top_k)),
    }


def _qwen_moe(file: GGUFFile, config: Config) -> Config:
    layers = config["num_hidden_layers"]
    routed = [f"blk.{i}.ffn_gate_inp.weight" in file.tensors for i in range(layers)]
    used = int(file.require("expert_used_count"))
    # llama.cpp's fallback for files without the key
    expert_size = file.key("expert_feed_forward_length") or config["intermediate_size"] // used
    shared = file.key("expert_shared_feed_forward_length")
    return {
        **_experts(file, config),
        "num_experts": int(file.require("expert_count")),
        "moe_intermediate_size": int(expert_size),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i, sparse in enumerate(routed) if not sparse],
        "shared_expert_intermediate_size": None if shared is None else int(shared),
        "use_sliding_window": False,
    }


def _mixtral(file: GGUFFile, config: Config) -> Config:
    size = file.key("expert_feed_forward_length") or config["intermediate_size"]
    return {
        **_experts(file, config),
        "num_local_experts": int(file.require("expert_count")),
        "intermediate_size": int(size),
        "sliding_window": None,
    }


def _olmoe(file: GGUFFile, config: Config) -> Config:
    size = file.key("expert_feed_forward_length") or config["intermediate_size"]
    return {
        **_experts(file, config),
        "num_experts": int(file.require("expert_count")),
        "intermediate_size": int(size),
        "clip_qkv": file.key("attention.clamp_kqv"),
    }


_FAMILY_KEYS: dict[str, Callable[[GGUFFile, Config], Config]] = {
    "LlamaForCausalLM": _full_rotary,
    "MixtralForCausalLM": _mixtral,
    "Qwen2ForCausalLM": _qwen2,
    "Qwen3ForCausalLM": _qwen2,
    "Phi3ForCausalLM": _phi3,
    "Gemma2ForCausalLM": _gemma2,
    "Gemma3ForCausalLM": _gemma3,
    "Qwen2MoeForCausalLM": _qwen_moe,
    "Qwen3MoeForCausalLM": _qwen_moe,
    "OlmoeForCausalLM": _olmoe,
}


# --- RoPE scaling ----------------------------------------------------------------------------


def _rope_scaling(file: GGUFFile, head_dim: int) -> Config | None:
    """HF's rope_scaling dict of the file (None: none)."""
    if "rope_freqs.weight" in file.tensors:
        return _llama3_scaling(file, head_dim)
    if "rope_factors_long.weight" in file.tensors:
        return _longrope_scaling(file)
    kind = file.key("rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": _f32(file.require("rope.scaling.factor"))}
    if kind == "yarn":
        return _yarn_scaling(file)
    raise ModelLoadError(
        f"{file.path}: GGUF RoPE scaling {kind!r} is not supported (supported: linear, yarn, "
        "Phi-3's LongRoPE factors, Llama 3's rope_freqs)"
    )


def _yarn_scaling(file: GGUFFile) -> Config:
    scaling: Config = {
        "rope_type": "yarn",
        "factor": _f32(file.require("rope.scaling.factor")),
        "original_max_position_embeddings": int(
            file.require("rope.scaling.original_context_length")
        ),
    }
    optional = {"beta_fast": "yarn_beta_fast", "beta_slow": "yarn_beta_slow",
                "attention_factor": "yarn_attn_factor"}  # fmt: skip
    for hf, key in optional.items():
        if (value := file.key(f"rope.scaling.{key}")) is not None:
            scaling[hf] = _f32(value)
    return scaling


def _longrope_scaling(file: GGUFFile) -> Config:
    """Phi-3's LongRoPE: its factors are tensors; the attention factor is written only
    where it is not the one HF derives from the lengths."""
    original = int(file.require("rope.scaling.original_context_length"))
    scaling: Config = {
        "rope_type": "longrope",
        "short_factor": [_f32(v) for v in file.values("rope_factors_short.weight")],
        "long_factor": [_f32(v) for v in file.values("rope_factors_long.weight")],
        "original_max_position_embeddings": original,
    }
    scale = int(file.require("context_length")) / original
    derived = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    stored = file.key("rope.scaling.attn_factor")
    if stored is not None and not math.isclose(stored, derived, rel_tol=1e-6):
        scaling["attention_factor"] = _f32(stored)
    return scaling


def _llama3_scaling(file: GGUFFile, head_dim: int) -> Config | None:
    """The llama3 parameters that reproduce the file's ``rope_freqs`` (the divisor of each
    rotary frequency).

    Those divisors are 1 above the high-frequency cut, ``factor`` below the low one and
    1 / ((1 - s) / factor + s) between, where s = a / wavelength - b with
    a = original / (high - low), b = low / (high - low): only a and b matter. With two or
    more frequencies between the cuts they are fitted (the original length rounded to an
    integer, ``low`` and ``high`` derived from it); otherwise Llama 3.1's (8192, 1, 4) is
    tried. Whatever is chosen must reproduce every divisor."""
    divisors = file.values("rope_freqs.weight").astype(np.float64)
    factor = float(divisors.max())
    if factor <= 1.0:
        return None
    theta = float(file.key("rope.freq_base", 10000.0))
    inv_wavelength = theta ** -(np.arange(0, head_dim, 2) / head_dim) / (2 * math.pi)
    between = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    candidates = [(8192, 1.0, 4.0)]
    if between.sum() >= 2:
        s = (1 / divisors[between] - 1 / factor) / (1 - 1 / factor)
        a, minus_b = np.polyfit(inv_wavelength[between], s, 1)
        original = round(a / -minus_b)
        low = float(f"{-minus_b * original / a:.6g}")
        candidates.insert(0, (original, low, float(f"{low + original / a:.6g}")))
    for original, low, high in candidates:
        want = _llama3_divisors(inv_wavelength, factor, original, low, high)
        if np.allclose(want, divisors, rtol=1e-5, atol=0):
            return {
                "rope_type": "llama3",
                "factor": _f32(factor),
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": original,
            }
    raise ModelLoadError(f"{file.path}: no llama3 RoPE scaling reproduces its rope_freqs")


def _llama3_divisors(
    inv_wavelength: np.ndarray, factor: float, original: int, low: float, high: float
) -> np.ndarray:
    smooth = (original * inv_wavelength - low) / (high - low)
    between = 1 / ((1 - smooth) / factor + smooth)
    return np.where(smooth > 1, 1.0, np.where(smooth < 0, factor, between))
