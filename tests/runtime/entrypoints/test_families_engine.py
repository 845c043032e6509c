"""The engine serving the families beyond Llama end to end, on random-weight
checkpoints with a word-level tokenizer: greedy tokens equal transformers', a
repeated prompt is served from the radix cache, a long prompt is prefilled in chunks
across its sliding window, constrained decoding holds, and int4 weights serve."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.models import write_random_model

BASE: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
}
EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
# windows of 16 tokens: the prompts (40 words) and the output reach past them
FAMILIES: dict[str, dict[str, Any]] = {
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"],
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 16,
    },
    "gemma3": {"architectures": ["Gemma3ForCausalLM"], "head_dim": 16, "sliding_window": 16},
    "phi3-partial": {"architectures": ["Phi3ForCausalLM"], "partial_rotary_factor": 0.5},
    "qwen3-moe": {"architectures": ["Qwen3MoeForCausalLM"], **EXPERTS},
    "mixtral-window": {
        "architectures": ["MixtralForCausalLM"],
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 16,
    },
}
GREEDY = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
PROMPT = " ".join(f"w{(7 * i) % 120 + 3}" for i in range(40))


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = {**BASE, **FAMILIES[request.param]}
    return write_random_model(tmp_path_factory.mktemp(request.param), config, torch.float32)


def _engine(model_dir: Path, **options: Any) -> Engine:
    return Engine(
        model_path=str(model_dir),
        dtype="float32",
        max_total_tokens=2048,
        chunked_prefill_size=16,  # the 40-token prompt in three chunks
        **options,
    )


def _hf_greedy(model_dir: Path, ids: list[int], steps: int) -> list[int]:
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    out = list(ids)
    with torch.inference_mode():
        for _ in range(steps):
            out.append(int(hf(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


def test_greedy_cached_and_chunked_equal_transformers(family_dir: Path) -> None:
    with _engine(family_dir) as engine:
        first = engine.generate(PROMPT, GREEDY)
        again = engine.generate(PROMPT, GREEDY)
        ids = engine.tokenizer.encode(PROMPT)
    assert first["output_ids"] == _hf_greedy(family_dir, ids, GREEDY["max_new_tokens"])
    assert again["output_ids"] == first["output_ids"]
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] >= len(ids) - 1  # served from the radix cache


def test_constrained_decoding_and_int4_weights_serve(family_dir: Path) -> None:
    # the word-level vocabulary spells token i as " w<i>" (its decoder puts a space before)
    pattern = r" ?w1[0-9] ?w2[0-9] ?w3[0-9]"
    with _engine(family_dir, quantization="int4", quantization_group_size=32) as engine:
        params = {"temperature": 0, "max_new_tokens": 12, "regex": pattern}
        # llguidance: outlines-core refuses a vocabulary where "w3" is a word and "0" none
        out = engine.generate(PROMPT, {**params, "grammar_backend": "llguidance"})
        free = engine.generate(PROMPT, GREEDY)
        small = engine._rt.runner.small_batch  # no public seam for the pass paths
    if family_dir.name.startswith("qwen3-moe"):  # the whole decode step, experts included
        assert small is not None and small.whole_steps >= GREEDY["max_new_tokens"] - 1
    assert re.fullmatch(r" w1[0-9] w2[0-9] w3[0-9]", out["text"]), out["text"]
    assert [i // 10 for i in out["output_ids"][:3]] == [1, 2, 3]
    assert len(free["output_ids"]) == GREEDY["max_new_tokens"]
