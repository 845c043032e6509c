"""Verification: greedy rows decode exactly as without speculation; sampled rows emit
tokens from the same distribution (chi-square against an independent reference of
the processed distribution); seeded rows are reproducible.

A toy "model" stands in for the target: its logits for the next token are a fixed
random function of the last two tokens (a Markov chain), so greedy decoding falls
into loops that the n-gram proposer predicts, and any context can be scored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from radixlm.kernels.bitmask import bitmask_from_allowed
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.sampling.sampler import Sampler, SamplingRow
from radixlm.runtime.sampling.verify import Verifier, VerifyRow
from radixlm.runtime.speculative.ngram import NgramConfig, NgramProposer
from tests.runtime.speculative.stats import chi_square_critical

EOS = 0


class ToyModel:
    """Next-token logits as a fixed random function of the last ``order`` tokens."""

    def __init__(self, vocab_size: int, scale: float = 1.5, seed: int = 0, order: int = 2):
        self.vocab_size, self.scale, self.seed, self.order = vocab_size, scale, seed, order
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}

    def logits(self, prefix: Sequence[int]) -> torch.Tensor:
        key = tuple(prefix[-self.order :])
        if key not in self._memo:
            code = sum((t + 1) * (self.vocab_size + 1) ** i for i, t in enumerate(key))
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + code)
            self._memo[key] = torch.randn(self.vocab_size, generator=g) * self.scale
        return self._memo[key]

    def verify_logits(self, contexts: Sequence[Sequence[int]], proposals) -> torch.Tensor:
        """(sum(K_i + 1), V): row i's positions score context + proposal[:j], j = 0..K_i."""
        return torch.stack(
            [
                self.logits([*ctx, *proposal[:j]])
                for ctx, proposal in zip(contexts, proposals)
                for j in range(len(proposal) + 1)
            ]
        )


