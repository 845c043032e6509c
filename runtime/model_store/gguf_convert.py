"""GGUF -> Hugging Face conversion for every architecture ``gguf_arch`` knows.

Reads a GGUF with the ``gguf`` package, dequantizes every weight to float32 (undoing what
llama.cpp's converter did to it: ``gguf_arch.plan_tensor``), rebuilds the byte-level BPE
tokenizer with ``tokenizers``, and writes config.json (``gguf_config.hf_config``),
model.safetensors, tokenizer.json, tokenizer_config.json (with the chat template),
special_tokens_map.json and generation_config.json. transformers is deliberately not used:
the tests compare this converter against transformers' own GGUF loader.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from tqdm import tqdm

from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.model_store.gguf_arch import GGUFFile, open_gguf
from radixlm.runtime.model_store.gguf_config import hf_config
from radixlm.runtime.model_store.gguf_weights import read_gguf_matrices

__all__ = ["convert_gguf_to_hf", "write_hf_metadata"]


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, progress: bool = False) -> None:
    """Write a Hugging Face directory (float32 weights) from a GGUF.

    Args:
        gguf_path: the GGUF file; every tensor is dequantized to float32.
        out_dir: the directory to fill (created if missing); existing files are overwritten.
        progress: show a progress bar over tensors.

    Raises:
        ModelLoadError: the file is not a readable GGUF, its architecture is not one radixlm
            serves (``UnsupportedArchitectureError``), its tokenizer is not a byte-level BPE
            this converter knows, or a tensor is unknown.
    """
    file = open_gguf(Path(gguf_path))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    matrices = tqdm(
        read_gguf_matrices(file), desc="converting", unit="tensor", disable=not progress
    )
    tensors = {matrix.name: matrix.dequantize() for matrix in matrices}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_hf_metadata(file, out_dir)


def write_hf_metadata(file: GGUFFile, out_dir: Path) -> None:
    """Everything of the Hugging Face directory but the weights: config.json, the
    tokenizer (with the chat template) and the generation config (``out_dir`` is
    created if missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = hf_config(file)
    meta = file.meta
    _build_tokenizer(meta).save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(meta))
    special = _special_tokens(meta)
    _write_json(out_dir / "special_tokens_map.json", special)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(meta, special, config))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _require(meta: dict[str, Any], key: str) -> Any:
    if key not in meta:
        raise ModelLoadError(f"GGUF metadata has no {key!r}")
    return meta[key]


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
