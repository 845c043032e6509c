"""The draft-model proposer: greedy proposals are the draft's own greedy continuation
(the engine's, decoded independently), it stays in step with whatever the target
accepted (a proposal after any cut equals a fresh draft's), its slots always equal the
tokens it holds, sampled rows draw from the distributions they return, and a full pool
evicts other requests instead of raising.

Tiny random models (untied embeddings, so greedy decoding does not just repeat the last
token); the draft and the reference engine both run torch attention without the C++
layer kernels, so both compute the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixlm import Engine
from radixlm.runtime.config import ConfigError
from radixlm.runtime.device import DeviceTraffic, count_traffic
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.models import ArchConfig, write_random_model
from radixlm.runtime.sampling.sampler import Sampler, SamplingRow
from radixlm.runtime.sampling.verify import Verifier, VerifyRow
from radixlm.runtime.speculative.draft import DraftModel, DraftRow, DraftRowError

VOCAB = 512
DRAFT = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
TARGET = {**DRAFT, "hidden_size": 96, "num_hidden_layers": 3, "intermediate_size": 192}
OPTIONS = {"attention_backend": "torch", "cpu_layer_kernels": False}
PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("draft"), DRAFT, torch.float32, seed=1)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("target"), TARGET, torch.float32, seed=2)


@pytest.fixture(scope="module")
def target_vocab(target_dir) -> int:
    return ArchConfig.from_model_dir(target_dir).vocab_size


def load(draft_dir: Path, target_vocab: int, max_total_tokens: int = 512, **options):
    return DraftModel.load(
        str(draft_dir), target_vocab, "float32", max_total_tokens, **{**OPTIONS, **options}
    )


@pytest.fixture(scope="module")
def engine(draft_dir):
    """The draft model served as an ordinary engine: the independent greedy reference."""
    eng = Engine(model_path=str(draft_dir), dtype="float32", max_total_tokens=1024, **OPTIONS)
    yield eng
    eng.shutdown()


def sampling(output_ids=(), **params) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), list(output_ids), frozenset())


GREEDY = sampling(temperature=0)


def engine_greedy(engine: Engine, prompts: list[list[int]], n: int, **params) -> list[list[int]]:
    wanted = {"temperature": 0, "max_new_tokens": n, "ignore_eos": True, **params}
    return [out["output_ids"] for out in engine.generate(input_ids=prompts, sampling_params=wanted)]


def assert_integrity(draft: DraftModel, rids) -> None:
    """Every slot handed out holds one held token, and none is lost."""
    held = sum(len(draft.held_token_ids(rid)) for rid in rids)
    assert draft.capacity - draft.num_free_slots == held


def test_greedy_proposals_are_the_drafts_own_continuation(draft_dir, target_vocab, engine):
    draft = load(draft_dir, target_vocab)
    rows = [DraftRow(f"r{i}", p, 6, GREEDY) for i, p in enumerate(PROMPTS)]
    proposals = draft.propose(rows)
    expected = engine_greedy(engine, PROMPTS, 6)
    for proposal, tokens in zip(proposals, expected):
        assert list(proposal.token_ids) == tokens
        assert proposal.probs.shape == (6, VOCAB) and proposal.probs.dtype == torch.float32
        one_hot = torch.zeros(6, VOCAB).scatter_(1, torch.tensor(tokens)[:, None], 1.0)
        assert torch.equal(proposal.probs, one_hot)
    # what it holds: each sequence and the K - 1 drafts fed back (the last has no KV)
    for row, tokens in zip(rows, expected):
        assert draft.held_token_ids(row.rid) == (*row.token_ids, *tokens[:-1])
    assert_integrity(draft, [r.rid for r in rows])
    for row in rows:
        draft.release(row.rid)
    assert draft.num_free_slots == draft.capacity


@pytest.mark.parametrize("penalty", ["presence_penalty", "repetition_penalty"])
def test_penalties_see_the_drafted_tokens(draft_dir, target_vocab, engine, penalty):
    """PROMPTS[2]'s greedy continuation repeats its own first token at step 7 (and the
    prompt's last at step 6): a penalty changes the tokens from there only when step j's
    row sees the tokens drafted before it (and the prompt, for the repetition penalty)."""
    prompt = PROMPTS[2]
    params = SamplingParams(temperature=0, **{penalty: 2.0})
    row = SamplingRow(params, [], frozenset(), prompt)
    proposal = load(draft_dir, target_vocab).propose([DraftRow("a", prompt, 10, row)])[0]
    expected = engine_greedy(engine, [prompt], 10, **{penalty: 2.0})[0]
    assert list(proposal.token_ids) == expected != engine_greedy(engine, [prompt], 10)[0]


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda seq, x: seq + x[:2] + [(x[2] + 1) % VOCAB], id="partial-accept"),
        # more than one token past the divergence (speculation off for a step, or a
        # jump-forward string): the stale drafts' KV must not be reused
        pytest.param(lambda seq, x: seq + x[:1] + [(x[1] + 1) % VOCAB, 3, 4], id="and-more"),
        pytest.param(lambda seq, x: seq + x + [7], id="all-accepted-plus-bonus"),
        pytest.param(lambda seq, x: seq + [(x[0] + 1) % VOCAB], id="first-rejected"),
        pytest.param(lambda seq, x: seq[:-2] + [99, 98, 97], id="rewritten"),  # jump-forward
        pytest.param(lambda seq, x: seq[:3], id="shorter"),
    ],
)
def test_follows_the_target_and_leaks_nothing(draft_dir, target_vocab, cut):
    draft, fresh = load(draft_dir, target_vocab), load(draft_dir, target_vocab)
    other = DraftRow("other", PROMPTS[2], 3, GREEDY)  # shares the pool and the passes
    seq = PROMPTS[0]
    first = draft.propose([DraftRow("a", seq, 4, GREEDY), other])[0]
    now = cut(list(seq), list(first.token_ids))
    second = draft.propose([DraftRow("a", now, 4, GREEDY), other])[0]
    reference = fresh.propose([DraftRow("a", now, 4, GREEDY)])[0]
    assert second.token_ids == reference.token_ids
    assert torch.equal(second.probs, reference.probs)
    assert draft.held_token_ids("a")[: len(now)] == tuple(now)
    assert_integrity(draft, ["a", "other"])
    draft.release("a")
    draft.release("other")
    draft.release("never-seen")  # ignored
    assert draft.num_free_slots == draft.capacity


SAMPLED = {
    "plain": {"temperature": 1.0},
    "top_k": {"temperature": 0.8, "top_k": 20},
    "top_p": {"temperature": 1.2, "top_p": 0.8},
    "min_p": {"temperature": 1.0, "min_p": 0.1},
    "all": {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "frequency_penalty": 0.5},
}


@pytest.mark.parametrize("params", SAMPLED.values(), ids=SAMPLED.keys())
def test_sampled_rows_draw_from_the_probs_they_return(draft_dir, target_vocab, params):
    draft = load(draft_dir, target_vocab)
    rows = [DraftRow(f"r{i}", p, 5, sampling([3, 4], **params)) for i, p in enumerate(PROMPTS)]
    for _ in range(3):
        for proposal in draft.propose(rows):
            assert proposal.num_tokens == 5
            assert torch.allclose(proposal.probs.sum(dim=-1), torch.ones(5), atol=1e-5)
            drawn = proposal.probs[torch.arange(5), torch.tensor(proposal.token_ids)]
            assert bool((drawn > 0).all())
            if "top_k" in params:
                assert int((proposal.probs > 0).sum(dim=-1).max()) <= params["top_k"]


def test_seeded_rows_reproduce(draft_dir, target_vocab):
    seeded = sampling([3], temperature=1.0, top_p=0.95, seed=11)
    rows = [DraftRow("s", PROMPTS[0], 6, seeded), DraftRow("u", PROMPTS[1], 6, sampling())]
    a = load(draft_dir, target_vocab, seed=0).propose(rows)
    b = load(draft_dir, target_vocab, seed=5).propose(rows[:1])  # another batch and seed
    assert a[0].token_ids == b[0].token_ids
    assert torch.allclose(a[0].probs, b[0].probs, atol=1e-5)
    other_seed = sampling([3], temperature=1.0, top_p=0.95, seed=12)
    draws = {
        load(draft_dir, target_vocab).propose([DraftRow("s", PROMPTS[0], 6, row)])[0].token_ids
        for row in (seeded, other_seed)
    }
    assert len(draws) == 2  # a different seed draws differently (6 tokens of ~V choices)
    # unseeded rows: the draft's own stream, seeded at load
    c = load(draft_dir, target_vocab, seed=0).propose(rows)
    assert a[1].token_ids == c[1].token_ids


@pytest.mark.parametrize(
    "params", [{"temperature": 0}, {"temperature": 0.8, "top_k": 20}, {"seed": 3, "top_p": 0.9}]
)
def test_a_proposal_waits_once_per_drafted_token_whatever_its_rows(draft_dir, target_vocab, params):
    """K = 4: each of the 4 passes sends its inputs in one copy and each draw reads its
    tokens back in one wait; sampled rows add one copy each for the target plan and
    the draw's row indices."""

    def traffic(prompts: list[list[int]]) -> DeviceTraffic:
        draft = load(draft_dir, target_vocab)
        rows = [DraftRow(f"r{i}", p, 4, sampling(**params)) for i, p in enumerate(prompts)]
        with count_traffic() as seen:
            draft.propose(rows)
        return seen

    copies_per_token = 1 if params.get("temperature") == 0 else 3
    expected = DeviceTraffic(copies_to_device=4 * copies_per_token, copies_to_host=4, syncs=4)
    assert traffic(PROMPTS[:1]) == traffic(PROMPTS) == expected


