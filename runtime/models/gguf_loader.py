"""Loads a Llama GGUF file straight into ``DecoderForCausalLM``, its weights kept at the
file's precision instead of converted to float.

Each linear layer takes the storage that holds its file tensors best (a fused layer
looks at all its parts)::

    every part 4-bit (Q4_0, Q4_1, Q4_K)   int4, groups of 32: the file's codes as they
                                          are, scales and zero points in bf16
    every part float (F32, F16, BF16)     a float layer in the activation dtype
    every part 4- to 8-bit (Q8_0, Q5_0,   int8 groups (16 where a part is Q6_K, else
      Q5_1, Q5_K, Q6_K, and the above)    32): the file's codes exactly, float32 scales
                                          and zero points
    otherwise (Q2_K, Q3_K, IQ*, mixes     int8 per output channel, from gguf's
      with float parts)                   dequantized values

The vocabulary (embedding, and the LM head or the tied matrix) is int8 groups when
its file tensors are 4- to 8-bit (exact), else int8 per channel as with
``--quantization`` (radixlm.runtime.layers.quantization). Norms stay float.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from radixlm.runtime.attention import AttentionBackend
from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.quantization import (
    INT4_ROWS_MULTIPLE,
    Codes,
    Quantization,
    QuantizedLinear,
)
from radixlm.runtime.model_store.gguf_weights import FLOAT_TYPES, GGUFMatrix, read_gguf_matrices
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.loader import FUSED_PARTS, load_weights

__all__ = ["load_gguf_model"]

_INT4 = Quantization("int4", 32)
_INT8 = Quantization("int8")
_VOCABULARY = ("model.embed_tokens.weight", "lm_head.weight")


def load_gguf_model(
    gguf_path: Path,
    attn_backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device | str,
    config: ArchConfig,
) -> tuple[DecoderForCausalLM, str]:
    """The model with the file's weights, and what its layers store (e.g.
    ``"GGUF: int4 x210, int8g x1"``, the vocabulary counted once).

    Raises:
        ModelNotFoundError / ModelLoadError: an unreadable file, an unknown tensor, or
            tensors that do not match ``config``.
    """
    matrices = {m.name: m for m in read_gguf_matrices(gguf_path)}
    # every linear layer in the vocabulary's storage first (about a byte a weight: never
    # the float model in memory), then each layer whose file tensors another storage
    # holds better is rebuilt with it
    vocabulary = _int8_groups([matrices[n] for n in _VOCABULARY if n in matrices]) or _INT8
    model = DecoderForCausalLM(config, attn_backend, dtype, device, vocabulary)
    kinds = collections.Counter({vocabulary.method: 1})
    for name, linear in list(model.named_modules()):
        if not isinstance(linear, QuantizedLinear) or name == "lm_head":
            continue
        storage = _storage(
            linear, [matrices[part] for part in _part_names(name) if part in matrices]
        )
        kinds[storage.method if storage else "float"] += 1
        if storage != vocabulary:
            layers = LayerFactory(dtype, device, storage)
            rebuilt = layers.linear(
                linear.in_features, linear.out_features, linear.bias is not None
            )
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, rebuilt)
    load_weights(model, _tensors(matrices.values()))
    return model, "GGUF: " + ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items()))


def _part_names(module_name: str) -> list[str]:
    """The HF tensor names a (possibly fused) linear layer is filled from."""
    path, _, leaf = module_name.rpartition(".")
    parts = [hf for hf, (fused, _) in FUSED_PARTS.items() if fused == leaf]
    return [f"{path}.{part}.weight" for part in parts or [leaf]]


def _storage(linear: QuantizedLinear, parts: list[GGUFMatrix]) -> Quantization | None:
    """What holds ``parts`` best (None: a float layer); see the module doc."""
    if (
        parts
        and all(part.four_bit for part in parts)
        and linear.out_features % INT4_ROWS_MULTIPLE == 0
    ):
        return _INT4
    if parts and all(part.ggml_type in FLOAT_TYPES for part in parts):
        return None
    return _int8_groups(parts) or _INT8


def _int8_groups(parts: list[GGUFMatrix]) -> Quantization | None:
    """int8 groups that hold every part's codes exactly, if every part has codes."""
    groups = [part.code_group for part in parts]
    if not groups or None in groups:
        return None
    return Quantization("int8g", min(groups))  # 16 divides 32


def _tensors(matrices: Iterable[GGUFMatrix]) -> Iterator[tuple[str, torch.Tensor | Codes]]:
    for matrix in matrices:
        if matrix.code_group is not None:
            yield matrix.name, matrix.codes()
        else:
            yield matrix.name, torch.from_numpy(matrix.dequantize())
