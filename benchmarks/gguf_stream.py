"""A GGUF file of a Qwen3 or Qwen3-MoE checkpoint larger than memory, written tensor by
tensor (``bench_moe.py``'s llama.cpp side, ``bench_load_memory.py``'s GGUF storages).

tests/runtime/model_store/gguf_writer.py writes any family as llama.cpp's converter
does, but holds the whole checkpoint (one float32 safetensors file) in memory; a
Qwen3-30B-A3B-shaped layer alone is 2.5 GB in float32. Here every tensor's info is
planned from the shards' headers first, then each tensor is read, quantized and
written in that order, a layer's stacked experts one expert at a time into one
buffer (a quantized block never spans two rows, so a stack's bytes are its experts'
bytes one after the other)::

    shards (bf16, HF names) --headers--> plan: (GGUF name, type, byte shape) per tensor
                                          |
    header, metadata, tensor infos  <-----+   then per planned tensor:
    data: read (one expert at a time) -> float32 -> gguf.quants.quantize -> file

Storage, as a 4-bit llama.cpp file keeps it: layer matrices ``matrix_type`` (Q4_0),
the vocabulary matrices ``vocab_type`` (Q8_0: radixlm's int4 keeps its embedding and
LM head int8, llama-quantize keeps Q4_0 files' output at 6 bits), norms and the router
F32 (as the converter stores them). Qwen3's RoPE needs no q/k permutation in GGUF.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open

__all__ = ["stack_layers", "write_moe_gguf"]

Q = gguf.GGMLQuantizationType
ARCHS = {"Qwen3MoeForCausalLM": gguf.MODEL_ARCH.QWEN3MOE, "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3}
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")
FLOAT_SUFFIXES = ("norm.weight", "mlp.gate.weight")  # norms and the router stay F32
VOCAB_NAMES = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class Planned:
    """One GGUF tensor: its name, storage type, logical shape (rows last, numpy order)
    and how to produce its bytes."""

    name: str
    kind: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    produce: Callable[[], np.ndarray]


def write_moe_gguf(
    model_dir: Path,
    path: Path,
    matrix_type: gguf.GGMLQuantizationType = Q.Q4_0,
    vocab_type: gguf.GGMLQuantizationType = Q.Q8_0,
) -> Path:
    """Writes ``model_dir`` (a Qwen3 or Qwen3-MoE checkpoint: config.json and safetensors
    shards listed in model.safetensors.index.json) as the GGUF file ``path``.

    Raises:
        ValueError: the checkpoint is neither.
    """
    config = json.loads((model_dir / "config.json").read_text())
    arch = ARCHS.get(config["architectures"][0])
    if arch is None:
        got = config["architectures"]
        raise ValueError(f"expected one of {', '.join(ARCHS)} checkpoints, got {got}")
    plan = _plan(model_dir, config, arch, matrix_type, vocab_type)
    part = path.with_suffix(".part")
    writer = gguf.GGUFWriter(part, gguf.MODEL_ARCH_NAMES[arch])
    _metadata(writer, config)
    for t in plan:
        byte_shape = (*t.shape[:-1], _row_bytes(t.shape[-1], t.kind))
        nbytes = int(np.prod(byte_shape))
        if t.kind == Q.F32:
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), nbytes)
        else:  # quantized blocks are given as bytes, (..., row bytes)
            writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), nbytes, t.kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in plan:
        writer.write_tensor_data(t.produce())
    writer.close()
    part.rename(path)  # a file that exists is whole
    return path


def stack_layers(source: Path, path: Path, layers: int, config: dict) -> Path:
    """Writes ``path``: the GGUF file ``source`` (written by ``write_moe_gguf`` from the
    checkpoint whose config.json is ``config``) deepened to ``layers`` layers, layer l
    a copy of the source's layer l mod its depth, byte for byte (no quantizing: a
    48-layer file from the 16-layer one in the time its bytes take to copy). Speed and
    memory do not depend on the weights' values; the metadata is ``config``'s with
    ``layers`` blocks.

    Raises:
        ValueError: ``source`` has no layer tensors.
    """
    reader = gguf.GGUFReader(source)
    depth = 1 + max(
        (int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk.")),
        default=-1,
    )
    if depth == 0:
        raise ValueError(f"{source} has no layer (blk.N.*) tensors")
    planned: list[tuple[str, object]] = []  # (name, source tensor)
    for t in reader.tensors:
        if not t.name.startswith("blk."):
            planned.append((t.name, t))
    for layer in range(layers):
        prefix = f"blk.{layer % depth}."
        for t in reader.tensors:
            if t.name.startswith(prefix):
                planned.append((f"blk.{layer}." + t.name[len(prefix) :], t))
    part = path.with_suffix(".part")
    writer = gguf.GGUFWriter(part, str(reader.fields["general.architecture"].contents()))
    _metadata(writer, {**config, "num_hidden_layers": layers})
    for name, t in planned:
        kind = Q(t.tensor_type)
        if kind == Q.F32:
            writer.add_tensor_info(name, t.data.shape, np.dtype(np.float32), t.n_bytes)
        else:  # quantized blocks as bytes, (..., row bytes)
            writer.add_tensor_info(name, t.data.shape, np.dtype(np.uint8), t.n_bytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, t in planned:
        writer.write_tensor_data(np.ascontiguousarray(t.data))
    writer.close()
    part.rename(path)
    return path


def _row_bytes(width: int, kind: gguf.GGMLQuantizationType) -> int:
    if kind == Q.F32:
        return width * 4
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return width // block * size


def _metadata(w: gguf.GGUFWriter, c: dict) -> None:
    """The qwen3.* / qwen3moe.* keys llama.cpp reads (the converter's Qwen3Model and
    Qwen3MoeModel), and a placeholder byte-level vocabulary: the benchmark feeds token
    ids, never text."""
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if "num_experts" in c:
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    vocab = c["vocab_size"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    # one character per token, skipping UTF-16 surrogates (not encodable), the last
    # token the one merge's result
    chars = [chr(0x21 + i + (0x800 if 0x21 + i >= 0xD800 else 0)) for i in range(vocab - 1)]
    w.add_token_list([*chars, "!!"])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges(["! !"])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_pad_token_id(c.get("pad_token_id", 0))


def _plan(
    model_dir: Path, c: dict, arch: gguf.MODEL_ARCH, matrix_type: Q, vocab_type: Q
) -> list[Planned]:
    """Every tensor of the file, shard by shard (a layer's stacked experts after its
    other tensors), from the shards' headers alone."""
    names = gguf.get_tensor_name_map(arch, c["num_hidden_layers"])
    weight_map = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    plan: list[Planned] = []
    for file in sorted(set(weight_map.values())):
        shard = model_dir / file
        with safe_open(shard, framework="pt") as f:
            shapes = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
        stacks: dict[tuple[int, str], int] = {}  # (layer, proj) -> experts
        for name, shape in shapes.items():
            parts = name.split(".")
            if "experts" in parts:  # model.layers.N.mlp.experts.E.<proj>.weight
                key = (int(parts[2]), parts[6])
                stacks[key] = max(stacks.get(key, 0), int(parts[5]) + 1)
                continue
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if len(shape) == 1 or name.endswith(FLOAT_SUFFIXES):
                kind = Q.F32
            else:
                kind = vocab_type if name in VOCAB_NAMES else matrix_type
            plan.append(Planned(gguf_name, kind, shape, _reader(shard, name, kind)))
        for (layer, proj), experts in sorted(stacks.items()):
            merged = f"model.layers.{layer}.mlp.experts.{proj}.weight"
            gguf_name = names.get_name(merged, try_suffixes=(".weight",))
            one = shapes[f"model.layers.{layer}.mlp.experts.0.{proj}.weight"]
            reader = _stack_reader(shard, layer, proj, experts, one, matrix_type)
            plan.append(Planned(gguf_name, matrix_type, (experts, *one), reader))
    return plan


def _stored(values: np.ndarray, kind: Q) -> np.ndarray:
    return values if kind == Q.F32 else gguf.quants.quantize(values, kind)


def _reader(shard: Path, name: str, kind: Q) -> Callable[[], np.ndarray]:
    def read() -> np.ndarray:
        with safe_open(shard, framework="pt") as f:
            values = f.get_tensor(name).float().numpy()
        return _stored(values, kind)

    return read


def _stack_reader(
    shard: Path, layer: int, proj: str, experts: int, one: tuple[int, ...], kind: Q
) -> Callable[[], np.ndarray]:
    def read() -> np.ndarray:
        rows, cols = one
        out = np.empty((experts, rows, _row_bytes(cols, kind)), dtype=np.uint8)  # (E, rows, bytes)
        with safe_open(shard, framework="pt") as f:
            for e in range(experts):
                name = f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
                out[e] = _stored(f.get_tensor(name).float().numpy(), kind)
        return out

    return read
