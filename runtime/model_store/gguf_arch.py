"""The GGUF architectures radixlm serves, as llama.cpp's converter (convert_hf_to_gguf.py)
writes them, and how each one's tensors become Hugging Face ones::

    general.architecture   Hugging Face architecture       what the converter did
    llama                  LlamaForCausalLM (Mistral's     q/k rows interleaved per head;
                           too); MixtralForCausalLM when   Mixtral's experts stacked
                           the file has experts
    qwen2, qwen3           Qwen2/Qwen3ForCausalLM          -
    phi3                   Phi3ForCausalLM                 qkv and gate_up kept fused (attn_qkv,
                                                           ffn_up); LongRoPE's factors as tensors
    gemma2, gemma3         Gemma2/Gemma3ForCausalLM        every norm stored as 1 + w
    qwen2moe, qwen3moe,    Qwen2Moe/Qwen3Moe/              each layer's experts stacked
    olmoe                  OlmoeForCausalLM

Only the llama converter permutes q/k rows (``LlamaModel.permute``, for its GPT-J-style
RoPE); every other family here keeps HF's row order. Gemma's norms are stored as ``1 + w``
and read back as HF's ``w`` (radixlm adds the 1 itself when it loads them).

Stacked experts: ``blk.N.ffn_{gate,up,down}_exps.weight`` holds expert e's matrix at
index e of its slowest axis (numpy's (experts, rows, cols)), so it splits into
``model.layers.N.mlp.experts.e.{gate,up,down}_proj.weight`` (Mixtral:
``block_sparse_moe.experts.e.{w1,w3,w2}``), quantized blocks alike: a block never
straddles two rows, let alone two experts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError, UnsupportedArchitectureError
from radixlm.runtime.model_store.gguf_split import split_part_names

__all__ = [
    "GGUF_ARCHITECTURES",
    "GGUFFamily",
    "GGUFFile",
    "TensorPlan",
    "open_gguf",
    "plan_tensor",
    "unpermute_rotary_rows",
]


@dataclass(frozen=True)
class GGUFFamily:
    """One Hugging Face architecture as GGUF files hold it.

    blocks: GGUF tensor kind within a block (``attn_q``) -> its HF name under
        ``model.layers.N.``; ``{e}`` marks the experts of a stacked tensor.
    permuted_qk: the converter interleaved q/k rotary rows (llama's converter).
    norm_offset: the converter stored each norm weight as ``norm_offset + w``.
    normalize_top_k: whether llama.cpp renormalises the chosen experts' weights
        (its graph hard-codes it per architecture; a file may say otherwise).
    """

    architecture: str
    model_type: str
    blocks: Mapping[str, str]
    permuted_qk: bool = False
    norm_offset: float = 0.0
    normalize_top_k: bool = False


_DENSE = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_EXPERTS = {
    "ffn_gate_inp": "mlp.gate",  # the router
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}
_SHARED_EXPERT = {
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
_GEMMA = {
    **_DENSE,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_MIXTRAL = {
    **_DENSE,
    "ffn_gate_inp": "block_sparse_moe.gate",
    "ffn_gate_exps": "block_sparse_moe.experts.{e}.w1",
    "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
    "ffn_down_exps": "block_sparse_moe.experts.{e}.w2",
}

# keyed by general.architecture
_FAMILIES = {
    "llama": GGUFFamily("LlamaForCausalLM", "llama", _DENSE, permuted_qk=True),
    "qwen2": GGUFFamily("Qwen2ForCausalLM", "qwen2", _DENSE),
    "qwen3": GGUFFamily("Qwen3ForCausalLM", "qwen3", _DENSE),
    "phi3": GGUFFamily(
        "Phi3ForCausalLM",
        "phi3",
        {**_DENSE, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    ),
    "gemma2": GGUFFamily("Gemma2ForCausalLM", "gemma2", _GEMMA, norm_offset=1.0),
    "gemma3": GGUFFamily("Gemma3ForCausalLM", "gemma3_text", _GEMMA, norm_offset=1.0),
    "qwen2moe": GGUFFamily(
        "Qwen2MoeForCausalLM", "qwen2_moe", {**_DENSE, **_EXPERTS, **_SHARED_EXPERT}
    ),
    "qwen3moe": GGUFFamily(
        "Qwen3MoeForCausalLM", "qwen3_moe", {**_DENSE, **_EXPERTS}, normalize_top_k=True
    ),
    "olmoe": GGUFFamily("OlmoeForCausalLM", "olmoe", {**_DENSE, **_EXPERTS}),
}
# a llama file with experts (llama.cpp converts Mixtral to its llama architecture)
_MIXTRAL_FAMILY = GGUFFamily(
    "MixtralForCausalLM", "mixtral", _MIXTRAL, permuted_qk=True, normalize_top_k=True
)
GGUF_ARCHITECTURES = tuple(_FAMILIES)


@dataclass(frozen=True)
class GGUFFile:
    """An opened GGUF of a supported architecture (``open_gguf``): one file, or every
    part of a GGUF split into files (``gguf_split``)."""

    path: Path  # the file (a split GGUF's first part)
    readers: tuple[gguf.GGUFReader, ...]  # one per part, in order; one for a whole file
    meta: dict[str, Any]  # every metadata key -> its value (a split GGUF's: its first part's)
    arch: str  # general.architecture
    family: GGUFFamily

    def key(self, name: str, default: Any = None) -> Any:
        """The architecture's own metadata ``<arch>.<name>`` (``attention.head_count``)."""
        return self.meta.get(f"{self.arch}.{name}", default)

    def require(self, name: str) -> Any:
        """``key(name)``; ModelLoadError when the file lacks it."""
        if f"{self.arch}.{name}" not in self.meta:
            raise ModelLoadError(f"{self.path}: GGUF metadata has no {self.arch}.{name!r}")
        return self.meta[f"{self.arch}.{name}"]

    @cached_property
    def tensors(self) -> dict[str, gguf.ReaderTensor]:
        """The file's tensors by GGUF name (every part's, in the parts' order)."""
        return {tensor.name: tensor for reader in self.readers for tensor in reader.tensors}

    def values(self, name: str) -> np.ndarray:
        """A tensor's float32 values, numpy-shaped (slowest axis first)."""
        tensor = self.tensors[name]
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists fastest first
        return gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)


