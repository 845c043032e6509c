"""Quantized KV caches for the C++ attention kernels' tests, and the float64 truth
(with its rounding bound) of attention over them.

A cache is random K/V of varied magnitudes per slot and head (so the scales
differ), a few head vectors of zeros (scale 0), quantized by ``kv_quant.quantize``.
Its exact values are code * scale, exact in float64. A kernel's float32 evaluation
differs from the plain float32 one over those values in where the scale enters
(the score and the weight, or the packed key) by one rounding per key and value
element: the bound models that as an error of u |value| on each cached element
(``numerics.attention`` carries operand errors), on top of the float32 rounding
it derives for attention itself.
"""

from __future__ import annotations

import torch

from radixlm.kernels.paged_attention import allowed_keys
from radixlm.runtime.mem_cache.kv_quant import KVFormat, kv_format, quantize
from tests import numerics as num

FORMATS = ("int8", "fp8_e4m3", "fp8_e5m2")


def quantized_cache(
    name: str, num_slots: int, kv_heads: int, head_dim: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, KVFormat]:
    """(codes (slots, Hkv, D), scales (slots, Hkv) bfloat16, format) of random K or V."""
    fmt = kv_format(name, torch.float32)
    x = torch.randn(num_slots, kv_heads, head_dim, generator=gen)
    x *= torch.rand(num_slots, kv_heads, 1, generator=gen) * 4 + 0.05
    x[1::37] = 0.0  # a zero head vector: scale 0, codes 0
    codes, scales = quantize(x, fmt)
    return codes, scales, fmt


# bfloat16 bit patterns below the ties ``scale_ties`` puts scales at: odd and even
# last bits (a tie rounds to the even one), 0x3FFF and 0x007F (rounding up carries
# into the exponent; the latter from the largest subnormal), subnormals.
_TIE_PATTERNS = (0x3F80, 0x3F81, 0x3E4D, 0x3B12, 0x3FFF, 0x007F, 0x0001, 0x0002)


def scale_ties(fmt: KVFormat, head_dim: int = 32, seed: int = 0) -> torch.Tensor:
    """(n, head_dim) float32 head vectors whose float32 scale (largest magnitude /
    ``fmt.max_code``) is a bfloat16 rounding tie, or lands within a few float32 units
    of one on either side: each tie's largest magnitude, exact in float32 (a tie's 9
    significant bits times max_code's 7 or 3), and its neighbours 1-3 units up and
    down. The largest magnitude is the first value (its sign alternating), the rest
    random below it."""
    bits = torch.tensor(_TIE_PATTERNS, dtype=torch.int32) << 16 | 0x8000
    amax = (bits.view(torch.float32).double() * fmt.max_code).float()
    near = [amax]
    for direction in (float("inf"), 0.0):
        step = amax
        for _ in range(3):
            step = torch.nextafter(step, torch.tensor(direction))
            near.append(step)
    amax = torch.cat(near)
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(len(amax), head_dim, generator=gen) * 2 - 1) * amax[:, None]
    x[:, 0] = amax * torch.tensor([1.0, -1.0]).repeat(len(amax) // 2 + 1)[: len(amax)]
    return x


def exact_rows(codes: torch.Tensor, scales: torch.Tensor, slots: torch.Tensor) -> num.Bounded:
    """The cache's slots as exact values (float64), each with one float32 rounding
    (u |value|) of error: where the scale enters, as the module says."""
    value = codes.view(torch.uint8)[slots].view(codes.dtype).double()
    value = value * scales[slots].double()[..., None]
    return num.Bounded(value, num.U * value.abs())


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1)


def decode_truth(
    q: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> num.Bounded:
    """Decode attention over a quantized cache (k codes, v codes, k scales, v scales)
    in float64, with the bound on a float32 evaluation: (B, H, D)."""
    k_codes, v_codes, k_scale, v_scale = caches
    outs = []
    for b in range(q.shape[0]):
        n = int(prefix_lens[b])
        slots = req_to_token[rows[b], :n]
        keys = num.cat([exact_rows(k_codes, k_scale, slots), num.exact(k_new[b : b + 1])])
        values = num.cat([exact_rows(v_codes, v_scale, slots), num.exact(v_new[b : b + 1])])
        allowed = allowed_keys(torch.tensor([n]), n + 1, window)
        queries = num.exact(q[b]).map(lambda t: t[:, None])
        out = num.attention(
            queries,
            keys.map(_heads_first),
            values.map(_heads_first),
            scale,
            allowed,
            None,
            softcap or None,
        )
        outs.append(out.map(lambda t: t.transpose(0, 1)))
    return num.cat(outs)


def extend_truth(
    q: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> num.Bounded:
    """Extend attention over a quantized cache in float64, with the bound on a float32
    evaluation: (T, H, D), exactly zero in the rows no request covers."""
    k_codes, v_codes, k_scale, v_scale = caches
    value = torch.zeros_like(q, dtype=torch.float64)
    error = torch.zeros_like(value)
    for b in range(rows.shape[0]):
        n, e, start = int(prefix_lens[b]), int(extend_lens[b]), int(starts[b])
        slots = req_to_token[rows[b], : n + e]
        keys = exact_rows(k_codes, k_scale, slots).map(_heads_first)
        values = exact_rows(v_codes, v_scale, slots).map(_heads_first)
        allowed = allowed_keys(n + torch.arange(e), n + e, window)
        queries = num.exact(q[start : start + e]).map(_heads_first)
        out = num.attention(queries, keys, values, scale, allowed, None, softcap or None)
        out = out.map(_heads_first)
        value[start : start + e], error[start : start + e] = out.value, out.error
    return num.Bounded(value, error)


def assert_near_truth(got: torch.Tensor, truth: num.Bounded) -> None:
    """A kernel's output within a float32 evaluation's bound of the float64 truth,
    plus one rounding to a bfloat16 output."""
    rounded = None if got.dtype == torch.float32 else got.dtype
    num.assert_within(got, truth.value, num.from_exact(truth, rounded))
