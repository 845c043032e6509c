"""Residual add fused with RMSNorm in Triton: one program per row.

Contract: ``radixlm.kernels.norm.add_rms_norm_reference``::

    program t:  r = residual[t] + x[t]    float32 sum, rounded once to the dtype and
                                          stored back into residual[t]
                out[t] = r * rsqrt(mean(r^2) + eps) * weight    float32, rounded once

The norm reads the rounded sum, as the unfused add-then-norm does, so the stream
is bit for bit the one torch's in-place add leaves. A row is one block
(``BLOCK >= n``): hidden sizes up to 16k stay in registers.

Triton's interpreter (3.x, CPU tensors) casts float32 to bfloat16 by truncation; a
GPU rounds to nearest. On CPU the kernel rounds the bfloat16 sum by hand
(``ROUND_BY_HAND``) so that the stream matches torch's there too; the output's one
rounding is left to the cast (the tests' bounds allow either).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.norm import check_add_rms_norm_args

__all__ = ["add_rms_norm_triton"]


@triton.jit
def _add_rms_norm_kernel(
    residual_ptr,
    x_ptr,
    weight_ptr,
    out_ptr,
    stride_r,
    stride_x,
    stride_o,
    n,
    eps,
    HAS_X: tl.constexpr,
    BLOCK: tl.constexpr,
    ROUND_BY_HAND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < n
    r_ptrs = residual_ptr + row * stride_r + offs
    r = tl.load(r_ptrs, mask=ok, other=0.0)
    if HAS_X:
        x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0)
        r = r.to(tl.float32) + x.to(tl.float32)
        if ROUND_BY_HAND:  # to bfloat16's nearest (ties to even), then an exact cast
            bits = r.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            r = bits.to(tl.float32, bitcast=True)
        r = r.to(residual_ptr.dtype.element_ty)
        tl.store(r_ptrs, r, mask=ok)
    r = r.to(tl.float32)
    rms = tl.sqrt_rn(tl.sum(r * r, 0) / n + eps)
    w = tl.load(weight_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    out = tl.math.div_rn(r, rms) * w  # IEEE division: Triton's "/" is approximate
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=ok)


def add_rms_norm_triton(
    residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Same contract as :func:`add_rms_norm_reference`, one Triton launch (tensors on
    a GPU, or on CPU under TRITON_INTERPRET=1); no host sync, so a CUDA graph can
    capture it. Rows may be strided (their last dim contiguous).

    Raises:
        ValueError: shapes, dtypes or devices do not fit together.
    """
    check_add_rms_norm_args(residual, x, weight)
    rows, n = residual.shape
    out = torch.empty((rows, n), dtype=residual.dtype, device=residual.device)
    if rows == 0:
        return out
    block = triton.next_power_of_2(n)
    _add_rms_norm_kernel[(rows,)](
        residual,
        residual if x is None else x,  # unread without HAS_X
        weight,
        out,
        residual.stride(0),
        0 if x is None else x.stride(0),
        out.stride(0),
        n,
        eps,
        HAS_X=x is not None,
        BLOCK=block,
        ROUND_BY_HAND=residual.dtype == torch.bfloat16 and residual.device.type == "cpu",
        num_warps=min(16, max(1, block // 512)),
    )
    return out
