"""Our Llama-family decoder against transformers, on tiny random-weight checkpoints."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from radixlm.kernels.cpu.elementwise import load_elementwise_kernels
from radixlm.runtime.errors import UnsupportedArchitectureError
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import ArchConfig, load_model
from tests import numerics as num
from tests.runtime.models.helpers import (
    KVHarness,
    assert_like_transformers,
    build_hf_model,
    exact_twin,
    hf_logits,
    load_saved,
    save_hf,
)

# id -> (kind, HF config overrides)
VARIANTS = {
    "llama-tied-gqa": ("llama", {"tie_word_embeddings": True}),
    "llama-untied-mha": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": False}),
    "qwen2-bias-untied": ("qwen2", {"tie_word_embeddings": False}),
    "qwen3-qknorm-headdim-tied": ("qwen3", {"head_dim": 24, "tie_word_embeddings": True}),
    "mistral-gqa": ("mistral", {"sliding_window": 4096, "tie_word_embeddings": False}),
}


def _prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_logits_match_transformers(variant: str, tmp_path: Path) -> None:
    kind, overrides = VARIANTS[variant]
    hf = build_hf_model(kind, **overrides)
    model, harness = load_saved(hf, tmp_path / variant)
    # the torch backend on a CPU: RoPE and the norms in torch ops, no fused kernel
    assert all(layer.self_attn.rotating is None for layer in model.model.layers)
    assert all(layer.input_layernorm.fused_add_norm is None for layer in model.model.layers)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == overrides["tie_word_embeddings"]
    ids = _prompt(13)
    (ours,) = harness.run(model, [("a", ids)])
    assert_like_transformers([ours], hf, exact_twin(hf), [ids])


@pytest.mark.parametrize("elementwise", [False, True], ids=["torch-ops", "cpp-elementwise"])
@pytest.mark.parametrize(
    "variant", ["llama-tied-gqa", "qwen3-qknorm-headdim-tied", "qwen2-bias-untied"]
)
def test_mixed_batch_over_kv_pool_matches_transformers(
    variant: str, elementwise: bool, tmp_path: Path
) -> None:
    """One pass mixing a fresh prefill, an extend over a cached prefix and three
    decodes; with the torch ops and with the C++ elementwise kernels."""
    kind, overrides = VARIANTS[variant]
    hf = build_hf_model(kind, **overrides)
    model, harness = load_saved(hf, tmp_path / variant)
    if elementwise:
        model.use_elementwise_kernels(load_elementwise_kernels(cache_root() / "kernels"))
    lengths = {"fresh": 9, "extend": 15, "dec1": 6, "dec2": 11, "dec3": 4}
    seqs = {key: _prompt(n, seed) for seed, (key, n) in enumerate(lengths.items())}
    harness.run(model, [("extend", seqs["extend"][:8])])  # a lone fresh prefill (causal path)
    decodes = ["dec1", "dec2", "dec3"]
    harness.run(model, [(k, seqs[k][:-1]) for k in decodes])  # several prefills, masked path
    chunks = [("fresh", seqs["fresh"]), ("extend", seqs["extend"][8:])]
    chunks += [(k, seqs[k][-1:]) for k in decodes]
    got = harness.run(model, chunks)
    assert_like_transformers(got, hf, exact_twin(hf), [seqs[key] for key, _ in chunks])


@pytest.mark.parametrize("elementwise", [False, True], ids=["torch-ops", "cpp-elementwise"])
def test_output_rows_are_those_rows_of_the_full_pass(elementwise: bool, tmp_path: Path) -> None:
    """A pass asked for some rows returns those rows of the full pass (in the
    asked order, repeats allowed, none at all) and still writes every token's
    K/V: a later pass on top of a prefix whose pass returned no row at all gives
    transformers' logits."""
    hf = build_hf_model("qwen2", tie_word_embeddings=False)
    model, harness = load_saved(hf, tmp_path / "qwen2")
    if elementwise:
        model.use_elementwise_kernels(load_elementwise_kernels(cache_root() / "kernels"))
    first, second, more = _prompt(9, 1), _prompt(5, 2), _prompt(4, 3)
    full = torch.cat(harness.run(model, [("a", first), ("b", second)]))  # (14, V)
    rows = [8, 13, 8, 2]
    some = harness.run_rows(model, [("c", first), ("d", second)], rows)
    # The last layer's o_proj and MLP, the norm and the LM head see 4 rows instead of
    # 14 (other summation orders): as accurate as the full pass, against the exact rows.
    twin = exact_twin(hf)
    truth = torch.cat((hf_logits(twin, first), hf_logits(twin, second)))[rows]
    num.assert_no_worse_than(some, full[rows], truth, num.SAME_COMPUTATION)
    none = harness.run_rows(model, [("e", first)], [])
    assert none.shape == (0, full.shape[1])
    (after,) = harness.run(model, [("e", more)])
    assert_like_transformers([after], hf, twin, [first + more])


