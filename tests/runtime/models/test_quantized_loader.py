"""Quantized checkpoints (AWQ, GPTQ, compressed-tensors, FP8) load at the file's
precision: each layer holds what its format's own reference dequantizes the file to,
and the model's logits are those of that dequantized float twin."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from radixlm.runtime.layers import quantization
from radixlm.runtime.layers.linear import Linear
from radixlm.runtime.layers.quantization import Int4Weight, Int8GroupWeight, QuantizedLinear
from radixlm.runtime.models import ArchConfig
from radixlm.runtime.models.checkpoint_formats import (
    QuantizedCheckpointError,
    read_checkpoint_quantization,
)
from radixlm.runtime.models.loader import FUSED_PARTS
from radixlm.runtime.models.quantized_loader import load_quantized_model
from tests.runtime.models import quantized_checkpoints as qc
from tests.runtime.models.helpers import KVHarness, build_hf_model, save_hf

# widths every group size divides: hidden 128, MLP 256, heads of 32
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4}
PROMPT = [5, 17, 3, 60, 2, 44, 9, 81]


@pytest.fixture(scope="module")
def float_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny float checkpoints: Llama (GQA), Qwen2 (biases, tied) and Qwen3-MoE."""
    root = tmp_path_factory.mktemp("float")
    models = {
        "llama": build_hf_model("llama", **SHAPE),
        "qwen2": build_hf_model("qwen2", tie_word_embeddings=True, **SHAPE),
        "qwen3_moe": build_hf_model(
            "qwen3_moe", moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2,
            head_dim=32, **SHAPE,
        ),
    }  # fmt: skip
    return {kind: save_hf(model, root / kind) for kind, model in models.items()}


def _load(path: Path, dtype: torch.dtype = torch.bfloat16):  # noqa: ANN202
    quant = read_checkpoint_quantization(path)
    assert quant is not None
    harness = KVHarness(ArchConfig.from_model_dir(path), dtype=dtype)
    model, stored = load_quantized_model(
        path, quant, harness.backend, dtype, "cpu", ArchConfig.from_model_dir(path)
    )
    return harness, model, stored


def _layer_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each checkpoint linear weight's (out, in) float64 values as the model holds
    them, fused layers cut back into their parts."""
    config = model.config
    q_rows = config.num_heads * config.head_dim
    kv_rows = config.num_kv_heads * config.head_dim
    weights = {}
    for name, module in model.named_modules():
        if not isinstance(module, QuantizedLinear | Linear) or name == "lm_head":
            continue
        whole = (
            module.qweight.dequantize(torch.float32)
            if isinstance(module, QuantizedLinear)
            else module.weight.float()
        ).double()
        if isinstance(module, QuantizedLinear) and module.qweight.input_order is not None:
            order = module.qweight.input_order
            whole = torch.empty_like(whole).index_copy_(1, order, whole)
        path, _, leaf = name.rpartition(".")
        parts = [hf for hf, (fused, _) in FUSED_PARTS.items() if fused == leaf]
        if not parts:
            weights[f"{name}.weight"] = whole
            continue
        sizes = (q_rows, kv_rows, kv_rows) if leaf == "qkv_proj" else (whole.shape[0] // 2,) * 2
        for part, rows in zip(parts, whole.split(sizes)):
            weights[f"{path}.{part}.weight"] = rows
    return weights


def _assert_holds(model: torch.nn.Module, written: qc.Written) -> None:
    """Every quantized layer holds the reference's values: exactly in int8 groups
    (float32 scales), within the bf16 rounding of each scale and zero point in int4."""
    held = _layer_weights(model)
    for name, want in written.weights.items():
        got = held[name.replace("block_sparse_moe", "mlp")]
        tol = 2**-7 * want.abs().max().item()
        assert (got - want).abs().max().item() <= tol, name


def _storage_of(model: torch.nn.Module) -> dict[str, type]:
    return {
        name: type(m.qweight) for name, m in model.named_modules() if isinstance(m, QuantizedLinear)
    }


def _assert_logits_of_twin(path: Path, written: qc.Written, tmp_path: Path) -> None:
    """Logits within bf16 activations' rounding of the float32 twin's (a misplaced
    part or a transposed weight is off by the whole range)."""
    harness, model, _ = _load(path)
    twin = qc.write_float_twin(written, tmp_path / "twin")
    ref_harness = KVHarness(ArchConfig.from_model_dir(twin), dtype=torch.float32)
    reference = ref_harness.load(twin)
    got = harness.run(model, [("a", PROMPT)])[0]
    want = ref_harness.run(reference, [("a", PROMPT)])[0]
    spread = (want.max() - want.min()).item()
    assert (got - want).abs().max().item() <= 0.03 * spread
    step = harness.run(model, [("b", PROMPT[:-1])]) and harness.run(model, [("b", PROMPT[-1:])])
    assert (step[0][0] - want[-1]).abs().max().item() <= 0.03 * spread


@pytest.mark.parametrize("group", [32, 64, 128])
def test_awq_layers_hold_the_files_codes(
    float_dirs: dict[str, Path], tmp_path: Path, group: int
) -> None:
    written = qc.write_awq(float_dirs["llama"], tmp_path / "awq", group)
    _, model, stored = _load(written.path)
    _assert_holds(model, written)
    assert set(_storage_of(model).values()) == {Int4Weight}
    assert stored == f"AWQ 4-bit, group {group}: float x1, int4 x8"


def test_awq_layout_matches_the_compressed_tensors_converter(
    float_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """compressed-tensors' AutoAWQ converter (a second reading of AWQ's layout) and
    the package's decompression give the values this writer's file stands for."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter

    written = qc.write_awq(float_dirs["llama"], tmp_path / "awq", 64)
    tensors = load_file(written.path / "model.safetensors")
    converter = AutoAWQConverter(group_size=64)
    converted = converter.process(dict(tensors))
    scheme = qc._ct_scheme(
        {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64}
    )
    compressor = BaseCompressor.get_value_from_registry("pack-quantized")
    name = "model.layers.1.mlp.down_proj"
    state = {k.rpartition(".")[2]: v for k, v in converted.items() if k.startswith(name + ".")}
    reference = compressor.decompress(state, scheme)["weight"].double()
    want = written.weights[name + ".weight"]
    assert (reference - want).abs().max().item() <= 2**-10 * want.abs().max().item()


