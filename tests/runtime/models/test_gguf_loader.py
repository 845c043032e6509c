"""GGUF files served at their own precision: the 4-bit blocks are read back exactly
(against ``gguf``'s own dequantization), and a model loaded from a file keeps its
codes and computes what the float conversion of the file computes."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from radixlm.runtime.layers import quantization
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import (
    Int4Codes,
    Int4Weight,
    Int8Codes,
    Int8GroupWeight,
    Int8Weight,
    QuantizedLinear,
)
from radixlm.runtime.model_store import gguf_weights
from radixlm.runtime.model_store.gguf_arch import open_gguf
from radixlm.runtime.model_store.gguf_convert import convert_gguf_to_hf, write_hf_metadata
from radixlm.runtime.model_store.gguf_weights import read_gguf_matrices
from radixlm.runtime.models import ArchConfig, load_model
from radixlm.runtime.models.gguf_loader import load_gguf_model
from tests.runtime.models.helpers import KVHarness

Q = gguf.GGMLQuantizationType
HIDDEN, INTER, HEADS, KV_HEADS, LAYERS, VOCAB = 256, 256, 4, 2, 2, 96  # K-quants: 256 wide


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


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0", "Q5_1"])
def test_legacy_5_and_8_bit_blocks_read_back_exactly(kind: str) -> None:
    x = np.random.default_rng(3).standard_normal((16, 256)).astype(np.float32)
    raw = gguf.quants.quantize(x, getattr(Q, kind))
    groups = Int8Codes(*(torch.from_numpy(a) for a in gguf_weights._DECODERS[kind](raw, 256)))
    want = gguf.quants.dequantize(raw, getattr(Q, kind)).reshape(16, 256)
    assert groups.group_size == 32 and torch.equal(groups.dequantize(), torch.from_numpy(want))


def _random_k_blocks(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """(rows, bytes) of random K-quant blocks whose f16 scales are small and finite
    (gguf dequantizes K-quants but cannot write them)."""
    size, scales = {"Q5_K": (176, (0, 2)), "Q6_K": (210, (208,)), "Q4_K": (144, (0, 2))}[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // 256, size), dtype=np.uint8)
    for offset in scales:
        d = (1e-4 * rng.random((rows, cols // 256, 1)) + 1e-5).astype(np.float16)
        raw[..., offset : offset + 2] = d.view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize(("kind", "group"), [("Q5_K", 32), ("Q6_K", 16)])
def test_k_quant_5_and_6_bit_blocks_read_back_exactly(kind: str, group: int) -> None:
    raw = _random_k_blocks(kind, 8, 512, seed=4)
    groups = Int8Codes(*(torch.from_numpy(a) for a in gguf_weights._DECODERS[kind](raw, 512)))
    want = gguf.quants.dequantize(raw, getattr(Q, kind)).reshape(8, 512)
    assert groups.group_size == group and torch.equal(groups.dequantize(), torch.from_numpy(want))


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
        if kind.name in ("Q5_K", "Q6_K"):
            data = _random_k_blocks(kind.name, rows, cols, seed=rows + cols)
        elif kind in (Q.F32, Q.F16):
            data = w.astype(np.float16 if kind == Q.F16 else np.float32)
        else:
            data = gguf.quants.quantize(w, kind)
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


@pytest.fixture(scope="module")
def k_quant_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # K-quants at 5 and 6 bits beside 4-bit ones, and a layer with a float part
    path = tmp_path_factory.mktemp("gguf") / "k.gguf"
    types = {"attn_v": Q.Q6_K, "ffn_down": Q.Q5_K, "attn_output": Q.Q5_1, "ffn_up": Q.F16}
    _write_llama_gguf(path, types)
    return path


@pytest.mark.parametrize("file", ["tiny_gguf", "k_quant_gguf"])
def test_a_matrix_read_by_row_blocks_is_the_matrix_read_whole(
    file: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a load reads (a block of rows at a time; whole heads of a q/k matrix, whose
    rows llama.cpp permuted within each) is the whole matrix's codes or values."""
    monkeypatch.setattr(quantization, "ROWS_CHUNK_WEIGHTS", 32 * HIDDEN)  # 32-row blocks
    for matrix in read_gguf_matrices(request.getfixturevalue(file)):
        if len(matrix.shape) != 2:
            continue
        read = [rows for _, rows in matrix.row_blocks().blocks()]
        assert len(read) > 1, matrix.name
        if matrix.code_group is None:
            assert torch.equal(torch.cat(read), torch.from_numpy(matrix.dequantize()))
            continue
        whole = matrix.codes()
        for part in ("codes", "scale", "zero"):
            joined = torch.cat([getattr(rows, part) for rows in read])
            assert torch.equal(joined, getattr(whole, part)), (matrix.name, part)


