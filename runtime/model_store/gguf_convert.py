"""GGUF -> Hugging Face conversion for Llama-architecture files.

Reads a GGUF with the ``gguf`` package, dequantizes every tensor to float32 (undoing
llama.cpp's rotary row permutation of q/k), rebuilds the byte-level BPE tokenizer with
``tokenizers``, and writes config.json, model.safetensors, tokenizer.json,
tokenizer_config.json (with the chat template), special_tokens_map.json and
generation_config.json. transformers is deliberately not used: the tests compare this
converter against transformers' own GGUF loader.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from tqdm import tqdm

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError

__all__ = [
    "convert_gguf_to_hf",
    "hf_name",
    "open_llama_gguf",
    "unpermute_rotary_rows",
    "write_hf_metadata",
]


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, progress: bool = False) -> None:
    """Write a Hugging Face Llama directory (float32 weights) from a Llama GGUF.

    Args:
        gguf_path: the GGUF file; every tensor is dequantized to float32.
        out_dir: the directory to fill (created if missing); existing files are overwritten.
        progress: show a progress bar over tensors.

    Raises:
        ModelLoadError: the file is not a readable GGUF, its architecture is not ``llama``, its
            tokenizer is not a byte-level BPE this converter knows, or a tensor is unknown.
    """
    reader, meta = open_llama_gguf(Path(gguf_path))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = _hf_tensors(reader, meta, progress)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_hf_metadata(reader, meta, out_dir)


def open_llama_gguf(path: Path) -> tuple[gguf.GGUFReader, dict[str, Any]]:
    """The reader of a Llama GGUF and its metadata (name -> value).

    Raises:
        ModelNotFoundError: no such file.
        ModelLoadError: not a readable GGUF, or its architecture is not ``llama``.
    """
    reader = _open_gguf(path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"{path}: architecture {arch!r} is not supported (only 'llama')")
    return reader, meta


def write_hf_metadata(reader: gguf.GGUFReader, meta: dict[str, Any], out_dir: Path) -> None:
    """Everything of the Hugging Face directory but the weights: config.json, the
    tokenizer (with the chat template) and the generation config (``out_dir`` is
    created if missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tied = "output.weight" not in {tensor.name for tensor in reader.tensors}
    config = _llama_config(meta, tied=tied)
    _build_tokenizer(meta).save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(meta))
    special = _special_tokens(meta)
    _write_json(out_dir / "special_tokens_map.json", special)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(meta, special, config))


def _open_gguf(path: Path) -> gguf.GGUFReader:
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file {path} does not exist")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _require(meta: dict[str, Any], key: str) -> Any:
    if key not in meta:
        raise ModelLoadError(f"GGUF metadata has no {key!r}")
    return meta[key]


def _f32(value: float) -> float:
    # GGUF stores floats as float32; the shortest float32 repr recovers the intended decimal
    # (1e-05 rather than 9.999999747378752e-06).
    return float(str(np.float32(value)))


# --- weights ---------------------------------------------------------------------------------

_LM_HEAD = "lm_head.weight"
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": _LM_HEAD,
}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); ModelLoadError for an unknown one."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _BLOCK_TENSOR_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_TENSORS:
        raise ModelLoadError(f"GGUF tensor {gguf_name!r} has no Llama counterpart")
    layer, part = match.groups()
    return f"model.layers.{layer}.{_BLOCK_TENSORS[part]}.weight"


