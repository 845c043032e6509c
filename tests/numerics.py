"""Error bounds for the suite's numeric comparisons, derived from the computations.

A comparison of two float results states one of three things:

- **bit-identical** (``torch.equal``): both sides perform the same roundings in the
  same order (a copy, a lookup, one elementwise op, a result that must not depend
  on its batch or thread count);
- **within a derived bound** (``assert_within``): a float32 computation's rounding
  error, bounded by the standard worst-case analysis (Higham, *Accuracy and
  Stability of Numerical Algorithms*, ch. 2-3) from the operands' magnitudes and
  the accumulation lengths. ``Bounded`` carries the exact value (float64, from
  the stored operands) with a bound on one float32 evaluation's distance from it
  through a chain of operations; ``between_two`` and ``from_exact`` turn that into
  the bound for what a test compares. These hold whatever order each side sums in
  (AVX2, AVX-512, MKL or a C++ kernel), and a wrong result (a dropped term, a
  skipped key, a transposed weight) exceeds them by orders of magnitude;
- **no worse than the reference** (``assert_no_worse_than``): through several layers
  (a decode step, whole models) the worst-case bounds compound past use (each
  product can scale an error bound by sum_i |w_ij|, each softmax by the scores'
  magnitude), so the exact result is computed in float64 and our error may be at
  most a stated multiple of the reference implementation's own error.

Bounds are first order in the unit roundoff u: terms in u^2 (relative 1e-14 in
float32) are left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixlm.kernels.paged_attention import allowed_keys

__all__ = [
    "Bounded",
    "add",
    "assert_no_worse_than",
    "assert_within",
    "attention",
    "between_two",
    "cat",
    "decode_attention",
    "exact",
    "extend_attention",
    "from_exact",
    "gamma",
    "linear",
    "rms_norm",
    "rope",
    "silu_mul",
    "unit_roundoff",
]

# How many times the reference's error ours may be (``assert_no_worse_than``) where
# both are float32 implementations of one computation: the same operations, sums
# in different orders. Measured ratios of the largest errors: at most 1.45 over the
# suite (AVX-512 and AVX2 builds, torch on either); a wrong result (a skipped key, a
# final norm off by 1e-4) is off by 10^2-10^6 times.
SAME_COMPUTATION = 4.0
# The same where reduced-precision roundings at the same points (bfloat16 weights,
# pool, activations) dominate both errors: ours and the reference round the same
# values, but for the few whose float32 results straddle a rounding boundary
# (one ulp apart); measured ratios are 1.00.
SAME_ROUNDINGS = 1.25
# Relative error of one exp evaluation, in units of u: torch's (Sleef) and the
# kernels' exp_nonpositive (Cody-Waite reduction and the Cephes polynomial, about
# 1 ulp) are within 1 ulp; 1 ulp <= 2u relative, and another 2u of margin.
EXP_ULPS = 4
# exp_nonpositive clamps its argument at -87 (below that exp is denormal or 0).
EXP_CLAMP = -87.0
# Relative error of one tanh evaluation, in units of u: torch's (Sleef, 1 ulp); the
# kernels' (the Cephes tanhf polynomial below |x| = 0.625, within 3u; above, (1 - e)
# / (1 + e) with e = exp(-2|x|) <= 0.29, exp's EXP_ULPS u damped to under 2u by the
# quotient, and three roundings: under 6u), and 2u of margin.
TANH_ULPS = 8
# Keys per block of the extend kernel's online softmax, or per span of the decode
# kernel (128-512): each block's or span's sums are rescaled by one exp and one
# product per later block (extend) or once when spans merge (decode).
SOFTMAX_BLOCK = 128


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-p for a p-bit significand: |fl(x) - x| <= u |x| for one rounding."""
    bits = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}
    return 2.0 ** -bits[dtype]


U = unit_roundoff(torch.float32)


def gamma(n: int, dtype: torch.dtype = torch.float32) -> float:
    """gamma_n = n u / (1 - n u): a sum of n terms in any order, or a product of n
    factors, has relative error at most gamma_n (Higham, Lemma 3.1)."""
    nu = n * unit_roundoff(dtype)
    assert nu < 0.5, "bound meaningless at this length"
    return nu / (1 - nu)


@dataclass(frozen=True)
class Bounded:
    """A float32 computation: ``value`` its exact result from the given operands
    (float64), ``error`` a bound on ``|fl - value|`` for any float32 evaluation of it."""

    value: torch.Tensor
    error: torch.Tensor

    def __getitem__(self, index: object) -> Bounded:
        return Bounded(self.value[index], self.error[index])

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Bounded:
        """A shape-only op (view, slice, transpose), applied to the value and the bound."""
        return Bounded(fn(self.value), fn(self.error))


