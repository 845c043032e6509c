"""A KIVI KV pool as the Triton attention kernels read it, codes in place.

The layout is ``radixlm.runtime.mem_cache.kivi``'s (its ``gather`` is the reading these
kernels equal); one layer of it is a ``KiviCache``. For a request of n stored tokens
(the pass's own written first), G positions a key group::

    positions   | 0 .. G-1 | G .. 2G-1 | ... | n//G*G .. n-1 |
    read from   |  codes   |   codes   | ... |  float window |  window[row, p % G]

    key   (p, d) = code * scale[g, d] + min[g, d]      g = p // G: the group's D scales
                   and D minimums, P = [scales, mins], spread over its own slots: P[i]
                   is in the slot of position gG + i // c, at meta[.., i % c], c = 2D/G
    value (p, d) = code * vscale[p, d // VG] + vmin[p, d // VG]   (the slot's own meta)

each in float32 from the float16 parameters, rounded once to q's dtype. Codes are
unpacked in the kernel: code d is bits (d % (8/b)) * b of byte d // (8/b).

The kernels (``kivi_decode_attention``, ``kivi_extend_attention``) read keys a whole
group at a time (BLOCK_N = G, from a multiple of G: ``load_keys_t``, ``load_values``),
so a block's key parameters are one (D,) scale and one (D,) minimum vector, and a block
is all codes or all window (n // G * G is a multiple of G too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixlm.kernels.paged_attention import MAX_HEAD_DIM
from radixlm.kernels.triton.decode_attention import check_last_dims

__all__ = [
    "KiviCache",
    "check_per_request",
    "load_keys_t",
    "load_values",
    "rounded",
    "rounds_by_bits",
]


@dataclass(frozen=True)
class KiviCache:
    """One layer of a KIVI pool (``radixlm.runtime.mem_cache.kivi``).

    k, v: (num_slots, Hkv, D * bits / 8) uint8 packed codes; meta: (num_slots, Hkv,
    2D / group + 2D / value_group) float16 parameters; window_k, window_v: (rows, group,
    Hkv, D) in the model's dtype, each request row's positions past its last whole group.
    """

    k: torch.Tensor
    v: torch.Tensor
    meta: torch.Tensor
    window_k: torch.Tensor
    window_v: torch.Tensor
    bits: int
    group: int
    value_group: int

    @property
    def head_dim(self) -> int:
        return self.window_k.shape[-1]

    def check(self, q: torch.Tensor, req_to_token: torch.Tensor) -> None:
        """Raises ValueError unless the cache fits q (T, H, D) and the table: shapes,
        dtypes, devices (never values)."""
        d, hkv, g = self.head_dim, self.k.shape[1], self.group
        if q.dim() != 3 or not q.is_floating_point() or not 0 < q.shape[2] <= MAX_HEAD_DIM:
            raise ValueError(f"expected float q of shape (T, H, D <= 256), got {tuple(q.shape)}")
        if self.bits not in (2, 4) or g < 16 or g & (g - 1) or (2 * d) % g or d % self.value_group:
            raise ValueError(
                f"expected 2 or 4 bits, a power-of-2 group >= 16 dividing 2D and value "
                f"groups dividing D = {d}; got {self.bits}, {g}, {self.value_group}"
            )
        codes = (self.k.shape[0], hkv, d * self.bits // 8)
        meta = (self.k.shape[0], hkv, 2 * d // g + 2 * d // self.value_group)
        window = (self.window_k.shape[0], g, hkv, d)
        expected = (
            ("k", self.k, codes, torch.uint8),
            ("v", self.v, codes, torch.uint8),
            ("meta", self.meta, meta, torch.float16),
            ("window_k", self.window_k, window, q.dtype),
            ("window_v", self.window_v, window, q.dtype),
        )
        for name, t, shape, dtype in expected:
            if tuple(t.shape) != shape or t.dtype != dtype or t.device != q.device:
                raise ValueError(
                    f"expected {name} of shape {shape}, {dtype} on {q.device}; got "
                    f"{tuple(t.shape)}, {t.dtype} on {t.device}"
                )
        if q.shape[2] != d or hkv == 0 or q.shape[1] % hkv:
            raise ValueError(f"expected q of head dim {d} and heads a multiple of {hkv}")
        if req_to_token.dim() != 2 or req_to_token.is_floating_point():
            raise ValueError(f"expected an integer (R, C) req_to_token, got {req_to_token.dtype}")
        check_last_dims(self.k, self.v, self.meta, self.window_k, self.window_v, req_to_token)

    def strides(self) -> tuple[int, ...]:
        """(codes: slot, head; meta: slot, head; window: row, position, head): k and v
        alike. Raises ValueError when k and v (or the windows) are laid out apart."""
        if self.k.stride() != self.v.stride() or self.window_k.stride() != self.window_v.stride():
            raise ValueError("expected k and v (window_k and window_v) of one layout")
        c, m, w = self.k.stride(), self.meta.stride(), self.window_k.stride()
        return c[0], c[1], m[0], m[1], w[0], w[1], w[2]


def check_per_request(batch: int, q: torch.Tensor, out: torch.Tensor | None, **tensors) -> None:
    """Raises ValueError unless each of ``tensors`` is an integer (batch,) tensor on q's
    device, and ``out`` (if given) is like q with a contiguous last dim."""
    for name, t in tensors.items():
        if tuple(t.shape) != (batch,) or t.is_floating_point() or t.device != q.device:
            raise ValueError(
                f"expected {name} as an integer tensor of shape ({batch},) on {q.device}, "
                f"got {t.dtype} {tuple(t.shape)} on {t.device}"
            )
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device):
        raise ValueError(f"expected out like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)}")
    if out is not None:
        check_last_dims(out)


# ---- reading one group's block ---------------------------------------------------------
#
# Helpers, not written out in each kernel: they are long, and the two kernels read alike.


def rounds_by_bits(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the kernels round float32 to bfloat16 by bits (to nearest even): on a
    CPU, where Triton's interpreter (3.x) casts by truncation (and, asked for rtne,
    misses the carry into the exponent); a GPU's cast rounds to nearest even itself."""
    return dtype == torch.bfloat16 and device.type == "cpu"


