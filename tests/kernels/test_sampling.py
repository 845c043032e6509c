"""Masked sampling's reference (``radixlm.kernels.sampling``): against a slow Python
reading of the spec (tests/kernels/sampling_cases.py), on cases whose answer is known,
and its drawn distribution; the dispatcher on CPU. The Triton kernel's tests:
tests/kernels/test_triton_sampling.py."""

from __future__ import annotations

import math

import pytest
import torch

from radixlm.kernels import bitmask_width, masked_sample, masked_sample_reference
from radixlm.kernels.sampling import row_uniforms
from tests.kernels.sampling_cases import (
    NEG_INF,
    Batch,
    batch,
    f32,
    nucleus,
    random_batch,
    slow_sample,
)


def reference_sample(b: Batch) -> list[int]:
    return masked_sample_reference(*b.reference_args()).tolist()


# ---- the reference is the spec --------------------------------------------------------------


@pytest.mark.parametrize("vocab_size", [1, 2, 5, 31, 33, 70])
def test_reference_matches_slow_python(vocab_size):
    b = random_batch(120, vocab_size, seed=vocab_size)
    assert reference_sample(b) == slow_sample(b)


def test_reference_without_bitmask_matches_slow_python():
    b = random_batch(120, 40, seed=1, with_bitmask=False)
    assert reference_sample(b) == slow_sample(b)


# ---- cases whose answer is known -----------------------------------------------------------

# -ln 2 in float32: exp gives exactly 0.5 after rounding to float32, so masses are exact.
HALF = f32(-math.log(2.0))


def implementations():
    return [reference_sample, slow_sample]


@pytest.mark.parametrize("sample", implementations())
def test_row_with_no_allowed_token_is_minus_one(sample):
    b = batch([[1.0, 2.0, 3.0]] * 3, allowed=[[], [], [1]], temperature=[1.0, 0.0, 1.0])
    assert sample(b) == [-1, -1, 1]


@pytest.mark.parametrize("sample", implementations())
def test_all_minus_inf_logits_is_minus_one(sample):
    assert sample(batch([[NEG_INF] * 4], temperature=[0.0])) == [-1]
    assert sample(batch([[NEG_INF] * 4])) == [-1]


@pytest.mark.parametrize("sample", implementations())
def test_greedy_takes_the_lowest_index_among_ties(sample):
    logits = [[0.0, 5.0, 1.0, 5.0, 5.0]] * 4
    b = batch(
        logits,
        allowed=[range(5), [3, 4, 2], [2], range(5)],
        temperature=[0.0, 0.0, 1e-7, 1.0],
        top_k=[0, 0, 0, 1],
    )
    assert sample(b) == [1, 3, 2, 1]


@pytest.mark.parametrize("sample", implementations())
def test_draw_is_the_first_token_whose_running_mass_exceeds_u(sample):
    # e = [1, 1, 1, 1]: token j owns u in [j/4, (j+1)/4); u == j/4 belongs to j
    b = batch([[2.0] * 4] * 6, uniform=[0.0, 0.2499, 0.25, 0.5, 0.75, 1.0 - 2**-24])
    assert sample(b) == [0, 0, 1, 2, 3, 3]


@pytest.mark.parametrize("sample", implementations())
def test_disallowed_tokens_carry_no_mass(sample):
    b = batch([[0.0] * 6] * 3, allowed=[[1, 4]] * 3, uniform=[0.0, 0.49, 0.51])
    assert sample(b) == [1, 1, 4]


@pytest.mark.parametrize("sample", implementations())
def test_top_k_keeps_ties_at_the_boundary(sample):
    # z = [3, 2, 2, 2, 1]; k = 2: the 2nd largest is 2, so all three 2s stay
    logits = [[3.0, 2.0, 2.0, 2.0, 1.0]] * 4
    b = batch(logits, temperature=0.5, top_k=[2, 2, 4, 5], uniform=1.0 - 2**-24)
    assert sample(b) == [3, 3, 3, 4]  # u ~ 1 picks the last kept token


