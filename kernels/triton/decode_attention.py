"""Decode attention over the paged KV pool in Triton: split-KV ("flash decoding").

Contract: ``radixlm.kernels.paged_attention.decode_attention_reference``.

Two launches, whose grids depend only on shapes and ``num_kv_splits`` (so a CUDA
graph can capture them; no value is read on the host)::

    stage 1, program (b, kv head x head block, split):
        positions [split * L, min((split + 1) * L, seq_len)),
        L = max(cdiv(seq_len, splits), min_split_len)
        q rows  = the G query heads of the kv head, padded to BLOCK_H >= 16 rows
                  (a group larger than BLOCK_H takes several head blocks)
        for each BLOCK_N positions: slots -> K^T (D, N), V (N, D), one read per kv head
            s = q K^T (BLOCK_H, N), online softmax in float32 (base 2)
        -> partial[b, h, split] = acc / l,  lse[b, h, split] = m + log2 l
           (a split with no positions: 0 and -inf, which weigh nothing below)
    stage 2, program (b, h):
        out[b, h] = sum_s 2^(lse_s - max) partial_s / sum_s 2^(lse_s - max)

The split count is fixed per launch (a captured graph fixes it for its batch size),
so it is chosen from the batch and the longest context a row may have
(``radixlm.kernels.paged_attention.choose_kv_splits``: enough programs to fill the
GPU, no split shorter than ``MIN_SPLIT_LEN``); the floor ``min_split_len`` then
keeps a short row in its first splits, and an empty split costs its program a load
of its length and two stores::

    splits 8, min_split_len 256:   seq_len 5,000 -> 8 splits of 625
                                   seq_len   600 -> 256 | 256 | 88 | empty x 5

Scores are kept in base 2 (scale * log2 e folded into one multiply) so every
exponential is an exp2. float32 operands multiply with IEEE precision (no TF32),
so float32 results keep float32 accuracy.

A sliding window W (``window`` > 0) narrows each row to its last W positions,
[max(0, seq_len - W), seq_len), which the splits then share: the keys before it
are never read. A soft-cap c (``softcap`` > 0) makes each score c tanh(s / c):
the product scales by 1 / c, ``tanh_f32`` bends it, and c log2 e takes it to base
2. Both are compile-time switches (``WINDOWED``, ``CAP``), so a layer with
neither runs the plain kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from radixlm.kernels.paged_attention import check_decode_args

__all__ = ["decode_attention_triton"]

_LOG2E = math.log2(math.e)


@triton.jit
def tanh_f32(x):
    """tanh(x), a few ulp: x + x^3 P(x^2) below |x| = 0.625 (the Cephes tanhf
    polynomial), else sign(x) (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.29 (no
    cancellation; +-1 once e underflows). Triton has no tanh of its own that its
    interpreter runs (libdevice's is a GPU extern)."""
    ax = tl.abs(x)
    z = x * x
    p = -5.70498872745e-3 * z + 2.06390887954e-2
    p = p * z - 5.37397155531e-2
    p = p * z + 1.33314422036e-1
    p = p * z - 3.33332819422e-1
    small = x + x * z * p
    e = tl.exp2(ax * -2.8853900817779268)  # exp(-2|x|) = 2^(-2|x| log2 e)
    large = tl.math.div_rn(1.0 - e, 1.0 + e)
    return tl.where(ax < 0.625, small, tl.where(x < 0, -large, large))


def score_args(scale: float, softcap: float) -> tuple[float, float]:
    """(qk_scale, CAP) of the kernels: a product's factor to base-2 scores, and 0.0;
    or, soft-capped, its factor to tanh's argument (scale / c) and c log2 e."""
    if softcap > 0:
        return scale / softcap, softcap * _LOG2E
    return scale * _LOG2E, 0.0


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    req_to_token_ptr,
    rows_ptr,
    seq_lens_ptr,
    partial_ptr,
    lse_ptr,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ss,
    stride_sh,
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
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr,
    CAP: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Program (b, kv_head * head_blocks + head block, split): see the module docstring.

    The softmax update is written out here rather than in a helper: under
    TRITON_INTERPRET every call of a jitted function (a helper, or tl.cdiv) re-patches
    triton.language, which slows the CPU tests.
    """
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1) // head_blocks
    in_group = (tl.program_id(1) % head_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    heads = kv_head * group + in_group
    head_ok = in_group < group
    split = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    seq_len = tl.load(seq_lens_ptr + b)
    first = 0  # the row's first position: its window's, or 0
    if WINDOWED:
        first = tl.maximum(seq_len - window, 0)
    split_len = (seq_len - first + num_kv_splits - 1) // num_kv_splits  # not tl.cdiv: see above
    split_len = tl.maximum(split_len, min_split_len)  # a short row: the last splits empty
    start = first + split * split_len
    end = tl.minimum(start + split_len, seq_len)
    table = req_to_token_ptr + tl.load(rows_ptr + b).to(tl.int64) * stride_table

    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=head_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)
    top = tl.full([BLOCK_H], float("-inf"), tl.float32)
    mass = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        slots = tl.load(table + offs_n, mask=n_ok, other=0)  # (BLOCK_N,)
        kt_ptrs = k_ptr + slots[None, :] * stride_ks + kv_head * stride_kh + offs_d[:, None]
        kt = tl.load(kt_ptrs, mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
        if QUANT:  # codes * their token-head's scale, in float32, rounded to q's dtype
            scale_ptrs = slots * stride_ss + kv_head * stride_sh
            ks = tl.load(k_scale_ptr + scale_ptrs, mask=n_ok, other=0.0).to(tl.float32)
            kt = (kt.to(tl.float32) * ks[None, :]).to(q_ptr.dtype.element_ty)
        s = tl.dot(q, kt.to(DOT_DTYPE), input_precision=DOT_PRECISION) * qk_scale
        if CAP > 0:
            s = CAP * tanh_f32(s)
        s = tl.where(n_ok[None, :], s, float("-inf"))  # (BLOCK_H, BLOCK_N), base 2
        top_new = tl.maximum(top, tl.max(s, 1))  # finite: every block holds a position
        alpha = tl.exp2(top - top_new)
        p = tl.exp2(s - top_new[:, None])
        mass = mass * alpha + tl.sum(p, 1)
        v_ptrs = v_ptr + slots[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :]
        v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        if QUANT:
            vs = tl.load(v_scale_ptr + scale_ptrs, mask=n_ok, other=0.0).to(tl.float32)
            v = (v.to(tl.float32) * vs[:, None]).to(q_ptr.dtype.element_ty)
        pv = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        top = top_new

    has_keys = mass > 0
    mass_safe = tl.where(has_keys, mass, 1.0)
    partial = tl.math.div_rn(acc, mass_safe[:, None])  # 0 where the split is empty
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


@triton.jit
def _decode_merge_kernel(
    partial_ptr,
    lse_ptr,
    out_ptr,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    num_kv_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (b, h): the splits' partial outputs weighed by their softmax mass."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < num_kv_splits
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + offs_s, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # seq_len 0 (a padded row): zeros, no NaN
    w = tl.exp2(lse - top)  # (BLOCK_S,)
    p_ptrs = (
        partial_ptr + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :]
    )
    partial = tl.load(p_ptrs, mask=s_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_S, BLOCK_D)
    num = tl.sum(w[:, None] * partial, 0)
    den = tl.sum(w, 0)
    o = tl.math.div_rn(num, tl.where(den > 0, den, 1.0))
    o_ptrs = out_ptr + b * stride_ob + h * stride_oh + offs_d
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=d_ok)


def dot_dtype(dtype: torch.dtype, device: torch.device) -> tl.dtype:
    """The operand type of the kernels' tl.dot: the inputs' own, but float32 for
    bfloat16 on CPU, as Triton's interpreter (3.x) multiplies bfloat16 operands as
    their raw uint16 bits. Widening is exact, and so are bfloat16 products in
    float32; the interpreter then keeps the softmax weights in float32 rather than
    rounding them to bfloat16 as a GPU does (a rounding the tests' bounds allow)."""
    if dtype == torch.bfloat16 and device.type == "cpu":
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[
        dtype
    ]


def dot_precision(dtype: tl.dtype) -> str:
    """IEEE float32 products (not TF32, which keeps 10 mantissa bits) for float32 operands."""
    return "ieee" if dtype == tl.float32 else "tf32"


def _launch_config(element_size: int, block_d: int, group: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_N, num_warps) of stage 1 for a Hopper-class GPU.

    A kv head's query heads are one tile of BLOCK_H >= 16 rows (tl.dot's minimum;
    the padding is masked), up to 64 (16-bit: one warpgroup's wgmma) or 16 (float32:
    IEEE products on the FMA units, which spill past 16 x 32 at D >= 128) a
    program; larger groups take several programs, each reading the kv head's K/V.
    16-bit: 64 keys a block (32 at D = 256) on 4 warps, 80-240 registers a thread;
    float32: 32 keys on 8 warps. Every size was compiled for sm_90a: no spills.
    """
    sixteen_bit = element_size == 2
    block_h = min(64 if sixteen_bit else 16, max(16, triton.next_power_of_2(group)))
    block_n = 64 if sixteen_bit and block_d <= 128 else 32
    return block_h, block_n, 4 if sixteen_bit else 8


def decode_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    num_kv_splits: int = 8,
    window: int = 0,
    softcap: float = 0.0,
    min_split_len: int = 1,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as :func:`decode_attention_reference`, as two Triton launches
    (tensors on a GPU, or on CPU under TRITON_INTERPRET=1). No host sync: CUDA-graph
    capturable (scratch comes from the caching allocator, or the graph's pool).

    k_scale, v_scale: (num_slots, Hkv) bfloat16 scales of a quantized pool, whose
    k_pool/v_pool then hold int8 or fp8 codes (radixlm.runtime.mem_cache.kv_quant):
    each key and value read is code * scale in float32, rounded to q's dtype, as
    ``kv_quant.dequantize`` gives it. None: a float pool of q's dtype.

    num_kv_splits: the grid's splits of every row (see ``choose_kv_splits``); each split
    takes at least ``min_split_len`` positions, so a row shorter than
    num_kv_splits x min_split_len fills its first splits and leaves the rest empty.

    q and out may be strided views (rows and heads); their last dim, and the pools'
    last dim, must be contiguous (q is copied if not). Values (slots, rows,
    seq_lens <= C) are the caller's to keep in range.

    Raises:
        ValueError: shapes, dtypes or devices do not fit together, or out's last
            dim is strided.
    """
    check_decode_args(
        q, k_pool, v_pool, req_to_token, rows, seq_lens, out, num_kv_splits, (k_scale, v_scale)
    )
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    check_last_dims(out, k_pool, v_pool, req_to_token)
    if batch == 0 or num_heads == 0:
        return out
    q = q if q.stride(2) == 1 else q.contiguous()
    rows, seq_lens = rows.contiguous(), seq_lens.contiguous()
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_h, block_n, num_warps = _launch_config(q.element_size(), block_d, group)
    head_blocks = triton.cdiv(group, block_h)
    partial = torch.empty(
        (batch, num_heads, num_kv_splits, head_dim), dtype=torch.float32, device=q.device
    )
    lse = torch.empty((batch, num_heads, num_kv_splits), dtype=torch.float32, device=q.device)
    operand = dot_dtype(q.dtype, q.device)
    qk_scale, cap = score_args(scale, softcap)
    quant = k_scale is not None and v_scale is not None
    k_scale_arg, v_scale_arg = (k_scale, v_scale) if quant else (k_pool, v_pool)  # unread
    _decode_split_kernel[(batch, num_kv_heads * head_blocks, num_kv_splits)](
        q,
        k_pool,
        v_pool,
        k_scale_arg,
        v_scale_arg,
        req_to_token,
        rows,
        seq_lens,
        partial,
        lse,
        qk_scale,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        k_scale.stride(0) if quant else 0,
        k_scale.stride(1) if quant else 0,
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
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_DTYPE=operand,
        DOT_PRECISION=dot_precision(operand),
        WINDOWED=window > 0,
        CAP=cap,
        QUANT=quant,
        num_warps=num_warps,
        num_stages=2,
    )
    merge_splits(partial, lse, out)
    return out


def merge_splits(partial: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> None:
    """Stage 2: out[b, h] from the splits' partial outputs (B, H, splits, D) float32
    and their lse (B, H, splits), weighed by their softmax mass."""
    batch, num_heads, num_kv_splits, head_dim = partial.shape
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_merge_kernel[(batch, num_heads)](
        partial,
        lse,
        out,
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        num_kv_splits,
        HEAD_DIM=head_dim,
        BLOCK_S=max(2, triton.next_power_of_2(num_kv_splits)),
        BLOCK_D=block_d,
        num_warps=4 if block_d >= 128 else 2,
    )


def check_last_dims(*tensors: torch.Tensor) -> None:
    """The kernels index the last dim with stride 1 (vector loads)."""
    for t in tensors:
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"expected a contiguous last dim, got strides {t.stride()}")
