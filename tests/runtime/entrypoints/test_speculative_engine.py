"""Speculative decoding end to end: the default model (float32) with n-gram
speculation gives the same greedy tokens as without, alone and in mixed batches,
unconstrained and constrained (JSON schema, regex, jump-forward), under a pool tight
enough to retract, with the same stop rules and logprobs; seeded sampled rows give the
same tokens; sampled frequencies on a small random model match those without."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from radixlm import Engine
from radixlm.runtime.models import write_random_model
from radixlm.runtime.speculative.cost import PassCost
from tests.runtime.speculative.stats import assert_same_distribution

DOC = (
    "Invoice number: INV-2024-00917. Customer: Margaret Ellison, 42 Harbor Lane, Portland, "
    "Oregon. Date: March 14, 2024. Amount due: 1,284.50 USD. Payment terms: net 30. "
    "Contact: billing@ellison-supply.com."
)


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


COPYING = [
    chat(f"Copy this text exactly:\n{DOC}"),
    chat(f"{DOC}\nWho is the customer, and how much is due?"),
    chat("List the numbers from 1 to 30, separated by commas."),
]
FRESH = [chat("Write a short poem about the sea."), chat("Explain how a bicycle works.")]
GREEDY = {"temperature": 0, "max_new_tokens": 64}
SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string"},
        "customer": {"type": "string"},
        "email": {"type": "string"},
        "amount": {"type": "string"},
    },
    "required": ["invoice_number", "customer", "email", "amount"],
    "additionalProperties": False,
}
EXTRACT = chat(f"{DOC}\nReturn the invoice number, customer, email and amount as JSON.")


@pytest.fixture(scope="module")
def spec_engine(default_model_dir):
    eng = Engine(
        model_path=str(default_model_dir),
        dtype="float32",
        max_total_tokens=4096,  # this module holds at most ~1,000 tokens at once
        speculative="ngram",
        speculative_num_tokens=4,
        speculative_calibrate=False,  # the fixed cost model: the same plans on any machine
    )
    yield eng
    eng.shutdown()


def ids(outputs: list[dict]) -> list[list[int]]:
    return [o["output_ids"] for o in outputs]


def accepted(engine: Engine) -> int:
    return engine.get_stats().speculative.num_accepted


def test_greedy_tokens_equal_without_speculation(engine, spec_engine, check_no_leaks):
    prompts = COPYING + FRESH
    want = ids(engine.generate(prompts, GREEDY))  # (batch invariant: see test_engine.py)
    before = spec_engine.get_stats().speculative
    got = [spec_engine.generate(p, GREEDY)["output_ids"] for p in prompts]
    assert got == want
    again = spec_engine.generate(COPYING[0], GREEDY)["meta_info"]  # SGLang's meta_info
    assert 0 < again["spec_verify_ct"] < again["completion_tokens"]
    assert again["spec_accepted_tokens"] >= again["completion_tokens"] // 3
    assert "spec_verify_ct" not in engine.generate(COPYING[0], GREEDY)["meta_info"]
    after = spec_engine.get_stats().speculative
    assert after.verify_rows > before.verify_rows
    # copying prompts accept most of what they propose
    assert after.num_accepted - before.num_accepted >= 60
    check_no_leaks(spec_engine)


def test_batched_and_mixed_with_prefills(engine, spec_engine, check_no_leaks):
    """A batch whose requests decode (and speculate) while others still prefill, with
    different lengths and a greedy request finishing early on max_new_tokens."""
    prompts = COPYING + FRESH + [chat("Name three colours." * 6)]
    params = [{**GREEDY, "max_new_tokens": 16 + 9 * i} for i in range(len(prompts))]
    want = ids(engine.generate(prompts, params))
    spec_engine.flush_cache()
    got = spec_engine.generate(prompts, params)
    assert ids(got) == want
    assert [len(o["output_ids"]) for o in got] == [len(w) for w in want]
    check_no_leaks(spec_engine)


def test_constrained_json_schema_and_regex(engine, spec_engine, check_no_leaks):
    cases = [
        {**GREEDY, "max_new_tokens": 96, "json_schema": json.dumps(SCHEMA)},
        {**GREEDY, "max_new_tokens": 96, "json_schema": json.dumps(SCHEMA), "jump_forward": True},
        {**GREEDY, "regex": r"INV-[0-9]{4}-[0-9]{5}, (Margaret|Peter) [A-Z][a-z]+\."},
    ]
    wants = engine.generate([EXTRACT] * len(cases), cases)
    for params, want in zip(cases, wants):
        before = accepted(spec_engine)
        got = spec_engine.generate(EXTRACT, params)
        assert got["output_ids"] == want["output_ids"], params
        assert got["text"] == want["text"]
        if "json_schema" in params:  # (the 135M model may not close the object in time)
            assert got["text"].startswith('{"invoice_number":"INV-2024-00917"')
            assert accepted(spec_engine) > before  # copied fields were accepted
    stats = spec_engine.get_stats()
    forced = stats.speculative.accepted["jump_forward"]  # jump-forward's, as proposals
    assert forced == stats.speculative.proposed["jump_forward"] == stats.num_jump_forward_tokens
    assert forced > 0
    check_no_leaks(spec_engine)


def test_seeded_sampling_gives_the_same_tokens(engine, spec_engine):
    """Seeded rows draw from their own (seed, step) stream at every verified position,
    so they emit what they emit without speculation, token for token."""
    params = [
        {"temperature": 0.8, "top_p": 0.9, "seed": 11, "max_new_tokens": 48},
        {"temperature": 0.7, "top_k": 20, "min_p": 0.05, "seed": 12, "max_new_tokens": 48},
        {"temperature": 1.0, "repetition_penalty": 1.2, "seed": 13, "max_new_tokens": 48},
    ]
    prompts = [COPYING[0], COPYING[2], COPYING[1]]
    want = ids(engine.generate(prompts, params))
    assert ids(spec_engine.generate(prompts, params)) == want


def test_stop_rules_and_lengths(engine, spec_engine):
    """Stop strings, stop_regex, stop token ids, min_new_tokens and max_new_tokens end a
    speculating request exactly where they end it without speculation, even inside a
    run of accepted proposals."""
    copy = COPYING[0]
    cases = [
        {**GREEDY, "stop": ["Portland"]},
        {**GREEDY, "stop": ["Portland"], "no_stop_trim": True},
        {**GREEDY, "stop_regex": [r"\d{3}\.\d\d"]},
        {**GREEDY, "max_new_tokens": 7},
        {**GREEDY, "max_new_tokens": 13, "min_new_tokens": 13, "stop_token_ids": [13]},
        {**GREEDY, "stop_token_ids": [30]},
    ]
    wants = engine.generate([copy] * len(cases), cases)
    for params, want in zip(cases, wants):
        got = spec_engine.generate(copy, params)
        assert got["output_ids"] == want["output_ids"], params
        assert got["text"] == want["text"], params
        assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"], params


def test_logprobs_equal_without_speculation(engine, spec_engine):
    kwargs = {"return_logprob": True, "top_logprobs_num": 3}
    want = engine.generate(COPYING[0], GREEDY, **kwargs)["meta_info"]
    got = spec_engine.generate(COPYING[0], GREEDY, **kwargs)["meta_info"]
    assert [t[1] for t in got["output_token_logprobs"]] == [
        t[1] for t in want["output_token_logprobs"]
    ]
    for a, b in zip(got["output_token_logprobs"], want["output_token_logprobs"]):
        assert a[0] == pytest.approx(b[0], abs=1e-3)
    for a, b in zip(got["output_top_logprobs"], want["output_top_logprobs"]):
        assert [t[1] for t in a] == [t[1] for t in b]


def test_request_may_turn_speculation_off(spec_engine):
    stats = spec_engine.get_stats().speculative
    spec_engine.generate(COPYING[0], {**GREEDY, "speculative_num_tokens": 0})
    assert spec_engine.get_stats().speculative.verify_rows == stats.verify_rows
    spec_engine.generate(COPYING[0], {**GREEDY, "speculative_num_tokens": 2})
    after = spec_engine.get_stats().speculative
    assert after.verify_rows > stats.verify_rows
    assert len(after.accept_lengths) <= 5  # never more than the engine's K = 4


def test_tight_pool_retracts_and_completes(engine, default_model_dir, check_no_leaks):
    prompts = [COPYING[0], COPYING[2], FRESH[0]]
    params = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}
    want = ids(engine.generate(prompts, params))
    longest = max(len(engine.tokenizer(p).input_ids) for p in prompts) + 32
    small = Engine(
        model_path=str(default_model_dir),
        dtype="float32",
        max_total_tokens=longest + 40,
        chunked_prefill_size=32,
        init_new_token_ratio=0.0,  # admit eagerly, so the decodes outgrow the pool
        min_new_token_ratio=0.0,
        speculative="ngram",
        speculative_calibrate=False,
    )
    try:
        assert ids(small.generate(prompts, params)) == want
        stats = small.get_stats()
        assert stats.num_retractions > 0
        assert stats.speculative.num_accepted > 0
        check_no_leaks(small)
    finally:
        small.shutdown()


# ---- sampled distributions, on a small random model ----------------------------------------

TINY = {
    "vocab_size": 32,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,  # tied, a random model repeats its last token for sure
}
# a periodic prompt: the n-gram proposer proposes its continuation every step
PERIODIC = " ".join(f"w{3 + i % 5}" for i in range(30))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("tiny"), TINY, torch.float32, seed=3)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A smaller random model with the same vocabulary: a poor draft (exactness does
    not depend on its quality)."""
    config = {**TINY, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    return write_random_model(tmp_path_factory.mktemp("draft"), config, torch.float32, seed=9)


@pytest.fixture(scope="module")
def near_draft_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target with its LM head scaled by 0.6: a draft whose q overlaps p without
    equalling it, so rejection sampling both accepts and rejects."""
    from safetensors.torch import load_file, save_file

    directory = tmp_path_factory.mktemp("near_draft")
    for path in tiny_dir.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, directory / path.name)
            continue
        tensors = load_file(str(path))
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"] = tensors["lm_head.weight"] * 0.6
        save_file(tensors, str(directory / path.name))
    return directory


def _sample_tokens(model_dir: Path, params: dict[str, Any], n: int, **options: Any) -> list:
    engine = Engine(model_path=str(model_dir), dtype="float32", random_seed=5, **options)
    try:
        sp = {**params, "max_new_tokens": 3, "ignore_eos": True}
        outs = engine.generate([PERIODIC] * n, sp)
        stats = engine.get_stats().speculative
        return [tuple(o["output_ids"]) for o in outs], stats
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 1.0, "top_k": 4},
        {"temperature": 0.9, "top_p": 0.8},
        {"temperature": 1.0, "min_p": 0.2},
    ],
    ids=["top_k", "top_p", "min_p"],
)
@pytest.mark.parametrize("algorithm", ["ngram", "draft"])
def test_sampled_tokens_follow_the_same_distribution(tiny_dir, near_draft_dir, params, algorithm):
    """Frequencies of the 2nd and 3rd sampled tokens (those a verify row emits after an
    accepted proposal) with speculation match those without: a two-sample chi-square
    test at alpha = 1e-4 over 1,000 samples each. The draft path's proposals are drawn
    from the draft's own distribution and verified by rejection sampling."""
    n = 1000
    plain, _ = _sample_tokens(tiny_dir, params, n)
    options: dict[str, Any] = {"speculative": algorithm, "speculative_adaptive": False}
    if algorithm == "draft":
        options["speculative_draft_model_path"] = str(near_draft_dir)
    spec, stats = _sample_tokens(tiny_dir, params, n, **options)
    # proposals were accepted and rejected: both paths were exercised
    assert n // 20 < stats.num_accepted < stats.num_proposed
    for position in (1, 2):
        assert_same_distribution([t[position] for t in plain], [t[position] for t in spec])


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_draft_model_greedy_tokens_equal_without_speculation(
    tiny_dir, draft_dir, check_no_leaks, kv_cache_dtype
):
    """A poor draft (another random model) changes nothing under greedy decoding, alone
    and in a batch, and its KV is all handed back when the requests end; with an int8
    KV cache too (the draft's pool takes the target's format)."""
    prompts = [PERIODIC, " ".join(f"w{3 + (i * 7) % 20}" for i in range(25)), "w5 w6"]
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    plain = Engine(model_path=str(tiny_dir), dtype="float32", kv_cache_dtype=kv_cache_dtype)
    try:
        want = ids(plain.generate(prompts, params))
    finally:
        plain.shutdown()
    spec = Engine(
        model_path=str(tiny_dir),
        dtype="float32",
        speculative="draft",
        speculative_draft_model_path=str(draft_dir),
        speculative_adaptive=False,
        kv_cache_dtype=kv_cache_dtype,
    )
    try:
        draft = spec._rt.scheduler.speculator._draft
        assert draft._shard.pool.quantized == (kv_cache_dtype == "int8")
        assert [spec.generate(p, params)["output_ids"] for p in prompts] == want
        assert ids(spec.generate(prompts, params)) == want
        stats = spec.get_stats().speculative
        assert stats.verify_rows > 0 and set(stats.proposed) == {"draft"}
        check_no_leaks(spec)
        assert draft.num_free_slots == draft.capacity
    finally:
        spec.shutdown()


def test_default_model_drafting_for_itself_accepts_everything(default_model_dir, engine):
    """The sanity check: a draft equal to the target proposes what the target would
    emit, greedy or sampled (p = q: every proposal is accepted)."""
    own = Engine(
        model_path=str(default_model_dir),
        dtype="float32",
        max_total_tokens=2048,
        speculative_draft_max_total_tokens=2048,
        speculative="draft",
        speculative_draft_model_path=str(default_model_dir),
        speculative_adaptive=False,
    )
    try:
        greedy = {**GREEDY, "max_new_tokens": 32}
        assert (
            own.generate(FRESH[0], greedy)["output_ids"]
            == (engine.generate(FRESH[0], greedy)["output_ids"])
        )
        own.generate(FRESH, {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 24})
        stats = own.get_stats().speculative
        assert stats.num_proposed > 30 and stats.num_accepted == stats.num_proposed
    finally:
        own.shutdown()


def test_bfloat16_greedy_tokens_equal_without_speculation(default_model_dir):
    """In bfloat16 too: a verify pass computes each token as the decode pass that would
    compute it alone (the C++ whole-step kernel, one decode row per token)."""
    prompts = [COPYING[0], FRESH[0]]
    params = {**GREEDY, "max_new_tokens": 40}
    outputs = []
    for options in ({}, {"speculative": "ngram", "speculative_calibrate": False}):
        eng = Engine(
            model_path=str(default_model_dir), dtype="bfloat16", max_total_tokens=2048, **options
        )
        try:
            outputs.append([eng.generate(p, params)["output_ids"] for p in prompts])
            if options:
                assert eng.get_stats().speculative.num_accepted > 15
        finally:
            eng.shutdown()
    assert outputs[0] == outputs[1]


def test_calibrated_engine_measures_its_passes_and_keeps_outputs(
    engine, default_model_dir, check_no_leaks
):
    """By default the engine times scratch passes at start-up and plans with them; the
    scratch passes touch no request's KV: outputs stay those without speculation."""
    prompts = [COPYING[0], FRESH[0]]
    params = {**GREEDY, "max_new_tokens": 24}
    want = [engine.generate(p, params)["output_ids"] for p in prompts]
    eng = Engine(
        model_path=str(default_model_dir),
        dtype="float32",
        max_total_tokens=2048,
        speculative="ngram",
    )
    try:
        cost = eng._rt.scheduler.speculator.pass_cost
        assert cost != PassCost.per_token(0.1)  # measured, in seconds
        assert 0 < cost.decode(1) < 5 and 0 < cost.verify(1, 5) < 5
        assert [eng.generate(p, params)["output_ids"] for p in prompts] == want
        assert ids(eng.generate(prompts, params)) == want
        check_no_leaks(eng)
    finally:
        eng.shutdown()
