"""Token bitmasks: apply a grammar's allowed-token set to logits, in place.

The layout is xgrammar's and outlines-core's: a packed int32 tensor (R, W) with
W = ceil(V / 32) words per row. Token t is allowed iff bit t % 32 of word t // 32
is set; bit 31 is the sign bit of the int32 word, and bits at t >= V are ignored::

    word w:   bit 31 ........ bit 1  bit 0
    token:    32w+31 ........ 32w+1  32w

With ``indices``, bitmask row r applies to logits row ``indices[r]`` (the batch
may hold unconstrained rows); the indices must be distinct. This module is the plain-torch
reference and the dispatcher (it imports only torch); the Triton kernel lives in
``radixlm.kernels.triton.bitmask`` and is imported on first use on CUDA. Both
implementations write -inf at every disallowed token and leave the rest alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "allowed_token_ids",
    "apply_token_bitmask",
    "apply_token_bitmask_reference",
    "bitmask_from_allowed",
    "bitmask_width",
    "check_bitmask",
    "unpack_bitmask",
]

# -inf's bit pattern as a signed integer of the float's width.
_NEG_INF_BITS = {
    dtype: torch.tensor([float("-inf")], dtype=dtype).view(int_dtype).item()
    for dtype, int_dtype in [
        (torch.float16, torch.int16),
        (torch.bfloat16, torch.int16),
        (torch.float32, torch.int32),
        (torch.float64, torch.int64),
    ]
}


def bitmask_width(vocab_size: int) -> int:
    """int32 words per bitmask row: ceil(vocab_size / 32)."""
    return (vocab_size + 31) // 32


def _keep_words(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(R, W) int32 bitmask -> (R, V) int32 words: -1 (all ones) where allowed, else 0.

    Shifting bit b up to bit 31 and then arithmetically back down by 31 smears it
    over the whole word, so bit 31 (the sign) needs no special case.
    """
    up = torch.arange(31, -1, -1, dtype=torch.int32, device=bitmask.device)  # (32,)
    keep = bitmask.unsqueeze(-1) << up  # (R, W, 32)
    keep >>= 31
    return keep.view(bitmask.shape[0], bitmask.shape[1] * 32)[:, :vocab_size]  # (R, V)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(R, W) int32 bitmask -> (R, V) bool, True where the token is allowed.

    Raises:
        ValueError: the bitmask is not (R, ceil(vocab_size / 32)) int32.
    """
    check_bitmask(bitmask, vocab_size)
    return _keep_words(bitmask, vocab_size) != 0


def allowed_token_ids(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(W,) int32 bitmask row -> (N,) int64 ids of the allowed tokens, ascending.

    Raises:
        ValueError: the row is not (ceil(vocab_size / 32),) int32.
    """
    if bitmask_row.dim() != 1:
        raise ValueError(f"expected a (W,) bitmask row, got shape {tuple(bitmask_row.shape)}")
    check_bitmask(bitmask_row.unsqueeze(0), vocab_size)
    # Only the words with a bit set are unpacked: a grammar mask is often sparse.
    word_ids = bitmask_row.nonzero().squeeze(1)  # (N,)
    shifts = torch.arange(32, device=bitmask_row.device)
    bits = (bitmask_row[word_ids].long().unsqueeze(1) >> shifts) & 1  # (N, 32)
    ids = (word_ids.unsqueeze(1) * 32 + shifts)[bits.bool()]  # ascending
    return ids[ids < vocab_size]


