"""Rotary embedding of q and k fused with storing k and v in the paged KV pool: the
plain-torch reference (this module imports only torch; the Triton kernel is
``radixlm.kernels.triton.rope_kv``).

Rotation: neox style (``rotate_half``) over each head's leading R rotary dims; the
dims past R pass through (partial rotary)::

    x = [x1 | x2 | rest]  (x1, x2: R/2 dims each)
      -> [x1 cos - x2 sin | x2 cos + x1 sin | rest]       cos, sin: (T, R/2)

Any rope scaling (linear, NTK, llama3, yarn, longrope, attention factors) is in the
cos/sin tables already, looked up by position. Per token t of the pass::

    q[t]              rotated in place                      (T, H, D)
    k[t]              rotated in place (extend attention reads it)  (T, Hkv, D)
    k_pool[slots[t]]  = k[t] rotated;  v_pool[slots[t]] = v[t]       (S, Hkv, D)
"""

from __future__ import annotations

import torch

__all__ = ["check_rope_kv_args", "rotate_and_store_reference", "rotate_in_place"]


def check_rope_kv_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    codes: bool = False,
) -> None:
    """Raises ValueError unless the shapes above fit together on one device, with
    contiguous last dims, an even R <= D, and one dtype for q, k, v and the pools
    (``codes``: for q, k and v; the pools hold a quantized pool's codes)."""
    tokens, _, head_dim = q.shape
    kv_shape = (tokens, k_pool.shape[1], head_dim)
    if k.shape != kv_shape or v.shape != kv_shape:
        raise ValueError(
            f"k and v must be {kv_shape} (the pool's kv heads), got {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if k_pool.shape != v_pool.shape or k_pool.shape[2] != head_dim:
        raise ValueError(
            f"the pools must be (S, Hkv, {head_dim}) alike, got {tuple(k_pool.shape)}, "
            f"{tuple(v_pool.shape)}"
        )
    half = cos.shape[-1]
    if cos.shape != (tokens, half) or sin.shape != cos.shape or not 0 < 2 * half <= head_dim:
        raise ValueError(
            f"cos and sin must be ({tokens}, R/2) with R <= {head_dim}, got "
            f"{tuple(cos.shape)}, {tuple(sin.shape)}"
        )
    if slots.shape != (tokens,) or slots.dtype != torch.int64:
        raise ValueError(f"slots must be ({tokens},) int64, got {tuple(slots.shape)} {slots.dtype}")
    tensors = (q, k, v, cos, sin, k_pool, v_pool, slots)
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"expected one device, got {[str(t.device) for t in tensors]}")
    if len({t.dtype for t in (q, k, v, *(() if codes else (k_pool, v_pool)))}) != 1:
        raise ValueError("q, k, v and the pools must share one dtype")
    if any(t.numel() and t.stride(-1) != 1 for t in tensors[:-1]):
        raise ValueError("q, k, v, cos, sin and the pools need contiguous last dims")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(T, heads, D) rotated over its leading 2 cos.shape[-1] dims, in float32."""
    half = cos.shape[-1]
    x = x.float()
    c, s = cos.float()[:, None], sin.float()[:, None]  # (T, 1, R/2)
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1)


def rotate_in_place(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """q and k rotated in place as ``rotate_and_store_reference`` rotates them, nothing
    stored (for a pool the caller writes itself: a quantized one)."""
    q.copy_(_rotate(q, cos, sin))
    k.copy_(_rotate(k, cos, sin))


def rotate_and_store_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """See the module docstring: q and k rotated in place (float32 inside, rounded once
    to their dtype), then k and v stored at ``slots``."""
    check_rope_kv_args(q, k, v, cos, sin, k_pool, v_pool, slots)
    rotate_in_place(q, k, cos, sin)
    k_pool.index_copy_(0, slots, k)
    v_pool.index_copy_(0, slots, v)
