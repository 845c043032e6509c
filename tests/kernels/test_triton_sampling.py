"""The Triton masked-sampling kernel (``radixlm.kernels.triton.sampling``).

Its draw is an exponential race over Philox noise, so a row's token is a function of
its inputs alone: tests/kernels/sampling_cases.py recomputes it (the spec's kept set,
``tl.rand``'s stream in numpy), and on CPU under TRITON_INTERPRET the kernel must
return that very token, whether its rejection rounds or its exact fallback found the
kept set. The drawn distribution is then tested by chi-square per setting, on the
kernel's own draws (one seed per row) and on many more draws of the same race.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from radixlm.kernels import bitmask_width
from radixlm.kernels.triton import masked_sample_triton
from tests.kernels.sampling_cases import (
    NEG_INF,
    Batch,
    batch,
    f32,
    greedy_token,
    kept_weights,
    race_scores,
    race_token,
    random_batch,
    z_row,
)

# Triton runs on CUDA, else on CPU through its interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# -ln 2 in float32: exp gives exactly 0.5 after rounding to float32, so masses are exact.
HALF = f32(-math.log(2.0))


def kernel_sample(b: Batch, max_rounds: int | None = None, capacity: int | None = None):
    extra = {"max_rounds": max_rounds, "capacity": capacity}
    extra = {k: v for k, v in extra.items() if v is not None}
    return masked_sample_triton(*b.kernel_args(DEVICE), **extra).cpu().tolist()


def expected_tokens(b: Batch) -> list[int]:
    return [race_token(b, i) for i in range(b.logits.shape[0])]


def assert_same_tokens(got: list[int], expected: list[int]) -> None:
    # The GPU's log is not numpy's: a near-tie of the two best scores may go either way.
    mismatches = sum(g != e for g, e in zip(got, expected))
    assert mismatches <= (len(got) // 100 if DEVICE == "cuda" else 0), (got, expected)


# ---- the token is the race winner over the spec's kept set ---------------------------------


@pytest.mark.parametrize(
    "vocab_size, num_rows, max_rounds, capacity",
    [
        (1, 7, None, None),
        (5, 21, None, 2),
        (33, 35, None, None),
        (70, 21, 1, 8),
        (70, 21, 0, 2),
        (1000, 14, None, None),
    ],
)
def test_kernel_returns_the_race_winner_over_the_kept_set(
    vocab_size, num_rows, max_rounds, capacity
):
    """Every mode (greedy, plain, top-k, top-p, min-p and mixes) and bitmask kind. A
    small capacity sends top-k rows to rounds over the row; 0 and 1 rounds reach the
    exact fallback: each path must return the same tokens."""
    b = random_batch(num_rows, vocab_size, seed=2000 + vocab_size)
    assert_same_tokens(kernel_sample(b, max_rounds, capacity), expected_tokens(b))


def test_kernel_over_several_blocks_and_without_a_bitmask():
    b = random_batch(5, 4099, seed=5, with_bitmask=False)
    assert_same_tokens(kernel_sample(b), expected_tokens(b))


def test_a_peaked_large_vocab_row_in_top_k_and_top_p():
    """LM-like logits at V = 8192: a few likely tokens over a long tail."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 8192, generator=gen) * 2
    logits[:, :5] += 12
    b = batch(logits, temperature=0.8, top_k=[50, 0, 50, 7], top_p=[0.9, 0.95, 1.0, 0.5],
              seed=[1, 2, 3, 4], offset=[0, 5, 2**40 + 9, 2**31 - 1])  # fmt: skip
    assert_same_tokens(kernel_sample(b), expected_tokens(b))


# ---- cases whose answer is known -----------------------------------------------------------


def test_greedy_takes_the_lowest_index_among_ties():
    logits = [[0.0, 5.0, 1.0, 5.0, 5.0]] * 4
    b = batch(
        logits,
        allowed=[range(5), [3, 4, 2], [2], range(5)],
        temperature=[0.0, 0.0, 1e-7, 1.0],
        top_k=[0, 0, 0, 1],
    )
    assert kernel_sample(b) == [1, 3, 2, 1]


def test_greedy_is_the_argmax_of_the_masked_logits():
    b = random_batch(20, 300, seed=9)
    b.temperatures[:] = 0.0
    assert kernel_sample(b) == [greedy_token(b, i) for i in range(20)]


def test_a_row_with_no_allowed_token_is_minus_one():
    b = batch([[1.0, 2.0, 3.0]] * 4, allowed=[[], [], [1], []], temperature=[1.0, 0.0, 1.0, 0.5],
              top_k=[0, 0, 0, 2])  # fmt: skip
    assert kernel_sample(b) == [-1, -1, 1, -1]
    assert kernel_sample(batch([[NEG_INF] * 4] * 2, temperature=[0.0, 1.0])) == [-1, -1]