@triton.jit
def rounded(x, OUT_DTYPE: tl.constexpr, BY_BITS: tl.constexpr):
    """float32 x rounded to OUT_DTYPE, to nearest even (``rounds_by_bits``)."""
    if BY_BITS:  # the top 16 bits, rounded: the carry may reach the exponent
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        x = bits.to(tl.float32, bitcast=True)
    return x.to(OUT_DTYPE)


@triton.jit
def load_keys_t(
    k_ptr,
    meta_ptr,
    window_ptr,
    table,
    slots,
    n0,
    offs_n,
    n_ok,
    coded,
    offs_d,
    d_ok,
    stride_cs,
    stride_ms,
    stride_wg,
    HEAD_DIM: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """K^T (BLOCK_D, GROUP) of the group at n0 (a multiple of GROUP), in OUT_DTYPE;
    k_ptr, meta_ptr, window_ptr: at the kv head (the window at the request's row)."""
    per: tl.constexpr = 8 // BITS
    chunk: tl.constexpr = 2 * HEAD_DIM // GROUP
    in_codes = n_ok & (offs_n < coded)  # the whole block or none: GROUP divides coded
    ok = in_codes[None, :] & d_ok[:, None]
    packed = tl.load(
        k_ptr + slots[None, :] * stride_cs + (offs_d // per)[:, None], mask=ok, other=0
    )
    codes = (packed.to(tl.int32) >> ((offs_d % per) * BITS)[:, None]) & ((1 << BITS) - 1)
    # the group's parameters: channel d's scale at position n0 + d // chunk, its
    # minimum at n0 + (D + d) // chunk (a vector compare: the interpreter takes no
    # scalar one in a mask)
    scale_at = n0 + offs_d // chunk
    min_at = n0 + (HEAD_DIM + offs_d) // chunk
    param_ok = d_ok & (scale_at < coded)  # the block is coded
    scale_slots = tl.load(table + scale_at, mask=param_ok, other=0).to(tl.int64)
    min_slots = tl.load(table + min_at, mask=param_ok, other=0).to(tl.int64)
    scale = tl.load(meta_ptr + scale_slots * stride_ms + offs_d % chunk, mask=param_ok, other=0.0)
    minimum = tl.load(
        meta_ptr + min_slots * stride_ms + (HEAD_DIM + offs_d) % chunk, mask=param_ok, other=0.0
    )
    kt = codes.to(tl.float32) * scale.to(tl.float32)[:, None] + minimum.to(tl.float32)[:, None]
    in_window = n_ok & (offs_n >= coded)
    w_ptrs = window_ptr + (offs_n % GROUP)[None, :] * stride_wg + offs_d[:, None]
    floats = tl.load(w_ptrs, mask=in_window[None, :] & d_ok[:, None], other=0.0)
    return tl.where(in_window[None, :], floats, rounded(kt, OUT_DTYPE, BY_BITS))


@triton.jit
def load_values(
    v_ptr,
    meta_ptr,
    window_ptr,
    slots,
    offs_n,
    n_ok,
    coded,
    offs_d,
    d_ok,
    stride_cs,
    stride_ms,
    stride_wg,
    HEAD_DIM: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    VALUE_GROUP: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """V (GROUP, BLOCK_D) of the positions offs_n, in OUT_DTYPE (see ``_keys_t``)."""
    per: tl.constexpr = 8 // BITS
    chunk: tl.constexpr = 2 * HEAD_DIM // GROUP
    groups: tl.constexpr = HEAD_DIM // VALUE_GROUP
    in_window = n_ok & (offs_n >= coded)
    ok = (n_ok & (offs_n < coded))[:, None] & d_ok[None, :]
    packed = tl.load(
        v_ptr + slots[:, None] * stride_cs + (offs_d // per)[None, :], mask=ok, other=0
    )
    codes = (packed.to(tl.int32) >> ((offs_d % per) * BITS)[None, :]) & ((1 << BITS) - 1)
    params = meta_ptr + slots[:, None] * stride_ms + chunk + (offs_d // VALUE_GROUP)[None, :]
    scale = tl.load(params, mask=ok, other=0.0).to(tl.float32)
    minimum = tl.load(params + groups, mask=ok, other=0.0).to(tl.float32)
    v = codes.to(tl.float32) * scale + minimum
    w_ptrs = window_ptr + (offs_n % GROUP)[:, None] * stride_wg + offs_d[None, :]
    floats = tl.load(w_ptrs, mask=in_window[:, None] & d_ok[None, :], other=0.0)
    return tl.where(in_window[:, None], floats, rounded(v, OUT_DTYPE, BY_BITS))
