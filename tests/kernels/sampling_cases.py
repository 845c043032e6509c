"""Masked-sampling cases and the spec read slowly in Python floats, shared by the
reference's tests (tests/kernels/test_sampling.py) and the Triton kernel's
(tests/kernels/test_triton_sampling.py).

The spec is split where the two implementations part: ``kept_weights`` is the kept
set K with its weights (both implementations must agree on it exactly), then the
reference draws by inverse CDF (``slow_sample_row``) and the kernel by an
exponential race over Philox noise (``race_token``, with ``philox_uniforms`` the
stream Triton's ``tl.rand`` produces).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import torch

from radixlm.kernels import bitmask_from_allowed

NEG_INF = float("-inf")


def f32(x: float) -> float:
    """x rounded to the nearest float32."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass
class Batch:
    """Inputs of one masked-sampling call (CPU tensors)."""

    logits: torch.Tensor  # (B, V)
    bitmask: torch.Tensor | None  # (B, W)
    temperatures: torch.Tensor  # (B,)
    top_ks: torch.Tensor  # (B,)
    top_ps: torch.Tensor  # (B,)
    uniforms: torch.Tensor  # (B,) the reference's draw
    min_ps: torch.Tensor  # (B,)
    seeds: torch.Tensor  # (B,) the kernel's draw
    offsets: torch.Tensor  # (B,)

    def reference_args(self, device: str = "cpu") -> tuple:
        rest = (self.temperatures, self.top_ks, self.top_ps, self.uniforms, self.min_ps)
        return (*self._head(device), *(t.to(device) for t in rest))

    def kernel_args(self, device: str = "cpu") -> tuple:
        rest = (self.temperatures, self.top_ks, self.top_ps, self.seeds, self.offsets)
        return (*self._head(device), *(t.to(device) for t in rest), self.min_ps.to(device))

    def _head(self, device: str) -> tuple:
        bitmask = None if self.bitmask is None else self.bitmask.to(device)
        return self.logits.to(device), bitmask


def batch(
    logits, allowed=None, temperature=1.0, top_k=0, top_p=1.0, uniform=0.5, min_p=0.0,
    seed=0, offset=0,
) -> Batch:  # fmt: skip
    """A Batch from per-row lists (or one value, or one allowed list, for every row)."""
    logits = torch.as_tensor(logits, dtype=torch.float32)
    num_rows, vocab_size = logits.shape

    def per_row(value, dtype):
        values = value if isinstance(value, (list, tuple, range)) else [value] * num_rows
        return torch.tensor(list(values), dtype=dtype)

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
        per_row(min_p, torch.float32),
        per_row(seed, torch.int64),
        per_row(offset, torch.int64),
    )


# Row i gets MODES[i % 7] and ALLOWED_KINDS[i % 5]: 35 rows cover every pair.
MODES = ["top_k+top_p", "top_p", "top_k", "plain", "greedy", "top_k+top_p", "min_p"]
ALLOWED_KINDS = ["half", "all", "sparse", "one", "none"]


def random_batch(num_rows: int, vocab_size: int, seed: int, with_bitmask: bool = True) -> Batch:
    """Rows mixing every case: greedy and sampled, top_k/top_p/min_p on and off, bitmasks
    with all, none, one or some tokens allowed, and logits with many exact ties."""
    gen = torch.Generator().manual_seed(seed)

    def pick(choices: list):
        return choices[int(torch.randint(len(choices), (1,), generator=gen))]

    logits = torch.randn(num_rows, vocab_size, generator=gen) * 3
    logits[::2] = logits[::2].round()  # ties, also at top-k / top-p boundaries
    rows = [random_row(MODES[i % len(MODES)], vocab_size, pick) for i in range(num_rows)]
    uniforms = torch.rand(num_rows, generator=gen)
    uniforms[: min(2, num_rows)] = torch.tensor([0.0, 1.0 - 2**-24])[: min(2, num_rows)]
    allowed = [random_allowed(ALLOWED_KINDS[i % 5], vocab_size, gen) for i in range(num_rows)]
    temperatures, top_ks, top_ps, min_ps = zip(*rows)
    return Batch(
        logits,
        bitmask_from_allowed(allowed, vocab_size) if with_bitmask else None,
        torch.tensor(temperatures),
        torch.tensor(top_ks, dtype=torch.int32),
        torch.tensor(top_ps),
        uniforms,
        torch.tensor(min_ps),
        torch.randint(0, 2**62, (num_rows,), generator=gen),
        torch.randint(0, 2**31, (num_rows,), generator=gen),
    )


def random_row(mode: str, vocab_size: int, pick) -> tuple[float, int, float, float]:
    """(temperature, top_k, top_p, min_p) of one row in ``mode``."""
    v = vocab_size
    if mode == "greedy":
        return pick([(0.0, 0, 1.0, 0.0), (1e-7, 5, 0.5, 0.3), (1.0, 1, 0.9, 0.0)])
    temperature = pick([0.3, 0.7, 1.0, 1.5])
    top_k = pick([2, 3, 10, v - 1]) if "top_k" in mode else pick([-1, 0, v, v + 5])
    top_p = pick([0.95, 0.8, 0.5, 0.1, 1e-4]) if "top_p" in mode else 1.0
    min_p = pick([0.05, 0.3, 0.9, 1.0]) if mode in ("min_p", "top_p") else 0.0
    return temperature, top_k, top_p, min_p


