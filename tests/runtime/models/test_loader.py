"""Config parsing, dtype names and checkpoint loading errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlm.runtime.errors import ModelLoadError, ModelNotFoundError, UnsupportedArchitectureError
from radixlm.runtime.models import ArchConfig, load_model, parse_dtype
from radixlm.runtime.models.decoder import DecoderForCausalLM
from radixlm.runtime.models.loader import load_weights
from tests.runtime.models.helpers import TINY, KVHarness, build_hf_model, save_hf

BASE: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], **TINY}


def _config(**overrides: Any) -> ArchConfig:
    return ArchConfig.from_dict({**BASE, **overrides})


# ---- parse_dtype ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp16", torch.float16),
    ],
)
def test_parse_dtype_names(name: str, expected: torch.dtype) -> None:
    assert parse_dtype(name) is expected


def test_parse_dtype_auto_follows_the_checkpoint_else_float32() -> None:
    assert parse_dtype("auto", "bfloat16") is torch.bfloat16
    assert parse_dtype("auto", "float16") is torch.float16
    assert parse_dtype("auto", None) is torch.float32
    assert parse_dtype("auto", "int8") is torch.float32


def test_parse_dtype_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="float64"):
        parse_dtype("float64")


# ---- ArchConfig -----------------------------------------------------------------


def test_llama_config_fields() -> None:
    c = _config(eos_token_id=[2, 7], bos_token_id=1, tie_word_embeddings=True, dtype="bfloat16")
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (2, 4, 2, 16)
    assert c.eos_token_ids == (2, 7) and c.bos_token_id == 1
    assert c.tie_word_embeddings and c.torch_dtype == "bfloat16"
    assert not (c.attention_bias or c.o_proj_bias or c.qk_norm)
    assert c.max_context_len == 128 and c.attention_scale == 16**-0.5


def test_explicit_head_dim_wins() -> None:
    c = _config(architectures=["Qwen3ForCausalLM"], head_dim=24)
    assert c.head_dim == 24 and c.qk_norm


def test_qwen2_has_qkv_bias_but_no_o_bias_without_a_key() -> None:
    c = _config(architectures=["Qwen2ForCausalLM"])
    assert c.attention_bias and not c.o_proj_bias


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_attention_bias_key_covers_qkv_and_o(arch: str) -> None:
    c = _config(architectures=[arch], attention_bias=True)
    assert c.attention_bias and c.o_proj_bias


def test_mistral_slides_every_layer_and_serves_its_whole_context() -> None:
    c = _config(architectures=["MistralForCausalLM"], sliding_window=32)
    assert c.layer_windows == (32, 32) and c.sliding_window == 32
    assert c.max_context_len == 128 and not c.llama_layers


def test_qwen_sliding_window_needs_its_switch() -> None:
    off = _config(architectures=["Qwen2ForCausalLM"], sliding_window=32, use_sliding_window=False)
    on = _config(
        architectures=["Qwen2ForCausalLM"],
        sliding_window=32,
        use_sliding_window=True,
        max_window_layers=1,
    )
    assert off.layer_windows == () and on.layer_windows == (None, 32)


def test_unsupported_architecture_lists_the_supported_ones() -> None:
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel") as info:
        _config(architectures=["GPT2LMHeadModel"])
    assert "Qwen3ForCausalLM" in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"num_key_value_heads": 3}, "multiple"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"head_dim": 15}, "even"),
        ({"vocab_size": 0}, "vocab_size"),
    ],
)
def test_inconsistent_configs_are_rejected(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        _config(**overrides)


def test_missing_required_key_is_named() -> None:
    d = dict(BASE)
    del d["intermediate_size"]
    with pytest.raises(ModelLoadError, match="intermediate_size"):
        ArchConfig.from_dict(d)


# ---- load_model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    hf = build_hf_model("llama", tie_word_embeddings=False)
    return save_hf(hf, tmp_path_factory.mktemp("ckpt") / "llama")


def _copy_with(checkpoint: Path, dst: Path, edit) -> Path:
    """A copy of ``checkpoint`` whose tensors went through ``edit(dict) -> dict``."""
    dst.mkdir()
    (dst / "config.json").write_text((checkpoint / "config.json").read_text())
    save_file(edit(load_file(checkpoint / "model.safetensors")), dst / "model.safetensors")
    return dst


def _load(path: Path):
    harness = KVHarness(ArchConfig.from_model_dir(path))
    return load_model(path, harness.backend, torch.float32)


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nowhere"):
        ArchConfig.from_model_dir(tmp_path / "nowhere")


def test_missing_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="config.json"):
        ArchConfig.from_model_dir(tmp_path)


def test_missing_weights_name_the_directory(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    with pytest.raises(ModelNotFoundError, match=str(tmp_path)):
        _load(tmp_path)


def test_missing_tensor_is_named(checkpoint: Path, tmp_path: Path) -> None:
    def drop(t: dict) -> dict:
        return {k: v for k, v in t.items() if k != "model.layers.1.self_attn.k_proj.weight"}

    missing = r"missing tensors: model\.layers\.1\.self_attn\.k_proj"
    with pytest.raises(ModelLoadError, match=missing):
        _load(_copy_with(checkpoint, tmp_path / "m", drop))


def test_unexpected_tensor_is_named(checkpoint: Path, tmp_path: Path) -> None:
    def add(t: dict) -> dict:
        return t | {"model.layers.0.mlp.extra.weight": torch.zeros(2)}

    with pytest.raises(ModelLoadError, match=r"unexpected tensors: model\.layers\.0\.mlp\.extra"):
        _load(_copy_with(checkpoint, tmp_path / "m", add))


def test_wrong_shape_is_named(checkpoint: Path, tmp_path: Path) -> None:
    def shrink(t: dict) -> dict:
        return t | {"model.norm.weight": torch.ones(3)}

    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight.*\(3,\).*\(64,\)"):
        _load(_copy_with(checkpoint, tmp_path / "m", shrink))


def test_absent_lm_head_ties_embeddings(checkpoint: Path, tmp_path: Path) -> None:
    def drop_head(t: dict) -> dict:
        return {k: v for k, v in t.items() if k != "lm_head.weight"}

    model = _load(_copy_with(checkpoint, tmp_path / "m", drop_head))
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_old_rotary_buffers_are_skipped(checkpoint: Path, tmp_path: Path) -> None:
    """A checkpoint with a stale ``rotary_emb.inv_freq`` (all ones, not the model's
    frequencies) loads, and the buffer changes nothing: every parameter and buffer is
    the plain checkpoint's, RoPE's frequencies included."""

    def add_inv_freq(t: dict) -> dict:
        return t | {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}

    model = _load(_copy_with(checkpoint, tmp_path / "m", add_inv_freq))
    plain = _load(checkpoint)
    got, want = model.state_dict(), plain.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rope, plain_rope = model.model.rotary_emb, plain.model.rotary_emb  # not in state_dict
    assert torch.equal(rope.cos, plain_rope.cos) and torch.equal(rope.sin, plain_rope.sin)


def test_fused_parameters_hold_the_hf_parts(checkpoint: Path) -> None:
    model = _load(checkpoint)
    hf = load_file(checkpoint / "model.safetensors")
    prefix = "model.layers.1."
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    expected = [hf[prefix + f"self_attn.{p}_proj.weight"] for p in "qkv"]
    assert torch.equal(qkv, torch.cat(expected))
    gate_up = model.model.layers[1].mlp.gate_up_proj.weight
    expected = [hf[prefix + f"mlp.{p}_proj.weight"] for p in ("gate", "up")]
    assert torch.equal(gate_up, torch.cat(expected))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_no_parameter_shares_memory_with_the_tensors_it_was_loaded_from(
    checkpoint: Path, dtype: torch.dtype
) -> None:
    """A linear weight holds a tensor of its dtype as it came until it is laid out for
    its kernel (its values copied once); a loaded model holds none of them, laid out
    or not (float16 weights are not)."""
    config = ArchConfig.from_model_dir(checkpoint)
    sources = {n: t.to(dtype) for n, t in load_file(checkpoint / "model.safetensors").items()}
    model = DecoderForCausalLM(config, KVHarness(config).backend, dtype)
    load_weights(model, iter(sources.items()))
    source_memory = {t.untyped_storage().data_ptr() for t in sources.values()}
    for name, param in model.named_parameters():
        assert param.untyped_storage().data_ptr() not in source_memory, name
    assert torch.equal(model.lm_head.weight, sources["lm_head.weight"])
    o_proj = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(model.model.layers[0].self_attn.o_proj.weight, sources[o_proj])


def test_config_json_must_be_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="JSON"):
        ArchConfig.from_model_dir(tmp_path)


def test_config_from_saved_transformers_checkpoint(checkpoint: Path) -> None:
    c = ArchConfig.from_model_dir(checkpoint)
    saved = json.loads((checkpoint / "config.json").read_text())
    assert c.architecture == "LlamaForCausalLM" and c.torch_dtype == saved["dtype"]