def test_the_draw_never_leaves_the_kept_set():
    """Boundaries with exact masses, each row its own seed: top-k ties (z = [3, 2, 2, 2,
    1], k = 2 keeps all three 2s), an inclusive top-p boundary and just past it, top-p
    within top-k, min-p at a weight, top-p 0 (the most likely ties)."""
    n = 8
    cases = [  # logits, top_k, top_p, min_p, the kept set
        ([3.0, 2.0, 2.0, 2.0, 1.0], 2, 1.0, 0.0, {0, 1, 2, 3}),
        ([0.0, 0.0, HALF, HALF, HALF, HALF], 0, 0.5, 0.0, {0, 1}),
        ([0.0, 0.0, HALF, HALF, HALF, HALF], 0, 0.5 + 2**-24, 0.0, set(range(6))),
        ([0.0, HALF, HALF, 2 * HALF], 3, 0.5, 0.0, {0}),
        ([0.0, HALF, 2 * HALF, 3 * HALF], 0, 1.0, 0.25, {0, 1, 2}),
        ([1.0, 3.0, 0.0, 3.0], 0, 0.0, 0.0, {1, 3}),
    ]
    for logits, top_k, top_p, min_p, kept in cases:
        b = batch([logits] * n, top_k=top_k, top_p=top_p, min_p=min_p, seed=range(n))
        drawn = kernel_sample(b)
        assert set(drawn) <= kept and len(set(drawn)) >= min(len(kept), 2), (logits, drawn)
        assert drawn == expected_tokens(b)


# ---- seeds ---------------------------------------------------------------------------------


def test_a_seeded_row_draws_the_same_token_wherever_it_sits_in_any_batch():
    gen = torch.Generator().manual_seed(4)
    row = torch.randn(1, 500, generator=gen)
    others = torch.randn(5, 500, generator=gen)
    params = {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "min_p": 0.01}
    alone = kernel_sample(batch(row, seed=77, offset=3, **params))
    mixed = batch(torch.cat([others[:3], row, others[3:]]), seed=[1, 2, 3, 77, 5, 6],
                  offset=[0, 0, 9, 3, 1, 1], **params)  # fmt: skip
    mixed.temperatures[0] = 0.0  # a greedy neighbour
    mixed.top_ks[4] = 0
    first = kernel_sample(mixed)
    assert first[3] == alone[0] and kernel_sample(mixed) == first


def test_the_offset_and_the_seed_each_change_the_stream():
    flat = torch.zeros(1, 1000)
    by_offset = [kernel_sample(batch(flat, seed=5, offset=o))[0] for o in range(4)]
    by_seed = [kernel_sample(batch(flat, seed=s, offset=0))[0] for s in range(4)]
    assert len(set(by_offset)) == 4 and len(set(by_seed)) == 4


# ---- the drawn distribution ----------------------------------------------------------------

DIST_LOGITS = [0.0, 1.5, -1.0, 2.0, 0.5, 2.0, -3.0, 1.0, 0.2, 1.0]
DIST_ALLOWED = [0, 1, 2, 3, 5, 6, 7, 8]  # 4 and 9 are disallowed
# name: (temperature, top_k, top_p, min_p, bitmask); each keeps >= 2 tokens
SETTINGS = {
    "temperature": (0.8, 0, 1.0, 0.0, False),
    "top_k": (1.0, 4, 1.0, 0.0, False),
    "top_k_boundary_ties": (1.0, 4, 1.0, 0.0, False),  # 1.0 at 7 and 9 tie: 5 kept
    "top_p": (1.2, 0, 0.8, 0.0, False),
    "min_p": (1.0, 0, 1.0, 0.2, False),
    "top_k_top_p": (0.7, 5, 0.9, 0.0, False),
    "bitmask_top_k_top_p_min_p": (1.0, 6, 0.95, 0.1, True),
}


def setting_batch(name: str, num_rows: int) -> Batch:
    temperature, top_k, top_p, min_p, masked = SETTINGS[name]
    return batch(
        [DIST_LOGITS] * num_rows,
        allowed=[DIST_ALLOWED if masked else range(len(DIST_LOGITS))],
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=[1_000_003 * i + 17 for i in range(num_rows)],
        offset=[i % 7 for i in range(num_rows)],
    )


