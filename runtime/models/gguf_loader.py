"""Loads a GGUF file (any architecture ``radixlm.runtime.model_store.gguf_arch`` knows)
straight into ``DecoderForCausalLM``, its weights kept at the file's precision instead
of converted to float.

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

Each expert of a mixture-of-experts layer is a layer of its own here (its slice of
the file's stacked tensors); the routers stay float, as in every model.

The vocabulary (embedding, and the LM head or the tied matrix) is float when its
file tensors are, int8 groups when they are 4- to 8-bit (exact), else int8 per
channel as with ``--quantization`` (radixlm.runtime.layers.quantization). Norms
stay float.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from radixlm.runtime.attention import AttentionBackend
from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.quantization import INT4_ROWS_MULTIPLE, Quantization, RowBlocks
from radixlm.runtime.model_store.gguf_weights import FLOAT_TYPES, GGUFMatrix, read_gguf_matrices
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.layer_storage import part_names, restore_layers, weight_layers
from radixlm.runtime.models.loader import canonical_name, load_weights

if TYPE_CHECKING:
    from radixlm.runtime.distributed.group import TensorParallelGroup

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
    tp: TensorParallelGroup | None = None,
) -> tuple[DecoderForCausalLM, str]:
    """The model with the file's weights, and what its layers store (e.g.
    ``"GGUF: int4 x210, int8g x1"``, the vocabulary counted once).

    ``tp``: this rank's shard of a tensor-parallel model (``config`` is the whole
    model's; each tensor, codes included, is cut to the rank's slice as it is read).

    Raises:
        ModelNotFoundError / ModelLoadError: an unreadable file, an unknown tensor, or
            tensors that do not match ``config``.
    """
    architecture = config.architecture
    matrices = {canonical_name(architecture, m.name): m for m in read_gguf_matrices(gguf_path)}
    # every linear layer in the vocabulary's storage first (a float file: float; else
    # about a byte a weight, never the float model in memory: int8 per channel where the
    # vocabulary's groups do not divide every layer's width), then each layer whose file
    # tensors another storage holds better is rebuilt with it
    if tp is not None:
        config = tp.plan.local_arch()
    vocabulary = _vocabulary([matrices[n] for n in _VOCABULARY if n in matrices])
    first = vocabulary if _fits_every_layer(vocabulary, config) else _INT8
    model = DecoderForCausalLM(config, attn_backend, dtype, device, first, tp)
    if first != vocabulary:
        layers = LayerFactory(dtype, device, vocabulary)
        model.model.embed_tokens, model.lm_head = layers.vocab_layers(
            config.vocab_size, config.hidden_size, config.tie_word_embeddings
        )

    def storage(name: str, shape: tuple[int, int]) -> Quantization | None:
        names = (f"{part}.weight" for part in part_names(name))
        return _storage(shape, [matrices[n] for n in names if n in matrices])

    kinds = restore_layers(model, weight_layers(model), first, storage)
    kinds[vocabulary.method if vocabulary else "float"] += 1
    tensors = _tensors(matrices.values())
    if tp is not None:
        tensors = tp.plan.shard_tensors((canonical_name(architecture, n), t) for n, t in tensors)
    load_weights(model, tensors)
    return model, "GGUF: " + ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items()))


def _vocabulary(parts: list[GGUFMatrix]) -> Quantization | None:
    """The vocabulary's storage (None: float); see the module doc."""
    if parts and all(part.ggml_type in FLOAT_TYPES for part in parts):
        return None
    return _int8_groups(parts) or _INT8


def _fits_every_layer(storage: Quantization | None, config: ArchConfig) -> bool:
    """Whether ``storage``'s groups divide every linear layer's input width (a file's
    F16 matrices may have widths its 8-bit vocabulary's blocks do not divide)."""
    if storage is None or storage.method == "int8":
        return True
    widths = {config.hidden_size, config.num_heads * config.head_dim, config.intermediate_size}
    if config.moe is not None:
        widths |= {config.moe.intermediate_size, config.moe.shared_expert_size or 0}
    return all(width % storage.group_size == 0 for width in widths)


def _storage(shape: tuple[int, int], parts: list[GGUFMatrix]) -> Quantization | None:
    """What holds ``parts`` of a layer of (out, in) ``shape`` best (None: a float
    layer); see the module doc."""
    if parts and all(part.four_bit for part in parts) and shape[0] % INT4_ROWS_MULTIPLE == 0:
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


def _tensors(
    matrices: Iterable[GGUFMatrix],
) -> Iterator[tuple[str, torch.Tensor | RowBlocks]]:
    """Each matrix a block of rows at a time (codes or float32 values), the rest whole."""
    for matrix in matrices:
        if len(matrix.shape) == 2:
            yield matrix.name, matrix.row_blocks()
        else:
            yield matrix.name, torch.from_numpy(matrix.dequantize())
