"""The token-bitmask kernel in Triton: one launch masks every constrained row.

Contract, layout and errors: ``radixlm.kernels.bitmask`` (the plain-torch reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.bitmask import check_apply_args

__all__ = ["apply_token_bitmask_triton"]

# Vocab entries per program.
_BLOCK = 1024


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    indices_ptr,
    vocab_size,
    stride_logits,
    stride_bitmask,
    HAS_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program (r, b): bitmask row r over vocab block b."""
    r = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    in_vocab = offs < vocab_size
    if HAS_INDICES:
        row = tl.load(indices_ptr + r).to(tl.int64)
    else:
        row = r.to(tl.int64)
    words = tl.load(bitmask_ptr + r * stride_bitmask + offs // 32, mask=in_vocab, other=-1)
    allowed = ((words >> (offs % 32)) & 1) != 0  # arithmetic shift: bit 31 lands in bit 0
    neg_inf = tl.full([BLOCK], float("-inf"), tl.float32)
    tl.store(logits_ptr + row * stride_logits + offs, neg_inf, mask=in_vocab & ~allowed)


def apply_token_bitmask_triton(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Same contract as :func:`apply_token_bitmask_reference`, as one Triton launch.

    The logits must live where Triton runs (a GPU, or CPU under TRITON_INTERPRET=1).
    Index values are not range-checked (that would need a device sync).

    Raises:
        ValueError: shapes or dtypes do not fit together, or the vocab dim is strided.
    """
    check_apply_args(logits, bitmask, indices)
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the vocab dim")
    bitmask = bitmask.to(logits.device).contiguous()
    num_rows, vocab_size = bitmask.shape[0], logits.shape[1]
    if num_rows == 0 or vocab_size == 0:
        return
    if indices is not None:
        indices = indices.to(device=logits.device, dtype=torch.int64).contiguous()
    grid = (num_rows, triton.cdiv(vocab_size, _BLOCK))
    _apply_token_bitmask_kernel[grid](
        logits,
        bitmask,
        indices if indices is not None else bitmask,  # unread without indices
        vocab_size,
        logits.stride(0),
        bitmask.stride(0),
        HAS_INDICES=indices is not None,
        BLOCK=_BLOCK,
        num_warps=4,
        enable_fp_fusion=False,
    )
