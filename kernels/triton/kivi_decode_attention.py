"""Decode attention over a KIVI KV pool in Triton: ``decode_attention``'s split-KV
form, each row's context split into whole key groups (its split length rounded up to
a multiple of G; ``merge_splits`` reduces the splits), every key read in place from the
codes or the row's float window (``kivi_cache``: the layout and the reading). The
sliding window and the soft-cap are ``decode_attention``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.decode_attention import (
    dot_dtype,
    dot_precision,
    merge_splits,
    score_args,
    tanh_f32,
)
from radixlm.kernels.triton.kivi_cache import (
    KiviCache,
    check_per_request,
    load_keys_t,
    load_values,
    rounds_by_bits,
)

__all__ = ["decode_attention_kivi_triton"]


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    meta_ptr,
    window_k_ptr,
    window_v_ptr,
    req_to_token_ptr,
    rows_ptr,
    seq_lens_ptr,
    partial_ptr,
    lse_ptr,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_cs,
    stride_ch,
    stride_ms,
    stride_mh,
    stride_wr,
    stride_wg,
    stride_wh,
    stride_table,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    group,
    head_blocks,
    num_kv_splits,
    min_split_len,
    window,
    HEAD_DIM: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    VALUE_GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr,
    CAP: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """Program (b, kv_head * head_blocks + head block, split): ``decode_attention``'s
    stage 1 over whole key groups."""
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1) // head_blocks
    in_group = (tl.program_id(1) % head_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
    heads = kv_head * group + in_group
    head_ok = in_group < group
    split = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    dtype = q_ptr.dtype.element_ty

    seq_len = tl.load(seq_lens_ptr + b)
    coded = seq_len // GROUP * GROUP  # positions below: codes; from there: the window
    first = 0  # the row's first position: its window's, or 0
    if WINDOWED:
        first = tl.maximum(seq_len - window, 0)
    base = first // GROUP * GROUP  # splits start on whole groups
    split_len = tl.maximum((seq_len - base + num_kv_splits - 1) // num_kv_splits, min_split_len)
    split_len = (split_len + GROUP - 1) // GROUP * GROUP
    start = base + split * split_len
    end = tl.minimum(start + split_len, seq_len)
    row = tl.load(rows_ptr + b).to(tl.int64)
    table = req_to_token_ptr + row * stride_table
    k_head = k_ptr + kv_head * stride_ch
    v_head = v_ptr + kv_head * stride_ch
    meta_head = meta_ptr + kv_head * stride_mh
    window_k = window_k_ptr + row * stride_wr + kv_head * stride_wh
    window_v = window_v_ptr + row * stride_wr + kv_head * stride_wh

    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=head_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)
    top = tl.full([BLOCK_H], float("-inf"), tl.float32)
    mass = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, GROUP):
        offs_n = n0 + tl.arange(0, GROUP)
        n_ok = (offs_n < end) & (offs_n >= first)  # a position of each block: first's or n0
        slots = tl.load(table + offs_n, mask=n_ok, other=0).to(tl.int64)
        kt = load_keys_t(
            k_head, meta_head, window_k, table, slots, n0, offs_n, n_ok, coded, offs_d, d_ok,
            stride_cs, stride_ms, stride_wg, HEAD_DIM, BITS, GROUP, dtype, BY_BITS,
        )  # fmt: skip
        s = tl.dot(q, kt.to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale
        if CAP > 0:
            s = CAP * tanh_f32(s)
        s = tl.where(n_ok[None, :], s, float("-inf"))  # (BLOCK_H, GROUP), base 2
        top_new = tl.maximum(top, tl.max(s, 1))
        alpha = tl.exp2(top - top_new)
        p = tl.exp2(s - top_new[:, None])
        mass = mass * alpha + tl.sum(p, 1)
        v = load_values(
            v_head, meta_head, window_v, slots, offs_n, n_ok, coded, offs_d, d_ok,
            stride_cs, stride_ms, stride_wg, HEAD_DIM, BITS, GROUP, VALUE_GROUP, dtype, BY_BITS,
        )  # fmt: skip
        pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        top = top_new

    has_keys = mass > 0
    mass_safe = tl.where(has_keys, mass, 1.0)
    partial = tl.math.div_rn(acc, mass_safe[:, None])
    lse = tl.where(has_keys, top + tl.log2(mass_safe), float("-inf"))
    p_ptrs = (
        partial_ptr
        + b * stride_pb
        + heads[:, None] * stride_ph
        + split * stride_ps
        + offs_d[None, :]
    )
    tl.store(p_ptrs, partial, mask=head_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=head_ok)


def decode_attention_kivi_triton(
    q: torch.Tensor,
    cache: KiviCache,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    num_kv_splits: int = 8,
    window: int = 0,
    softcap: float = 0.0,
    min_split_len: int = 1,
) -> torch.Tensor:
    """``decode_attention_triton`` over a KIVI pool: q (B, H, D), each row's query over
    positions 0 .. seq_lens[b] - 1 of its ``req_to_token`` row (its new token stored).
    Each split takes a whole number of key groups, at least ``min_split_len`` positions.
    No host sync. Raises ValueError when shapes, dtypes or devices do not fit."""
    cache.check(q, req_to_token)
    batch, num_heads, head_dim = q.shape
    check_per_request(batch, q, out, rows=rows, seq_lens=seq_lens)
    if num_kv_splits < 1:
        raise ValueError(f"expected num_kv_splits >= 1, got {num_kv_splits}")
    out = out if out is not None else torch.empty_like(q)
    if batch == 0 or num_heads == 0:
        return out
    q = q if q.stride(2) == 1 else q.contiguous()
    num_kv_heads = cache.k.shape[1]
    group = num_heads // num_kv_heads
    sixteen_bit = q.element_size() == 2
    block_h = min(64 if sixteen_bit else 16, max(16, triton.next_power_of_2(group)))
    head_blocks = triton.cdiv(group, block_h)
    partial = q.new_empty((batch, num_heads, num_kv_splits, head_dim), dtype=torch.float32)
    lse = q.new_empty((batch, num_heads, num_kv_splits), dtype=torch.float32)
    operand = dot_dtype(q.dtype, q.device)
    qk_scale, cap = score_args(scale, softcap)
    _decode_split_kernel[(batch, num_kv_heads * head_blocks, num_kv_splits)](
        q,
        cache.k,
        cache.v,
        cache.meta,
        cache.window_k,
        cache.window_v,
        req_to_token,
        rows.contiguous(),
        seq_lens.contiguous(),
        partial,
        lse,
        qk_scale,
        q.stride(0),
        q.stride(1),
        *cache.strides(),
        req_to_token.stride(0),
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        group,
        head_blocks,
        num_kv_splits,
        max(min_split_len, 1),
        max(window, 0),
        HEAD_DIM=head_dim,
        BITS=cache.bits,
        GROUP=cache.group,
        VALUE_GROUP=cache.value_group,
        BLOCK_H=block_h,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_DTYPE=operand,
        DOT_PRECISION=dot_precision(operand),
        WINDOWED=window > 0,
        CAP=cap,
        BY_BITS=rounds_by_bits(q.dtype, q.device),
        num_warps=4 if sixteen_bit else 8,
        num_stages=2,
    )
    merge_splits(partial, lse, out)
    return out
