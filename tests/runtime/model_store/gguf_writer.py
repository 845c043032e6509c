"""GGUF files as llama.cpp's converter (convert_hf_to_gguf.py) writes them, from a
tiny Hugging Face checkpoint of any family radixlm serves.

What the converter does is done here again, written from its behaviour: the family's
``general.architecture`` and ``<arch>.*`` keys (each family's ``set_gguf_parameters``),
tensor names from gguf-py's own map (``gguf.get_tensor_name_map``), and the tensors as
it changes them::

    llama (Llama, Mistral, Mixtral)  q/k rows (and biases) permuted per head for
                                     GPT-J-style RoPE; Llama 3 RoPE as a rope_freqs tensor
    Phi-3                            LongRoPE's factors as rope_factors_long/short tensors
    Gemma 2 / 3                      every ``*norm.weight`` stored as 1 + w; no lm_head
    every MoE family                 each layer's experts stacked into (E, rows, cols)

Storage types as the converter picks them: 1-D tensors, norms and routers F32, the rest
the file type, F16 where a row does not fill whole blocks. A placeholder byte-level BPE
vocabulary stands in for the tokenizer (the checkpoints have none).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

__all__ = ["write_gguf"]

Q = gguf.GGMLQuantizationType
Config = dict[str, Any]
A = gguf.MODEL_ARCH
_ARCHES = {
    "LlamaForCausalLM": A.LLAMA,
    "MistralForCausalLM": A.LLAMA,
    "MixtralForCausalLM": A.LLAMA,
    "Qwen2ForCausalLM": A.QWEN2,
    "Qwen3ForCausalLM": A.QWEN3,
    "Phi3ForCausalLM": A.PHI3,
    "Gemma2ForCausalLM": A.GEMMA2,
    "Gemma3ForCausalLM": A.GEMMA3,
    "Qwen2MoeForCausalLM": A.QWEN2MOE,
    "Qwen3MoeForCausalLM": A.QWEN3MOE,
    "OlmoeForCausalLM": A.OLMOE,
}
_LLAMA_ARCH = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")
_GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")


def write_gguf(
    model_dir: Path,
    path: Path,
    file_type: gguf.GGMLQuantizationType = Q.F32,
    split_max_tensors: int = 0,
) -> Path:
    """Writes the GGUF of the checkpoint at ``model_dir`` (config.json and
    model.safetensors, float32) to ``path``; ``file_type``: the matrices' type (F32, Q8_0,
    Q4_0, ...). ``split_max_tensors``: split it into files of at most that many tensors,
    as ``convert_hf_to_gguf.py --split-max-tensors`` does (``path``'s stem, then
    ``-00001-of-0000N.gguf``, ...); returns the first file's path."""
    config = json.loads((model_dir / "config.json").read_text())
    architecture = config["architectures"][0]
    arch = _ARCHES[architecture]
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch], split_max_tensors=split_max_tensors)
    _PARAMETERS[architecture](writer, config)
    _write_vocabulary(writer, config)
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    tensors = load_file(model_dir / "model.safetensors")
    for name, values in _converted(architecture, config, tensors):
        if not name.startswith("rope_"):
            name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        data, kind = _stored(name, values, file_type)
        writer.add_tensor(name, data, raw_dtype=kind)
    first = writer.format_shard_names(path)[0]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return first


# --- metadata --------------------------------------------------------------------------------