def test_proposals_verify_against_a_target(draft_dir, target_vocab):
    """The proposal is what ``VerifyRow.draft_probs`` takes (shapes, dtype, device)."""
    draft = load(draft_dir, target_vocab)
    row = sampling([3], temperature=0.9, top_k=30)
    proposal = draft.propose([DraftRow("a", PROMPTS[0], 4, row)])[0]
    verifier = Verifier(Sampler(target_vocab), seed=0)
    logits = torch.randn(proposal.num_tokens + 1, target_vocab)
    out = verifier.verify(logits, [VerifyRow(row, proposal.token_ids, proposal.probs)])
    assert 1 <= len(out.token_ids[0]) <= proposal.num_tokens + 1


def test_vocabulary_mismatch_names_both_sizes(tmp_path, draft_dir):
    with pytest.raises(ConfigError, match=f"{VOCAB}.*1000"):
        load(draft_dir, 1000)


def test_bad_rows_raise(draft_dir, target_vocab):
    draft = load(draft_dir, target_vocab)
    for rows in (
        [DraftRow("a", [], 2, GREEDY)],
        [DraftRow("a", [1], 0, GREEDY)],
        [DraftRow("a", [VOCAB], 2, GREEDY)],
        [DraftRow("a", [1], 2, GREEDY), DraftRow("a", [2], 2, GREEDY)],
    ):
        with pytest.raises(DraftRowError):
            draft.propose(rows)
    assert draft.num_free_slots == draft.capacity


