"""The constrained-sampling kernel in Triton: one program per row, no sort.

Contract and shared numerics: ``radixlm.kernels.sampling`` (the plain-torch reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.sampling import GREEDY_TEMPERATURE, check_sample_args, per_row

__all__ = ["masked_sample_triton"]

# Largest vocab block one program holds at a time.
_MAX_BLOCK = 4096
# Constants the kernels read (Triton only lets a kernel read constexpr globals).
_GREEDY_TEMPERATURE = tl.constexpr(GREEDY_TEMPERATURE)
# The order key (see _top_k_z) of -inf: below every other non-NaN float32's key.
_KEY_NEG_INF = tl.constexpr(-2139095041)
# Bit pattern of 1.0f, the largest e (e = exp(0) at the max).
_ONE_BITS = tl.constexpr(0x3F800000)
_INT32_MAX = tl.constexpr(2147483647)


# ---- Triton -----------------------------------------------------------------------------
#
# Each helper is one pass (or one bisection) over the row, in BLOCK-sized chunks.
# The workspace row holds z after _z_pass and e after _weights_pass:
#
#   logits, bitmask --_z_pass--> z --_top_k_z (reads)--> kth z
#                                z --_weights_pass--> e --_top_p_bits (reads)--> tau
#                                                     e --_draw_pass (reads)--> token
#
# The per-chunk code is written inline rather than in small @jit helpers: under
# TRITON_INTERPRET every helper call re-patches triton.language, which slows the
# CPU tests.


@triton.jit
def _z_pass(
    logits_ptr,
    bitmask_ptr,
    ws_ptr,
    row,
    vocab_size,
    stride_l,
    stride_b,
    temperature,
    HAS_BITMASK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Writes z = masked logits / temperature to the workspace row.

    Returns (max masked logit, its lowest index as int64; -1 when all are -inf).
    """
    best = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), -1, tl.int64)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        logit = tl.load(logits_ptr + row * stride_l + offs, mask=in_vocab, other=float("-inf"))
        logit = logit.to(tl.float32)
        if HAS_BITMASK:
            words = tl.load(bitmask_ptr + row * stride_b + offs // 32, mask=in_vocab, other=0)
            logit = tl.where(((words >> (offs % 32)) & 1) != 0, logit, float("-inf"))
        z = tl.math.div_rn(logit, temperature)
        tl.store(ws_ptr + row * vocab_size + offs, z, mask=in_vocab)
        block_max = tl.max(logit, axis=0)
        block_id = tl.min(tl.where(logit == block_max, offs, _INT32_MAX), axis=0)
        better = block_max > best  # strict: an earlier block wins ties
        best_id = tl.where(better, block_id.to(tl.int64), best_id)
        best = tl.where(better, block_max, best)
    return best, best_id


@triton.jit
def _top_k_z(ws_ptr, row, vocab_size, z_max, top_k, BLOCK: tl.constexpr):
    """The k-th largest z, found as the largest key t with #{key(z) >= t} >= top_k.

    key(z) is an int32 that orders like z: negative floats order backwards as
    signed ints, so their 31 low bits are flipped (-0.0 is mapped to 0's key).
    Invariant: count(lo) >= top_k > count(hi). Each step also snaps lo up (hi
    down) to the nearest key present, so the loop ends as soon as no key lies
    strictly between: usually well before 32 steps.
    """
    z_max_bits = z_max.to(tl.int32, bitcast=True)
    lo = tl.full((), _KEY_NEG_INF, tl.int64)
    hi = tl.where(z_max_bits < 0, z_max_bits ^ 0x7FFFFFFF, z_max_bits).to(tl.int64) + 1
    hi = tl.where(z_max == 0.0, 1, hi)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        count = tl.full((), 0, tl.int32)
        above = tl.full((), _INT32_MAX, tl.int64)  # smallest key >= mid
        below = lo  # largest key < mid
        for start in range(0, vocab_size, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(
                ws_ptr + row * vocab_size + offs, mask=offs < vocab_size, other=float("-inf")
            )
            bits = z.to(tl.int32, bitcast=True)
            key = tl.where(z == 0.0, 0, tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits))
            ge = key >= mid
            count += tl.sum(ge.to(tl.int32), axis=0)
            above = tl.minimum(above, tl.min(tl.where(ge, key, _INT32_MAX), axis=0).to(tl.int64))
            below = tl.maximum(below, tl.max(tl.where(ge, _KEY_NEG_INF, key), axis=0).to(tl.int64))
        fits = count >= top_k
        lo = tl.where(fits, tl.minimum(above, hi - 1), lo)
        hi = tl.where(fits, hi, below + 1)
    lo_bits = tl.where(lo < 0, lo ^ 0x7FFFFFFF, lo).to(tl.int32)
    return lo_bits.to(tl.float32, bitcast=True)


@triton.jit
def _weights_pass(ws_ptr, row, vocab_size, z_max, kth_z, BLOCK: tl.constexpr):
    """Overwrites the row's z with e = float32(exp(float64(z - z_max))), 0 where z < kth_z.

    Returns the float64 mass of e.
    """
    mass = tl.full((), 0.0, tl.float64)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        z = tl.load(ws_ptr + row * vocab_size + offs, mask=in_vocab, other=float("-inf"))
        e = tl.exp((z - z_max).to(tl.float64)).to(tl.float32)
        e = tl.where(z >= kth_z, e, 0.0)
        tl.store(ws_ptr + row * vocab_size + offs, e, mask=in_vocab)
        mass += tl.sum(e.to(tl.float64), axis=0)
    return mass


@triton.jit
def _top_p_bits(ws_ptr, row, vocab_size, top_p, mass, BLOCK: tl.constexpr):
    """(bits of tau, mass {e >= tau}): tau the largest e with mass {e >= tau} >= top_p * mass.

    e >= 0, so its int32 bit pattern orders like its value. Invariant: the mass
    at lo reaches the target (lo = 0 keeps everything), and the max e is exactly
    exp(0) = 1.0 < hi, so some e >= mid always exists. lo and hi snap to keys
    present, as in _top_k_z.
    """
    target = top_p.to(tl.float64) * mass
    lo = tl.full((), 0, tl.int64)
    lo_mass = mass
    hi = tl.full((), _ONE_BITS + 1, tl.int64)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        mid_mass = tl.full((), 0.0, tl.float64)
        above = tl.full((), _INT32_MAX, tl.int64)
        below = lo
        for start in range(0, vocab_size, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            e = tl.load(ws_ptr + row * vocab_size + offs, mask=offs < vocab_size, other=0.0)
            bits = e.to(tl.int32, bitcast=True)
            ge = bits >= mid
            mid_mass += tl.sum(tl.where(ge, e, 0.0).to(tl.float64), axis=0)
            above = tl.minimum(above, tl.min(tl.where(ge, bits, _INT32_MAX), axis=0).to(tl.int64))
            below = tl.maximum(below, tl.max(tl.where(ge, 0, bits), axis=0).to(tl.int64))
        fits = mid_mass >= target
        lo = tl.where(fits, tl.minimum(above, hi - 1), lo)
        lo_mass = tl.where(fits, mid_mass, lo_mass)
        hi = tl.where(fits, hi, below + 1)
    return lo, lo_mass


@triton.jit
def _draw_pass(ws_ptr, row, vocab_size, tau_bits, x, BLOCK: tl.constexpr):
    """First j with e_j >= tau, e_j > 0 and running kept mass > x (else the last such j)."""
    running = tl.full((), 0.0, tl.float64)
    token = tl.full((), -1, tl.int64)
    last = tl.full((), -1, tl.int64)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        e = tl.load(ws_ptr + row * vocab_size + offs, mask=offs < vocab_size, other=0.0)
        kept = e.to(tl.int32, bitcast=True) >= tau_bits
        w = tl.where(kept, e, 0.0).to(tl.float64)
        hit = (running + tl.cumsum(w, axis=0) > x) & (w > 0)
        first = tl.min(tl.where(hit, offs, _INT32_MAX), axis=0)
        token = tl.where((token < 0) & (first < _INT32_MAX), first.to(tl.int64), token)
        last = tl.maximum(last, tl.max(tl.where(w > 0, offs, -1), axis=0).to(tl.int64))
        running += tl.sum(w, axis=0)
    return tl.where(token < 0, last, token)


@triton.jit
def _masked_sample_kernel(
    logits_ptr,
    bitmask_ptr,
    temperatures_ptr,
    top_ks_ptr,
    top_ps_ptr,
    uniforms_ptr,
    ws_ptr,
    out_ptr,
    vocab_size,
    stride_l,
    stride_b,
    HAS_BITMASK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row; see the module docstring for what it computes."""
    row = tl.program_id(0).to(tl.int64)
    temperature = tl.load(temperatures_ptr + row)
    top_k = tl.load(top_ks_ptr + row)
    top_p = tl.load(top_ps_ptr + row)
    greedy = (temperature < _GREEDY_TEMPERATURE) | (top_k == 1)
    temperature = tl.where(greedy, 1.0, temperature)  # z is unused then; no 0-division
    l_max, token = _z_pass(
        logits_ptr,
        bitmask_ptr,
        ws_ptr,
        row,
        vocab_size,
        stride_l,
        stride_b,
        temperature,
        HAS_BITMASK,
        BLOCK,
    )
    if (l_max > float("-inf")) & ~greedy:
        z_max = tl.math.div_rn(l_max, temperature)
        kth_z = tl.full((), float("-inf"), tl.float32)
        if (top_k > 1) & (top_k < vocab_size):
            kth_z = _top_k_z(ws_ptr, row, vocab_size, z_max, top_k, BLOCK)
        mass = _weights_pass(ws_ptr, row, vocab_size, z_max, kth_z, BLOCK)
        tau_bits = tl.full((), 0, tl.int64)
        if top_p < 1.0:
            tau_bits, mass = _top_p_bits(ws_ptr, row, vocab_size, top_p, mass, BLOCK)
        x = tl.load(uniforms_ptr + row).to(tl.float64) * mass
        token = _draw_pass(ws_ptr, row, vocab_size, tau_bits, x, BLOCK)
    tl.store(out_ptr + row, token)


def masked_sample_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Same contract as :func:`masked_sample_reference`, as one Triton launch (a program
    per row). The tensors must live where Triton runs (a GPU, or CPU under
    TRITON_INTERPRET=1).

    Raises:
        ValueError: shapes do not fit together.
    """
    check_sample_args(logits, bitmask, temperatures, top_ks, top_ps, uniforms)
    num_rows, vocab_size = logits.shape
    out = torch.full((num_rows,), -1, dtype=torch.int64, device=logits.device)
    if num_rows == 0 or vocab_size == 0:
        return out
    logits = logits.contiguous()
    if bitmask is not None:
        bitmask = bitmask.to(logits.device).contiguous()
    block = min(_MAX_BLOCK, max(32, triton.next_power_of_2(vocab_size)))
    _masked_sample_kernel[(num_rows,)](
        logits,
        bitmask if bitmask is not None else logits,  # unread without a bitmask
        per_row(temperatures, torch.float32, logits.device),
        per_row(top_ks, torch.int32, logits.device),
        per_row(top_ps, torch.float32, logits.device),
        per_row(uniforms, torch.float32, logits.device),
        torch.empty_like(logits, dtype=torch.float32),  # the workspace: z, then e
        out,
        vocab_size,
        logits.stride(0),
        bitmask.stride(0) if bitmask is not None else 0,
        HAS_BITMASK=bitmask is not None,
        BLOCK=block,
        num_warps=8 if block >= 2048 else 4,
        enable_fp_fusion=False,  # no contracted a * b + c: every step rounds as in torch
    )
    return out
