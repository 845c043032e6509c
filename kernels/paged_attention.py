"""Attention over the paged KV pool: decode rows and extend (prefill) requests.

Layout (``radixlm.runtime.mem_cache.kv_pool``, page size 1)::

    k_pool, v_pool: (num_slots, Hkv, D)        one layer's K / V; slot 0 pads
    req_to_token[row, pos] = slot of position ``pos`` of the request on ``row``

Decode, row b (one query token, ``q[b]``: (H, D)), its new token's K/V already
in the pool::

    slots = req_to_token[rows[b], : seq_lens[b]]
    out[b, h] = softmax(scale * k_pool[slots, h // G] @ q[b, h]) @ v_pool[slots, h // G]

Extend, request b: ``e = extend_lens[b]`` new tokens at flat rows
``extend_starts[b] ..`` of q/k/v, after ``n = prefix_lens[b]`` cached ones::

    keys   = cat(k_pool[req_to_token[rows[b], : n]], k[start : start + e])    # (n + e, Hkv, D)
    values = cat(v_pool[req_to_token[rows[b], : n]], v[start : start + e])
    new token t (position n + t) attends keys 0 .. n + t                      # causal

with G = H / Hkv query heads per KV head. Two options shape the scores (0: off):

    window W > 0:   the query at position p attends only keys p - W < k <= p
    softcap c > 0:  each score s = scale q.k becomes c tanh(s / c) before the softmax

(``allowed_keys`` and ``cap_scores`` say it in torch). The new tokens' K/V come from the
``k``/``v`` arguments, never from the pool (the caller may or may not have
written them there). Rows of an extend output that no request covers are left
as they were (zero when the function allocates the output).

This module is the plain-torch reference (float32 arithmetic, one request at a
time; it imports only torch), the argument checks, and the decode kernel's split
rule (``choose_kv_splits``: how many parts of each row's context run side by side); the kernels are
``radixlm.kernels.triton.decode_attention`` and ``...extend_attention``, with
the same signatures.
"""

from __future__ import annotations

import torch

__all__ = [
    "MAX_HEAD_DIM",
    "MAX_KV_SPLITS",
    "MIN_SPLIT_LEN",
    "choose_kv_splits",
    "allowed_keys",
    "cap_scores",
    "KV_CODE_DTYPES",
    "check_decode_args",
    "check_extend_args",
    "check_kv_scales",
    "decode_attention_reference",
    "extend_attention_reference",
]

MAX_HEAD_DIM = 256


# A split shorter than this costs more in its fixed work (q, the partial's store, its
# share of the merge) than it saves by running beside the others: 4 blocks of 64 keys.
MIN_SPLIT_LEN = 256
# The merge reads every split's partial of a head (64 x D float32 at most).
MAX_KV_SPLITS = 64
# Programs per SM the split count aims for: two, so one SM's tail overlaps another's.
_PROGRAMS_PER_SM = 2