def random_allowed(kind: str, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "all":
        return torch.arange(vocab_size)
    if kind == "none":
        return torch.arange(0)
    if kind == "one":
        return torch.randint(vocab_size, (1,), generator=gen)
    density = 0.5 if kind == "half" else 0.05
    return (torch.rand(vocab_size, generator=gen) < density).nonzero().squeeze(1)


# ---- the spec -------------------------------------------------------------------------


def masked_row(b: Batch, i: int) -> list[float]:
    """Row i's logits with every token its bitmask disallows at -inf."""
    masked = [float(x) for x in b.logits[i]]
    if b.bitmask is None:
        return masked
    words = [int(w) for w in b.bitmask[i]]
    return [x if (words[t // 32] >> (t % 32)) & 1 else NEG_INF for t, x in enumerate(masked)]


def greedy_token(b: Batch, i: int) -> int | None:
    """The row's token when it does not sample (-1: nothing allowed); None when it does."""
    masked = masked_row(b, i)
    if max(masked) == NEG_INF:
        return -1
    if float(b.temperatures[i]) < f32(1e-6) or int(b.top_ks[i]) == 1:
        return masked.index(max(masked))
    return None


def z_row(b: Batch, i: int) -> list[float]:
    """z = masked logits / temperature, rounded as float32 division rounds."""
    temperature = float(b.temperatures[i])
    return [f32(x / temperature) for x in masked_row(b, i)]


def kept_weights(b: Batch, i: int) -> list[float]:
    """e over the kept set K of a sampling row, 0 outside it."""
    vocab_size = b.logits.shape[1]
    z, top_k = z_row(b, i), int(b.top_ks[i])
    kept = [True] * vocab_size
    if 1 < top_k < vocab_size:
        kth = sorted(z, reverse=True)[top_k - 1]
        kept = [zj >= kth for zj in z]
    e = [f32(math.exp(f32(zj - max(z)))) if k else 0.0 for zj, k in zip(z, kept)]
    top_p = float(b.top_ps[i])
    if top_p < 1:
        e = nucleus(e, top_p)
    min_p = float(b.min_ps[i])
    return [w if w >= min_p else 0.0 for w in e]


def nucleus(e: list[float], top_p: float) -> list[float]:
    """e with 0 below tau, the largest value whose mass {e >= tau} >= top_p * mass."""
    target = top_p * sum(e)
    for tau in sorted({w for w in e if w > 0}, reverse=True):
        if sum(w for w in e if w >= tau) >= target:
            return [w if w >= tau else 0.0 for w in e]
    return e


def slow_sample(b: Batch) -> list[int]:
    """The reference's draw, one row and one token at a time: inverse CDF."""
    return [slow_sample_row(b, i) for i in range(b.logits.shape[0])]


def slow_sample_row(b: Batch, i: int) -> int:
    token = greedy_token(b, i)
    if token is not None:
        return token
    e = kept_weights(b, i)
    x = float(b.uniforms[i]) * sum(e)
    running = 0.0
    for j, w in enumerate(e):
        running += w
        if w > 0 and running > x:
            return j
    return max((j for j, w in enumerate(e) if w > 0), default=-1)


# ---- the kernel's draw ----------------------------------------------------------------

_M32 = np.uint64(0xFFFFFFFF)


def philox_uniforms(seeds, offsets, tokens) -> np.ndarray:
    """float32 u in [0, 1) of each token under each (seed, offset), broadcast together
    (ints or int arrays), as the kernel draws them: Philox4x32-10 on counter (token,
    offset low, offset high, 0) with key (seed low, seed high), first word, made a float
    as ``tl.rand`` does (for offset < 2^32: tl.rand(seed, offset << 32 | token))."""
    seeds = np.asarray(seeds, dtype=np.int64).view(np.uint64)
    offsets = np.asarray(offsets, dtype=np.int64).view(np.uint64)
    tokens = np.asarray(tokens, dtype=np.uint64)
    shape = np.broadcast_shapes(seeds.shape, offsets.shape, tokens.shape)
    c0 = np.broadcast_to(tokens & _M32, shape).astype(np.uint64)
    c1 = np.broadcast_to(offsets & _M32, shape).astype(np.uint64)
    c2 = np.broadcast_to(offsets >> np.uint64(32), shape).astype(np.uint64)
    c3 = np.zeros(shape, dtype=np.uint64)
    k0 = np.broadcast_to(seeds & _M32, shape).astype(np.uint64)
    k1 = np.broadcast_to(seeds >> np.uint64(32), shape).astype(np.uint64)
    for _ in range(10):  # 32-bit words held in uint64: products and sums are exact
        a = np.uint64(0xD2511F53) * c0
        b = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (
            (b >> np.uint64(32)) ^ c1 ^ k0,
            b & _M32,
            (a >> np.uint64(32)) ^ c3 ^ k1,
            a & _M32,
        )
        k0 = (k0 + np.uint64(0x9E3779B9)) & _M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _M32
    x = c0.astype(np.uint32).view(np.int32)
    x = np.where(x < 0, ~x, x)
    return x.astype(np.float32) * np.float32(4.6566127342e-10)


def race_scores(z: list[float], seeds, offsets) -> np.ndarray:
    """The kernel's race scores z - log(-log u), in float32: (V,) for one (seed, offset),
    (N, V) for (N, 1) arrays of them."""
    u = np.maximum(philox_uniforms(seeds, offsets, np.arange(len(z))), np.float32(1e-10))
    return np.asarray(z, dtype=np.float32) - np.log(-np.log(u))


def race_token(b: Batch, i: int) -> int:
    """The kernel's token for row i: the race winner over K (lowest index among ties)."""
    token = greedy_token(b, i)
    if token is not None:
        return token
    scores = race_scores(z_row(b, i), int(b.seeds[i]), int(b.offsets[i]))
    kept = np.asarray(kept_weights(b, i)) > 0
    return int(np.argmax(np.where(kept, scores, -np.inf)))
