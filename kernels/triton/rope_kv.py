"""Rotary embedding of q and k fused with the KV pool write, in Triton.

Contract: ``radixlm.kernels.rope_kv.rotate_and_store_reference``. One program per
token, each head a row of a (heads, R/2) tile::

    program t:  c, s = cos[t], sin[t]                               (R/2,) float32
                q[t]  <- [q1 c - q2 s | q2 c + q1 s | rest]          (H rows)
                k[t]  <- the same over the Hkv rows; k_pool[slot] <- k[t]
                v_pool[slot] <- v[t]
                slot = slots[t]

An int8 pool (``k_scale`` and ``v_scale`` given: radixlm.runtime.mem_cache.kv_quant)
gets codes instead: each token-head row's scale is its largest magnitude / 127 rounded
to bfloat16 (to nearest even, on its bits: ``_int8_scale``), its code
round-half-to-even(value / that scale)
(``torch.round``'s rounding: 1.5 * 2^23 added and taken away in float32), clamped to
+-127; the same values ``kv_quant.quantize`` stores. fp8 pools are quantized by the
caller (a cast: Triton's interpreter rounds a value past its binade's top code down a
binade, so the tests could not hold it).

One launch replaces the rotation's few elementwise ops per tensor and the two
``index_copy_`` of the pool write: q, k and v are each read once, and k is written
to the pool from registers. Rounding: float32 inside, once to the dtype (the tests'
bounds hold for a GPU's round-to-nearest and for the interpreter's truncation of
bfloat16). No host sync: a CUDA graph can capture it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.paged_attention import check_kv_scales
from radixlm.kernels.rope_kv import check_rope_kv_args

__all__ = ["rotate_and_store_triton"]


@triton.jit
def _int8_codes(x, safe_scale):
    """(rows, n) float32 values over their (rows, 1) scale -> int8 codes, half to even
    (1.5 * 2^23 added and taken away: float32 keeps no fraction there, so the sum
    rounds as IEEE does, to even)."""
    c = tl.math.div_rn(x, safe_scale)
    c = (c + 12582912.0) - 12582912.0
    return tl.minimum(tl.maximum(c, -127.0), 127.0).to(tl.int8)


@triton.jit
def _int8_scale(amax):
    """(rows,) largest magnitudes -> (their scales' bfloat16 bits as int16, the scales
    widened to float32 with 1 for a scale of 0: what the codes divide by).

    amax / 127 in float32 is rounded to nearest even on its bits, as torch rounds it
    (as ``kivi_cache.rounded`` does), and the bits are stored as they are: Triton's
    interpreter casts float32 to bfloat16 by truncation, and subnormals wrongly."""
    bits = tl.math.div_rn(amax, 127.0).to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # amax >= 0: the sign bit is 0
    wide = (bits << 16).to(tl.float32, bitcast=True)
    return bits.to(tl.int16), tl.where(wide > 0, wide, 1.0)


@triton.jit
def _rope_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    k_pool_ptr,
    v_pool_ptr,
    k_scale_ptr,
    v_scale_ptr,
    slots_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ct,
    stride_st,
    stride_ps,
    stride_ph,
    stride_ss,
    num_heads,
    num_kv_heads,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INT8: tl.constexpr,
):
    """Program t: see the module docstring. The pools share strides (one layer each),
    and so do an int8 pool's scales (row stride ``stride_ss``, heads contiguous; their
    bfloat16 bits, as int16)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t)
    offs_i = tl.arange(0, BLOCK_HALF)
    i_ok = offs_i < HALF
    c = tl.load(cos_ptr + t * stride_ct + offs_i, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * stride_st + offs_i, mask=i_ok, other=0.0).to(tl.float32)[None, :]

    # q: (BLOCK_H, BLOCK_HALF) tiles of both halves, rotated in place
    heads = tl.arange(0, BLOCK_H)
    ok = (heads < num_heads)[:, None] & i_ok[None, :]
    q1_ptrs = q_ptr + t * stride_qt + heads[:, None] * stride_qh + offs_i[None, :]
    q1 = tl.load(q1_ptrs, mask=ok, other=0.0).to(tl.float32)
    q2 = tl.load(q1_ptrs + HALF, mask=ok, other=0.0).to(tl.float32)
    tl.store(q1_ptrs, (q1 * c - q2 * s).to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(q1_ptrs + HALF, (q2 * c + q1 * s).to(q_ptr.dtype.element_ty), mask=ok)

    # k: the same over the kv heads, in place and into the pool
    kv = tl.arange(0, BLOCK_KV)
    kv_ok = kv < num_kv_heads
    ok = kv_ok[:, None] & i_ok[None, :]
    k1_ptrs = k_ptr + t * stride_kt + kv[:, None] * stride_kh + offs_i[None, :]
    k1 = tl.load(k1_ptrs, mask=ok, other=0.0).to(tl.float32)
    k2 = tl.load(k1_ptrs + HALF, mask=ok, other=0.0).to(tl.float32)
    r1 = (k1 * c - k2 * s).to(k_ptr.dtype.element_ty)
    r2 = (k2 * c + k1 * s).to(k_ptr.dtype.element_ty)
    tl.store(k1_ptrs, r1, mask=ok)
    tl.store(k1_ptrs + HALF, r2, mask=ok)
    pool_row = slot * stride_ps + kv[:, None] * stride_ph
    if BLOCK_REST > 0:  # partial rotary: the dims past R pass through
        offs_r = 2 * HALF + tl.arange(0, BLOCK_REST)
        rest_ok = kv_ok[:, None] & (offs_r < HEAD_DIM)[None, :]
        rest_ptrs = k_ptr + t * stride_kt + kv[:, None] * stride_kh + offs_r[None, :]
        rest = tl.load(rest_ptrs, mask=rest_ok, other=0.0)
    if INT8:  # a scale per kv head (row): its largest magnitude over 127
        r1f, r2f = r1.to(tl.float32), r2.to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(r1f), 1), tl.max(tl.abs(r2f), 1))  # (BLOCK_KV,)
        if BLOCK_REST > 0:
            amax = tl.maximum(amax, tl.max(tl.abs(rest.to(tl.float32)), 1))
        scale, safe = _int8_scale(amax)
        safe = safe[:, None]
        tl.store(k_pool_ptr + pool_row + offs_i[None, :], _int8_codes(r1f, safe), mask=ok)
        tl.store(k_pool_ptr + pool_row + HALF + offs_i[None, :], _int8_codes(r2f, safe), mask=ok)
        if BLOCK_REST > 0:
            codes = _int8_codes(rest.to(tl.float32), safe)
            tl.store(k_pool_ptr + pool_row + offs_r[None, :], codes, mask=rest_ok)
        tl.store(k_scale_ptr + slot * stride_ss + kv, scale, mask=kv_ok)
    else:
        tl.store(k_pool_ptr + pool_row + offs_i[None, :], r1, mask=ok)
        tl.store(k_pool_ptr + pool_row + HALF + offs_i[None, :], r2, mask=ok)
        if BLOCK_REST > 0:
            tl.store(k_pool_ptr + pool_row + offs_r[None, :], rest, mask=rest_ok)

    # v: copied to the pool as it is (an int8 pool: its codes and scale)
    offs_d = tl.arange(0, BLOCK_D)
    ok = kv_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    v_ptrs = v_ptr + t * stride_vt + kv[:, None] * stride_vh + offs_d[None, :]
    v = tl.load(v_ptrs, mask=ok, other=0.0)
    if INT8:
        vf = v.to(tl.float32)
        scale, safe = _int8_scale(tl.max(tl.abs(vf), 1))
        safe = safe[:, None]
        tl.store(v_pool_ptr + pool_row + offs_d[None, :], _int8_codes(vf, safe), mask=ok)
        tl.store(v_scale_ptr + slot * stride_ss + kv, scale, mask=kv_ok)
    else:
        tl.store(v_pool_ptr + pool_row + offs_d[None, :], v, mask=ok)