def choose_kv_splits(
    batch: int,
    num_kv_heads: int,
    max_context: int,
    num_sms: int,
    min_split_len: int = MIN_SPLIT_LEN,
) -> int:
    """The split count of a decode launch of ``batch`` rows, each at most
    ``max_context`` positions: enough that batch x kv heads x splits programs reach
    two per SM, never more than the longest row has ``min_split_len`` runs of
    positions for, nor ``MAX_KV_SPLITS``; 1 once the rows alone fill the GPU.

    Raises:
        ValueError: an argument is not positive.
    """
    for name, value in (
        ("batch", batch),
        ("num_kv_heads", num_kv_heads),
        ("max_context", max_context),
        ("num_sms", num_sms),
        ("min_split_len", min_split_len),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    wanted = -(-_PROGRAMS_PER_SM * num_sms // (batch * num_kv_heads))  # ceil
    useful = -(-max_context // min_split_len)
    return max(1, min(wanted, useful, MAX_KV_SPLITS))


def allowed_keys(positions: torch.Tensor, num_keys: int, window: int = 0) -> torch.Tensor:
    """(Tq, num_keys) bool: True where the query at ``positions[i]`` may attend key
    position k: k <= p, and p - window < k when ``window`` > 0."""
    keys = torch.arange(num_keys, device=positions.device)[None, :]
    allowed = keys <= positions[:, None]
    if window > 0:
        allowed &= keys > positions[:, None] - window
    return allowed


def cap_scores(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """c tanh(scores / c) for ``softcap`` c > 0; the scores as they are for 0."""
    if softcap <= 0:
        return scores
    return torch.tanh(scores / softcap) * softcap


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    allowed: torch.Tensor | None,
    softcap: float = 0.0,
) -> torch.Tensor:
    """(Tq, H, D) queries over (S, Hkv, D) keys/values -> (Tq, H, D) float32.

    allowed: (Tq, S) bool, True where the query may attend the key; None: every key.
    """
    group = q.shape[1] // keys.shape[1]
    keys = keys.float().repeat_interleave(group, dim=1).transpose(0, 1)  # (H, S, D)
    values = values.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = q.float().transpose(0, 1) @ keys.transpose(1, 2) * scale  # (H, Tq, S)
    scores = cap_scores(scores, softcap)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ values).transpose(0, 1)  # (Tq, H, D)


def decode_attention_reference(
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
) -> torch.Tensor:
    """One query token per row over its first ``seq_lens[b]`` pool positions (the
    last ``window`` of them when ``window`` > 0).

    Args:
        q: (B, H, D) queries.
        k_pool, v_pool: (num_slots, Hkv, D) one layer's K/V, Hkv dividing H.
        req_to_token: (R, C) integer slot table.
        rows: (B,) each row's ``req_to_token`` row.
        seq_lens: (B,) positions attended, >= 1 (a row of 0 gets zeros).
        scale: the score scale (usually D ** -0.5).
        out: (B, H, D) of q's dtype to write, or None (allocated).
        num_kv_splits: how the kernel splits the context; no effect on the result.
        window, softcap: the sliding window and the score cap (0: none; see the module).

    Returns:
        ``out``: (B, H, D), q's dtype.

    Raises:
        ValueError: shapes, dtypes or devices do not fit together.
    """
    check_decode_args(q, k_pool, v_pool, req_to_token, rows, seq_lens, out, num_kv_splits)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    for b in range(q.shape[0]):
        slots = req_to_token[rows[b], : seq_lens[b]]
        if slots.numel() == 0:
            out[b] = 0
            continue
        allowed = allowed_keys(seq_lens[b : b + 1] - 1, slots.numel(), window)
        out[b] = _attend(q[b : b + 1], k_pool[slots], v_pool[slots], scale, allowed, softcap)[0]
    return out


def extend_attention_reference(
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
) -> torch.Tensor:
    """Each request's new tokens over its cached prefix and, causally, themselves
    (within ``window`` positions when ``window`` > 0).

    Args:
        q: (T, H, D) new tokens' queries, request after request.
        k, v: (T, Hkv, D) new tokens' K/V.
        k_pool, v_pool: (num_slots, Hkv, D) one layer's K/V, Hkv dividing H.
        req_to_token: (R, C) integer slot table.
        rows: (B,) each request's ``req_to_token`` row.
        prefix_lens: (B,) cached tokens, >= 0, read from the pool.
        extend_lens: (B,) new tokens, >= 1 (0: the request is skipped).
        extend_starts: (B,) flat index in q/k/v of each request's first new token.
        max_extend: the largest ``extend_lens`` (sizes the kernel's grid; a
            request longer than it is cut short by the kernel, not here).
        scale: the score scale.
        out: (T, H, D) of q's dtype to write (rows no request covers are left
            as they are), or None (allocated, zero there).
        window, softcap: the sliding window and the score cap (0: none; see the module).

    Returns:
        ``out``: (T, H, D), q's dtype.

    Raises:
        ValueError: shapes, dtypes or devices do not fit together.
    """
    check_extend_args(
        q, k, v, k_pool, v_pool, req_to_token, rows, prefix_lens, extend_lens, extend_starts, out
    )
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    for b in range(rows.shape[0]):
        n, e, start = int(prefix_lens[b]), int(extend_lens[b]), int(extend_starts[b])
        if e == 0:
            continue
        slots = req_to_token[rows[b], :n]
        new = slice(start, start + e)
        keys = torch.cat((k_pool[slots], k[new]))  # (n + e, Hkv, D)
        values = torch.cat((v_pool[slots], v[new]))
        allowed = allowed_keys(n + torch.arange(e, device=q.device), n + e, window)  # (e, n + e)
        out[new] = _attend(q[new], keys, values, scale, allowed, softcap)
    return out


# ---- argument checks --------------------------------------------------------------------


def check_decode_args(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor | None,
    num_kv_splits: int,
    scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
) -> None:
    """Shapes, dtypes and devices (never values: reading them would sync a GPU).
    scales: a quantized pool's (k_scale, v_scale) (``check_kv_scales``)."""
    if q.dim() != 3:
        raise ValueError(f"expected q of shape (B, H, D), got {tuple(q.shape)}")
    _check_pools(q, k_pool, v_pool, req_to_token, scales)
    _check_per_request(q.shape[0], q.device, rows=rows, seq_lens=seq_lens)
    _check_out(q, out)
    if num_kv_splits < 1:
        raise ValueError(f"expected num_kv_splits >= 1, got {num_kv_splits}")


def check_extend_args(
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
    out: torch.Tensor | None,
    scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
) -> None:
    """Shapes, dtypes and devices (never values: reading them would sync a GPU).
    scales: a quantized pool's (k_scale, v_scale) (``check_kv_scales``)."""
    if q.dim() != 3:
        raise ValueError(f"expected q of shape (T, H, D), got {tuple(q.shape)}")
    _check_pools(q, k_pool, v_pool, req_to_token, scales)
    new_shape = (q.shape[0], *k_pool.shape[1:])
    for name, t in (("k", k), ("v", v)):
        if tuple(t.shape) != new_shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(
                f"expected {name} of shape {new_shape}, {q.dtype} on {q.device}; got "
                f"{tuple(t.shape)}, {t.dtype} on {t.device}"
            )
    _check_per_request(
        rows.shape[0] if rows.dim() == 1 else -1,
        q.device,
        rows=rows,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        extend_starts=extend_starts,
    )
    _check_out(q, out)


# what a quantized pool's codes are (radixlm.runtime.mem_cache.kv_quant)
KV_CODE_DTYPES = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)


def check_kv_scales(
    k_pool: torch.Tensor, v_pool: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor
) -> None:
    """A quantized pool: codes of one of ``KV_CODE_DTYPES`` and (num_slots, Hkv)
    bfloat16 scales beside them on their device. Raises ValueError otherwise."""
    if k_pool.dtype not in KV_CODE_DTYPES or v_pool.dtype != k_pool.dtype:
        raise ValueError(
            f"expected pools of codes ({', '.join(map(str, KV_CODE_DTYPES))}) with scales, "
            f"got {k_pool.dtype} and {v_pool.dtype}"
        )
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if (
            scale.shape != k_pool.shape[:2]
            or scale.dtype != torch.bfloat16
            or scale.device != k_pool.device
        ):
            raise ValueError(
                f"expected {name} of shape {tuple(k_pool.shape[:2])}, bfloat16 on "
                f"{k_pool.device}; got {tuple(scale.shape)}, {scale.dtype} on {scale.device}"
            )


def _check_pools(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_to_token: torch.Tensor,
    scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
) -> None:
    num_heads, head_dim = q.shape[1:]
    k_scale, v_scale = scales
    if k_scale is not None and v_scale is not None:
        check_kv_scales(k_pool, v_pool, k_scale, v_scale)
    if not q.is_floating_point() or not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"expected float q with head dim 1..{MAX_HEAD_DIM}, got {q.dtype} {head_dim}"
        )
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        if pool.dim() != 3 or pool.shape[2] != head_dim:
            raise ValueError(
                f"expected {name} of shape (num_slots, Hkv, {head_dim}), got {tuple(pool.shape)}"
            )
        if (pool.dtype != q.dtype and k_scale is None) or pool.device != q.device:
            raise ValueError(
                f"expected {name} as {q.dtype} on {q.device}, got {pool.dtype} on {pool.device}"
            )
    num_kv_heads = k_pool.shape[1]
    if v_pool.shape != k_pool.shape or num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"expected K/V pools of one shape with Hkv dividing H = {num_heads}, got "
            f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}"
        )
    if req_to_token.dim() != 2 or req_to_token.is_floating_point():
        raise ValueError(f"expected an integer (R, C) req_to_token, got {req_to_token.dtype}")
    if req_to_token.device != q.device:
        raise ValueError(f"expected req_to_token on {q.device}, got {req_to_token.device}")


def _check_per_request(batch: int, device: torch.device, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if tuple(t.shape) != (batch,) or t.is_floating_point() or t.device != device:
            raise ValueError(
                f"expected {name} as an integer tensor of shape ({batch},) on {device}, got "
                f"{t.dtype} {tuple(t.shape)} on {t.device}"
            )


def _check_out(q: torch.Tensor, out: torch.Tensor | None) -> None:
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device):
        raise ValueError(
            f"expected out of shape {tuple(q.shape)}, {q.dtype} on {q.device}; got "
            f"{tuple(out.shape)}, {out.dtype} on {out.device}"
        )