def sampling_row(output_ids: Sequence[int] = (), **params: object) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), list(output_ids), frozenset({EOS}))  # type: ignore[arg-type]


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The processed distribution, written independently of the sampler: temperature,
    then the k best renormalised, then the smallest prefix reaching top_p, then min_p."""
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    k = params.top_k if 0 < params.top_k < len(probs) else len(probs)
    keep[order[:k]] = True
    probs = torch.where(keep, probs, 0.0)
    probs = probs / probs.sum()
    mass_before = 0.0
    for rank, token in enumerate(order[:k].tolist()):
        if rank > 0 and params.top_p < 1 and mass_before >= params.top_p:
            keep[token] = False
        mass_before += float(probs[token])
    keep &= probs >= params.min_p * probs.max()
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum()


def assert_follows(observed: Counter, expected: dict, num_samples: int) -> None:
    """Chi-square goodness of fit; impossible outcomes must never occur; cells expected
    fewer than 5 times are pooled."""
    impossible = {key for key in observed if expected.get(key, 0.0) == 0.0}
    assert not impossible, f"drew outcomes of probability 0: {impossible}"
    cells = [(observed.get(key, 0), p * num_samples) for key, p in expected.items() if p > 0]
    big = [(o, e) for o, e in cells if e >= 5]
    small = [(o, e) for o, e in cells if e < 5]
    if small:
        big.append((sum(o for o, _ in small), sum(e for _, e in small)))
    stat = sum((o - e) ** 2 / e for o, e in big)
    df = len(big) - 1
    assert df >= 1
    assert stat < chi_square_critical(df), f"chi-square {stat:.1f} on {df} degrees of freedom"


# --- greedy -------------------------------------------------------------------------


def test_greedy_accepts_the_longest_matching_prefix_and_the_argmax() -> None:
    g = torch.Generator().manual_seed(0)
    vocab, k, batch = 1000, 3, 64
    logits = torch.randn(batch * (k + 1), vocab, generator=g)
    best = logits.argmax(dim=-1).view(batch, k + 1)
    rows, expected = [], []
    for i in range(batch):
        m = i % (k + 1)  # accepted proposals: 0 .. k
        proposal = best[i, :k].tolist()
        if m < k:
            proposal[m] = (proposal[m] + 1) % vocab  # the first mismatch
        q = torch.softmax(torch.randn(k, vocab, generator=g), dim=-1) if i % 2 else None
        rows.append(VerifyRow(sampling_row(temperature=0), proposal, q))
        expected.append(best[i, : m + 1].tolist())
    out = Verifier(Sampler(vocab)).verify(logits, rows)
    assert out.token_ids == expected
    assert out.num_accepted == [i % (k + 1) for i in range(batch)]


def decode(model: ToyModel, prompt: list[int], num_tokens: int, params: dict, k: int = 0):
    """Generates ``num_tokens`` tokens, one sampler call per step (k = 0) or one verify
    step of up to k n-gram proposals; returns the output and the accepted count."""
    sampler = Sampler(model.vocab_size, seed=1)
    verifier = Verifier(sampler)
    proposer = NgramProposer(NgramConfig(num_tokens=max(k, 1), max_ngram=3))
    index = proposer.new_index(prompt)
    output: list[int] = []
    num_accepted = 0
    while len(output) < num_tokens:
        row = sampling_row(output, **params)
        proposal = proposer.propose(index, k).token_ids if k else ()
        logits = model.verify_logits([prompt + output], [proposal])
        result = verifier.verify(logits, [VerifyRow(row, proposal)])
        new = result.token_ids[0]
        num_accepted += result.num_accepted[0]
        output += new
        index.extend(new)
    return output[:num_tokens], num_accepted


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_output_is_identical_with_and_without_speculation(seed: int) -> None:
    model = ToyModel(16, seed=seed)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain, _ = decode(model, prompt, 60, {"temperature": 0})
    reference = []
    for _ in range(60):  # plain argmax decoding, no sampler involved
        reference.append(int(model.logits(prompt + reference).argmax()))
    assert plain == reference
    for k in (1, 3, 5):
        spec, num_accepted = decode(model, prompt, 60, {"temperature": 0}, k)
        assert spec == reference
        assert num_accepted > 0  # the loops were predicted


def test_positions_see_the_proposals_as_output() -> None:
    """min_new_tokens and penalties at position j count the j proposals before it."""
    logits = torch.full((3, 8), 0.0)
    logits[:, EOS] = 5.0
    logits[:, 5] = 4.0
    row = VerifyRow(sampling_row(min_new_tokens=2, temperature=0), [5, 5])
    assert Verifier(Sampler(8)).verify(logits, [row]).token_ids == [[5, 5, EOS]]
    # A repetition penalty at position 1 sees the proposed 5 and pushes it below 3.
    logits = torch.zeros(2, 8)
    logits[:, 5], logits[:, 3] = 4.0, 3.0
    row = VerifyRow(sampling_row(repetition_penalty=2.0, temperature=0), [5])
    assert Verifier(Sampler(8)).verify(logits, [row]).token_ids == [[5, 3]]


def test_grammar_masks_apply_to_their_positions() -> None:
    vocab = 8
    logits = torch.zeros(5, vocab)
    logits[:, 6] = 3.0
    logits[:, 2] = 2.0
    rows = [
        VerifyRow(sampling_row(temperature=0), [6, 6]),  # positions 0..2
        VerifyRow(sampling_row(temperature=0.5), [6], torch.full((1, vocab), 1 / vocab)),
    ]
    # Position 1 of row 0 and position 0 of row 1 (flat 3) forbid token 6.
    allowed = [[t for t in range(vocab) if t != 6]] * 2
    bitmask = bitmask_from_allowed(allowed, vocab)
    out = Verifier(Sampler(vocab)).verify(logits, rows, False, bitmask, torch.tensor([1, 3]))
    assert out.token_ids[0] == [6, 2]
    assert out.token_ids[1][0] != 6


def test_logprobs_are_those_of_the_emitted_tokens_at_their_positions() -> None:
    model = ToyModel(16)
    contexts, proposals = [[1, 2], [3, 4]], [[5, 6, 7], [8]]
    logits = model.verify_logits(contexts, proposals)
    rows = [
        VerifyRow(SamplingRow(SamplingParams(temperature=0), [], frozenset(), (), 2), p)
        for p in proposals
    ]
    out = Verifier(Sampler(16)).verify(logits, rows, return_logprobs=True)
    assert out.logprobs is not None
    flat, positions = [], []
    for i, ids in enumerate(out.token_ids):
        flat += ids
        positions += [[0, 4][i] + t for t in range(len(ids))]
    expected = torch.log_softmax(logits[positions], dim=-1)
    assert out.logprobs.next_token_ids.tolist() == flat
    assert torch.allclose(out.logprobs.logprobs, expected[range(len(flat)), flat])
    assert out.logprobs.top_logprobs is not None
    assert out.logprobs.top_logprobs[0].shape == (len(flat), 2)


def test_bad_inputs_are_refused() -> None:
    verifier = Verifier(Sampler(8))
    row = VerifyRow(sampling_row(), [1, 2])
    with pytest.raises(ValueError, match="logits of shape"):
        verifier.verify(torch.zeros(2, 8), [row])
    with pytest.raises(ValueError, match="proposed tokens"):
        verifier.verify(torch.zeros(3, 8), [VerifyRow(sampling_row(), [1, 8])])
    with pytest.raises(ValueError, match="draft_probs"):
        verifier.verify(torch.zeros(3, 8), [VerifyRow(sampling_row(), [1, 2], torch.ones(1, 8))])


# --- sampled rows: the distribution ------------------------------------------------

CASES = {
    "temperature": {"temperature": 0.7},
    "top_k": {"temperature": 1.0, "top_k": 3},
    "top_p": {"temperature": 1.0, "top_p": 0.7},
    "min_p": {"temperature": 1.3, "min_p": 0.2},
    "top_k_top_p_min_p": {"temperature": 0.9, "top_k": 5, "top_p": 0.9, "min_p": 0.1},
}


class Proposer:
    """Proposals drawn from a draft q close to the target (most are accepted, so the
    accepted paths are exercised too): q = softmax(target logits + noise logits).
    ``draft`` passes q to the verifier; otherwise the tokens go as one-hot proposals."""

    def __init__(self, target: ToyModel, draft: bool, seed: int = 0) -> None:
        self.target, self.draft = target, draft
        self.noise = ToyModel(target.vocab_size, scale=0.7, seed=seed + 100)
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, ctx: list[int], k: int) -> tuple[list[int], torch.Tensor | None]:
        tokens: list[int] = []
        qs = []
        for _ in range(k):
            prefix = ctx + tokens
            q = torch.softmax(self.target.logits(prefix) + self.noise.logits(prefix), dim=-1)
            tokens.append(int(torch.multinomial(q, 1, generator=self.g)))
            qs.append(q)
        return tokens, torch.stack(qs) if self.draft else None


def speculative_samples(
    model: ToyModel, ctx: list[int], params: dict, draft: bool, num: int, seeded: bool
) -> list[tuple[int, int]]:
    """The first two tokens of ``num`` rows decoded with K = 3 proposals per step."""
    verifier = Verifier(Sampler(model.vocab_size, seed=5), seed=6)
    proposer = Proposer(model, draft, seed=7)
    outputs: list[list[int]] = [[] for _ in range(num)]
    pending = list(range(num))
    while pending:
        rows, contexts, proposals = [], [], []
        for i in pending:
            proposal, q = proposer.propose(ctx + outputs[i], 3)
            seed = {"seed": 1000 + i} if seeded else {}
            rows.append(VerifyRow(sampling_row(outputs[i], **params, **seed), proposal, q))
            contexts.append(ctx + outputs[i])
            proposals.append(proposal)
        result = verifier.verify(model.verify_logits(contexts, proposals), rows)
        for i, new in zip(pending, result.token_ids):
            outputs[i] += new
        pending = [i for i in pending if len(outputs[i]) < 2]
    return [(out[0], out[1]) for out in outputs]


@pytest.mark.parametrize("draft", [False, True], ids=["one_hot", "draft_q"])
@pytest.mark.parametrize("case", list(CASES))
def test_first_two_tokens_follow_the_target_distribution(case: str, draft: bool) -> None:
    model, ctx = ToyModel(8, scale=1.0, seed=3), [2, 5]
    num = 6000 if draft else 12000  # the one-hot path is cheap: more power
    params = SamplingParams(**CASES[case])  # type: ignore[arg-type]
    pairs = speculative_samples(model, ctx, CASES[case], draft, num, seeded=False)
    first = reference_probs(model.logits(ctx), params)
    joint = {
        (a, b): float(first[a]) * float(reference_probs(model.logits([*ctx, a]), params)[b])
        for a in range(8)
        for b in range(8)
    }
    assert_follows(Counter(a for a, _ in pairs), dict(enumerate(first.tolist())), num)
    assert_follows(Counter(pairs), joint, num)


@pytest.mark.parametrize("draft", [False, True], ids=["one_hot", "draft_q"])
def test_seeded_rows_follow_the_target_distribution(draft: bool) -> None:
    model, ctx, num = ToyModel(8, scale=1.0, seed=4), [1, 1], 4000
    params = CASES["top_k_top_p_min_p"]
    pairs = speculative_samples(model, ctx, params, draft, num, seeded=True)
    p = SamplingParams(**params)  # type: ignore[arg-type]
    first = reference_probs(model.logits(ctx), p)
    joint = {
        (a, b): float(first[a]) * float(reference_probs(model.logits([*ctx, a]), p)[b])
        for a in range(8)
        for b in range(8)
    }
    assert_follows(Counter(pairs), joint, num)


def test_target_probs_are_the_samplers_distribution() -> None:
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(len(CASES), 50, generator=g) * 2
    rows = [sampling_row(**params) for params in CASES.values()]
    probs = Verifier(Sampler(50)).target_probs(logits, rows)
    for i, row in enumerate(rows):
        expected = reference_probs(logits[i], row.params).float()
        assert torch.allclose(probs[i], expected, atol=1e-6), list(CASES)[i]


# --- seeded reproducibility ------------------------------------------------------------


@pytest.mark.parametrize("params", [{"temperature": 1.0}, {"temperature": 0.8, "top_p": 0.9}])
def test_seeded_one_hot_rows_emit_what_they_emit_without_speculation(params: dict) -> None:
    model = ToyModel(12, scale=1.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    seeded = {**params, "seed": 42}
    plain, _ = decode(model, prompt, 50, seeded)
    for k in (2, 4):
        spec, num_accepted = decode(model, prompt, 50, seeded, k)
        assert spec == plain
        assert num_accepted > 0


def test_seeded_draft_rows_do_not_depend_on_the_batch() -> None:
    model, vocab = ToyModel(12), 12
    g = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(4, vocab, generator=g), dim=-1)
    proposal = torch.multinomial(q, 1, generator=g).squeeze(1).tolist()
    row = VerifyRow(sampling_row([4, 4], temperature=1.0, seed=7), proposal, q)
    other = VerifyRow(sampling_row([1], temperature=1.0), [3, 3], torch.full((2, vocab), 1 / vocab))
    logits = model.verify_logits([[5], [1, 2], [5]], [[3, 3], proposal, [3, 3]])
    single = model.verify_logits([[1, 2]], [proposal])
    alone = Verifier(Sampler(vocab)).verify(single, [row])
    mixed = Verifier(Sampler(vocab, seed=9), seed=9).verify(logits, [other, row, other])
    assert mixed.token_ids[1] == alone.token_ids[0]
    outcomes = set()
    for seed in range(20):
        reseeded = VerifyRow(sampling_row([4, 4], temperature=1.0, seed=seed), proposal, q)
        outcomes.add(tuple(Verifier(Sampler(vocab)).verify(single, [reseeded]).token_ids[0]))
    assert len(outcomes) > 1  # the seed matters