def rotate_and_store_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Same contract as :func:`rotate_and_store_reference`, one Triton launch (tensors
    on a GPU, or on CPU under TRITON_INTERPRET=1). q, k and v may be strided views
    (tokens and heads: the heads of a fused QKV projection); the pools share strides.

    k_scale, v_scale: (num_slots, Hkv) bfloat16 scales of an int8 pool (k_pool/v_pool
    its codes): the tokens are stored quantized (see the module). None: a float pool.

    Raises:
        ValueError: shapes, dtypes or devices do not fit together, or a quantized
            pool is not int8.
    """
    quant = k_scale is not None and v_scale is not None
    check_rope_kv_args(q, k, v, cos, sin, k_pool, v_pool, slots, codes=quant)
    if k_pool.stride() != v_pool.stride():
        raise ValueError(f"the pools must share strides, got {k_pool.stride()}, {v_pool.stride()}")
    if quant:
        _check_int8_scales(k_pool, v_pool, k_scale, v_scale)  # type: ignore[arg-type]
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if tokens == 0:
        return
    half = cos.shape[1]
    rest = head_dim - 2 * half
    # an int8 pool's scales as their bfloat16 bits (the kernel stores bits); the pools
    # in a float pool's launch, unread
    scale_bits = (k_pool, v_pool)
    if quant:
        scale_bits = (k_scale.view(torch.int16), v_scale.view(torch.int16))  # type: ignore[union-attr]
    _rope_kv_kernel[(tokens,)](
        q,
        k,
        v,
        cos,
        sin,
        k_pool,
        v_pool,
        *scale_bits,
        slots,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        sin.stride(0),
        k_pool.stride(0),
        k_pool.stride(1),
        k_scale.stride(0) if quant else 0,  # type: ignore[union-attr]
        num_heads,
        num_kv_heads,
        HALF=half,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_KV=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_REST=triton.next_power_of_2(rest) if rest else 0,
        BLOCK_D=triton.next_power_of_2(head_dim),
        INT8=quant,
        num_warps=4,
    )


def _check_int8_scales(
    k_pool: torch.Tensor, v_pool: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor
) -> None:
    """An int8 pool, its scales sharing one layout with contiguous heads."""
    check_kv_scales(k_pool, v_pool, k_scale, v_scale)
    if k_pool.dtype != torch.int8:
        raise ValueError(f"the store kernel quantizes to int8 only, got a {k_pool.dtype} pool")
    if k_scale.stride() != v_scale.stride() or k_scale.stride(1) != 1:
        raise ValueError(
            f"the scales must share strides with contiguous heads, got {k_scale.stride()}, "
            f"{v_scale.stride()}"
        )
