"""Fused masked sampling: the reference against a slow Python reading of the spec,
the Triton kernel against the reference (exact token ids), and the drawn
distribution against the renormalised probabilities."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import pytest
import torch

from radixlm.kernels import (
    bitmask_from_allowed,
    bitmask_width,
    masked_sample,
    masked_sample_reference,
)
from radixlm.kernels.triton import masked_sample_triton

# Triton runs on CUDA, else on CPU through its interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEG_INF = float("-inf")


def f32(x: float) -> float:
    """x rounded to the nearest float32."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass
class Batch:
    """Inputs of one masked_sample call (CPU tensors)."""

    logits: torch.Tensor  # (B, V)
    bitmask: torch.Tensor | None  # (B, W)
    temperatures: torch.Tensor  # (B,)
    top_ks: torch.Tensor  # (B,)
    top_ps: torch.Tensor  # (B,)
    uniforms: torch.Tensor  # (B,)

    def args(self, device: str = "cpu") -> tuple:
        bitmask = None if self.bitmask is None else self.bitmask.to(device)
        rest = (self.temperatures, self.top_ks, self.top_ps, self.uniforms)
        return (self.logits.to(device), bitmask, *(t.to(device) for t in rest))


def batch(logits, allowed=None, temperature=1.0, top_k=0, top_p=1.0, uniform=0.5) -> Batch:
    """A Batch from per-row lists (or one value, or one allowed list, for every row)."""
    logits = torch.as_tensor(logits, dtype=torch.float32)
    num_rows, vocab_size = logits.shape

    def per_row(value, dtype):
        values = value if isinstance(value, (list, tuple)) else [value] * num_rows
        return torch.tensor(values, dtype=dtype)

    bitmask = None if allowed is None else bitmask_from_allowed(allowed, vocab_size)
    if bitmask is not None and bitmask.shape[0] == 1:
        bitmask = bitmask.expand(num_rows, -1)  # one allowed set for every row
    return Batch(
        logits,
        bitmask,
        per_row(temperature, torch.float32),
        per_row(top_k, torch.int32),
        per_row(top_p, torch.float32),
        per_row(uniform, torch.float32),
    )


def slow_sample(b: Batch) -> list[int]:
    """The spec, one row and one token at a time, in Python floats."""
    return [slow_sample_row(b, i) for i in range(b.logits.shape[0])]