def open_gguf(path: Path) -> GGUFFile:
    """Opens a GGUF whose architecture radixlm serves: a file, or the first part of a
    GGUF split into files (``-00001-of-0000N.gguf``), its other parts beside it.

    Raises:
        ModelNotFoundError: no such file, or a part of a split GGUF missing (named).
        ModelLoadError: not a readable GGUF, or a split GGUF's part other than the first
            (the message names the first) or one named otherwise than llama.cpp names them.
        UnsupportedArchitectureError: its ``general.architecture`` is none of
            ``GGUF_ARCHITECTURES`` (the message names it and them).
    """
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file {path} does not exist")
    reader = _read(path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    readers = (reader, *_other_parts(path, meta))
    arch = meta.get("general.architecture")
    if arch not in _FAMILIES:
        raise UnsupportedArchitectureError(
            f"{path}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    family = _MIXTRAL_FAMILY if arch == "llama" and meta.get("llama.expert_count") else None
    return GGUFFile(path, readers, meta, arch, family or _FAMILIES[arch])


def _read(path: Path) -> gguf.GGUFReader:
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc


def _other_parts(path: Path, meta: dict[str, Any]) -> list[gguf.GGUFReader]:
    """The readers of a split GGUF's parts after the first (``path``, whose metadata is
    ``meta``); none for a whole file."""
    count = int(meta.get("split.count", 1))
    if count <= 1:
        return []
    no = int(meta.get("split.no", 0))
    names = split_part_names(path.name)
    if names is None or len(names) != count:
        raise ModelLoadError(
            f"{path} is part {no + 1} of a GGUF split into {count} files, named otherwise "
            f"than NAME-00001-of-{count:05d}.gguf, ...: radixlm finds a split GGUF's parts by "
            "those names (llama.cpp's)"
        )
    if no != 0:
        raise ModelLoadError(
            f"{path} is part {no + 1} of a GGUF split into {count} files: give its first "
            f"part, {path.with_name(names[0])}"
        )
    parts = [path.with_name(name) for name in names[1:]]
    missing = [part.name for part in parts if not part.is_file()]
    if missing:
        raise ModelNotFoundError(
            f"{path} is the first of a GGUF split into {count} files; missing beside it: "
            + ", ".join(missing)
        )
    readers = [_read(part) for part in parts]
    for index, (part, reader) in enumerate(zip(parts, readers, strict=True), start=1):
        field = reader.fields.get("split.no")
        if field is None or int(field.contents()) != index:
            raise ModelLoadError(f"{part} is not part {index + 1} of the split GGUF {path}")
    return readers


# --- tensors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorPlan:
    """How one GGUF tensor becomes Hugging Face tensors.

    hf_names: its HF name, or one per expert of a stacked tensor.
    stacked: expert e's tensor is index e of the stored tensor's slowest axis.
    rotary_heads: q/k of a llama file: heads whose rows the converter interleaved; None:
        rows as HF has them.
    offset: subtracted from the stored values (Gemma's norms hold ``1 + w``).
    """

    hf_names: tuple[str, ...]
    stacked: bool = False
    rotary_heads: int | None = None
    offset: float = 0.0


_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# RoPE tables the config carries (``gguf_config``), not weights: Llama 3's per-frequency
# factors, Phi-3's LongRoPE factors
_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
_BLOCK_TENSOR_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def plan_tensor(file: GGUFFile, name: str) -> TensorPlan | None:
    """How the file's tensor ``name`` becomes HF tensors; None for a RoPE table.

    Raises:
        ModelLoadError: a tensor the file's architecture has no counterpart for.
    """
    if name in _ROPE_TENSORS:
        return None
    if name in _GLOBAL_TENSORS:
        offset = file.family.norm_offset if name == "output_norm.weight" else 0.0
        return TensorPlan((_GLOBAL_TENSORS[name],), offset=offset)
    match = _BLOCK_TENSOR_RE.fullmatch(name)
    template = file.family.blocks.get(match.group(2)) if match else None
    if match is None or template is None:
        raise ModelLoadError(
            f"{file.path}: GGUF tensor {name!r} has no {file.family.architecture} counterpart"
        )
    layer, kind, leaf = match.groups()
    prefix = f"model.layers.{layer}."
    if "{e}" in template:
        num_experts = int(file.tensors[name].shape[-1])  # GGUF lists the slowest axis last
        names = tuple(f"{prefix}{template.format(e=e)}.{leaf}" for e in range(num_experts))
        return TensorPlan(names, stacked=True)
    offset = file.family.norm_offset if kind.endswith("norm") and leaf == "weight" else 0.0
    hf_name = f"{prefix}{template}.{leaf}"
    return TensorPlan((hf_name,), rotary_heads=_rotary_heads(file, kind), offset=offset)


def _rotary_heads(file: GGUFFile, kind: str) -> int | None:
    if not file.family.permuted_qk or kind not in ("attn_q", "attn_k"):
        return None
    heads = int(file.require("attention.head_count"))
    return heads if kind == "attn_q" else int(file.key("attention.head_count_kv", heads))


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k rows so HF's rotate-half RoPE applies again.

    HF keeps each head's rotary dims as two halves; llama.cpp's converter interleaves them into
    pairs for its GPT-J-style RoPE. Per head, with half = head_dim // 2:

        HF row (s, i)  -- s in {0, 1}, i < half --  is GGUF row (i, s)
    """
    rows, *cols = weight.shape  # (H * D, hidden), or (H * D, ...) of per-row values
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *cols).swapaxes(1, 2).reshape(rows, *cols)
