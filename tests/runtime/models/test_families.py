"""Every family beyond Llama against transformers' own implementation, on tiny
random-weight checkpoints that transformers builds and saves: Phi-3 (fused tensors,
LongRoPE, partial rotary), Gemma 2 and 3, and the mixture-of-experts families."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from radixlm.kernels.cpu.elementwise import load_elementwise_kernels
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models import ArchConfig
from radixlm.runtime.models.moe import SparseMoE
from tests import numerics as num
from tests.runtime.models.helpers import (
    KVHarness,
    assert_like_transformers,
    build_hf_model,
    exact_twin,
    fuse_norms,
    hf_logits,
    load_saved,
    save_hf,
)

HEAD_HALF = 8  # tiny models' head_dim / 2


def _longrope(original: int) -> dict[str, Any]:
    factors = torch.linspace(1.0, 3.0, HEAD_HALF).tolist()
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": factors,
        "long_factor": [2 * f for f in factors],
        "original_max_position_embeddings": original,
    }


# id -> (kind, HF config overrides); windows wider than every test sequence here (the
# sliding-window tests narrow them)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "phi3": ("phi3", {}),
    "phi3-longrope": (
        "phi3",
        {"rope_parameters": _longrope(64), "max_position_embeddings": 128},
    ),
    "phi4mini-partial-rotary": ("phi3", {"partial_rotary_factor": 0.5}),
    "gemma2": ("gemma2", {"attn_implementation": "eager"}),
    "gemma3": ("gemma3", {"num_hidden_layers": 3, "sliding_window_pattern": 3}),
    "qwen3-moe": ("qwen3_moe", {"norm_topk_prob": True}),
    "qwen2-moe-shared": ("qwen2_moe", {}),
    "mixtral": ("mixtral", {}),
    "olmoe-clip": ("olmoe", {"clip_qkv": 2.0}),
    # windows of 8: every prompt, cached prefix and greedy run below reaches past them
    "gemma2-window8": ("gemma2", {"attn_implementation": "eager", "sliding_window": 8}),
    "gemma3-window8": (
        "gemma3",
        {"num_hidden_layers": 3, "sliding_window": 8, "sliding_window_pattern": 2},
    ),
    "mistral-window8": ("mistral", {"sliding_window": 8}),
    "qwen2-window8-upper-layer": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    "phi3-window8": ("phi3", {"sliding_window": 8}),
}


def _prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(3, 96, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(name, HF model, its checkpoint directory) of each family."""
    kind, overrides = FAMILIES[request.param]
    hf = build_hf_model(kind, **overrides)
    path = save_hf(hf, tmp_path_factory.mktemp(request.param) / "model")
    return request.param, hf, path


def test_config_reads_each_family(family) -> None:
    name, hf, path = family
    c = ArchConfig.from_model_dir(path)
    assert c.architecture == type(hf).__name__
    assert c.llama_layers == (name.startswith("phi3") and "window" not in name)
    if name.endswith("window8"):
        assert c.sliding_window == 8
    if name == "qwen2-window8-upper-layer":
        assert c.layer_windows == (None, 8)
    assert (c.moe is not None) == ("moe" in name or name in ("mixtral", "olmoe-clip"))
    types = getattr(hf.config, "layer_types", None)
    window = getattr(hf.config, "sliding_window", None)
    if types and window and "sliding_attention" in types:  # transformers' own layer plan
        assert c.layer_windows == tuple(window if t == "sliding_attention" else None for t in types)
    if name.startswith("gemma3"):
        assert c.local_rope_theta == 10_000.0 and c.rope_theta == 1_000_000.0
    if name == "phi4mini-partial-rotary":
        assert c.rotary_dims == 8
    if name.startswith("gemma"):
        assert c.gemma_norms and c.hidden_act == "gelu_tanh" and c.attention_scale == 0.25


def test_prefill_logits_match_transformers(family) -> None:
    _, hf, path = family
    harness = KVHarness(ArchConfig.from_model_dir(path))
    model = harness.load(path)
    ids = _prompt(21)
    (ours,) = harness.run(model, [("a", ids)])
    assert_like_transformers([ours], hf, exact_twin(hf), [ids])


@pytest.mark.parametrize("elementwise", [False, True], ids=["torch-ops", "cpp-elementwise"])
def test_mixed_batch_over_a_cached_prefix_matches_transformers(family, elementwise: bool) -> None:
    """One pass mixing a fresh prefill, an extend over a cached prefix and three
    decodes; with the torch ops and with the C++ elementwise kernels."""
    _, hf, path = family
    harness = KVHarness(ArchConfig.from_model_dir(path))
    model = harness.load(path)
    if elementwise:
        model.use_elementwise_kernels(load_elementwise_kernels(cache_root() / "kernels"))
    lengths = {"fresh": 9, "extend": 15, "dec1": 6, "dec2": 11, "dec3": 4}
    seqs = {key: _prompt(n, seed) for seed, (key, n) in enumerate(lengths.items())}
    harness.run(model, [("extend", seqs["extend"][:8])])
    decodes = ["dec1", "dec2", "dec3"]
    harness.run(model, [(k, seqs[k][:-1]) for k in decodes])
    chunks = [("fresh", seqs["fresh"]), ("extend", seqs["extend"][8:])]
    chunks += [(k, seqs[k][-1:]) for k in decodes]
    got = harness.run(model, chunks)
    assert_like_transformers(got, hf, exact_twin(hf), [seqs[key] for key, _ in chunks])