@pytest.mark.parametrize("sample", implementations())
def test_top_k_off_values(sample):
    logits = [[3.0, 2.0, 1.0]] * 4
    b = batch(logits, top_k=[0, -5, 3, 99], uniform=1.0 - 2**-24)
    assert sample(b) == [2, 2, 2, 2]


@pytest.mark.parametrize("sample", implementations())
def test_top_p_boundary_is_inclusive(sample):
    # e = [1, 1, .5, .5, .5, .5], mass 4: top_p = 0.5 is reached exactly by {e >= 1}
    logits = [[0.0, 0.0, HALF, HALF, HALF, HALF]] * 4
    above = 0.5 + 2**-24  # the next float32 after 0.5: needs the 0.5s as well
    b = batch(logits, top_p=[0.5, above, 1e-6, 1.0], uniform=1.0 - 2**-24)
    assert sample(b) == [1, 5, 1, 5]


@pytest.mark.parametrize("sample", implementations())
def test_top_p_renormalises_within_top_k(sample):
    # top_k = 3 keeps e = [1, .5, .5] (mass 2); top_p = 0.5 of that is reached by {e >= 1}
    logits = [[0.0, HALF, HALF, 2 * HALF]] * 2
    b = batch(logits, top_k=3, top_p=[0.5, 0.75], uniform=1.0 - 2**-24)
    assert sample(b) == [0, 2]


@pytest.mark.parametrize("sample", implementations())
def test_uniform_one_gives_the_last_kept_token(sample):
    b = batch([[0.0, 1.0, 2.0, -1.0, 0.5]] * 2, allowed=[[0, 1, 2, 4]], top_k=[0, 2], uniform=1.0)
    assert sample(b) == [4, 2]


@pytest.mark.parametrize("sample", implementations())
def test_top_p_zero_keeps_only_the_most_likely_ties(sample):
    b = batch([[1.0, 3.0, 0.0, 3.0]], top_p=0.0, uniform=1.0 - 2**-24)
    assert sample(b) == [3]


@pytest.mark.parametrize("sample", implementations())
def test_min_p_keeps_e_at_least_min_p_times_the_best(sample):
    # e = [1, .5, .25]: min_p = 0.5 keeps {0, 1} (inclusive), just above keeps {0}
    logits = [[0.0, HALF, 2 * HALF]] * 3
    b = batch(logits, min_p=[0.5, 0.5 + 2**-24, 0.0], uniform=1.0 - 2**-24)
    assert sample(b) == [1, 0, 2]


@pytest.mark.parametrize("sample", implementations())
def test_min_p_is_relative_to_the_best_after_top_k_and_top_p(sample):
    # top_k 3 keeps e = [1, .5, .5]; top_p 0.75 of mass 2 keeps all three; min_p 0.6: {0}
    logits = [[0.0, HALF, HALF, 2 * HALF]] * 2
    b = batch(logits, top_k=3, top_p=0.75, min_p=[0.6, 0.5], uniform=1.0 - 2**-24)
    assert sample(b) == [0, 2]


def test_exact_masses_used_above():
    e = torch.exp(torch.tensor([HALF, 2 * HALF]).double()).float()
    assert e.tolist() == [0.5, 0.25]


# ---- the drawn distribution ----------------------------------------------------------------

DIST_LOGITS = [0.0, 1.5, -1.0, 2.0, 0.5, 2.0, -3.0, 1.0, 0.2, -0.5]
DIST_ALLOWED = [0, 1, 2, 3, 5, 6, 7, 8]  # 4 and 9 are disallowed