def _gguf_model(path: Path, out: Path):
    write_hf_metadata(open_gguf(path), out)
    arch = ArchConfig.from_model_dir(out)
    harness = KVHarness(arch, dtype=torch.bfloat16)
    model, weights = load_gguf_model(path, harness.backend, torch.bfloat16, "cpu", arch)
    return harness, model, weights


def test_each_layer_takes_the_storage_of_its_file_tensors(tiny_gguf: Path, tmp_path: Path):
    _, model, weights = _gguf_model(tiny_gguf, tmp_path / "meta")
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    qkv = attn.qkv_proj.qweight  # q Q4_0, k Q4_1, v Q8_0: every part's codes, exactly
    assert isinstance(qkv, Int8GroupWeight) and qkv.group_size == 32
    assert isinstance(attn.o_proj.qweight, Int4Weight)
    assert isinstance(mlp.gate_up_proj.qweight, Int4Weight)
    assert isinstance(mlp.down_proj, Linear) and mlp.down_proj.weight.dtype == torch.bfloat16
    assert isinstance(model.lm_head, QuantizedLinear)
    assert model.model.embed_tokens.qweight is model.lm_head.qweight  # tied: no output.weight
    assert isinstance(model.lm_head.qweight, Int8GroupWeight)  # the Q8_0 vocabulary
    assert weights == "GGUF: float x2, int4 x4, int8g x3"
    file = {m.name: m for m in read_gguf_matrices(tiny_gguf)}
    parts = [file[f"model.layers.0.self_attn.{p}_proj.weight"].codes() for p in "qkv"]
    want = torch.cat([part.dequantize() for part in parts])
    assert torch.equal(qkv.dequantize(torch.float32), want)
    vocabulary = file["model.embed_tokens.weight"].dequantize()
    assert torch.equal(
        model.lm_head.qweight.dequantize(torch.float32), torch.from_numpy(vocabulary)
    )
    # the 4-bit layers hold the file's codes; scale and zero points are rounded to bf16
    parts = [file[f"model.layers.0.mlp.{p}_proj.weight"].codes() for p in ("gate", "up")]
    held = mlp.gate_up_proj.qweight
    assert torch.equal(held._unpacked_codes(), torch.cat([g.codes for g in parts]))
    scale = torch.cat([g.scale for g in parts])
    assert torch.equal(held.scales_zeros[..., 0].t(), scale.to(torch.bfloat16))


def test_5_and_6_bit_k_quants_are_held_exactly(k_quant_gguf: Path, tmp_path: Path):
    _, model, weights = _gguf_model(k_quant_gguf, tmp_path / "meta")
    layer = model.model.layers[1]
    attn, mlp = layer.self_attn, layer.mlp
    file = {m.name: m for m in read_gguf_matrices(k_quant_gguf)}
    for module, name, group in (
        (attn.qkv_proj, None, 16),  # Q4_1, Q4_1, Q6_K: groups of 16 hold all three
        (attn.o_proj, "self_attn.o_proj", 32),  # Q5_1
        (mlp.down_proj, "mlp.down_proj", 32),  # Q5_K
    ):
        assert isinstance(module.qweight, Int8GroupWeight) and module.qweight.group_size == group
        if name is not None:
            want = torch.from_numpy(file[f"model.layers.1.{name}.weight"].dequantize())
            assert torch.equal(module.qweight.dequantize(torch.float32), want)
    assert isinstance(mlp.gate_up_proj.qweight, Int8Weight)  # Q4_1 beside F16: per channel
    assert weights == "GGUF: int8 x2, int8g x7"


@pytest.mark.parametrize("file", ["tiny_gguf", "k_quant_gguf"])
def test_a_gguf_model_computes_what_its_float_conversion_does(
    file: str, tmp_path: Path, request: pytest.FixtureRequest
):
    """Against the file converted to float32 (every tensor dequantized by gguf): what is
    left is bf16 scales, zero points and activations (at most 2% of the logits' range;
    a misread block or a q/k row order not undone is off by the whole range)."""
    path = request.getfixturevalue(file)
    harness, model, _ = _gguf_model(path, tmp_path / "meta")
    convert_gguf_to_hf(path, tmp_path / "float")
    ref = KVHarness(ArchConfig.from_model_dir(tmp_path / "float"))
    reference = load_model(tmp_path / "float", ref.backend, torch.float32)
    prompt = [5, 17, 3, 60, 2, 44, 9, 81, 12, 33]
    got = harness.run(model, [("a", prompt)])[0]
    want = ref.run(reference, [("a", prompt)])[0]
    assert (got - want).abs().max() <= 0.02 * (want.max() - want.min())
