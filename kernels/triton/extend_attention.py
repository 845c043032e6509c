"""Extend (prefill) attention over the paged KV pool in Triton.

Contract: ``radixlm.kernels.paged_attention.extend_attention_reference``.

One launch, program (b, h, m) for BLOCK_M new tokens of request b, query head h
(kv head h // G); programs past the request's extend_len exit at once::

    request b's keys:  | prefix: n cached, by slot from the pool | e new, from k/v |
    stage 1            |  BLOCK_N at a time, mask: pos < n       |
    stage 2                                       | 0 .. min(e, (m + 1) BLOCK_M), causal |

    new token t (flat row extend_starts[b] + t, position n + t) sees pool
    positions 0 .. n - 1 and new tokens 0 .. t.

Online softmax in float32, scores in base 2 (see ``decode_attention``); float32
operands multiply with IEEE precision.

A sliding window W (``window`` > 0) adds p - W < k to the mask, and each stage
starts at the block's first token's first key (a cached prefix longer than the
window is read from there on only); a row may then see no key of a block, so the
online softmax's reference max is 0 while its max is still -inf. A soft-cap c
makes each score c tanh(s / c) (``decode_attention.tanh_f32``). Both are
compile-time switches (``WINDOWED``, ``CAP``): a layer with neither runs the
plain kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.paged_attention import check_extend_args
from radixlm.kernels.triton.decode_attention import (
    check_last_dims,
    dot_dtype,
    dot_precision,
    score_args,
    tanh_f32,
)

__all__ = ["extend_attention_triton"]


@triton.jit
def _extend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_pool_ptr,
    v_pool_ptr,
    k_scale_ptr,
    v_scale_ptr,
    req_to_token_ptr,
    rows_ptr,
    prefix_lens_ptr,
    extend_lens_ptr,
    extend_starts_ptr,
    out_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kps,
    stride_kph,
    stride_vps,
    stride_vph,
    stride_ss,
    stride_sh,
    stride_table,
    stride_ot,
    stride_oh,
    group,
    window,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr,
    CAP: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Program (b, h, m): see the module docstring.

    The softmax update is written out in both stages rather than in a helper:
    under TRITON_INTERPRET every call of a jitted function re-patches triton.language,
    which slows the CPU tests.
    """
    b = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    m_start = tl.program_id(2) * BLOCK_M
    extend_len = tl.load(extend_lens_ptr + b)
    if m_start >= extend_len:
        return
    prefix_len = tl.load(prefix_lens_ptr + b)
    first = tl.load(extend_starts_ptr + b).to(tl.int64)  # flat row of new token 0
    table = req_to_token_ptr + tl.load(rows_ptr + b).to(tl.int64) * stride_table
    kv_head = head // group
    offs_m = m_start + tl.arange(0, BLOCK_M)  # (BLOCK_M,) new-token index
    m_ok = offs_m < extend_len
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    q_ptrs = q_ptr + (first + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    mass = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Stage 1: the cached prefix, gathered by slot, from the block's first key.
    prefix_from = 0
    new_from = 0
    if WINDOWED:  # token m_start (position prefix_len + m_start) sees keys > its - window
        prefix_from = tl.maximum(prefix_len + m_start + 1 - window, 0)
        new_from = tl.maximum(m_start + 1 - window, 0)
    for n0 in range(prefix_from, prefix_len, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < prefix_len
        slots = tl.load(table + offs_n, mask=n_ok, other=0)
        kt_ptrs = k_pool_ptr + slots[None, :] * stride_kps + kv_head * stride_kph + offs_d[:, None]
        kt = tl.load(kt_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
        if QUANT:  # codes * their token-head's scale, in float32, rounded to q's dtype
            scale_ptrs = slots * stride_ss + kv_head * stride_sh
            ks = tl.load(k_scale_ptr + scale_ptrs, mask=n_ok, other=0.0).to(tl.float32)
            kt = (kt.to(tl.float32) * ks[None, :]).to(q_ptr.dtype.element_ty)
        s = tl.dot(q, kt.to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale
        if CAP > 0:
            s = CAP * tanh_f32(s)
        seen = n_ok[None, :]
        if WINDOWED:
            seen = seen & (offs_n[None, :] > (prefix_len + offs_m)[:, None] - window)
        s = tl.where(seen, s, float("-inf"))  # (BLOCK_M, BLOCK_N), base 2
        top_new = tl.maximum(top, tl.max(s, 1))  # finite unless windowed: a block holds a key
        ref = top_new
        if WINDOWED:
            ref = tl.where(top_new == float("-inf"), 0.0, top_new)
        alpha = tl.exp2(top - ref)
        p = tl.exp2(s - ref[:, None])
        mass = mass * alpha + tl.sum(p, 1)
        v_ptrs = v_pool_ptr + slots[:, None] * stride_vps + kv_head * stride_vph + offs_d[None, :]
        v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        if QUANT:
            vs = tl.load(v_scale_ptr + scale_ptrs, mask=n_ok, other=0.0).to(tl.float32)
            v = (v.to(tl.float32) * vs[:, None]).to(q_ptr.dtype.element_ty)
        pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        top = top_new

    # Stage 2: the request's own new tokens up to this block's last, causally.
    # Without a window every query row sees new token 0, so top is finite after
    # the first block.
    for n0 in range(new_from, tl.minimum(extend_len, m_start + BLOCK_M), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < extend_len
        rows_n = first + offs_n
        kt_ptrs = k_ptr + rows_n[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None]
        kt = tl.load(kt_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, kt.to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale
        if CAP > 0:
            s = CAP * tanh_f32(s)
        seen = offs_n[None, :] <= offs_m[:, None]
        if WINDOWED:
            seen = seen & (offs_n[None, :] > offs_m[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        top_new = tl.maximum(top, tl.max(s, 1))
        ref = top_new
        if WINDOWED:
            ref = tl.where(top_new == float("-inf"), 0.0, top_new)
        alpha = tl.exp2(top - ref)
        p = tl.exp2(s - ref[:, None])
        mass = mass * alpha + tl.sum(p, 1)
        v_ptrs = v_ptr + rows_n[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :]
        v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        top = top_new

    if WINDOWED:  # a padding row past extend_len may see no key: 0 / 0, never stored
        mass = tl.where(mass > 0, mass, 1.0)
    o = tl.math.div_rn(acc, mass[:, None])
    o_ptrs = out_ptr + (first + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def _launch_config(element_size: int, block_d: int, max_extend: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a Hopper-class GPU.

    16-bit operands run on the tensor cores: 128 x 64 tiles on two warpgroups up to
    D = 128 (~220 registers a thread, 128 KB of shared memory over 3 stages), tiles
    halved at D = 256. float32 (IEEE products on the FMA units) takes 32 x 16 tiles:
    larger ones spill. BLOCK_M never exceeds the longest extend, rounded up to a
    power of 2 >= 16 (tl.dot's minimum); 8 warps from 64 query rows (16-bit) or 32
    (float32), 4 below. Every size was compiled for sm_90a: no register spills.
    """
    if element_size == 2:
        block_m, block_n, stages = (128, 64, 3) if block_d <= 128 else (64, 32, 2)
        rows_for_8_warps = 64
    else:
        block_m, block_n, stages = 32, 16, 2
        rows_for_8_warps = 32
    block_m = min(block_m, max(16, triton.next_power_of_2(max_extend)))
    return block_m, block_n, 8 if block_m >= rows_for_8_warps else 4, stages


def extend_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
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
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as :func:`extend_attention_reference`, as one Triton launch
    (tensors on a GPU, or on CPU under TRITON_INTERPRET=1). No host sync.

    k_scale, v_scale: (num_slots, Hkv) bfloat16 scales of a quantized pool, whose
    k_pool/v_pool then hold int8 or fp8 codes: a cached key or value is code * scale
    in float32, rounded to q's dtype (``kv_quant.dequantize``); the new tokens' k/v
    are read as given. None: a float pool of q's dtype.

    ``max_extend`` (a host int) must be >= every extend_len: it sizes the grid, and
    tokens past it are not computed. q, k, v and out may be strided views (rows
    and heads, e.g. slices of a fused QKV projection); their last dim, and the
    pools' and table's, must be contiguous (q, k, v are copied if not). Values
    (slots, rows, lengths) are the caller's to keep in range.

    Raises:
        ValueError: shapes, dtypes or devices do not fit together, or out's last
            dim is strided.
    """
    check_extend_args(
        q,
        k,
        v,
        k_pool,
        v_pool,
        req_to_token,
        rows,
        prefix_lens,
        extend_lens,
        extend_starts,
        out,
        (k_scale, v_scale),
    )
    num_tokens, num_heads, head_dim = q.shape
    if out is None:
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    check_last_dims(out, k_pool, v_pool, req_to_token)
    batch = rows.shape[0]
    if batch == 0 or num_tokens == 0 or num_heads == 0 or max_extend < 1:
        return out
    q, k, v = (t if t.stride(2) == 1 else t.contiguous() for t in (q, k, v))
    per_request = [t.contiguous() for t in (rows, prefix_lens, extend_lens, extend_starts)]
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m, block_n, num_warps, num_stages = _launch_config(q.element_size(), block_d, max_extend)
    operand = dot_dtype(q.dtype, q.device)
    qk_scale, cap = score_args(scale, softcap)
    quant = k_scale is not None and v_scale is not None
    k_scale_arg, v_scale_arg = (k_scale, v_scale) if quant else (k_pool, v_pool)  # unread
    _extend_kernel[(batch, num_heads, triton.cdiv(max_extend, block_m))](
        q,
        k,
        v,
        k_pool,
        v_pool,
        k_scale_arg,
        v_scale_arg,
        req_to_token,
        *per_request,
        out,
        qk_scale,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        k_scale.stride(0) if quant else 0,
        k_scale.stride(1) if quant else 0,
        req_to_token.stride(0),
        out.stride(0),
        out.stride(1),
        num_heads // k_pool.shape[1],
        max(window, 0),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_DTYPE=operand,
        DOT_PRECISION=dot_precision(operand),
        WINDOWED=window > 0,
        CAP=cap,
        QUANT=quant,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