def _hf_tensors(
    reader: gguf.GGUFReader, meta: dict[str, Any], progress: bool
) -> dict[str, np.ndarray]:
    num_heads = int(_require(meta, "llama.attention.head_count"))
    num_kv_heads = int(meta.get("llama.attention.head_count_kv", num_heads))
    tensors: dict[str, np.ndarray] = {}
    for tensor in tqdm(reader.tensors, desc="converting", unit="tensor", disable=not progress):
        # GGUF lists dimensions fastest-first; numpy (and HF) want them slowest-first.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        if tensor.name.endswith(".attn_q.weight"):
            weight = unpermute_rotary_rows(weight, num_heads)
        elif tensor.name.endswith(".attn_k.weight"):
            weight = unpermute_rotary_rows(weight, num_kv_heads)
        tensors[hf_name(tensor.name)] = np.ascontiguousarray(weight, dtype=np.float32)
    return tensors


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k rows so HF's rotate-half RoPE applies again.

    HF keeps each head's rotary dims as two halves; llama.cpp's converter interleaves them into
    pairs for its GPT-J-style RoPE. Per head, with half = head_dim // 2:

        HF row (s, i)  -- s in {0, 1}, i < half --  is GGUF row (i, s)
    """
    rows, *cols = weight.shape  # (H * D, hidden), or (H * D, ...) of per-row values
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *cols).swapaxes(1, 2).reshape(rows, *cols)


# --- config ----------------------------------------------------------------------------------


def _llama_config(meta: dict[str, Any], tied: bool) -> dict[str, Any]:
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise ModelLoadError(f"GGUF RoPE scaling {scaling!r} is not supported")
    hidden = int(_require(meta, "llama.embedding_length"))
    num_heads = int(_require(meta, "llama.attention.head_count"))
    head_dim = int(meta.get("llama.attention.key_length", hidden // num_heads))
    rotary_dim = int(meta.get("llama.rope.dimension_count", head_dim))
    if rotary_dim != head_dim:  # HF's Llama rotates the whole head
        raise ModelLoadError(f"GGUF rotary dim {rotary_dim} != head dim {head_dim}: unsupported")
    tokens = _require(meta, "tokenizer.ggml.tokens")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_require(meta, "llama.feed_forward_length")),
        "num_hidden_layers": int(_require(meta, "llama.block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(_require(meta, "llama.context_length")),
        "rms_norm_eps": _f32(_require(meta, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": int(meta.get("llama.vocab_size", len(tokens))),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    keys = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
            "pad_token_id": "padding_token_id"}  # fmt: skip
    return {
        hf: meta[f"tokenizer.ggml.{key}"]
        for hf, key in keys.items()
        if f"tokenizer.ggml.{key}" in meta
    }


# --- tokenizer -------------------------------------------------------------------------------


def _smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # llama.cpp's "smollm" splits every digit on its own, then applies the GPT-2 regex.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _gpt2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


# Keyed by llama.cpp's pre-tokenizer name (``tokenizer.ggml.pre``); each splits text the way
# that vocabulary's merges were learned, so a wrong one silently changes token ids.
_PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "smollm": _smollm_pre_tokenizer,
    "gpt-2": _gpt2_pre_tokenizer,
    "gpt2": _gpt2_pre_tokenizer,
}


def _build_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(f"GGUF tokenizer {kind!r} is not supported (only byte-level 'gpt2')")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in _PRE_TOKENIZERS:
        raise ModelLoadError(
            f"GGUF pre-tokenizer {pre!r} is not supported (known: {sorted(_PRE_TOKENIZERS)})"
        )
    tokens: list[str] = _require(meta, "tokenizer.ggml.tokens")
    merges = [tuple(merge.split(" ")) for merge in _require(meta, "tokenizer.ggml.merges")]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(meta, tokens)
    token_types = meta.get("tokenizer.ggml.token_type") or [gguf.TokenType.NORMAL] * len(tokens)
    _add_marked_tokens(tokenizer, tokens, token_types)
    return tokenizer


def _post_processor(meta: dict[str, Any], tokens: list[str]) -> processors.PostProcessor:
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    if not meta.get("tokenizer.ggml.add_bos_token", False) or bos_id is None:
        return processors.ByteLevel(trim_offsets=False)
    bos = tokens[bos_id]
    return processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
    )


def _add_marked_tokens(tokenizer: Tokenizer, tokens: list[str], token_types: list[int]) -> None:
    # Control tokens (<|im_start|>, ...) must be matched whole and skipped when decoding with
    # skip_special_tokens; user-defined ones are matched whole but decoded as text.
    kinds = list(zip(tokens, token_types, strict=True))
    control = [token for token, kind in kinds if kind == gguf.TokenType.CONTROL]
    user = [token for token, kind in kinds if kind == gguf.TokenType.USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])


def _special_tokens(meta: dict[str, Any]) -> dict[str, str]:
    tokens = meta["tokenizer.ggml.tokens"]
    keys = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
            "pad_token": "padding_token_id", "unk_token": "unknown_token_id"}  # fmt: skip
    return {
        name: tokens[meta[f"tokenizer.ggml.{key}"]]
        for name, key in keys.items()
        if f"tokenizer.ggml.{key}" in meta
    }


def _tokenizer_config(
    meta: dict[str, Any], special: dict[str, str], config: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    if "tokenizer.chat_template" in meta:
        result["chat_template"] = meta["tokenizer.chat_template"]
    return result