def renormalised(temperature: float, top_k: int, top_p: float, min_p: float = 0.0) -> list[float]:
    """The kept tokens' probabilities, from the spec in float64."""
    z = [x / temperature if t in DIST_ALLOWED else NEG_INF for t, x in enumerate(DIST_LOGITS)]
    if top_k > 1:
        kth = sorted(z, reverse=True)[top_k - 1]
        z = [zj if zj >= kth else NEG_INF for zj in z]
    e = nucleus([math.exp(zj - max(z)) for zj in z], top_p)
    e = [w if w >= min_p else 0.0 for w in e]
    return [w / sum(e) for w in e]


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p",
    [(1.0, 0, 1.0, 0.0), (0.7, 5, 0.9, 0.0), (2.0, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.3)],
)
def test_inverse_cdf_over_a_grid_of_uniforms_gives_each_token_its_probability(
    temperature, top_k, top_p, min_p
):
    """u on an even grid: token j is drawn for a p_j-wide slice, so counts are exact
    up to the grid step (no randomness)."""
    n = 4000
    b = batch(
        [DIST_LOGITS] * n,
        allowed=[DIST_ALLOWED],
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        uniform=[(i + 0.5) / n for i in range(n)],
    )
    counts = torch.bincount(torch.tensor(reference_sample(b)), minlength=len(DIST_LOGITS))
    for count, p in zip(counts.tolist(), renormalised(temperature, top_k, top_p, min_p)):
        assert abs(count - p * n) <= 1


def test_sampling_frequencies_follow_the_renormalised_distribution():
    """Seeded uniforms; a 6-sigma band (the seed is fixed, so this cannot flake)."""
    n = 50_000
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(0)).tolist()
    b = batch(
        [DIST_LOGITS] * n,
        allowed=[DIST_ALLOWED],
        temperature=0.9,
        top_k=6,
        top_p=0.95,
        uniform=uniforms,
    )
    counts = torch.bincount(torch.tensor(reference_sample(b)), minlength=len(DIST_LOGITS))
    for count, p in zip(counts.tolist(), renormalised(0.9, 6, 0.95)):
        assert abs(count / n - p) <= 6 * math.sqrt(p * (1 - p) / n) + 1e-9


# ---- plumbing ------------------------------------------------------------------------------


def test_dispatch_on_cpu_is_the_reference_with_uniforms_from_the_seeds():
    b = random_batch(8, 50, seed=3)
    before = b.logits.clone()
    ids = masked_sample(*b.kernel_args())
    b.uniforms = row_uniforms(b.seeds, b.offsets).float()
    assert ids.dtype == torch.int64 and ids.tolist() == reference_sample(b)
    assert torch.equal(b.logits, before)


def test_row_uniforms_depend_on_the_row_seed_and_offset_alone():
    seeds, offsets = torch.tensor([7, 7, 7, 8]), torch.tensor([0, 1, 0, 0])
    u = row_uniforms(seeds, offsets)
    assert u[0] == u[2] and len(set(u.tolist())) == 3
    assert u[2] == row_uniforms(seeds[2:], offsets[2:])[0]  # not the row's place
    assert ((u >= 0) & (u < 1)).all()
    with pytest.raises(ValueError):
        row_uniforms(torch.tensor([0.5]))


def test_empty_batch():
    b = batch(torch.zeros(0, 10))
    assert reference_sample(b) == [] and masked_sample(*b.kernel_args()).tolist() == []


@pytest.mark.parametrize(
    "change",
    [
        {"logits": torch.zeros(3)},
        {"logits": torch.zeros(2, 10, dtype=torch.int32)},
        {"bitmask": torch.zeros(2, bitmask_width(10) + 1, dtype=torch.int32)},
        {"bitmask": torch.zeros(3, bitmask_width(10), dtype=torch.int32)},
        {"temperatures": torch.ones(3)},
        {"top_ks": torch.ones(2, 1, dtype=torch.int32)},
        {"uniforms": torch.ones(1)},
        {"min_ps": torch.zeros(3)},
    ],
)
def test_shape_errors(change):
    b = batch(torch.zeros(2, 10), allowed=[[1], [2]])
    for name, value in change.items():
        setattr(b, name, value)
    with pytest.raises(ValueError):
        masked_sample_reference(*b.reference_args())
