"""An int8 KV cache on the real default model: it picks the tokens a bfloat16 pool's
greedy continuations pick, the pool holds about twice the tokens in the same memory,
and ``radixlm perplexity``'s measure sees the quantized K/V (it moves, a little)."""

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
NEW_TOKENS = 64
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def _engine(model_dir, kv_cache_dtype: str) -> Engine:
    return Engine(
        model_path=str(model_dir),
        dtype="bfloat16",
        kv_memory_gb=0.25,
        kv_cache_dtype=kv_cache_dtype,
    )


def _picks(engine: Engine, prompts: list[list[int]], continuations: list[list[int]]) -> int:
    """How many continuation tokens are the engine's own greedy pick after the prompt
    and the continuation's tokens before them (teacher-forced: one divergence does not
    decide the rest)."""
    outputs = engine.generate(
        input_ids=[p + c for p, c in zip(prompts, continuations)],
        sampling_params={"temperature": 0, "max_new_tokens": 1},
        return_logprob=True,
        logprob_start_len=min(map(len, prompts)),
        top_logprobs_num=1,
    )
    picks = 0
    for out, continuation in zip(outputs, continuations):
        tops = out["meta_info"]["input_top_logprobs"][-len(continuation) :]  # its positions
        picks += sum(top[0][1] == token for top, token in zip(tops, continuation))
    return picks


def test_int8_kv_picks_bf16_kvs_greedy_tokens(default_model_dir):
    """Measured on a 2-core EPYC (AVX-512), of the 1,536 positions: int8 picks bf16's
    token at 1,507 (98.1%; fp8_e4m3 97.3%, fp8_e5m2 95.0%, kivi4 95.1%), the bf16 engine
    itself, scoring its own continuations in one prefill, at 1,517 (98.8%). Run free,
    10 / 24 int8 continuations stay equal for all 64 tokens, as did 18 / 24 of bf16
    through the torch backend against bf16 through the C++ kernels: a near tie flips
    either way and the rest of the text follows it, so the token-by-token share is what
    is asserted."""
    with _engine(default_model_dir, "auto") as engine:
        prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
        bf16 = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
        text = DEFAULT_TEXT.read_text(encoding="utf-8")
        bf16_ppl = measure_perplexity(engine, text, context=512, max_windows=2).perplexity
        bf16_tokens = engine.get_stats().kv_capacity
    with _engine(default_model_dir, "int8") as engine:
        picks = _picks(engine, prompts, bf16)
        int8_ppl = measure_perplexity(engine, text, context=512, max_windows=2).perplexity
        int8_tokens = engine.get_stats().kv_capacity
    positions = len(PROMPTS) * NEW_TOKENS
    assert picks >= 0.95 * positions, f"{picks} / {positions} tokens picked alike"
    # 64 values of 2 bytes a head, or 64 codes and a 2-byte (bfloat16) scale: 128 / 66
    assert int8_tokens / bf16_tokens == pytest.approx(128 / 66, rel=1e-3)
    assert int8_ppl != bf16_ppl  # the windows attend the quantized K/V
    assert abs(int8_ppl / bf16_ppl - 1) < 0.01
