"""Loads a quantized checkpoint directory (AWQ, GPTQ, compressed-tensors, FP8: see
radixlm.runtime.models.checkpoint_formats) into ``DecoderForCausalLM``, each layer
kept at the file's precision.

The tensors' headers are read first and each linear layer takes the storage that
holds its file tensors (a fused layer looks at all its parts)::

    every part 4-bit, out % 16 == 0   int4 (torch's int4 kernel), groups of the file's
                                      size (a per-channel file: 128, 64 or 32): the
                                      codes as they are, scales and zero points in bf16
                                      (what the kernel reads), as GGUF's 4-bit blocks
    every part 4- or 8-bit            int8 groups of 32 (or 16): codes, scales and
                                      zero points exactly (float32)
    otherwise (FP8, float parts)      a float layer in the model's dtype: FP8 values
                                      times their scales, rounded once

The vocabulary and norms stay as the file has them (float); a quantized LM head (a
GPTQ ``lm_head``) is a layer like the others. Activation scales (W8A8 and FP8 files'
``input_scale``) and KV scales are not used: activations stay in the model's dtype and
a quantized KV cache scales each token itself.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from radixlm.runtime.attention import AttentionBackend
from radixlm.runtime.layers.quantization import (
    INT4_ROWS_MULTIPLE,
    Codes,
    Quantization,
    RowBlocks,
)
from radixlm.runtime.models.checkpoint_formats import (
    IGNORED_SUFFIXES,
    CheckpointQuantization,
    LayerCodes,
    QuantizedCheckpointError,
    layer_codes,
    module_weight,
)
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.layer_storage import part_names, restore_layers, weight_layers
from radixlm.runtime.models.loader import (
    FUSED_PARTS,
    canonical_name,
    checkpoint_files,
    load_weights,
    read_tensors,
)

if TYPE_CHECKING:
    from radixlm.runtime.distributed.group import TensorParallelGroup

__all__ = ["load_quantized_model"]

# the tensor that marks a layer as quantized, per format
_MARKERS = {
    "awq": ("qweight",),
    "gptq": ("qweight",),
    "compressed-tensors": ("weight_packed", "weight_scale"),
    "fp8": ("weight_scale_inv", "weight_scale"),
}
_KV_SCALES = ("k_scale", "v_scale")  # FP8 files' static KV scales
# safetensors' names of the dtypes a quantized layer's ``weight`` may have
_DTYPES = {"I8": torch.int8, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


@dataclasses.dataclass
class _Layer:
    """A quantized layer of the file: its tensors' names by suffix, what they hold."""

    names: dict[str, str]
    codes: LayerCodes


def load_quantized_model(
    model_dir: Path,
    quant: CheckpointQuantization,
    attn_backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device | str,
    config: ArchConfig,
    tp: TensorParallelGroup | None = None,
) -> tuple[DecoderForCausalLM, str]:
    """The model with the file's weights, and what its layers store (e.g.
    ``"AWQ 4-bit, group 128: float x1, int4 x112"``, the vocabulary counted once).

    Raises:
        QuantizedCheckpointError: tensors the format does not have, or a layout not served.
        ModelLoadError: tensors that do not match ``config``.
    """
    files = checkpoint_files(Path(model_dir))
    architecture = config.architecture
    headers = _headers(files)
    layers = _quantized_layers(quant, files, headers, architecture)
    tie = config.tie_word_embeddings or not any(n.startswith("lm_head.") for n in headers)
    local = tp.plan.local_arch() if tp is not None else config
    model = DecoderForCausalLM(
        dataclasses.replace(local, tie_word_embeddings=tie), attn_backend, dtype, device, None, tp
    )
    float_weights = {canonical_name(architecture, n).removesuffix(".weight") for n in headers}

    def storage(name: str, shape: tuple[int, int]) -> Quantization | None:
        parts = [part for part in part_names(name) if part in layers or part in float_weights]
        if not parts or any(part not in layers for part in parts):
            return None
        return _storage(shape, [layers[part].codes for part in parts])

    kinds = restore_layers(model, weight_layers(model, with_head=not tie), None, storage)
    if tie:  # the vocabulary, counted once: an untied one as its LM head
        kinds["float"] += 1
    tensors = _tensors(quant, read_tensors(files), layers, model)
    if tp is not None:
        tensors = tp.plan.shard_tensors((canonical_name(architecture, n), t) for n, t in tensors)
    load_weights(model, tensors)
    stored = ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items()))
    return model, f"{quant.describe()}: {stored}"