ROPE_SCALINGS = {
    "linear": ({"rope_type": "linear", "factor": 2.0}, 32, 30),
    # Dynamic NTK is fixed for max_position_embeddings * factor; HF matches at that length.
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, 16, 32),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
        32,
        30,
    ),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}, 32, 30),
}


@pytest.mark.parametrize("rope_type", ROPE_SCALINGS)
def test_rope_scaling_logits_match_transformers(rope_type: str, tmp_path: Path) -> None:
    scaling, max_pos, num_tokens = ROPE_SCALINGS[rope_type]
    rope = {"rope_theta": 10000.0, **scaling}
    hf = build_hf_model("llama", rope_parameters=rope, max_position_embeddings=max_pos)
    model, harness = load_saved(hf, tmp_path / rope_type)
    assert harness.config.rope_scaling.rope_type == rope_type
    ids = _prompt(num_tokens)
    (ours,) = harness.run(model, [("a", ids)])
    assert_like_transformers([ours], hf, exact_twin(hf), [ids])


def test_sharded_checkpoint_loads_identically(tmp_path: Path) -> None:
    hf = build_hf_model("qwen2", tie_word_embeddings=False)
    single, harness = load_saved(hf, tmp_path / "single")
    sharded_dir = save_hf(hf, tmp_path / "sharded", max_shard_size="40KB")
    assert (sharded_dir / "model.safetensors.index.json").is_file()
    assert len(list(sharded_dir.glob("*.safetensors"))) > 1
    sharded = load_model(sharded_dir, harness.backend, torch.float32)
    for (name, a), (_, b) in zip(
        single.named_parameters(), sharded.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("num_tokens", [20, 128])  # 128: bf16's many-rows kernel (see Linear)
@pytest.mark.parametrize(
    ("dtype", "elementwise"),
    [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float16, False)],
    ids=["bfloat16-torch-ops", "bfloat16-cpp-elementwise", "float16-torch-ops"],
)
def test_half_precision_loads_and_runs_close_to_fp32(
    dtype: torch.dtype, elementwise: bool, num_tokens: int, tmp_path: Path
) -> None:
    """With the C++ elementwise kernels a bfloat16 model rounds once per step where
    torch rounds per op: no less accurate."""
    hf = build_hf_model("qwen3", head_dim=24, tie_word_embeddings=False)
    _, ref_harness = load_saved(hf, tmp_path / "fp32")
    half_harness = KVHarness(ref_harness.config, dtype)
    half = half_harness.load(tmp_path / "fp32")
    assert all(p.dtype == dtype for p in half.parameters())
    if elementwise:
        half.use_elementwise_kernels(load_elementwise_kernels(cache_root() / "kernels"))
    ids = _prompt(num_tokens)
    (got,) = half_harness.run(half, [("a", ids)])
    assert got.dtype == torch.float32
    # The weights rounded to 8-bit (bf16) or 11-bit (fp16) significands dominate the
    # error: against the exact float32 model, as accurate as transformers' own model
    # in that dtype (the same weights, rounded the same way).
    hf_half = copy.deepcopy(hf).to(dtype)
    truth = hf_logits(exact_twin(hf), ids)
    num.assert_no_worse_than(got, hf_logits(hf_half, ids), truth, num.SAME_ROUNDINGS)


def test_elementwise_kernels_take_float32_and_bfloat16_models_only(tmp_path: Path) -> None:
    hf = build_hf_model("llama")
    save_hf(hf, tmp_path)
    model = KVHarness(ArchConfig.from_model_dir(tmp_path), torch.float16).load(tmp_path)
    with pytest.raises(ValueError, match="float32 and bfloat16 models on CPU"):
        model.use_elementwise_kernels(load_elementwise_kernels(cache_root() / "kernels"))


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    harness = KVHarness(ArchConfig("LlamaForCausalLM", 96, 64, 112, 2, 4, 2, 16))
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel") as info:
        load_model(tmp_path, harness.backend, torch.float32)
    assert "LlamaForCausalLM" in str(info.value)  # lists what is supported