@pytest.mark.parametrize(
    ("bits", "group", "sym", "desc_act", "v2"),
    [
        (4, 128, True, False, False),
        (4, 32, False, False, True),
        (4, 64, True, True, False),
        (4, -1, False, False, False),
        (8, 128, True, False, False),
        (8, 32, False, True, True),
    ],
    ids=["4b-g128", "4b-g32-asym-v2", "4b-g64-act", "4b-channel", "8b-g128", "8b-act-v2"],
)
def test_gptq_layers_hold_the_files_codes(
    float_dirs: dict[str, Path],
    tmp_path: Path,
    bits: int,
    group: int,
    sym: bool,
    desc_act: bool,
    v2: bool,
) -> None:
    written = qc.write_gptq(
        float_dirs["llama"], tmp_path / "gptq", bits, group, sym=sym, desc_act=desc_act, v2=v2
    )
    _, model, _ = _load(written.path)
    _assert_holds(model, written)
    storages = set(_storage_of(model).values())
    assert storages == ({Int4Weight} if bits == 4 else {Int8GroupWeight})
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    ordered = [m.qweight.input_order is not None for m in layers]
    assert all(ordered) if desc_act else not any(ordered)


def test_a_quantized_lm_head_is_a_layer_like_the_others(
    float_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """GPTQ's ``lm_head: true``: the head holds its codes (the embedding stays float)."""
    written = qc.write_gptq(float_dirs["llama"], tmp_path / "gptq", 8, 32, lm_head=True)
    _, model, stored = _load(written.path)
    assert isinstance(model.lm_head, QuantizedLinear)
    assert isinstance(model.model.embed_tokens, torch.nn.Embedding)
    assert stored == "GPTQ 8-bit, group 32: int8g x9"
    got = model.lm_head.qweight.dequantize(torch.float32).double()
    assert torch.equal(got, written.weights["lm_head.weight"])
    _assert_logits_of_twin(written.path, written, tmp_path)


def test_gptq_layout_matches_sglangs_unpacking(float_dirs: dict[str, Path], tmp_path: Path) -> None:
    """SGLang's GPTQ unpacking (its XPU path, plain torch) reads the same codes and
    zero points from the file (v1: stored less one)."""
    from sglang.srt.hardware_backend.xpu.quantization.int4pack_utils import (
        unpack_gptq_qweight,
        unpack_gptq_qzeros,
    )

    written = qc.write_gptq(float_dirs["llama"], tmp_path / "gptq", 4, 32, sym=False)
    tensors = load_file(written.path / "model.safetensors")
    module = "model.layers.0.self_attn.o_proj"
    codes = unpack_gptq_qweight(tensors[f"{module}.qweight"]).double()  # (in, out)
    zeros = unpack_gptq_qzeros(tensors[f"{module}.qzeros"]).double() + 1  # v1
    scales = tensors[f"{module}.scales"].double()
    g_idx = tensors[f"{module}.g_idx"].long()
    reference = ((codes - zeros[g_idx]) * scales[g_idx]).t()
    assert torch.equal(reference, written.weights[f"{module}.weight"])


def test_act_order_layers_take_their_inputs_in_the_files_order(
    float_dirs: dict[str, Path], tmp_path: Path
) -> None:
    written = qc.write_gptq(float_dirs["llama"], tmp_path / "gptq", 4, 64, desc_act=True)
    _assert_logits_of_twin(written.path, written, tmp_path)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3_moe"])
def test_a_quantized_model_computes_its_dequantized_twins_logits(
    float_dirs: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    written = qc.write_awq(float_dirs[kind], tmp_path / "awq", 32)
    _assert_logits_of_twin(written.path, written, tmp_path)


def _args(bits: int, kind: str, strategy: str, **more: object) -> dict:
    return {"num_bits": bits, "type": kind, "symmetric": True, "strategy": strategy, **more}


DYNAMIC_INT8 = _args(8, "int", "token", dynamic=True)
DYNAMIC_FP8 = _args(8, "float", "token", dynamic=True)
CT_CASES = {  # (format, weights, input activations)
    "w4a16-group": ("pack-quantized", _args(4, "int", "group", group_size=64), None),
    "w4a16-asym": (
        "pack-quantized",
        _args(4, "int", "group", group_size=32, symmetric=False),
        None,
    ),
    "w8a16-channel": ("pack-quantized", _args(8, "int", "channel"), None),
    "w8a8-int8": ("int-quantized", _args(8, "int", "channel"), DYNAMIC_INT8),
    "w8a8-fp8-tensor": ("float-quantized", _args(8, "float", "tensor"), DYNAMIC_FP8),
    "w8a8-fp8-channel": ("float-quantized", _args(8, "float", "channel"), None),
    "w8a8-fp8-block": (
        "float-quantized",
        _args(8, "float", "block", block_structure=[32, 32]),
        None,
    ),
}


@pytest.mark.parametrize("case", list(CT_CASES))
def test_compressed_tensors_layers_hold_the_packages_decompression(
    float_dirs: dict[str, Path], tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt, args, activations = CT_CASES[case]
    written = qc.write_compressed_tensors(
        float_dirs["llama"], tmp_path / "ct", fmt, args, activations
    )
    # packed codes unpacked 8 or 16 rows at a time: int4 layout blocks filled in pieces
    monkeypatch.setattr(quantization, "ROWS_CHUNK_WEIGHTS", 2048)
    _, model, _ = _load(written.path)
    _assert_holds(model, written)
    storages = set(_storage_of(model).values())
    expected = {"pack-quantized": Int4Weight if args["num_bits"] == 4 else Int8GroupWeight}
    expected["int-quantized"] = Int8GroupWeight
    if fmt == "float-quantized":
        assert storages == set()  # FP8: float layers
    else:
        assert storages == {expected[fmt]}
    if case in ("w4a16-asym", "w8a8-int8", "w8a8-fp8-block"):
        _assert_logits_of_twin(written.path, written, tmp_path)


def test_fp8_block_checkpoints_hold_the_dequantizers_values(
    float_dirs: dict[str, Path], tmp_path: Path
) -> None:
    written = qc.write_fp8_blocks(float_dirs["qwen2"], tmp_path / "fp8", (32, 32))
    _, model, stored = _load(written.path, torch.float32)
    _assert_holds(model, written)
    assert stored.startswith("FP8 e4m3, 32x32 block scales: float x")
    _assert_logits_of_twin(written.path, written, tmp_path)


def _with_config(path: Path, tmp_path: Path, **changes: object) -> Path:
    copy = tmp_path / "changed"
    shutil.copytree(path, copy)
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"].update(changes)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": "gemv"}, "quantization_config.version = 'gemv' is not served"),
        ({"bits": 3}, "quantization_config.bits = 3 is not served"),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not served"),
        (
            {"quant_method": "gptq", "bits": 4, "format": "marlin"},
            "quantization_config.format = 'marlin' is not served",
        ),
    ],
)
def test_what_is_not_served_is_refused_by_its_field(
    float_dirs: dict[str, Path], tmp_path: Path, changes: dict, message: str
) -> None:
    written = qc.write_awq(float_dirs["llama"], tmp_path / "awq", 32)
    with pytest.raises(QuantizedCheckpointError, match=message.replace("(", r"\(")):
        read_checkpoint_quantization(_with_config(written.path, tmp_path, **changes))


def test_gptq_2_bit_and_compressed_tensors_sparsity_are_refused(tmp_path: Path) -> None:
    for config, message in (
        ({"quant_method": "gptq", "bits": 2}, "bits = 2 is not served"),
        (
            {"quant_method": "compressed-tensors", "format": "marlin-24"},
            "format = 'marlin-24' is not served",
        ),
    ):
        (tmp_path / "config.json").write_text(json.dumps({"quantization_config": config}))
        with pytest.raises(QuantizedCheckpointError, match=message):
            read_checkpoint_quantization(tmp_path)