def _headers(files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor's (shape, safetensors dtype name), without reading its data."""
    headers = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                headers[name] = (tuple(piece.get_shape()), piece.get_dtype())
    return headers


def _quantized_layers(
    quant: CheckpointQuantization,
    files: list[Path],
    headers: dict[str, tuple[tuple[int, ...], str]],
    architecture: str,
) -> dict[str, _Layer]:
    """The file's quantized layers by canonical module name."""
    by_module: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for name in headers:
        module, _, suffix = name.rpartition(".")
        by_module[module][suffix] = name
    members = (*quant.suffixes, "weight")
    layers = {}
    for module, names in by_module.items():
        if not any(marker in names for marker in _MARKERS[quant.method]):
            continue
        own = {suffix: name for suffix, name in names.items() if suffix in members}
        shapes = {suffix: headers[name][0] for suffix, name in own.items()}
        weight_dtype = _DTYPES.get(headers[own["weight"]][1]) if "weight" in own else None
        weight_shape = _small_tensor(files, own["weight_shape"]) if "weight_shape" in own else None
        codes = layer_codes(quant, shapes, weight_dtype, weight_shape)
        layers[canonical_name(architecture, f"{module}.weight").removesuffix(".weight")] = _Layer(
            own, codes
        )
    return layers


def _small_tensor(files: list[Path], name: str) -> tuple[int, int]:
    for file in files:
        with safe_open(file, framework="pt") as f:
            if name in f.keys():
                out_features, in_features = (int(n) for n in f.get_tensor(name).tolist())
                return out_features, in_features
    raise QuantizedCheckpointError(f"tensor {name!r} is listed but absent")


def _storage(shape: tuple[int, int], parts: list[LayerCodes]) -> Quantization | None:
    """What holds every part's codes (see the module doc); None: a float layer."""
    if any(part.bits is None for part in parts):
        return None
    group = min(part.group_size for part in parts)
    if any(part.group_size % group for part in parts):
        return None
    if all(part.bits == 4 for part in parts) and shape[0] % INT4_ROWS_MULTIPLE == 0:
        for size in (128, 64, 32):
            if group % size == 0:
                return Quantization("int4", size)
    for size in (32, 16):
        if group % size == 0:
            return Quantization("int8g", size)
    return None


def _tensors(
    quant: CheckpointQuantization,
    tensors: Iterator[tuple[str, torch.Tensor]],
    layers: dict[str, _Layer],
    model: DecoderForCausalLM,
) -> Iterator[tuple[str, torch.Tensor | Codes | RowBlocks]]:
    """The file's tensors with each quantized layer's turned into its weight (as soon
    as all of them are read, and then no longer held here); activation and KV scales
    dropped, and the all-zero biases some GPTQ files store for layers without one."""
    by_name = {name: module for module, layer in layers.items() for name in layer.names.values()}
    pending: dict[str, dict[str, torch.Tensor]] = collections.defaultdict(dict)
    architecture = model.config.architecture
    for name, tensor in tensors:
        module, _, suffix = name.rpartition(".")
        if suffix in IGNORED_SUFFIXES or suffix in _KV_SCALES:
            continue
        layer_name = by_name.get(name)
        if layer_name is None:
            if suffix == "bias" and _unwanted_bias(model, architecture, module, tensor):
                continue
            yield name, tensor
            continue
        pending[layer_name][suffix] = tensor
        if len(pending[layer_name]) == len(layers[layer_name].names):
            yield f"{module}.weight", module_weight(quant, layer_name, pending.pop(layer_name))


def _unwanted_bias(
    model: DecoderForCausalLM, architecture: str, module: str, tensor: torch.Tensor
) -> bool:
    canonical = canonical_name(architecture, f"{module}.bias").removesuffix(".bias")
    try:
        layer = model.get_submodule(_fused_name(canonical))
    except AttributeError:
        return False
    return getattr(layer, "bias", None) is None and not tensor.any()


def _fused_name(module: str) -> str:
    """The model's layer a checkpoint module fills (q_proj -> qkv_proj, ...)."""
    path, _, leaf = module.rpartition(".")
    return f"{path}.{FUSED_PARTS.get(leaf, (leaf, 0))[0]}"
