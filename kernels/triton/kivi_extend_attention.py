"""Extend (prefill) attention over a KIVI KV pool in Triton: ``extend_attention``'s
program (b, h, m), every key, the pass's own included, read from the pool a whole
group at a time (KIVI stores a pass's tokens before it attends; ``kivi_cache``: the
layout and the reading), causally. The sliding window and the soft-cap are
``extend_attention``'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.triton.decode_attention import dot_dtype, dot_precision, score_args, tanh_f32
from radixlm.kernels.triton.kivi_cache import (
    KiviCache,
    check_per_request,
    load_keys_t,
    load_values,
    rounds_by_bits,
)

__all__ = ["extend_attention_kivi_triton"]


@triton.jit
def _extend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    meta_ptr,
    window_k_ptr,
    window_v_ptr,
    req_to_token_ptr,
    rows_ptr,
    prefix_lens_ptr,
    extend_lens_ptr,
    extend_starts_ptr,
    out_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_cs,
    stride_ch,
    stride_ms,
    stride_mh,
    stride_wr,
    stride_wg,
    stride_wh,
    stride_table,
    stride_ot,
    stride_oh,
    group,
    window,
    HEAD_DIM: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    VALUE_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr,
    CAP: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """Program (b, h, m): BLOCK_M new tokens of request b over every key they see, the
    pass's own included, all read from the pool a group at a time (``extend_attention``'s
    masks and softmax)."""
    b = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    m_start = tl.program_id(2) * BLOCK_M
    extend_len = tl.load(extend_lens_ptr + b)
    if m_start >= extend_len:
        return
    prefix_len = tl.load(prefix_lens_ptr + b)
    coded = (prefix_len + extend_len) // GROUP * GROUP
    first = tl.load(extend_starts_ptr + b).to(tl.int64)  # flat row of new token 0
    row = tl.load(rows_ptr + b).to(tl.int64)
    table = req_to_token_ptr + row * stride_table
    kv_head = head // group
    k_head = k_ptr + kv_head * stride_ch
    v_head = v_ptr + kv_head * stride_ch
    meta_head = meta_ptr + kv_head * stride_mh
    window_k = window_k_ptr + row * stride_wr + kv_head * stride_wh
    window_v = window_v_ptr + row * stride_wr + kv_head * stride_wh
    dtype = q_ptr.dtype.element_ty
    offs_m = m_start + tl.arange(0, BLOCK_M)
    m_ok = offs_m < extend_len
    q_pos = prefix_len + offs_m  # (BLOCK_M,) the queries' positions
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    q_ptrs = q_ptr + (first + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    mass = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo = 0  # without a window every row sees position 0, so top is finite after a block
    if WINDOWED:  # the block's first query sees keys past its position - window
        lo = tl.maximum(prefix_len + m_start + 1 - window, 0) // GROUP * GROUP
    hi = prefix_len + tl.minimum(extend_len, m_start + BLOCK_M)  # past the last query
    for n0 in range(lo, hi, GROUP):
        offs_n = n0 + tl.arange(0, GROUP)
        n_ok = offs_n < hi
        slots = tl.load(table + offs_n, mask=n_ok, other=0).to(tl.int64)
        kt = load_keys_t(
            k_head, meta_head, window_k, table, slots, n0, offs_n, n_ok, coded, offs_d, d_ok,
            stride_cs, stride_ms, stride_wg, HEAD_DIM, BITS, GROUP, dtype, BY_BITS,
        )  # fmt: skip
        s = tl.dot(q, kt.to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale
        if CAP > 0:
            s = CAP * tanh_f32(s)
        seen = n_ok[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if WINDOWED:
            seen = seen & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))  # (BLOCK_M, GROUP), base 2
        top_new = tl.maximum(top, tl.max(s, 1))
        ref = top_new
        if WINDOWED:  # a row may see no key of the block
            ref = tl.where(top_new == float("-inf"), 0.0, top_new)
        alpha = tl.exp2(top - ref)
        p = tl.exp2(s - ref[:, None])
        mass = mass * alpha + tl.sum(p, 1)
        v = load_values(
            v_head, meta_head, window_v, slots, offs_n, n_ok, coded, offs_d, d_ok,
            stride_cs, stride_ms, stride_wg, HEAD_DIM, BITS, GROUP, VALUE_GROUP, dtype, BY_BITS,
        )  # fmt: skip
        pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        top = top_new

    if WINDOWED:  # a padding row past extend_len may see no key: 0 / 0, never stored
        mass = tl.where(mass > 0, mass, 1.0)
    o = tl.math.div_rn(acc, mass[:, None])
    o_ptrs = out_ptr + (first + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def extend_attention_kivi_triton(
    q: torch.Tensor,
    cache: KiviCache,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_starts: torch.Tensor,
    max_extend: int,
    scale: float,
    out: torch.Tensor | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """``extend_attention_triton`` over a KIVI pool whose every key, the new tokens'
    included, is stored: new token t of request b (flat row extend_starts[b] + t,
    position prefix_lens[b] + t) attends positions 0 .. its own, causally. ``max_extend``
    (a host int, >= every extend_len) sizes the grid. Rows no request covers are left
    as they were (zeros when allocated here). No host sync. Raises ValueError when
    shapes, dtypes or devices do not fit."""
    cache.check(q, req_to_token)
    batch = rows.shape[0] if rows.dim() == 1 else -1
    per_request = {
        "rows": rows,
        "prefix_lens": prefix_lens,
        "extend_lens": extend_lens,
        "extend_starts": extend_starts,
    }
    check_per_request(batch, q, out, **per_request)
    out = out if out is not None else torch.zeros_like(q)
    num_tokens, num_heads, head_dim = q.shape
    if batch == 0 or num_tokens == 0 or num_heads == 0 or max_extend < 1:
        return out
    q = q if q.stride(2) == 1 else q.contiguous()
    sixteen_bit = q.element_size() == 2
    block_m = min(64 if sixteen_bit else 32, max(16, triton.next_power_of_2(max_extend)))
    operand = dot_dtype(q.dtype, q.device)
    qk_scale, cap = score_args(scale, softcap)
    _extend_kernel[(batch, num_heads, triton.cdiv(max_extend, block_m))](
        q,
        cache.k,
        cache.v,
        cache.meta,
        cache.window_k,
        cache.window_v,
        req_to_token,
        *(t.contiguous() for t in per_request.values()),
        out,
        qk_scale,
        q.stride(0),
        q.stride(1),
        *cache.strides(),
        req_to_token.stride(0),
        out.stride(0),
        out.stride(1),
        num_heads // cache.k.shape[1],
        max(window, 0),
        HEAD_DIM=head_dim,
        BITS=cache.bits,
        GROUP=cache.group,
        VALUE_GROUP=cache.value_group,
        BLOCK_M=block_m,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_DTYPE=operand,
        DOT_PRECISION=dot_precision(operand),
        WINDOWED=window > 0,
        CAP=cap,
        BY_BITS=rounds_by_bits(q.dtype, q.device),
        num_warps=4 if block_m < 64 else 8,
        num_stages=2,
    )
    return out