# Families whose attention exercises each switch of the fused Triton path: partial
# rotary, longrope tables, Gemma's float32 norms, soft-cap and local rope, OLMoE's
# projection norms and clip, sliding windows
TRITON_FAMILIES = (
    "phi4mini-partial-rotary",
    "phi3-longrope",
    "gemma2",
    "gemma3",
    "olmoe-clip",
    "mistral-window8",
)


def test_the_triton_path_matches_transformers(family) -> None:
    """The Triton backend (RoPE fused with the pool write) and the fused add + RMSNorm
    kernel, as a model on CUDA runs them: a fresh prefill, an extend over a cached
    prefix and decodes in one pass."""
    name, hf, path = family
    if name not in TRITON_FAMILIES:
        pytest.skip("covered by the other families' Triton runs")
    harness = KVHarness(ArchConfig.from_model_dir(path), backend_name="triton")
    model = harness.load(path)
    assert all(layer.self_attn.rotating is harness.backend for layer in model.model.layers)
    assert model.model.norm.fused_add_norm is None  # built on a CPU: the torch ops
    fuse_norms(model)
    lengths = {"fresh": 9, "extend": 15, "dec1": 6, "dec2": 11}
    seqs = {key: _prompt(n, seed) for seed, (key, n) in enumerate(lengths.items())}
    harness.run(model, [("extend", seqs["extend"][:8])])
    harness.run(model, [(k, seqs[k][:-1]) for k in ("dec1", "dec2")])
    decodes = harness.run(model, [(k, seqs[k][-1:]) for k in ("dec1", "dec2")])
    chunks = [("fresh", seqs["fresh"]), ("extend", seqs["extend"][8:])]
    got = harness.run(model, chunks)
    keys = ["fresh", "extend", "dec1", "dec2"]
    assert_like_transformers(got + decodes, hf, exact_twin(hf), [seqs[k] for k in keys])


def test_bfloat16_is_as_accurate_as_transformers_in_bfloat16(family) -> None:
    _, hf, path = family
    harness = KVHarness(ArchConfig.from_model_dir(path), torch.bfloat16)
    model = harness.load(path)
    # Eight prompts in one pass, and the root-mean-square error over all their logits:
    # bf16's largest error swings by a third from prompt to prompt on either side
    # (Gemma's large logits most), and jumps wherever rounding flips an expert choice
    # near a routing tie or a value at OLMoE's clip, in either model.
    prompts = [_prompt(24, seed) for seed in range(8)]
    got = torch.cat(harness.run(model, [(f"p{i}", ids) for i, ids in enumerate(prompts)]))
    twin, hf_bf16 = exact_twin(hf), copy.deepcopy(hf).to(torch.bfloat16)
    truth = torch.cat([hf_logits(twin, ids) for ids in prompts])
    ref = torch.cat([hf_logits(hf_bf16, ids) for ids in prompts])

    def rms(error: torch.Tensor) -> float:
        return float(error.double().pow(2).mean().sqrt())

    ours, theirs = rms(got - truth), rms(ref - truth)
    assert ours <= num.SAME_ROUNDINGS * theirs, f"bf16 RMS error {ours:.3g} vs {theirs:.3g}"


def _greedy_hf(hf, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(hf_logits(hf, ids)[-1].argmax()))
    return ids[len(prompt) :]


def _greedy_ours(harness: KVHarness, model, key: str, chunks: list[list[int]], steps: int):
    """Prefills ``chunks`` one pass each (the later ones over the cached earlier ones),
    then decodes ``steps`` tokens one pass each."""
    for chunk in chunks:
        (logits,) = harness.run(model, [(key, chunk)])
    out = [int(logits[-1].argmax())]
    while len(out) < steps:
        (logits,) = harness.run(model, [(key, out[-1:])])
        out.append(int(logits[-1].argmax()))
    return out


def test_64_greedy_tokens_equal_transformers_fresh_and_over_a_cached_prefix(family) -> None:
    _, hf, path = family
    harness = KVHarness(ArchConfig.from_model_dir(path), num_slots=512)
    model = harness.load(path)
    prompt = _prompt(12, seed=7)
    want = _greedy_hf(hf, prompt, 64)
    assert _greedy_ours(harness, model, "fresh", [prompt], 64) == want
    assert _greedy_ours(harness, model, "cached", [prompt[:5], prompt[5:]], 64) == want


def test_an_expert_no_token_chose_is_never_run(tmp_path: Path) -> None:
    """Experts' weights made NaN except those a prompt's tokens choose: the output is
    finite and the experts that ran are exactly the chosen ones."""
    hf = build_hf_model("qwen3_moe")
    model, harness = load_saved(hf, tmp_path / "moe")
    moe = model.model.layers[0].mlp
    assert isinstance(moe, SparseMoE)
    ids = [5]
    chosen: list[set[int]] = []
    hook = moe.gate.register_forward_hook(
        lambda module, args, out: chosen.append(set(torch.topk(out, 2).indices[0].tolist()))
    )
    harness.run(model, [("probe", ids)])
    hook.remove()
    unused = set(range(8)) - chosen[0]
    with torch.no_grad():
        for e in unused:
            for p in moe.experts[e].parameters():
                p.fill_(float("nan"))
    before = moe.experts_run
    (logits,) = harness.run(model, [("again", ids)])
    assert torch.isfinite(logits).all()
    assert moe.experts_run - before == 2