def expected_probs(name: str) -> np.ndarray:
    e = np.asarray(kept_weights(setting_batch(name, 1), 0), dtype=np.float64)
    return e / e.sum()


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """P(chi-square >= the statistic) over the kept tokens; 0 if one outside is drawn."""
    kept = probs > 0
    if counts[~kept].sum():
        return 0.0
    expected = probs[kept] * counts.sum()
    stat = float(((counts[kept] - expected) ** 2 / expected).sum())
    dof = int(kept.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def race_counts(name: str, num_draws: int) -> np.ndarray:
    """Counts of the kernel's race (its noise recomputed in numpy), one seed per draw."""
    b = setting_batch(name, num_draws)
    kept = np.asarray(kept_weights(b, 0)) > 0
    z = z_row(b, 0)
    scores = race_scores(z, b.seeds.numpy()[:, None], b.offsets.numpy()[:, None])  # (N, V)
    winners = np.argmax(np.where(kept, scores, -np.inf), axis=1)
    return np.bincount(winners, minlength=len(DIST_LOGITS))


def test_the_settings_keep_what_their_names_say():
    assert (expected_probs("top_k_boundary_ties") > 0).sum() == 5
    assert expected_probs("bitmask_top_k_top_p_min_p")[[4, 9]].sum() == 0
    assert all((expected_probs(name) > 0).sum() >= 2 for name in SETTINGS)


def test_kernel_draws_pass_a_chi_square_test_per_setting():
    """24 of the kernel's own draws per setting, all in one launch (fixed seeds:
    deterministic): each the race's token, and together no outlier."""
    n = 24
    settings = [setting_batch(name, n) for name in SETTINGS]
    b = Batch(*(torch.cat([getattr(s, f) for s in settings]) for f in Batch.__dataclass_fields__))
    drawn = kernel_sample(b)
    assert_same_tokens(drawn, expected_tokens(b))
    for k, name in enumerate(SETTINGS):
        counts = np.bincount(drawn[k * n : (k + 1) * n], minlength=len(DIST_LOGITS))
        assert chi_square_p_value(counts, expected_probs(name)) > 1e-3, (name, counts)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_race_passes_a_chi_square_test_over_many_draws(name):
    """20,000 draws of the same race (the kernel returns each of them: see above)."""
    counts = race_counts(name, 20_000)
    assert chi_square_p_value(counts, expected_probs(name)) > 1e-4, counts


def test_the_chi_square_test_rejects_a_near_miss():
    """What it would catch: the kept set's weights tempered twice, or its boundary ties
    dropped (top-k 3 instead of 5 with two tied at the 5th: a strict comparison)."""
    counts = race_counts("top_k_top_p", 20_000)
    temperature, top_k, top_p, _, _ = SETTINGS["top_k_top_p"]
    for wrong in (
        batch([DIST_LOGITS], temperature=temperature**2, top_k=top_k, top_p=top_p),
        batch([DIST_LOGITS], temperature=temperature, top_k=top_k - 2, top_p=top_p),
    ):
        probs = np.asarray(kept_weights(wrong, 0))
        assert chi_square_p_value(counts, probs / probs.sum()) < 1e-9


# ---- plumbing ------------------------------------------------------------------------------


def test_inputs_are_not_modified_and_defaults_are_no_offset_and_no_min_p():
    b = random_batch(8, 50, seed=3)
    b.min_ps[:] = 0.0
    b.offsets[:] = 0
    before = b.logits.clone()
    logits, bitmask, temperatures, top_ks, top_ps, seeds = b.kernel_args(DEVICE)[:6]
    ids = masked_sample_triton(logits, bitmask, temperatures, top_ks, top_ps, seeds)
    assert ids.dtype == torch.int64 and ids.cpu().tolist() == expected_tokens(b)
    assert torch.equal(b.logits, before)


def test_empty_batch():
    assert kernel_sample(batch(torch.zeros(0, 10))) == []


@pytest.mark.parametrize(
    "change",
    [
        {"logits": torch.zeros(3)},
        {"bitmask": torch.zeros(2, bitmask_width(10) + 1, dtype=torch.int32)},
        {"temperatures": torch.ones(3)},
        {"top_ks": torch.ones(2, 1, dtype=torch.int32)},
        {"seeds": torch.ones(1, dtype=torch.int64)},
        {"seeds": torch.ones(2)},
        {"offsets": torch.zeros(3, dtype=torch.int64)},
        {"offsets": torch.zeros(2)},
        {"min_ps": torch.zeros(1)},
    ],
)
def test_argument_errors(change):
    b = batch(torch.zeros(2, 10), allowed=[[1], [2]])
    for name, value in change.items():
        setattr(b, name, value)
    with pytest.raises(ValueError):
        masked_sample_triton(*b.kernel_args(DEVICE))


@pytest.mark.parametrize("capacity", [0, 3, 1000])
def test_the_capacity_is_a_power_of_two(capacity):
    with pytest.raises(ValueError, match="power of 2"):
        masked_sample_triton(*batch(torch.zeros(2, 10)).kernel_args(DEVICE), capacity=capacity)