def slow_sample_row(b: Batch, i: int) -> int:
    vocab_size = b.logits.shape[1]
    masked = [float(x) for x in b.logits[i]]
    if b.bitmask is not None:
        words = [int(w) for w in b.bitmask[i]]
        masked = [x if (words[t // 32] >> (t % 32)) & 1 else NEG_INF for t, x in enumerate(masked)]
    temperature, top_k = float(b.temperatures[i]), int(b.top_ks[i])
    if max(masked) == NEG_INF:
        return -1
    if temperature < f32(1e-6) or top_k == 1:
        return masked.index(max(masked))
    z = [f32(x / temperature) for x in masked]
    kept = [True] * vocab_size
    if 1 < top_k < vocab_size:
        kth = sorted(z, reverse=True)[top_k - 1]
        kept = [zj >= kth for zj in z]
    e = [f32(math.exp(f32(zj - max(z)))) if k else 0.0 for zj, k in zip(z, kept)]
    top_p = float(b.top_ps[i])
    if top_p < 1:
        e = nucleus(e, top_p)
    x = float(b.uniforms[i]) * sum(e)
    running = 0.0
    for j, w in enumerate(e):
        running += w
        if w > 0 and running > x:
            return j
    return max(j for j, w in enumerate(e) if w > 0)


def nucleus(e: list[float], top_p: float) -> list[float]:
    """e with 0 below tau, the largest value whose mass {e >= tau} >= top_p * mass."""
    target = top_p * sum(e)
    for tau in sorted({w for w in e if w > 0}, reverse=True):
        if sum(w for w in e if w >= tau) >= target:
            return [w if w >= tau else 0.0 for w in e]
    return e


def triton_sample(b: Batch) -> list[int]:
    return masked_sample_triton(*b.args(DEVICE)).cpu().tolist()


def reference_sample(b: Batch) -> list[int]:
    return masked_sample_reference(*b.args()).tolist()


# Row i gets MODES[i % 6] and ALLOWED_KINDS[i % 5]: 30 rows cover every pair.
MODES = ["top_k+top_p", "top_p", "top_k", "plain", "greedy", "top_k+top_p"]
ALLOWED_KINDS = ["half", "all", "sparse", "one", "none"]


def random_batch(num_rows: int, vocab_size: int, seed: int, with_bitmask: bool = True) -> Batch:
    """Rows mixing every case: greedy and sampled, top_k/top_p on and off, bitmasks
    with all, none, one or some tokens allowed, and logits with many exact ties."""
    gen = torch.Generator().manual_seed(seed)

    def pick(choices: list):
        return choices[int(torch.randint(len(choices), (1,), generator=gen))]

    logits = torch.randn(num_rows, vocab_size, generator=gen) * 3
    logits[::2] = logits[::2].round()  # ties, also at top-k / top-p boundaries
    rows = [random_row(MODES[i % 6], vocab_size, pick) for i in range(num_rows)]
    uniforms = torch.rand(num_rows, generator=gen)
    uniforms[: min(2, num_rows)] = torch.tensor([0.0, 1.0 - 2**-24])[: min(2, num_rows)]
    allowed = [random_allowed(ALLOWED_KINDS[i % 5], vocab_size, gen) for i in range(num_rows)]
    temperatures, top_ks, top_ps = zip(*rows)
    return Batch(
        logits,
        bitmask_from_allowed(allowed, vocab_size) if with_bitmask else None,
        torch.tensor(temperatures),
        torch.tensor(top_ks, dtype=torch.int32),
        torch.tensor(top_ps),
        uniforms,
    )


def random_row(mode: str, vocab_size: int, pick) -> tuple[float, int, float]:
    """(temperature, top_k, top_p) of one row in ``mode``."""
    v = vocab_size
    if mode == "greedy":
        return pick([(0.0, 0, 1.0), (1e-7, 5, 0.5), (1.0, 1, 0.9)])
    temperature = pick([0.3, 0.7, 1.0, 1.5])
    top_k = pick([2, 3, 10, v - 1]) if "top_k" in mode else pick([-1, 0, v, v + 5])
    top_p = pick([0.95, 0.8, 0.5, 0.1, 1e-4]) if "top_p" in mode else 1.0
    return temperature, top_k, top_p


def random_allowed(kind: str, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "all":
        return torch.arange(vocab_size)
    if kind == "none":
        return torch.arange(0)
    if kind == "one":
        return torch.randint(vocab_size, (1,), generator=gen)
    density = 0.5 if kind == "half" else 0.05
    return (torch.rand(vocab_size, generator=gen) < density).nonzero().squeeze(1)


# ---- the reference is the spec --------------------------------------------------------------


@pytest.mark.parametrize("vocab_size", [1, 2, 5, 31, 33, 70])
def test_reference_matches_slow_python(vocab_size):
    b = random_batch(120, vocab_size, seed=vocab_size)
    assert reference_sample(b) == slow_sample(b)


def test_reference_without_bitmask_matches_slow_python():
    b = random_batch(120, 40, seed=1, with_bitmask=False)
    assert reference_sample(b) == slow_sample(b)


# ---- Triton == reference -------------------------------------------------------------------


@pytest.mark.parametrize(
    "vocab_size, num_rows",
    [(1, 10), (31, 30), (33, 30), (1000, 16), (4099, 10), (49152, 4)],
)
def test_triton_matches_reference(vocab_size, num_rows):
    b = random_batch(num_rows, vocab_size, seed=1000 + vocab_size)
    assert triton_sample(b) == reference_sample(b)


def test_triton_matches_reference_without_bitmask():
    b = random_batch(16, 300, seed=7, with_bitmask=False)
    assert triton_sample(b) == reference_sample(b)


def test_triton_matches_reference_on_a_peaked_large_vocab_row():
    """LM-like logits at V = 49152: a few likely tokens over a long tail."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(2, 49152, generator=gen) * 2
    logits[:, :5] += 12
    b = batch(logits, temperature=[0.8, 1.0], top_k=[50, 0], top_p=[0.9, 0.95], uniform=[0.3, 0.97])
    assert triton_sample(b) == reference_sample(b)


# ---- cases whose answer is known -----------------------------------------------------------

# -ln 2 in float32: exp gives exactly 0.5 after rounding to float32, so masses are exact.
HALF = f32(-math.log(2.0))


def implementations():
    return [reference_sample, triton_sample, slow_sample]


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


def test_exact_masses_used_above():
    e = torch.exp(torch.tensor([HALF, 2 * HALF]).double()).float()
    assert e.tolist() == [0.5, 0.25]


# ---- the drawn distribution ----------------------------------------------------------------

DIST_LOGITS = [0.0, 1.5, -1.0, 2.0, 0.5, 2.0, -3.0, 1.0, 0.2, -0.5]
DIST_ALLOWED = [0, 1, 2, 3, 5, 6, 7, 8]  # 4 and 9 are disallowed


def renormalised(temperature: float, top_k: int, top_p: float) -> list[float]:
    """The kept tokens' probabilities, from the spec in float64."""
    z = [x / temperature if t in DIST_ALLOWED else NEG_INF for t, x in enumerate(DIST_LOGITS)]
    if top_k > 1:
        kth = sorted(z, reverse=True)[top_k - 1]
        z = [zj if zj >= kth else NEG_INF for zj in z]
    e = nucleus([math.exp(zj - max(z)) for zj in z], top_p)
    return [w / sum(e) for w in e]


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9), (2.0, 0, 0.8)])
def test_inverse_cdf_over_a_grid_of_uniforms_gives_each_token_its_probability(
    temperature, top_k, top_p
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
        uniform=[(i + 0.5) / n for i in range(n)],
    )
    counts = torch.bincount(torch.tensor(reference_sample(b)), minlength=len(DIST_LOGITS))
    for count, p in zip(counts.tolist(), renormalised(temperature, top_k, top_p)):
        assert abs(count - p * n) <= 1


def test_triton_inverse_cdf_on_a_coarse_grid():
    n = 64
    b = batch(
        [DIST_LOGITS] * n,
        allowed=[DIST_ALLOWED],
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        uniform=[(i + 0.5) / n for i in range(n)],
    )
    assert triton_sample(b) == reference_sample(b)


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


def test_inputs_are_not_modified_and_dispatch_on_cpu_is_the_reference():
    b = random_batch(8, 50, seed=3)
    before = b.logits.clone()
    ids = masked_sample(*b.args())
    assert ids.dtype == torch.int64 and ids.tolist() == reference_sample(b)
    assert torch.equal(b.logits, before)
    masked_sample_triton(*b.args(DEVICE))
    assert torch.equal(b.logits, before)


def test_empty_batch():
    b = batch(torch.zeros(0, 10))
    assert reference_sample(b) == [] and triton_sample(b) == []


@pytest.mark.parametrize(
    "change",
    [
        {"logits": torch.zeros(3)},
        {"bitmask": torch.zeros(2, bitmask_width(10) + 1, dtype=torch.int32)},
        {"bitmask": torch.zeros(3, bitmask_width(10), dtype=torch.int32)},
        {"temperatures": torch.ones(3)},
        {"top_ks": torch.ones(2, 1, dtype=torch.int32)},
        {"uniforms": torch.ones(1)},
    ],
)
def test_shape_errors(change):
    b = batch(torch.zeros(2, 10), allowed=[[1], [2]])
    for name, value in change.items():
        setattr(b, name, value)
    for sample in (masked_sample_reference, masked_sample_triton):
        with pytest.raises(ValueError):
            sample(*b.args())
