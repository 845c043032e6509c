"""Loads a HF safetensors checkpoint into ``DecoderForCausalLM``.

Checkpoint layouts: ``model.safetensors``, or shards listed by
``model.safetensors.index.json``. Tensors are read one at a time (``safe_open``)
and copied, cast to the model dtype, into the parameters; fused parameters
take their HF parts as row slices::

    HF name                               -> our parameter                 rows
    model.layers.N.self_attn.q_proj.W     -> ...self_attn.qkv_proj.W      [0, H*D)
    model.layers.N.self_attn.k_proj.W     -> ...self_attn.qkv_proj.W      [H*D, (H+Hkv)*D)
    model.layers.N.self_attn.v_proj.W     -> ...self_attn.qkv_proj.W      [(H+Hkv)*D, (H+2Hkv)*D)
    model.layers.N.mlp.gate_proj.W        -> ...mlp.gate_up_proj.W        [0, I)
    model.layers.N.mlp.up_proj.W          -> ...mlp.gate_up_proj.W        [I, 2I)
    ...experts.E.gate_proj/up_proj.W      -> ...experts.E.gate_up_proj.W  (the same halves)
    ...qkv_proj.W, ...gate_up_proj.W      -> the whole fused parameter (Phi-3 stores them so)
    anything else                         -> the parameter of the same name

Families whose checkpoints name things otherwise are renamed first
(``canonical_name``): Mixtral's ``block_sparse_moe.experts.E.w1/w3/w2`` are the
experts' ``gate_proj/up_proj/down_proj`` under ``mlp``. Gemma's norms store ``1 + w``
once loaded (``DecoderForCausalLM.fold_norm_offsets``).

Embeddings are tied when the config says so or the checkpoint has no
``lm_head.weight`` (a tied checkpoint's redundant ``lm_head.weight`` is skipped).
Every parameter slice must be filled exactly once: missing and unexpected
tensors raise ``ModelLoadError`` naming them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from torch import nn

from radixlm.runtime.attention import AttentionBackend
from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError
from radixlm.runtime.host_memory import release_free_memory
from radixlm.runtime.layers.factory import prepare_layers
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import (
    Codes,
    Int4Codes,
    Int8Codes,
    Quantization,
    QuantizedEmbedding,
    QuantizedLinear,
    QuantizedWeight,
    RowBlocks,
    RowSlot,
)
from radixlm.runtime.models.config import ArchConfig
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.moe import SparseMoE

if TYPE_CHECKING:
    from radixlm.runtime.distributed.group import TensorParallelGroup

__all__ = [
    "load_model",
    "load_weights",
    "parse_dtype",
    "read_tensors",
    "checkpoint_files",
    "checkpoint_tensor_names",
    "canonical_name",
    "checkpoint_name",
]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# HF part name -> (our fused module name, index of the part).
FUSED_PARTS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# Buffers some older checkpoints saved; recomputed here, so skipped.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Mixtral's names -> the ones every other family uses (a checkpoint name's pieces)
_MIXTRAL_PIECES = {"block_sparse_moe": "mlp", "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MAX_NAMES_IN_ERROR = 10
# Weights copied between two hand-backs of the C heap's free memory to the OS: glibc keeps
# the temporaries a tensor's copy frees (a heap's top up to twice the largest buffer freed
# so far, 64 MiB at most, per thread arena; a hole below a live buffer for good), and
# over a load's tensors what it keeps would outgrow one tensor's temporaries.
_RELEASE_EVERY_WEIGHTS = 1 << 24


def parse_dtype(name: str, config_dtype: str | None = None) -> torch.dtype:
    """Maps a dtype name to a torch dtype.

    ``"auto"`` follows the checkpoint (``config_dtype``, i.e. ``ArchConfig.torch_dtype``)
    like HF's ``torch_dtype="auto"``, and falls back to float32 when the config
    names none or a non-float type.

    Raises:
        ValueError: an unknown name.
    """
    key = name.lower().removeprefix("torch.")
    if key == "auto":
        return _DTYPES.get((config_dtype or "").removeprefix("torch."), torch.float32)
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(_DTYPES)} or auto")
    return _DTYPES[key]


def load_model(
    model_dir: str | Path,
    attn_backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    config: ArchConfig | None = None,
    quantization: Quantization | None = None,
    tp: TensorParallelGroup | None = None,
) -> DecoderForCausalLM:
    """Builds the model described by ``model_dir/config.json`` and loads its weights.

    Args:
        model_dir: a HF model directory with config.json and safetensors weights.
        attn_backend: the attention backend every layer calls.
        dtype: parameter dtype (weights are cast to it).
        device: where parameters live.
        config: the already parsed config (read from model_dir when None).
        quantization: store the linear layers' weights quantized, each tensor as it
            is read (the float model is never in memory whole); dtype is then the
            activations'.
        tp: load this rank's shard of a tensor-parallel model (each tensor cut to its
            slice as it is read: ``ShardPlan.shard_tensor``).

    Raises:
        ModelNotFoundError: model_dir, config.json or the weights are absent.
        UnsupportedArchitectureError: config.json names an unsupported model.
        ModelLoadError: missing, unexpected or mis-shaped tensors.
    """
    config = config or ArchConfig.from_model_dir(model_dir)
    files = checkpoint_files(Path(model_dir))
    tie = config.tie_word_embeddings or "lm_head.weight" not in checkpoint_tensor_names(files)
    config = dataclasses.replace(config, tie_word_embeddings=tie)
    tensors = read_tensors(files)
    if tp is not None:
        config = dataclasses.replace(tp.plan.local_arch(), tie_word_embeddings=tie)
        tensors = tp.plan.shard_tensors(
            (canonical_name(config.architecture, name), t) for name, t in tensors
        )
    model = DecoderForCausalLM(config, attn_backend, dtype, device, quantization, tp)
    load_weights(model, tensors)
    return model


def checkpoint_tensor_names(files: list[Path]) -> set[str]:
    """Names of every tensor stored in the given safetensors files."""
    names: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt") as f:
            names.update(f.keys())
    return names


Source = torch.Tensor | Codes | RowBlocks  # what a loader's tensor stream carries


def load_weights(model: DecoderForCausalLM, tensors: Iterator[tuple[str, Source]]) -> None:
    """Copies HF-named tensors into ``model``; every parameter must be filled exactly once.

    A tensor may come as codes (a GGUF file's quantized blocks), or as ``RowBlocks`` read
    a block of rows at a time: a quantized layer that holds codes exactly keeps them
    (``RowSlot.takes_codes``), any other target takes their float values.

    Then prepares every linear layer's kernel for the final weights (``prepare_layers``).

    Memory (``benchmarks/bench_load_memory.py``): each tensor is copied as it arrives
    and dropped, a ``RowBlocks`` one block at a time; int4 codes go into their packed
    layout as their rows arrive; a float linear weight that arrives whole in its
    dtype (a safetensors file's tensor: the file's mapped pages) is held as it came
    until it is laid out for the kernels, so its values are copied once, into that
    layout, not into a parameter and again; and nothing holds the parameters' old
    storage when the layers are laid out. No parameter shares memory with a source
    tensor once loaded.

    Raises:
        ModelLoadError: a tensor has no parameter, a parameter got no tensor, or a
            shape differs.
    """
    held = _fill(model, tensors)  # returns holding no view of a parameter
    model.fold_norm_offsets()
    prepare_layers(model)
    for weight, source in held:  # not laid out anew (no CPU kernel): its own copy
        if weight.data.data_ptr() == source:
            weight.data = weight.data.clone()
    release_free_memory()
    if model.device.type == "cuda":  # the Triton grouped-experts kernel takes them stacked
        for module in model.modules():
            if isinstance(module, SparseMoE):
                module.stack_experts()


def _fill(
    model: DecoderForCausalLM, tensors: Iterator[tuple[str, Source]]
) -> list[tuple[nn.Parameter, int]]:
    """``load_weights``' copies: every target filled exactly once, each quantized weight
    packed once complete. Returns the linear weights that hold their source tensor
    itself, each with the address of that tensor's data."""
    targets, fused = _targets(model)
    quantized = _quantized_parts(targets)
    filled: set[str] = set()
    unexpected: list[str] = []
    held: list[tuple[nn.Parameter, int]] = []
    unreleased = 0  # weights copied since the heap's free memory was last released
    for name, tensor in tensors:
        name = canonical_name(model.config.architecture, name)
        tied_head = name == "lm_head.weight" and model.config.tie_word_embeddings
        if name.endswith(_IGNORED_SUFFIXES) or tied_head:
            continue
        target, parts = targets.get(name), (name,)
        if target is None and name in fused:
            target, parts = fused[name]
        if target is None:
            unexpected.append(name)
            continue
        if filled.intersection(parts):
            raise ModelLoadError(f"tensor {name!r} appears twice in the checkpoint")
        _check_shape(name, tensor, target)
        unreleased += _put(tensor, target, held)
        del tensor  # the next tensor is read without this one alive
        if unreleased >= _RELEASE_EVERY_WEIGHTS:
            release_free_memory()
            unreleased = 0
        filled.update(parts)
        weight, weight_parts = quantized.get(parts[0], (None, frozenset()))
        if weight is not None and weight_parts <= filled:
            weight.pack()
    missing = sorted(set(targets) - filled)
    if unexpected or missing:
        raise ModelLoadError(_mismatch_message(missing, unexpected))
    return held


def canonical_name(architecture: str, name: str) -> str:
    """A checkpoint tensor's name as every family spells it (see the module doc)."""
    if architecture != "MixtralForCausalLM" or "block_sparse_moe" not in name:
        return name
    return ".".join(_MIXTRAL_PIECES.get(piece, piece) for piece in name.split("."))


def checkpoint_name(architecture: str, name: str) -> str:
    """The family's own checkpoint name of a tensor ``canonical_name`` maps to ``name``."""
    if architecture != "MixtralForCausalLM" or ".mlp." not in name:
        return name
    own = {ours: theirs for theirs, ours in _MIXTRAL_PIECES.items()}
    return ".".join(own.get(piece, piece) for piece in name.split("."))


# what a checkpoint tensor is copied into: a parameter's rows, a quantized weight's, or
# a whole linear weight (the parameter itself: it may take the source as it is)
Target = torch.Tensor | RowSlot | nn.Parameter


def _targets(
    model: DecoderForCausalLM,
) -> tuple[dict[str, Target], dict[str, tuple[Target, tuple[str, ...]]]]:
    """(HF tensor name -> the parameter, or row slice of a fused one, it fills;
    fused parameter's name -> (the whole of it, the part names it fills at once)).
    A quantized matrix is filled through row slots that quantize what they get."""
    config = model.config
    q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    fused_names = {(fused_name, index): hf for hf, (fused_name, index) in FUSED_PARTS.items()}
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, Linear)}
    matrices: dict[str, torch.Tensor | QuantizedWeight] = {
        name: param if id(param) in linear_weights else param.data
        for name, param in model.named_parameters()
    }
    seen: set[int] = set()  # a tied int8 matrix is filled once, by its first name
    for path, module in model.named_modules():
        if isinstance(module, QuantizedLinear | QuantizedEmbedding):
            if id(module.qweight) not in seen:
                seen.add(id(module.qweight))
                matrices[f"{path}.weight"] = module.qweight
    targets: dict[str, Target] = {}
    fused: dict[str, tuple[Target, tuple[str, ...]]] = {}
    for name, matrix in matrices.items():
        module_path, module, leaf = _split_name(name)
        whole = (
            matrix if isinstance(matrix, nn.Parameter) else _row_parts(matrix, (_rows(matrix),))[0]
        )
        if module == "qkv_proj":
            sizes: tuple[int, ...] = (q_rows, kv_rows, kv_rows)
        elif module == "gate_up_proj":  # gate and up halves (a dense MLP's or an expert's)
            sizes = (_rows(matrix) // 2,) * 2
        else:
            targets[name] = whole
            continue
        parts = []
        for index, part in enumerate(_row_parts(matrix, sizes)):
            part_name = f"{module_path}{fused_names[module, index]}.{leaf}"
            targets[part_name] = part
            parts.append(part_name)
        fused[name] = (whole, tuple(parts))
    return targets, fused


def _quantized_parts(
    targets: dict[str, Target],
) -> dict[str, tuple[QuantizedWeight, frozenset[str]]]:
    """Each name that fills rows of a quantized weight -> that weight and every name
    that fills it (the weight is complete once all of them are filled)."""
    names: dict[int, list[str]] = {}
    weights: dict[int, QuantizedWeight] = {}
    for name, target in targets.items():
        if isinstance(target, RowSlot):
            names.setdefault(id(target.weight), []).append(name)
            weights[id(target.weight)] = target.weight
    return {
        name: (weights[key], frozenset(group)) for key, group in names.items() for name in group
    }


def _rows(matrix: torch.Tensor | QuantizedWeight) -> int:
    return matrix.shape[0] if isinstance(matrix, torch.Tensor) else matrix.out_features


def _row_parts(matrix: torch.Tensor | QuantizedWeight, sizes: tuple[int, ...]) -> list[Target]:
    """Consecutive row ranges of ``matrix`` with these sizes."""
    if isinstance(matrix, torch.Tensor):
        return list(matrix.data.split(sizes))
    starts = [0, *itertools.accumulate(sizes)]
    return [matrix.rows(start, stop) for start, stop in zip(starts, starts[1:])]


def _split_name(name: str) -> tuple[str, str, str]:
    """'a.b.qkv_proj.weight' -> ('a.b.', 'qkv_proj', 'weight')."""
    *path, module, leaf = name.split(".")
    return "".join(p + "." for p in path), module, leaf


def _check_shape(name: str, tensor: Source, target: Target) -> None:
    if tensor.shape != target.shape:
        raise ModelLoadError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
        )