def cat(parts: list[Bounded], dim: int = 0) -> Bounded:
    """Values and bounds concatenated alike."""
    return Bounded(
        torch.cat([p.value for p in parts], dim), torch.cat([p.error for p in parts], dim)
    )


def exact(t: torch.Tensor) -> Bounded:
    """An operand: stored values (float32, or bfloat16, exact in float32) carry no error."""
    v = t.detach().double()
    return Bounded(v, torch.zeros_like(v))


def _abs(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().double().abs()


def add(a: Bounded, b: Bounded) -> Bounded:
    """a + b: the operands' errors, then one rounding of the sum."""
    v = a.value + b.value
    return Bounded(v, a.error + b.error + U * v.abs())


def round_to(x: Bounded, dtype: torch.dtype | None) -> Bounded:
    """x's float32 evaluation rounded to ``dtype`` (a product's inputs, for one that
    multiplies in that dtype): one rounding more, u_dtype (|value| + error). None:
    x as it is."""
    if dtype is None:
        return x
    return Bounded(x.value, x.error + unit_roundoff(dtype) * (x.value.abs() + x.error))


def linear(x: Bounded, w: torch.Tensor, bias: torch.Tensor | None = None) -> Bounded:
    """y = x W^T + b over the last dim, W (out, in) stored values.

    Each output sums in + 1 terms (the bias one of them), so (Higham, eq. 3.5)
    |fl(y) - y| <= gamma_{in+1} (|x| |W|^T + |b|) in any order of summation, with or
    without FMA; an error e in x adds |W| e to first order."""
    w64 = w.detach().double()
    v = x.value @ w64.t()
    magnitude = x.value.abs() @ w64.abs().t()
    if bias is not None:
        v = v + bias.detach().double()
        magnitude = magnitude + _abs(bias)
    n = w.shape[1] + (bias is not None)
    return Bounded(v, gamma(n) * magnitude + x.error @ w64.abs().t())


def rms_norm(x: Bounded, weight: torch.Tensor | None, eps: float) -> Bounded:
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dim (n values).

    Rounding: the sum of n squares (positive terms) is within gamma_n relative;
    dividing by n and adding eps > 0 add 2u; the square root halves that and adds u;
    the reciprocal (or rsqrt, within 1 ulp) 2u; the products by x and weight 2u:
    relative error gamma_n / 2 + 6u of |y|. An error e in x moves y by
    |w_i| / r (e_i + |x_i| sum_j |x_j| e_j / (n r^2)), r = sqrt(mean(x^2) + eps)."""
    n = x.value.shape[-1]
    w = torch.ones(n, dtype=torch.float64) if weight is None else weight.detach().double()
    r = (x.value.square().mean(-1, keepdim=True) + eps).sqrt()
    v = x.value / r * w
    coupled = (x.value.abs() * x.error).sum(-1, keepdim=True) / (n * r.square())
    propagated = w.abs() / r * (x.error + x.value.abs() * coupled)
    return Bounded(v, (gamma(n) / 2 + 6 * U) * v.abs() + propagated)


def rope(
    x: Bounded, cos: torch.Tensor, sin: torch.Tensor, table_error: torch.Tensor | float = 0.0
) -> Bounded:
    """The rotate-half rotation [x1 c - x2 s | x2 c + x1 s] over the last dim, with
    cos/sin tables broadcastable to a half. Each output is two products and a sum
    (gamma_2 of the terms' magnitudes, FMA or not); errors in x are scaled by |c|, |s|,
    and an error ``table_error`` in each table entry by |x1| + |x2|."""
    c, s = cos.detach().double(), sin.detach().double()
    x1, x2 = x.value.chunk(2, dim=-1)
    e1, e2 = x.error.chunk(2, dim=-1)
    magnitude = x1.abs() * c.abs() + x2.abs() * s.abs()
    swapped = x2.abs() * c.abs() + x1.abs() * s.abs()
    v = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    propagated = torch.cat((c.abs() * e1 + s.abs() * e2, c.abs() * e2 + s.abs() * e1), dim=-1)
    from_table = ((x1.abs() + x2.abs()) * table_error).repeat(*[1] * (x1.dim() - 1), 2)
    rounding = gamma(2) * torch.cat((magnitude, swapped), dim=-1)
    return Bounded(v, rounding + propagated + from_table)


def silu_mul(gate: Bounded, up: Bounded) -> Bounded:
    """y = silu(g) * up = g sigmoid(g) up.

    sigmoid as 1 / (1 + e) or e / (1 + e) with e = exp(-|g|) (the kernel), or
    1 / (1 + exp(-g)) (torch): an exp error of EXP_ULPS u moves sigmoid by at most
    as much relatively, and the sum, quotient and two products add 4u. The kernel
    clamps exp's argument at -87: for g < -87 its sigmoid is off by up to e^-87
    absolutely. Errors in g and up propagate through silu'(g) and silu(g)."""
    g, p = gate.value, up.value
    sig = torch.sigmoid(g)
    silu = g * sig
    v = silu * p
    rounding = (EXP_ULPS + 4) * U * v.abs() + (g * p).abs() * math.exp(EXP_CLAMP) * (g < EXP_CLAMP)
    slope = (sig * (1 + g * (1 - sig))).abs()
    return Bounded(v, rounding + slope * gate.error * p.abs() + silu.abs() * up.error)


def attention(
    q: Bounded,
    k: Bounded,
    v: Bounded,
    scale: float,
    allowed: torch.Tensor | None = None,
    weights_rounded_to: torch.dtype | None = None,
    softcap: float | None = None,
) -> Bounded:
    """softmax(scale q k^T) v per head: q (H, T, D); k, v (Hkv, S, D), query head h
    reading KV head h // (H / Hkv); allowed: (T, S) bool (None: every key); softcap:
    each score s becomes c tanh(s / c) (None: not).

    The output o = sum_j p_j v_j is a convex combination of V rows, p = softmax(s).
    A relative error eta_j in the numerator exp(s_j - m) moves o by
    sum_j p_j eta_j (v_j - o), at most sum_j p_j eta_j (|v_j| + |o|), where eta_j is:

    - the score's error: each score sums D products (and is scaled once):
      gamma_{D+1} scale |q||k_j|, plus |q| e_k + e_q |k| from the inputs' errors;
      soft-capped, s' = c tanh(s / c) moves by sech^2(s / c) times that error and
      the argument's two roundings (s / c, or s times a rounded 1 / c: 2u |s|), then
      tanh's own error and the product by c: (TANH_ULPS + 1) u |s'|;
    - u |s_j - m| from rounding the subtraction of the maximum;
    - exp's own error (EXP_ULPS u), once more per rescale of a block's sums by
      exp(m_old - m_new) and a product (online softmax, span merges): at most
      S / SOFTMAX_BLOCK rescales;
    - with ``weights_rounded_to``, one rounding of each weight to that dtype before
      it multiplies V (torch's CPU SDPA on bfloat16 or float16 inputs: its
      reduced-precision second product).

    The numerator sum over S keys and the denominator sum are each within gamma_S
    relative: gamma_S (p |v| + |o|); the final division (or reciprocal and product)
    2u |o|; errors in v add p e_v."""
    group = q.value.shape[0] // k.value.shape[0]
    k, v = (t.map(lambda x: x.repeat_interleave(group, dim=0)) for t in (k, v))
    d, keys = q.value.shape[-1], k.value.shape[-2]
    scores = scale * q.value @ k.value.transpose(-1, -2)
    magnitude = scale * q.value.abs() @ k.value.abs().transpose(-1, -2)
    score_error = gamma(d + 1) * magnitude + scale * (
        q.value.abs() @ k.error.transpose(-1, -2) + q.error @ k.value.abs().transpose(-1, -2)
    )
    if softcap is not None:
        capped = softcap * torch.tanh(scores / softcap)
        slope = 1 - torch.tanh(scores / softcap).square()  # sech^2, <= 1
        score_error = slope * (score_error + 2 * U * scores.abs())
        score_error = score_error + (TANH_ULPS + 1) * U * capped.abs()
        scores = capped
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    p = scores.softmax(-1)
    out = p @ v.value
    top = scores.amax(-1, keepdim=True)
    shifted = torch.where(p > 0, (scores - top).abs(), 0.0)
    rescales = math.ceil(keys / SOFTMAX_BLOCK)
    eta = score_error + U * shifted + EXP_ULPS * U + rescales * (EXP_ULPS + 2) * U
    if weights_rounded_to is not None:
        eta = eta + unit_roundoff(weights_rounded_to)
    weighted = p * eta
    error = (
        weighted @ v.value.abs()
        + weighted.sum(-1, keepdim=True) * out.abs()
        + gamma(keys) * (p @ v.value.abs() + out.abs())
        + 2 * U * out.abs()
        + p @ v.error
    )
    return Bounded(out, error)


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1)


def decode_attention(
    q: Bounded,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    k_new: Bounded,
    v_new: Bounded,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> Bounded:
    """``decode_attention_reference``'s computation under ``attention``: row b's query
    (H, D) over its cached slots (stored values) and its new token's k/v, within the
    last ``window`` positions and soft-capped by ``softcap`` (0: neither). (B, H, D)."""
    outs = []
    for b in range(q.value.shape[0]):
        n = int(prefix_lens[b])
        slots = req_to_token[rows[b], :n]
        keys = cat([exact(k_cache[slots]), k_new[b : b + 1]]).map(_heads_first)
        values = cat([exact(v_cache[slots]), v_new[b : b + 1]]).map(_heads_first)
        allowed = allowed_keys(torch.tensor([n]), n + 1, window)
        queries = q[b].map(lambda t: t[:, None])
        out = attention(queries, keys, values, scale, allowed, None, softcap or None)
        outs.append(out.map(lambda t: t.transpose(0, 1)))  # (1, H, D)
    if not outs:
        return Bounded(q.value.clone(), q.error.clone())
    return cat(outs)


def extend_attention(
    q: Bounded,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    weights_rounded_to: torch.dtype | None = None,
) -> Bounded:
    """``extend_attention_reference``'s computation under ``attention``: each request's
    new tokens over its prefix and themselves, causally, within ``window`` positions
    and soft-capped by ``softcap`` (0: neither), the weights rounded to
    ``weights_rounded_to`` before they multiply V (None: not); rows of q no request
    covers are exactly zero. (T, H, D)."""
    value, error = torch.zeros_like(q.value), torch.zeros_like(q.error)
    for b in range(rows.shape[0]):
        n, e, start = int(prefix_lens[b]), int(extend_lens[b]), int(starts[b])
        slots = req_to_token[rows[b], : n + e]
        keys, values = (exact(c[slots]).map(_heads_first) for c in (k_cache, v_cache))
        allowed = allowed_keys(n + torch.arange(e), n + e, window)
        queries = q[start : start + e].map(_heads_first)
        out = attention(queries, keys, values, scale, allowed, weights_rounded_to, softcap or None)
        out = out.map(_heads_first)
        value[start : start + e], error[start : start + e] = out.value, out.error
    return Bounded(value, error)


def between_two(x: Bounded, rounded_to: torch.dtype | None = None) -> torch.Tensor:
    """Bound on |a - b| for two float32 evaluations a, b of x (a kernel and a float32
    reference, each summing in its own order): each is within x.error of the exact
    value. Rounded to ``rounded_to`` at the end, |fl(a) - fl(b)| <= |a - b| + u (|a| + |b|)."""
    bound = 2 * x.error
    if rounded_to is not None:
        bound = bound + 2 * unit_roundoff(rounded_to) * (x.value.abs() + x.error)
    return bound


def from_exact(x: Bounded, rounded_to: torch.dtype | None = None) -> torch.Tensor:
    """Bound on |fl(a) - fl(value)| for one float32 evaluation a of x against the
    exact value, both rounded to ``rounded_to`` when given (u (|a| + |value|) more)."""
    bound = x.error
    if rounded_to is not None:
        bound = bound + unit_roundoff(rounded_to) * (2 * x.value.abs() + x.error)
    return bound


def assert_within(
    got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, msg: str = ""
) -> None:
    """|got - want| <= bound elementwise (NaN nowhere); on failure names the worst
    element (the largest difference relative to its bound)."""
    assert got.shape == want.shape, f"{msg}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (got.detach().double() - want.detach().double()).abs()
    bound = bound.double().expand_as(diff)
    bad = ~(diff <= bound)
    if not bad.any():
        return
    ratio = torch.where(bound > 0, diff / bound, torch.where(diff > 0, math.inf, 0.0))
    worst = int(ratio.nan_to_num(nan=math.inf).flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape))
    g, w = got.flatten()[worst].item(), want.flatten()[worst].item()
    d, b = diff.flatten()[worst].item(), bound.flatten()[worst].item()
    raise AssertionError(
        f"{msg}: {int(bad.sum())} of {diff.numel()} elements out of bound; worst at {index}: "
        f"got {g:.9g}, want {w:.9g}, difference {d:.3e} > bound {b:.3e}"
    )


def assert_no_worse_than(
    got: torch.Tensor,
    reference: torch.Tensor,
    truth: torch.Tensor,
    multiple: float,
    msg: str = "",
) -> None:
    """Our result's error may be at most ``multiple`` times the reference
    implementation's, both measured against ``truth`` (the exact computation, in
    float64), in the largest and in the mean absolute error.

    For a whole model no worst-case bound is practical (30 layers of products,
    norms and softmaxes), but the reference's own error is measured on the same
    inputs. Two float32 implementations of the same computation round the same
    operations, each sum in its own order, so their errors are of one size;
    ``multiple`` says how much larger ours may be. The floor, u times the largest
    |truth| (one rounding of the largest value), covers a reference that happens
    to be exact."""
    truth = truth.double()
    ours = (got.double() - truth).abs()
    theirs = (reference.double() - truth).abs()
    floor = U * truth.abs().max().item()
    for name, stat in (("largest", torch.max), ("mean", torch.mean)):
        a, b = stat(ours).item(), stat(theirs).item()
        assert a <= multiple * b + floor, (
            f"{msg}: {name} error {a:.3e} against the exact result exceeds {multiple} x the "
            f"reference's {b:.3e} (+ floor {floor:.1e})"
        )
