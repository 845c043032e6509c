"""Rotary embedding of q and k fused with the KV pool write, in Triton.

Contract: ``radixlm.kernels.rope_kv.rotate_and_store_reference``. One program per
token, each head a row of a (heads, R/2) tile::

    program t:  c, s = cos[t], sin[t]                               (R/2,) float32
                q[t]  <- [q1 c - q2 s | q2 c + q1 s | rest]          (H rows)
                k[t]  <- the same over the Hkv rows; k_pool[slot] <- k[t]
                v_pool[slot] <- v[t]
                slot = slots[t]

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

from radixlm.kernels.rope_kv import check_rope_kv_args

__all__ = ["rotate_and_store_triton"]


@triton.jit
def _rope_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    k_pool_ptr,
    v_pool_ptr,
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
    num_heads,
    num_kv_heads,
    HALF: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program t: see the module docstring. The pools share strides (one layer each)."""
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
    tl.store(k_pool_ptr + pool_row + offs_i[None, :], r1, mask=ok)
    tl.store(k_pool_ptr + pool_row + HALF + offs_i[None, :], r2, mask=ok)
    if BLOCK_REST > 0:  # partial rotary: the dims past R pass through
        offs_r = 2 * HALF + tl.arange(0, BLOCK_REST)
        ok = kv_ok[:, None] & (offs_r < HEAD_DIM)[None, :]
        rest = tl.load(k_ptr + t * stride_kt + kv[:, None] * stride_kh + offs_r[None, :], mask=ok)
        tl.store(k_pool_ptr + pool_row + offs_r[None, :], rest, mask=ok)

    # v: copied to the pool as it is
    offs_d = tl.arange(0, BLOCK_D)
    ok = kv_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    v = tl.load(v_ptr + t * stride_vt + kv[:, None] * stride_vh + offs_d[None, :], mask=ok)
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
) -> None:
    """Same contract as :func:`rotate_and_store_reference`, one Triton launch (tensors
    on a GPU, or on CPU under TRITON_INTERPRET=1). q, k and v may be strided views
    (tokens and heads: the heads of a fused QKV projection); the pools share strides.

    Raises:
        ValueError: shapes, dtypes or devices do not fit together.
    """
    check_rope_kv_args(q, k, v, cos, sin, k_pool, v_pool, slots)
    if k_pool.stride() != v_pool.stride():
        raise ValueError(f"the pools must share strides, got {k_pool.stride()}, {v_pool.stride()}")
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if tokens == 0:
        return
    half = cos.shape[1]
    rest = head_dim - 2 * half
    _rope_kv_kernel[(tokens,)](
        q,
        k,
        v,
        cos,
        sin,
        k_pool,
        v_pool,
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
        num_heads,
        num_kv_heads,
        HALF=half,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_KV=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_REST=triton.next_power_of_2(rest) if rest else 0,
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4,
    )