def _rope(config: Config) -> tuple[Config, float | None]:
    """(the full-attention layers' rope parameters, the sliding layers' RoPE base)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if "full_attention" in rope or "sliding_attention" in rope:
        return rope.get("full_attention", {}), rope.get("sliding_attention", {}).get("rope_theta")
    return rope, config.get("rope_local_base_freq")


def _text_model(w: gguf.GGUFWriter, c: Config) -> None:
    """TextModel.set_gguf_parameters: the keys every family starts from."""
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    rope, local_theta = _rope(c)
    kind, factor = rope.get("rope_type"), rope.get("factor")
    if kind == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif kind == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if (attention := rope.get("attention_factor")) is not None:
            w.add_rope_scaling_yarn_attn_factor(attention)
        if rope.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if rope.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    elif kind == "longrope":
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    if rope.get("rope_theta") is not None:
        w.add_rope_freq_base(rope["rope_theta"])
    if local_theta is not None:
        w.add_rope_freq_base_swa(local_theta)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    experts = c.get("num_local_experts") or c.get("num_experts")
    if experts is not None:
        w.add_expert_count(experts)
    if c.get("num_experts_per_tok") is not None:
        w.add_expert_used_count(c["num_experts_per_tok"])
    if c.get("head_dim") is not None:
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])


def _llama(w: gguf.GGUFWriter, c: Config) -> None:
    _text_model(w, c)
    w.add_vocab_size(c["vocab_size"])
    w.add_rope_dimension_count(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def _qwen_moe(w: gguf.GGUFWriter, c: Config) -> None:
    _text_model(w, c)
    if c.get("moe_intermediate_size") is not None:
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if c.get("shared_expert_intermediate_size") is not None:
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])


def _olmoe(w: gguf.GGUFWriter, c: Config) -> None:
    _text_model(w, c)
    w.add_layer_norm_rms_eps(1e-5)  # the converter's own value


def _partial_rotary(c: Config) -> float:
    return c.get("partial_rotary_factor") or _rope(c)[0].get("partial_rotary_factor") or 1.0


def _phi3(w: gguf.GGUFWriter, c: Config) -> None:
    """Phi3MiniModel writes its own keys (no TextModel ones), LongRoPE's attention factor."""
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    w.add_context_length(c["max_position_embeddings"])
    w.add_rope_scaling_orig_ctx_len(c["original_max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(int(_partial_rotary(c) * hidden) // heads)
    w.add_rope_freq_base(_rope(c)[0]["rope_theta"])
    w.add_sliding_window(c.get("sliding_window") or 0)
    if _rope(c)[0].get("rope_type") == "longrope":
        original = c["original_max_position_embeddings"]
        scale = c["max_position_embeddings"] / original
        factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        w.add_rope_scaling_attn_factors(factor)


def _gemma2(w: gguf.GGUFWriter, c: Config) -> None:
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
    w.add_final_logit_softcapping(c["final_logit_softcapping"])
    w.add_sliding_window(c["sliding_window"])


def _gemma3(w: gguf.GGUFWriter, c: Config) -> None:
    """TextModel's keys, then Gemma3Model's own over them."""
    _text_model(w, c)
    w.add_rope_freq_base(_rope(c)[0].get("rope_theta", 1_000_000.0))
    if c.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
    if c.get("sliding_window_pattern") != 1:
        w.add_sliding_window(c["sliding_window"])


_PARAMETERS: dict[str, Callable[[gguf.GGUFWriter, Config], None]] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _llama,
    "MixtralForCausalLM": _llama,
    "Qwen2ForCausalLM": _text_model,
    "Qwen3ForCausalLM": _text_model,
    "Phi3ForCausalLM": _phi3,
    "Gemma2ForCausalLM": _gemma2,
    "Gemma3ForCausalLM": _gemma3,
    "Qwen2MoeForCausalLM": _qwen_moe,
    "Qwen3MoeForCausalLM": _qwen_moe,
    "OlmoeForCausalLM": _olmoe,
}


def _write_vocabulary(w: gguf.GGUFWriter, c: Config) -> None:
    vocab = c["vocab_size"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list([chr(ord("!") + i) for i in range(vocab - 1)] + ["!!"])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges(["! !"])
    ids = {"bos": w.add_bos_token_id, "eos": w.add_eos_token_id, "pad": w.add_pad_token_id}
    for kind, add in ids.items():
        if isinstance(token := c.get(f"{kind}_token_id"), int) and token < vocab:
            add(token)


# --- tensors ---------------------------------------------------------------------------------


def _converted(
    architecture: str, c: Config, tensors: dict[str, np.ndarray]
) -> Iterator[tuple[str, np.ndarray]]:
    """(name, values) as the converter hands them to gguf-py's name map: HF names, the
    merged names of stacked experts, GGUF names of the RoPE tables it makes up."""
    yield from _rope_tables(architecture, c)
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name, values in tensors.items():
        if architecture in _LLAMA_ARCH:
            values = _permuted(name, values, c)
        if architecture in _GEMMA:
            if name == "lm_head.weight":
                continue
            if name.endswith("norm.weight"):
                values = values + 1
        parts = name.split(".")
        if "experts" in parts:  # model.layers.N.<mlp>.experts.E.<proj>.weight
            layer, expert, proj = int(parts[2]), int(parts[5]), parts[6]
            experts.setdefault((layer, proj), {})[expert] = values
            continue
        yield name, values
    for (layer, proj), by_expert in sorted(experts.items()):
        stacked = np.stack([by_expert[e] for e in range(len(by_expert))])
        if architecture == "MixtralForCausalLM":
            yield f"layers.{layer}.feed_forward.experts.{proj}.weight", stacked
        else:
            yield f"model.layers.{layer}.mlp.experts.{proj}.weight", stacked


def _permuted(name: str, values: np.ndarray, c: Config) -> np.ndarray:
    """LlamaModel.permute: each head's two rotary halves interleaved into pairs."""
    heads = c["num_attention_heads"]
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        pass
    elif name.endswith(("k_proj.weight", "k_proj.bias")):
        heads = c["num_key_value_heads"]
    else:
        return values
    rows, *rest = values.shape
    return values.reshape(heads, 2, rows // heads // 2, *rest).swapaxes(1, 2).reshape(values.shape)


def _rope_tables(architecture: str, c: Config) -> Iterator[tuple[str, np.ndarray]]:
    """Llama 3's per-frequency divisors (LlamaModel.generate_extra_tensors), Phi-3's
    LongRoPE factors (Phi3MiniModel.generate_extra_tensors)."""
    rope = _rope(c)[0]
    if architecture in _LLAMA_ARCH and rope.get("rope_type") == "llama3":
        yield "rope_freqs.weight", _llama3_divisors(c, rope)
    if architecture == "Phi3ForCausalLM" and rope.get("rope_type") == "longrope":
        yield "rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32)
        yield "rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32)


def _llama3_divisors(c: Config, rope: Config) -> np.ndarray:
    dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    original = rope.get("original_max_position_embeddings", 8192)
    divisors = []
    for freq in freqs.astype(np.float32):
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            divisors.append(1.0)
        elif wavelen > original / low:
            divisors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


_FLOAT_KINDS = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "_norm.weight")


def _stored(
    name: str, values: np.ndarray, file_type: gguf.GGMLQuantizationType
) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """(data, type) as the converter stores a tensor of a ``file_type`` file."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if values.ndim <= 1 or name.endswith(_FLOAT_KINDS) or file_type == Q.F32:
        return values, Q.F32
    try:
        return gguf.quants.quantize(values, file_type), file_type
    except gguf.QuantError:  # rows that do not fill whole blocks
        return values.astype(np.float16), Q.F16
