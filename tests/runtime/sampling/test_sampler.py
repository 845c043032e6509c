"""Sampler: every parameter changes the outcome in a case built so the answer is known."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from radixlm.kernels.cpu.token_bitmask import load_token_bitmask_kernel
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.sampling.sampler import SampleOutput, Sampler, SamplingRow

EOS = 0


def row(
    output_ids: Sequence[int] = (),
    prompt_ids: Sequence[int] = (),
    stop_token_ids: frozenset[int] = frozenset({EOS}),
    top_logprobs_num: int = 0,
    **params: object,
) -> SamplingRow:
    return SamplingRow(
        SamplingParams(**params),  # type: ignore[arg-type]
        list(output_ids),
        stop_token_ids,
        list(prompt_ids),
        top_logprobs_num,
    )


def logits_from_probs(probs: Sequence[float], copies: int = 1) -> torch.Tensor:
    """(copies, V) logits whose softmax is ``probs`` (0 -> -inf)."""
    return torch.tensor([math.log(p) if p > 0 else -math.inf for p in probs]).repeat(copies, 1)


def draw(logits: torch.Tensor, r: SamplingRow, seed: int = 0) -> Counter[int]:
    """Sample every row of ``logits`` with the same row params; counts per token id."""
    sampler = Sampler(logits.shape[1], seed=seed)
    out = sampler.sample(logits, [r] * logits.shape[0], return_logprobs=False)
    return Counter(out.next_token_ids.tolist())


def greedy_token(logits_row: Sequence[float], r: SamplingRow) -> int:
    logits = torch.tensor([logits_row])
    return int(Sampler(len(logits_row)).sample(logits, [r], False).next_token_ids[0])


# --- temperature / greedy ---------------------------------------------------------


def test_temperature_zero_is_exact_argmax() -> None:
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0))
    out = Sampler(1000).sample(logits, [row(temperature=0)] * 64, False)
    assert torch.equal(out.next_token_ids, logits.argmax(dim=-1))
    assert out.next_token_ids.dtype == torch.int64


def test_top_k_one_at_temperature_one_is_argmax() -> None:
    logits = torch.randn(500, 50, generator=torch.Generator().manual_seed(1))
    out = Sampler(50).sample(logits, [row(top_k=1)] * 500, False)
    assert torch.equal(out.next_token_ids, logits.argmax(dim=-1))


def test_default_sampling_follows_softmax() -> None:
    probs = [0.5, 0.25, 0.15, 0.1, 0.0]
    counts = draw(logits_from_probs(probs, 20000), row())
    assert counts[4] == 0
    for token, p in enumerate(probs):
        assert abs(counts[token] / 20000 - p) < 0.015, (token, counts)


@pytest.mark.parametrize(("temperature", "expected"), [(1.0, 0.731), (0.25, 0.982), (4.0, 0.562)])
def test_temperature_reshapes_the_distribution(temperature: float, expected: float) -> None:
    # softmax([1, 0] / T)[0]: 0.731 at T=1; ignoring T would give 0.731 everywhere.
    logits = torch.tensor([[1.0, 0.0]]).repeat(8000, 1)
    counts = draw(logits, row(temperature=temperature))
    assert abs(counts[0] / 8000 - expected) < 0.02


# --- top_k / top_p / min_p ------------------------------------------------------------


def test_top_k_keeps_only_the_k_best() -> None:
    logits = torch.tensor([[3.0, 2.9, 2.8, 2.7, 2.6, 2.5, 2.4, 2.3]]).repeat(4000, 1)
    assert set(draw(logits, row(top_k=3))) == {0, 1, 2}


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = logits_from_probs([0.1, 0.5, 0.1, 0.3], 8000)
    counts = draw(logits, row(top_p=0.7))
    assert set(counts) == {1, 3}
    assert abs(counts[1] / 8000 - 0.5 / 0.8) < 0.02  # renormalised over the nucleus


@pytest.mark.parametrize("top_p", [1e-46, 1e-300, 5e-324])
@pytest.mark.parametrize("extra", [{}, {"top_k": 5}, {"seed": 3}])
def test_a_top_p_that_rounds_to_zero_keeps_the_most_likely_token(top_p, extra) -> None:
    """float32(top_p) is 0: the nucleus must still hold its first token (once none did,
    and the draw returned id V, outside the vocabulary)."""
    logits = torch.randn(8, 1000, generator=torch.Generator().manual_seed(1))
    sampler = Sampler(1000)
    out = sampler.sample(logits, [row(top_p=top_p, **extra)] * 8, False)
    assert torch.equal(out.next_token_ids, logits.argmax(dim=-1))


def test_top_p_after_top_k_renormalises_like_hf() -> None:
    # top_k=2 leaves {0: .5/.8, 1: .3/.8}; top_p=0.6 over those keeps token 0 alone.
    logits = logits_from_probs([0.5, 0.3, 0.1, 0.1], 2000)
    assert set(draw(logits, row(top_k=2, top_p=0.6))) == {0}


def test_top_p_nucleus_wider_than_the_candidate_shortcut() -> None:
    # 400 nearly equal tokens then a long tail: the 0.95-nucleus holds ~380 of
    # them, more than the top-256 shortcut, so the full-sort path must run.
    logits = torch.full((1, 2000), -30.0)
    logits[0, :400] = -torch.arange(400) * 1e-3
    probs = logits.softmax(-1)[0]
    sorted_probs, order = probs.sort(descending=True)
    nucleus = set(order[(sorted_probs.cumsum(0) - sorted_probs) < 0.95].tolist())
    counts = draw(logits.repeat(3000, 1), row(top_p=0.95))
    assert set(counts) <= nucleus
    assert max(counts) > 300


@pytest.mark.parametrize("extra", [{}, {"top_k": 3}, {"top_p": 0.99}])
def test_min_p_drops_tokens_below_a_fraction_of_the_best(extra: dict) -> None:
    # p >= 0.5 * 0.5 keeps {0, 1}; each sampling path (plain, top_k, top_p) applies it.
    logits = logits_from_probs([0.5, 0.3, 0.1, 0.1], 4000)
    assert set(draw(logits, row(min_p=0.5, **extra))) == {0, 1}


# --- penalties ------------------------------------------------------------------------


def test_repetition_penalty_flips_the_argmax_for_prompt_tokens() -> None:
    logits = [2.0, 1.9, 0.0]
    assert greedy_token(logits, row(prompt_ids=[0], temperature=0)) == 0
    assert greedy_token(logits, row(prompt_ids=[0], temperature=0, repetition_penalty=1.2)) == 1


def test_repetition_penalty_pushes_negative_logits_down() -> None:
    logits = [-1.0, -1.1, -5.0]
    r = row(output_ids=[0], temperature=0, repetition_penalty=1.2)
    assert greedy_token(logits, r) == 1  # -1.0 * 1.2 < -1.1


def test_repetition_penalty_counts_a_token_once() -> None:
    # 2.0 / 1.2 = 1.67 > 1.6; penalised three times it would be 1.16 < 1.6.
    r = row(output_ids=[0, 0, 0], prompt_ids=[0], temperature=0, repetition_penalty=1.2)
    assert greedy_token([2.0, 1.6], r) == 0


def test_frequency_penalty_scales_with_the_count() -> None:
    logits = [2.0, 1.5]
    three = row(output_ids=[0, 0, 0], temperature=0, frequency_penalty=0.2)
    two = row(output_ids=[0, 0], temperature=0, frequency_penalty=0.2)
    assert greedy_token(logits, three) == 1  # 2.0 - 0.6 < 1.5
    assert greedy_token(logits, two) == 0  # 2.0 - 0.4 > 1.5


def test_presence_penalty_is_flat_and_output_only() -> None:
    logits = [2.0, 1.5]
    assert greedy_token(logits, row(output_ids=[0], temperature=0, presence_penalty=0.6)) == 1
    in_prompt = row(prompt_ids=[0, 0], temperature=0, presence_penalty=0.6)
    assert greedy_token(logits, in_prompt) == 0


def test_negative_presence_penalty_encourages() -> None:
    r = row(output_ids=[1], temperature=0, presence_penalty=-1.0)
    assert greedy_token([2.0, 1.5], r) == 1


# --- min_new_tokens ---------------------------------------------------------------------


def test_min_new_tokens_suppresses_stop_tokens_until_reached() -> None:
    logits = [10.0, 0.0, 1.0, 9.0]  # EOS (0) and stop id 3 lead
    stops = frozenset({EOS, 3})
    early = row(output_ids=[1], stop_token_ids=stops, temperature=0, min_new_tokens=2)
    assert greedy_token(logits, early) == 2
    reached = row(output_ids=[1, 1], stop_token_ids=stops, temperature=0, min_new_tokens=2)
    assert greedy_token(logits, reached) == EOS


def test_min_new_tokens_applies_to_sampled_rows() -> None:
    logits = logits_from_probs([0.9, 0.05, 0.05], 2000)
    assert EOS not in draw(logits, row(min_new_tokens=1))


# --- seeds ------------------------------------------------------------------------------


def _seeded_run(
    logits: torch.Tensor,
    neighbours: list[SamplingRow],
    seeded: SamplingRow,
    steps: int,
    fused: bool | None = None,
) -> list[int]:
    """Tokens of ``seeded`` over ``steps`` steps, placed after ``neighbours`` in the batch."""
    sampler = Sampler(logits.shape[1], seed=len(neighbours), fused=fused)
    tokens: list[int] = []
    for _ in range(steps):
        current = SamplingRow(seeded.params, list(tokens), seeded.stop_token_ids)
        batch = [*neighbours, current]
        big = torch.cat([logits.repeat(len(neighbours), 1), logits]) if neighbours else logits
        out = sampler.sample(big, batch, return_logprobs=False)
        tokens.append(int(out.next_token_ids[-1]))
    return tokens


@pytest.mark.parametrize("extra", [{}, {"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.2}])
def test_seed_gives_the_same_tokens_whatever_the_batch(extra: dict) -> None:
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(3))
    seeded = row(seed=1234, **extra)
    others = [
        [],
        [row(), row(temperature=0)],
        [row(top_k=20), row(seed=7, repetition_penalty=1.3), row(top_p=0.5), row()],
    ]
    runs = [_seeded_run(logits, neighbours, seeded, steps=12) for neighbours in others]
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0])) > 1  # the step is part of the seed: not one token repeated


@pytest.mark.parametrize("extra", [{}, {"top_k": 3}, {"top_p": 0.75}])
def test_seeded_draws_follow_the_distribution(extra: dict) -> None:
    # p = (0.5, 0.25, 0.15, 0.1); top_k 3 renormalises the first three, top_p 0.75
    # keeps the first two (0.5 + 0.25 reaches it).
    probs = [0.5, 0.25, 0.15, 0.1]
    kept = {"top_k": probs[:3], "top_p": probs[:2]}.get(next(iter(extra), ""), probs)
    expected = [p / sum(kept) for p in kept]
    logits = logits_from_probs(probs, copies=4000)
    rows = [row(seed=s, **extra) for s in range(4000)]  # one draw from each of 4000 seeds
    counts = Counter(Sampler(4).sample(logits, rows, False).next_token_ids.tolist())
    assert set(counts) == set(range(len(kept)))
    for token, p in enumerate(expected):
        assert abs(counts[token] / 4000 - p) < 4 * math.sqrt(p * (1 - p) / 4000)


@pytest.mark.parametrize("extra", [{}, {"top_k": 50}, {"top_p": 0.9}])
def test_seeded_draws_shrug_off_rounding_noise_in_the_logits(extra: dict) -> None:
    # What another batch shape does to a row's logits (~1e-5, matmul rounding) must
    # not change a seeded token. The inverse CDF seeded rows used before changed 2, 1
    # and 25 of these 512 draws (plain, top_k, top_p): its boundaries move with the
    # noise summed before them.
    vocab = 49152
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(64, vocab, generator=gen) * 2.0
    noisy = logits + torch.randn(64, vocab, generator=gen) * 2e-5
    sampler = Sampler(vocab)
    same = 0
    for step in range(8):
        rows = [row(output_ids=[1] * step, seed=s, **extra) for s in range(64)]
        a = sampler.sample(logits, rows, False).next_token_ids
        b = sampler.sample(noisy, rows, False).next_token_ids
        same += int((a == b).sum())
    assert same == 64 * 8


def test_different_seeds_give_different_tokens() -> None:
    logits = torch.zeros(1, 1000)
    first = _seeded_run(logits, [], row(seed=1), steps=10)
    second = _seeded_run(logits, [], row(seed=2), steps=10)
    assert first != second


def test_unseeded_rows_follow_the_sampler_seed() -> None:
    logits = torch.zeros(16, 1000)
    rows = [row()] * 16
    first = Sampler(1000, seed=5).sample(logits, rows, False).next_token_ids
    again = Sampler(1000, seed=5).sample(logits, rows, False).next_token_ids
    other = Sampler(1000, seed=6).sample(logits, rows, False).next_token_ids
    assert torch.equal(first, again) and not torch.equal(first, other)


# --- batches ----------------------------------------------------------------------------


def test_default_rows_are_unaffected_by_a_penalised_neighbour() -> None:
    logits = torch.randn(3, 200, generator=torch.Generator().manual_seed(4))
    greedy, seeded = row(temperature=0), row(seed=9)
    penalised = row(output_ids=list(range(200)), repetition_penalty=1.5, frequency_penalty=1.0)
    sampler = Sampler(200)
    alone = sampler.sample(logits[[0, 2]], [greedy, seeded], False).next_token_ids
    original = logits.clone()
    mixed = sampler.sample(logits, [greedy, penalised, seeded], False).next_token_ids
    assert torch.equal(mixed[[0, 2]], alone)
    assert torch.equal(logits, original)  # the caller's logits are never modified


def test_penalties_only_touch_their_own_row() -> None:
    logits = torch.tensor([[2.0, 1.9], [2.0, 1.9]])
    rows = [row(output_ids=[0], temperature=0, presence_penalty=1.0), row(temperature=0)]
    assert Sampler(2).sample(logits, rows, False).next_token_ids.tolist() == [1, 0]


def test_empty_batch() -> None:
    out = Sampler(10).sample(torch.empty(0, 10), [], return_logprobs=True)
    assert out.next_token_ids.shape == (0,)


def test_logits_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="shape"):
        Sampler(10).sample(torch.zeros(2, 11), [row(), row()], False)
    with pytest.raises(ValueError, match="shape"):
        Sampler(10).sample(torch.zeros(3, 10), [row(), row()], False)


# --- logprobs ---------------------------------------------------------------------------


def test_logprobs_come_from_the_raw_logits() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(5))
    rows = [
        row(temperature=0, top_logprobs_num=3),
        row(temperature=0.5, top_k=5, repetition_penalty=2.0, output_ids=[1, 2]),
        row(top_logprobs_num=5),
        row(top_p=0.5, min_new_tokens=3, stop_token_ids=frozenset({1})),
    ]
    out = Sampler(50).sample(logits, rows, return_logprobs=True)
    raw = torch.log_softmax(logits, dim=-1)
    expected = raw.gather(1, out.next_token_ids[:, None]).squeeze(1)
    assert out.logprobs is not None and out.top_logprobs is not None
    # bit-identical: the sampler takes the same log_softmax of the same raw logits
    assert torch.equal(out.logprobs, expected)
    values, ids = out.top_logprobs
    assert values.shape == ids.shape == (4, 5)  # K = the largest request
    true_top = raw.topk(5, dim=-1)
    assert torch.equal(values, true_top.values)
    assert torch.equal(ids, true_top.indices)


def test_no_logprobs_unless_asked() -> None:
    out = Sampler(10).sample(torch.zeros(1, 10), [row(top_logprobs_num=2)], False)
    assert isinstance(out, SampleOutput)
    assert out.logprobs is None and out.top_logprobs is None
    asked = Sampler(10).sample(torch.zeros(1, 10), [row()], True)
    assert asked.logprobs is not None and asked.top_logprobs is None


# ---- grammar bitmasks ------------------------------------------------------------------


def _bitmask(allowed: list[list[int]], vocab_size: int) -> torch.Tensor:
    from radixlm.kernels.bitmask import bitmask_from_allowed

    return bitmask_from_allowed(allowed, vocab_size)


@pytest.mark.parametrize(("fused", "cpu_kernel"), [(False, False), (True, False), (False, True)])
def test_grammar_bitmask_confines_only_its_rows(fused: bool, cpu_kernel: bool) -> None:
    """Staged (the torch ops, or the C++ mask pass on CPU) and fused."""
    vocab = 100
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    rows = [row(temperature=0), row(temperature=1.0, seed=3), row(temperature=0), row()]
    allowed = [[5, 17, 99], [40, 41]]
    kernel = load_token_bitmask_kernel(cache_root() / "kernels") if cpu_kernel else None
    sampler = Sampler(vocab, fused=fused, cpu_bitmask=kernel)
    for _ in range(20):
        out = sampler.sample(
            logits, rows, False, grammar_bitmask=_bitmask(allowed, vocab),
            grammar_rows=torch.tensor([0, 1]),
        ).next_token_ids.tolist()  # fmt: skip
        assert out[0] == max(allowed[0], key=lambda t: logits[0, t])
        assert out[1] in allowed[1]
        assert out[2] == int(logits[2].argmax())  # unconstrained rows are untouched
    assert torch.equal(logits, torch.randn(4, vocab, generator=torch.Generator().manual_seed(0)))


def test_fused_and_staged_paths_agree_on_greedy_rows_and_distributions() -> None:
    vocab = 64
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1))
    allowed = [list(range(0, 64, 3))] * 3
    rows = [row(temperature=0), row(temperature=0, top_k=5), row(temperature=0.7, top_p=0.9)]
    outs = {}
    for fused in (False, True):
        sampler = Sampler(vocab, fused=fused)
        picks = [
            sampler.sample(
                logits,
                rows,
                False,
                grammar_bitmask=_bitmask(allowed, vocab),
                grammar_rows=torch.tensor([0, 1, 2]),
            ).next_token_ids.tolist()  # fmt: skip
            for _ in range(3000)
        ]
        outs[fused] = picks
    assert {p[0] for p in outs[True]} == {p[0] for p in outs[False]} and len(
        {p[0] for p in outs[True]}
    ) == 1
    assert [p[1] for p in outs[True]] == [p[1] for p in outs[False]]
    # the sampled row: same support and close frequencies (3000 draws each)
    fused_freq = Counter(p[2] for p in outs[True])
    staged_freq = Counter(p[2] for p in outs[False])
    assert set(fused_freq) <= set(allowed[2]) and set(staged_freq) <= set(allowed[2])
    for token in set(fused_freq) | set(staged_freq):
        assert abs(fused_freq[token] - staged_freq[token]) < 0.05 * 3000 + 30


@pytest.mark.parametrize("extra", [{}, {"seed": 1}])
def test_the_fused_path_applies_min_p(extra: dict) -> None:
    sampler = Sampler(10, fused=True)
    logits = torch.tensor([[5.0, 4.9] + [0.0] * 8]).repeat(64, 1)
    out = sampler.sample(logits, [row(temperature=1.0, min_p=0.99, **extra)] * 64, False)
    assert set(out.next_token_ids.tolist()) == {0}  # p1 / p0 = 0.905 < 0.99


@pytest.mark.parametrize("extra", [{}, {"top_k": 20, "top_p": 0.9, "min_p": 0.05}])
def test_a_fused_seeded_row_gives_the_same_tokens_whatever_the_batch(extra: dict) -> None:
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(3))
    seeded = row(seed=1234, **extra)
    others = [[], [row(), row(temperature=0)], [row(top_k=20), row(seed=7), row(min_p=0.1)]]
    runs = [_seeded_run(logits, n, seeded, steps=12, fused=True) for n in others]
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0])) > 1  # the step is part of the seed


@pytest.mark.parametrize("extra", [{}, {"top_k": 3}, {"top_p": 0.75}, {"min_p": 0.4}])
def test_fused_seeded_draws_follow_the_distribution(extra: dict) -> None:
    # p = (0.5, 0.25, 0.15, 0.1): top_k 3 keeps three, top_p 0.75 and min_p 0.4 two
    probs = [0.5, 0.25, 0.15, 0.1]
    kept = probs[:3] if "top_k" in extra else probs[:2] if extra else probs
    logits = logits_from_probs(probs, copies=4000)
    rows = [row(seed=s, **extra) for s in range(4000)]
    counts = Counter(Sampler(4, fused=True).sample(logits, rows, False).next_token_ids.tolist())
    assert set(counts) == set(range(len(kept)))
    for token, p in enumerate(kept):
        p /= sum(kept)
        assert abs(counts[token] / 4000 - p) < 4 * math.sqrt(p * (1 - p) / 4000)
