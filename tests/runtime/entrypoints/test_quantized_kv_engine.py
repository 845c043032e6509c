"""An int8 KV cache on the real default model: greedy continuations match a bfloat16
pool's, the pool holds about twice the tokens in the same memory, and ``radixlm
perplexity``'s measure sees the quantized K/V (it moves, a little)."""

from __future__ import annotations

import pytest

from radixlm import Engine
from radixlm.runtime.entrypoints.perplexity import DEFAULT_TEXT, measure_perplexity

# 24 prompts of several kinds; each continues for 64 greedy tokens
TOPICS = [
    "the history of Rome",
    "how a bicycle works",
    "why the sky is blue",
    "a recipe for bread",
    "the water cycle",
    "what a prime number is",
    "the rules of chess",
    "how bees make honey",
]
PROMPTS = [
    *(f"<|im_start|>user\nTell me about {t}.<|im_end|>\n<|im_start|>assistant\n" for t in TOPICS),
    *(f"Here is a short essay on {t}." for t in TOPICS),
    *(f"Q: What should a child know about {t}?\nA:" for t in TOPICS),
]
GREEDY = {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}


def _serve(model_dir, kv_cache_dtype: str) -> tuple[list[list[int]], float, int]:
    """(each prompt's continuation, perplexity over 2 windows, the pool's capacity)."""
    with Engine(
        model_path=str(model_dir),
        dtype="bfloat16",
        kv_memory_gb=0.25,
        kv_cache_dtype=kv_cache_dtype,
    ) as engine:
        outputs = engine.generate(PROMPTS, GREEDY)
        text = DEFAULT_TEXT.read_text(encoding="utf-8")
        ppl = measure_perplexity(engine, text, context=512, max_windows=2).perplexity
        return [o["output_ids"] for o in outputs], ppl, engine.get_stats().kv_capacity


def test_int8_kv_continues_as_bf16_kv_for_95_percent_of_prompts(default_model_dir):
    """Measured: 23 / 24 prompts (96 %) equal over 64 tokens on a 2-core AVX-512 CPU."""
    bf16, bf16_ppl, bf16_tokens = _serve(default_model_dir, "auto")
    int8, int8_ppl, int8_tokens = _serve(default_model_dir, "int8")
    same = sum(a == b for a, b in zip(bf16, int8))
    assert same >= 0.95 * len(PROMPTS), f"{same} / {len(PROMPTS)} continuations equal"
    # 64 values of 2 bytes a head, or 64 codes and a 4-byte scale: 128 / 68
    assert int8_tokens / bf16_tokens == pytest.approx(128 / 68, rel=1e-3)
    assert int8_ppl != bf16_ppl  # the windows attend the quantized K/V
    assert abs(int8_ppl / bf16_ppl - 1) < 0.01
