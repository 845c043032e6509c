"""GGUF -> Hugging Face conversion for every architecture ``gguf_arch`` knows.

Reads a GGUF with the ``gguf`` package, dequantizes every weight to float32 (undoing what
llama.cpp's converter did to it: ``gguf_arch.plan_tensor``), rebuilds the tokenizer with
``tokenizers`` (``gguf_tokenizer``: SentencePiece or byte-level BPE), and writes config.json
(``gguf_config.hf_config``), model.safetensors, tokenizer.json, tokenizer_config.json (with
the chat template), special_tokens_map.json and generation_config.json. transformers is
deliberately not used: the tests compare this converter against transformers' own GGUF loader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file
from tqdm import tqdm

from radixlm.runtime.model_store.gguf_arch import GGUFFile, open_gguf
from radixlm.runtime.model_store.gguf_config import hf_config
from radixlm.runtime.model_store.gguf_tokenizer import GGUFVocab, build_tokenizer, read_vocab
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
            serves (``UnsupportedArchitectureError``), its tokenizer is neither SentencePiece
            nor a byte-level BPE with a pre-tokenizer ``gguf_tokenizer`` knows, or a tensor
            is unknown.
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
    vocab = read_vocab(meta)
    build_tokenizer(vocab).save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(meta))
    special = _special_tokens(vocab)
    _write_json(out_dir / "special_tokens_map.json", special)
    tokenizer_config = _tokenizer_config(meta, vocab, special, config)
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    keys = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
            "pad_token_id": "padding_token_id"}  # fmt: skip
    return {
        hf: meta[f"tokenizer.ggml.{key}"]
        for hf, key in keys.items()
        if f"tokenizer.ggml.{key}" in meta
    }


# --- tokenizer -------------------------------------------------------------------------------


def _special_tokens(vocab: GGUFVocab) -> dict[str, str]:
    ids = {"bos_token": vocab.bos_id, "eos_token": vocab.eos_id, "pad_token": vocab.pad_id,
           "unk_token": vocab.unk_id}  # fmt: skip
    return {name: vocab.tokens[i] for name, i in ids.items() if i is not None}


def _tokenizer_config(
    meta: dict[str, Any], vocab: GGUFVocab, special: dict[str, str], config: dict[str, Any]
) -> dict[str, Any]:
    # transformers rebuilds the post-processor from add_bos/eos_token: they must be the
    # vocabulary's own (llama.cpp's defaults included), as tokenizer.json has them.
    result: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": vocab.add_bos,
        "add_eos_token": vocab.add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    if "tokenizer.chat_template" in meta:
        result["chat_template"] = meta["tokenizer.chat_template"]
    return result