def _put(tensor: Source, target: Target, held: list[tuple[nn.Parameter, int]]) -> int:
    """Fills ``target`` from ``tensor``: a whole linear weight takes the tensor itself
    where it can (``_holds_as_read``; appended to ``held``), anything else a copy.
    Returns how many weights were copied."""
    if _holds_as_read(tensor, target):
        target.data = tensor  # type: ignore[union-attr]
        held.append((target, tensor.data_ptr()))  # type: ignore[arg-type, union-attr]
        return 0
    _copy(tensor, target)
    return math.prod(tensor.shape)


def _holds_as_read(tensor: Source, target: Target) -> bool:
    """Whether a whole linear weight can take ``tensor`` itself: its dtype and device,
    contiguous. The weight is laid out anew for its kernels (``Linear.prepare``) from
    it, which copies the values once; a file's tensor stays the file's mapped pages
    until then."""
    return (
        isinstance(target, nn.Parameter)
        and isinstance(tensor, torch.Tensor)
        and tensor.dtype == target.dtype
        and tensor.device == target.device
        and tensor.is_contiguous()
    )


def _copy(tensor: Source, target: Target) -> None:
    if isinstance(target, RowSlot):
        target.copy_(tensor)
        return
    rows = target.data
    blocks = tensor.blocks() if isinstance(tensor, RowBlocks) else iter([(0, tensor)])
    for start, block in blocks:
        if isinstance(block, Int4Codes | Int8Codes):
            block = block.dequantize()
        rows[start : start + block.shape[0]].copy_(block)


def _mismatch_message(missing: list[str], unexpected: list[str]) -> str:
    def listed(names: list[str]) -> str:
        more = len(names) - _MAX_NAMES_IN_ERROR
        return ", ".join(names[:_MAX_NAMES_IN_ERROR]) + (f" and {more} more" if more > 0 else "")

    parts = []
    if missing:
        parts.append(f"missing tensors: {listed(missing)}")
    if unexpected:
        parts.append(f"unexpected tensors: {listed(unexpected)}")
    return "checkpoint does not match the model; " + "; ".join(parts)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, single-file or sharded."""
    if not model_dir.is_dir():
        raise ModelNotFoundError(f"model directory {str(model_dir)!r} does not exist")
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        raise ModelNotFoundError(
            f"model directory {str(model_dir)!r} has neither model.safetensors "
            "nor model.safetensors.index.json"
        )
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
        raise ModelLoadError(f"{str(index)!r} is not a safetensors index: {e}") from e
    files = [model_dir / f for f in sorted(set(weight_map.values()))]
    absent = [str(f) for f in files if not f.is_file()]
    if absent:
        raise ModelNotFoundError(f"checkpoint shards listed in {str(index)!r} are absent: {absent}")
    return files


def read_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