def test_a_full_pool_evicts_the_least_recently_used(draft_dir, target_vocab):
    draft = load(draft_dir, target_vocab, max_total_tokens=40, max_running_requests=2)
    seqs = {rid: [10 + i] * 12 for i, rid in enumerate("abc")}  # each needs 12 + 3 slots
    for rid in "abc":
        assert draft.propose([DraftRow(rid, seqs[rid], 4, GREEDY)])[0].num_tokens == 4
        assert_integrity(draft, "abcdef")
    assert draft.held_token_ids("a") == ()  # c evicted a, the least recently used (its table row)
    assert len(draft.held_token_ids("b")) == 15
    # d takes the least recently used table row (b's)
    assert draft.propose([DraftRow("d", [1, 2, 3], 2, GREEDY)])[0].num_tokens == 2
    assert draft.held_token_ids("b") == ()
    # a row that alone overflows the pool proposes nothing, and raises nothing
    assert draft.propose([DraftRow("e", [5] * 45, 4, GREEDY)])[0].num_tokens == 0
    assert_integrity(draft, "abcdef")
    # one that just fits proposes fewer: 38 tokens + 2 drafts' KV = 40 slots
    proposal = draft.propose([DraftRow("f", [6] * 38, 8, GREEDY)])[0]
    assert proposal.num_tokens == 3 and proposal.probs.shape == (3, VOCAB)
    assert_integrity(draft, "abcdef")
    # rows of the same call are never evicted for each other: the second gets nothing
    both = draft.propose([DraftRow("f", [6] * 38, 2, GREEDY), DraftRow("g", [7] * 5, 2, GREEDY)])
    assert [p.num_tokens for p in both] == [2, 0]
    assert_integrity(draft, "abcdefg")
    for rid in "abcdefg":
        draft.release(rid)
    assert draft.num_free_slots == draft.capacity


def test_a_failed_pass_leaks_no_slot(draft_dir, target_vocab):
    draft = load(draft_dir, target_vocab)
    draft.propose([DraftRow("kept", PROMPTS[0], 3, GREEDY)])
    forward, calls = draft._forward, []

    def fail_on_the_first_decode(segments):
        calls.append(len(segments))
        if len(calls) == 2:
            raise RuntimeError("boom")
        return forward(segments)

    draft._forward = fail_on_the_first_decode  # type: ignore[method-assign]
    rows = [DraftRow("a", PROMPTS[1], 4, GREEDY), DraftRow("b", PROMPTS[2], 4, GREEDY)]
    with pytest.raises(RuntimeError, match="boom"):
        draft.propose(rows)
    assert draft.held_token_ids("a") == draft.held_token_ids("b") == ()
    assert_integrity(draft, ["kept", "a", "b"])
    draft._forward = forward  # type: ignore[method-assign]
    assert [p.num_tokens for p in draft.propose(rows)] == [4, 4]
