"""GGUF files served at their own precision: the 4-bit blocks are read back exactly
(against ``gguf``'s own dequantization), and a model loaded from a file keeps its
codes and computes what the float conversion of the file computes."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import (
    Int4Codes,
    Int4Weight,
    Int8Weight,
    QuantizedLinear,
)
from radixlm.runtime.model_store import gguf_weights
from radixlm.runtime.model_store.gguf_convert import convert_gguf_to_hf, write_hf_metadata
from radixlm.runtime.model_store.gguf_weights import read_gguf_matrices
from radixlm.runtime.models import ArchConfig, load_model
from radixlm.runtime.models.gguf_loader import load_gguf_model
from tests.runtime.models.helpers import KVHarness

Q = gguf.GGMLQuantizationType
HIDDEN, INTER, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 128, 4, 2, 2, 96


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_legacy_4_bit_blocks_read_back_exactly(kind: str) -> None:
    x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
    raw = gguf.quants.quantize(x, getattr(Q, kind))
    groups = _codes(gguf_weights._DECODERS[kind](raw.reshape(16, -1), 256))
    want = gguf.quants.dequantize(raw, getattr(Q, kind)).reshape(16, 256)
    assert groups.codes.max() <= 15 and torch.equal(groups.dequantize(), torch.from_numpy(want))


def test_k_quant_4_bit_blocks_read_back_exactly() -> None:
    """Q4_K (gguf dequantizes it but cannot write it): random blocks, every 6-bit
    scale and min pattern, against gguf's dequantization."""
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(8, 2, 144), dtype=np.uint8)
    for offset, top in ((0, 0.01), (2, 0.02)):  # d, dmin: finite f16
        values = (top * rng.random((8, 2, 1)) + 1e-3).astype(np.float16)
        raw[..., offset : offset + 2] = values.view(np.uint8)
    raw = raw.reshape(8, 288)
    groups = _codes(gguf_weights._DECODERS["Q4_K"](raw, 512))
    want = gguf.quants.dequantize(raw, Q.Q4_K).reshape(8, 512)
    assert torch.equal(groups.dequantize(), torch.from_numpy(want))


def _codes(groups: tuple[np.ndarray, ...]) -> Int4Codes:
    return Int4Codes(*(torch.from_numpy(a) for a in groups))


# ---- a tiny Llama GGUF -------------------------------------------------------------------


def _permute_rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's two rotary halves interleaved into pairs."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _write_llama_gguf(path: Path, types: dict[str, gguf.GGMLQuantizationType]) -> None:
    """A random 2-layer Llama; ``types``: ggml type per block tensor kind (else Q4_1)."""
    rng = np.random.default_rng(2)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    tokens = [chr(ord("!") + i) for i in range(VOCAB - 2)] + ["!!", "<|end|>"]
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (VOCAB - 1) + [3])
    writer.add_token_merges(["! !"])
    writer.add_eos_token_id(VOCAB - 1)

    def add(name: str, rows: int, cols: int, kind: gguf.GGMLQuantizationType) -> None:
        w = (rng.standard_normal((rows, cols)) * cols**-0.5).astype(np.float32)
        data = w if kind == Q.F32 else gguf.quants.quantize(w, kind)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)

    add("token_embd.weight", VOCAB, HIDDEN, Q.Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    d = HIDDEN // HEADS
    shapes = {
        "attn_q": (HEADS * d, HIDDEN),
        "attn_k": (KV_HEADS * d, HIDDEN),
        "attn_v": (KV_HEADS * d, HIDDEN),
        "attn_output": (HIDDEN, HEADS * d),
        "ffn_gate": (INTER, HIDDEN),
        "ffn_up": (INTER, HIDDEN),
        "ffn_down": (HIDDEN, INTER),
    }
    for layer in range(LAYERS):
        for norm in ("attn_norm", "ffn_norm"):
            scale = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
            writer.add_tensor(f"blk.{layer}.{norm}.weight", scale)
        for kind, (rows, cols) in shapes.items():
            add(f"blk.{layer}.{kind}.weight", rows, cols, types.get(kind, Q.Q4_1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a Q4_K_M-like mix: attn_v at 8 bits, q/k at 4 bits of another kind, the MLP's
    # down projection unquantized
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_llama_gguf(path, {"attn_q": Q.Q4_0, "attn_v": Q.Q8_0, "ffn_down": Q.F32})
    return path


def _gguf_model(path: Path, out: Path):
    reader, meta = gguf_weights.open_llama_gguf(path)
    write_hf_metadata(reader, meta, out)
    arch = ArchConfig.from_model_dir(out)
    harness = KVHarness(arch, dtype=torch.bfloat16)
    model, weights = load_gguf_model(path, harness.backend, torch.bfloat16, "cpu", arch)
    return harness, model, weights


def test_each_layer_takes_the_storage_of_its_file_tensors(tiny_gguf: Path, tmp_path: Path):
    _, model, weights = _gguf_model(tiny_gguf, tmp_path / "meta")
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    assert isinstance(attn.qkv_proj.qweight, Int8Weight)  # q 4-bit, k 4-bit, v Q8_0
    assert isinstance(attn.o_proj.qweight, Int4Weight)
    assert isinstance(mlp.gate_up_proj.qweight, Int4Weight)
    assert isinstance(mlp.down_proj, Linear) and mlp.down_proj.weight.dtype == torch.bfloat16
    assert isinstance(model.lm_head, QuantizedLinear)
    assert model.model.embed_tokens.qweight is model.lm_head.qweight  # tied: no output.weight
    assert weights == "GGUF: float x2, int4 x4, int8 x3"
    # the 4-bit layers hold the file's codes; scale and zero points are rounded to bf16
    file = {m.name: m for m in read_gguf_matrices(tiny_gguf)}
    parts = [file[f"model.layers.0.mlp.{p}_proj.weight"].int4_codes() for p in ("gate", "up")]
    codes = torch.cat([g.codes for g in parts])
    held = mlp.gate_up_proj.qweight
    assert torch.equal(held._unpacked_codes(), codes)
    scale = torch.cat([g.scale for g in parts])
    assert torch.equal(held.scales_zeros[..., 0].t(), scale.to(torch.bfloat16))


def test_a_gguf_model_computes_what_its_float_conversion_does(tiny_gguf: Path, tmp_path: Path):
    """Against the file converted to float32 (every tensor dequantized by gguf): what is
    left is bf16 scales, zero points and activations (at most 2% of the logits' range;
    a misread block or a q/k row order not undone is off by the whole range)."""
    harness, model, _ = _gguf_model(tiny_gguf, tmp_path / "meta")
    convert_gguf_to_hf(tiny_gguf, tmp_path / "float")
    ref = KVHarness(ArchConfig.from_model_dir(tmp_path / "float"))
    reference = load_model(tmp_path / "float", ref.backend, torch.float32)
    prompt = [5, 17, 3, 60, 2, 44, 9, 81, 12, 33]
    got = harness.run(model, [("a", prompt)])[0]
    want = ref.run(reference, [("a", prompt)])[0]
    assert (got - want).abs().max() <= 0.02 * (want.max() - want.min())