def bitmask_from_allowed(
    allowed_ids: Sequence[Sequence[int] | torch.Tensor], vocab_size: int
) -> torch.Tensor:
    """Packs one list of allowed token ids per row into an (R, W) int32 CPU bitmask.

    Args:
        allowed_ids: per row, the ids it allows (any order; repeats are fine).
        vocab_size: V; the bitmask gets W = ceil(V / 32) words per row.

    Returns:
        (R, W) int32 bitmask with exactly those bits set.

    Raises:
        ValueError: an id is outside [0, vocab_size).
    """
    width = bitmask_width(vocab_size)
    allowed = torch.zeros(len(allowed_ids), width * 32, dtype=torch.bool)  # (R, 32W)
    for r, ids in enumerate(allowed_ids):
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        if bad.numel():
            raise ValueError(f"row {r}: token ids must be in [0, {vocab_size}), got {bad.tolist()}")
        allowed[r, ids] = True
    shifts = torch.arange(32, dtype=torch.int64)  # (32,)
    bits = allowed.view(len(allowed_ids), width, 32).long() << shifts  # (R, W, 32)
    words = bits.sum(dim=-1)  # (R, W) in [0, 2**32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def check_bitmask(bitmask: torch.Tensor, vocab_size: int, num_rows: int | None = None) -> None:
    """Checks that ``bitmask`` is an int32 (R, ceil(vocab_size / 32)) tensor.

    Raises:
        ValueError: the dtype or shape differs (or R != num_rows, when given).
    """
    width = bitmask_width(vocab_size)
    fits = bitmask.dim() == 2 and bitmask.shape[1] == width
    if fits and num_rows is not None:
        fits = bitmask.shape[0] == num_rows
    if bitmask.dtype != torch.int32 or not fits:
        rows = "R" if num_rows is None else num_rows
        raise ValueError(
            f"expected an int32 bitmask of shape ({rows}, {width}) for vocab {vocab_size}, "
            f"got {bitmask.dtype} {tuple(bitmask.shape)}"
        )


def check_apply_args(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None
) -> None:
    if logits.dim() != 2 or logits.dtype not in _NEG_INF_BITS:
        raise ValueError(
            f"expected float16/bfloat16/float32/float64 logits (B, V), "
            f"got {logits.dtype} {tuple(logits.shape)}"
        )
    check_bitmask(bitmask, logits.shape[1])
    num_rows = bitmask.shape[0]
    if indices is None:
        if num_rows != logits.shape[0]:
            raise ValueError(f"{num_rows} bitmask rows for {logits.shape[0]} logits rows")
    elif indices.dim() != 1 or indices.numel() != num_rows or indices.is_floating_point():
        raise ValueError(
            f"expected {num_rows} integer indices, got {indices.dtype} {tuple(indices.shape)}"
        )


def _int_view(logits: torch.Tensor) -> torch.Tensor:
    """The logits' bits as a same-sized signed integer tensor (a view, not a copy)."""
    int_dtype = {2: torch.int16, 4: torch.int32, 8: torch.int64}[logits.element_size()]
    return logits.view(int_dtype)


def _mask_rows_(rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """-inf at every disallowed token of (R, V) ``rows``, in place, on the raw bits.

    ``bits & keep | -inf_bits & ~keep`` runs as plain integer ops: on CPU it is
    several times faster than ``masked_fill_`` with a bool mask.
    """
    bits = _int_view(rows)  # (R, V)
    keep = _keep_words(bitmask, rows.shape[1]).to(bits.dtype)  # (R, V)
    neg_inf_bits = _NEG_INF_BITS[rows.dtype]
    bits &= keep
    keep.bitwise_not_()
    keep &= neg_inf_bits
    bits |= keep


def apply_token_bitmask_reference(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Sets every disallowed token's logit to -inf, in place (plain torch, any device).

    Args:
        logits: (B, V) float logits, modified in place.
        bitmask: (R, ceil(V / 32)) int32 packed allowed-token bits.
        indices: (R,) distinct logits rows that bitmask rows 0..R-1 apply to; None
            means row r -> row r (then R == B).

    Raises:
        ValueError: shapes or dtypes do not fit together.
    """
    check_apply_args(logits, bitmask, indices)
    bitmask = bitmask.to(logits.device)
    if indices is None:
        if logits.stride(1) == 1 and logits.stride(0) == logits.shape[1]:
            _mask_rows_(logits, bitmask)
            return
        indices = torch.arange(logits.shape[0], device=logits.device)
    indices = indices.to(device=logits.device, dtype=torch.int64)
    rows = logits.index_select(0, indices)  # (R, V), contiguous
    _mask_rows_(rows, bitmask)
    logits.index_copy_(0, indices, rows)


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Masks disallowed tokens to -inf in place: Triton on CUDA, the reference elsewhere.

    See :func:`apply_token_bitmask_reference` for the arguments and errors.
    """
    if logits.is_cuda:
        from radixlm.kernels.triton.bitmask import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bitmask, indices)
    else:
        apply_token_bitmask_reference(logits, bitmask, indices)
