"""KIVI: a KV cache of 4- or 2-bit codes, keys quantized per channel over groups of
positions, values per token over groups of channels, the newest positions kept in
float (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache").

A value is ``code * scale + minimum`` (asymmetric: the codes 0 .. 2^b - 1 span a
group's range), computed in float32 from float16 parameters, rounded once to the
model's dtype. Per layer, with b bits, head dim D, G = ``KiviLayout.group`` positions
per key group and value channel groups of ``KiviLayout.value_group``::

    k[layer], v[layer]   (slots, Hkv, D*b/8) uint8    the codes, packed: code d in byte
                                                      d // (8/b), bits (d % (8/b)) * b
    meta[layer]          (slots, Hkv, M) float16     M = c + 2 nv,  c = 2D / G,
                                                      nv = D / value_group
        [0, c)           this slot's share of its key group's parameters: positions
                         gG .. gG+G-1 of a sequence share, per channel, a scale and a
                         minimum, P = [scales (D), minimums (D)]; the slot of position
                         gG + j holds P[j*c : (j+1)*c]
        [c, c + nv)      the token's value scales, one per channel group
        [c + nv, M)      its value minimums
    window_k[layer], window_v[layer]   (rows, G, Hkv, D) model dtype

Keys are quantized a whole group at a time, once its G positions are written; until
then a sequence's positions past its last whole group live in float in its
req_to_token row's window, at ``window[row, p % G]``. So for a sequence of n tokens
(this pass's included), positions below ``n // G * G`` are read from the codes and
the rest from the window. A group's parameters are spread over its own slots, so they
live and die with them: the radix cache keeps whole groups (its page is G, see
``RadixCache(page_size=)``) and a group is read whole from one sequence's slots.

``KiviWrites`` stores a pass's new K/V (one plan per pass, applied in every layer),
``gather`` reads K/V by position: the reference every backend's reading equals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.runtime.mem_cache.kv_pool import KVPool

__all__ = [
    "KIVI_GROUP",
    "KiviLayout",
    "KiviWrites",
    "dequantize_keys",
    "dequantize_values",
    "gather",
    "pack",
    "quantize_keys",
    "quantize_values",
    "unpack",
]

KIVI_GROUP = 32  # positions per key group, channels per value group (KIVI's 32)
# KIVI's own; bfloat16's 8 bits would move a minimum by a third of a 4-bit step
_PARAM_DTYPE = torch.float16
_PARAM_MAX = float(torch.finfo(_PARAM_DTYPE).max)


@dataclass(frozen=True)
class KiviLayout:
    """bits: per code (4 or 2); group: key positions per group; value_group: value
    channels per group."""

    bits: int
    group: int = KIVI_GROUP
    value_group: int = KIVI_GROUP

    @property
    def codes_per_byte(self) -> int:
        return 8 // self.bits

    @property
    def max_code(self) -> int:
        return (1 << self.bits) - 1

    def packed_dim(self, head_dim: int) -> int:
        return head_dim // self.codes_per_byte

    def key_chunk(self, head_dim: int) -> int:
        """c: how many of its key group's 2D parameters one slot holds."""
        return 2 * head_dim // self.group

    def value_groups(self, head_dim: int) -> int:
        return head_dim // self.value_group

    def meta_dim(self, head_dim: int) -> int:
        return self.key_chunk(head_dim) + 2 * self.value_groups(head_dim)

    def unsupported(self, head_dim: int) -> str | None:
        """Why heads of ``head_dim`` cannot be stored, or None."""
        if head_dim % self.value_group or (2 * head_dim) % self.group:
            return (
                f"KIVI stores heads whose dim is a multiple of {self.value_group} "
                f"(value groups) and of {self.group // 2} (key groups); this model's is {head_dim}"
            )
        return None

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        """K and V codes and the parameters of one token in every layer (the window,
        per running request, is not counted: ``window_bytes``)."""
        per_head = 2 * self.packed_dim(head_dim) + 2 * self.meta_dim(head_dim)
        return num_layers * num_kv_heads * per_head

    def window_bytes(
        self, num_layers: int, rows: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """The float windows of ``rows`` request rows, K and V, every layer."""
        return 2 * num_layers * rows * self.group * num_kv_heads * head_dim * dtype.itemsize


# ---- codes -----------------------------------------------------------------------------


def pack(codes: torch.Tensor, layout: KiviLayout) -> torch.Tensor:
    """codes (..., D) in 0 .. max_code (any integer dtype) -> (..., D * bits / 8) uint8."""
    per = layout.codes_per_byte
    shifts = torch.arange(per, device=codes.device, dtype=torch.uint8) * layout.bits
    grouped = codes.to(torch.uint8).view(*codes.shape[:-1], -1, per)
    return (grouped << shifts).sum(-1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, layout: KiviLayout) -> torch.Tensor:
    """(..., P) uint8 -> (..., P * 8 / bits) uint8 codes."""
    per = layout.codes_per_byte
    shifts = torch.arange(per, device=packed.device, dtype=torch.uint8) * layout.bits
    codes = (packed[..., None] >> shifts) & layout.max_code
    return codes.flatten(-2)


def _params(
    lo: torch.Tensor, hi: torch.Tensor, layout: KiviLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, minimum) of ranges [lo, hi], rounded to float16 (what is stored)."""
    scale = ((hi - lo) / layout.max_code).clamp_(max=_PARAM_MAX).to(_PARAM_DTYPE)
    minimum = lo.clamp(-_PARAM_MAX, _PARAM_MAX).to(_PARAM_DTYPE)
    return scale, minimum


def _codes(
    x: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, layout: KiviLayout
) -> torch.Tensor:
    """Codes of float32 ``x`` under the stored (broadcast) parameters."""
    s, m = scale.float(), minimum.float()
    safe = torch.where(s > 0, s, torch.ones_like(s))
    codes = torch.round((x - m) / safe).clamp_(0, layout.max_code)
    return torch.where(s > 0, codes, torch.zeros_like(codes)).to(torch.uint8)


def quantize_keys(
    x: torch.Tensor, layout: KiviLayout
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A key group: x (N, G, Hkv, D) float -> (codes (N, G, Hkv, D) uint8, scales and
    minimums (N, Hkv, D) float16), per channel over the group's positions."""
    x = x.float()
    scale, minimum = _params(x.amin(1), x.amax(1), layout)
    return _codes(x, scale[:, None], minimum[:, None], layout), scale, minimum


def dequantize_keys(
    codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """codes (N, G, Hkv, D), scale/minimum (N, Hkv, D) -> (N, G, Hkv, D) in ``dtype``."""
    return (codes.float() * scale.float()[:, None] + minimum.float()[:, None]).to(dtype)


def quantize_values(
    x: torch.Tensor, layout: KiviLayout
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (..., D) float -> (codes (..., D) uint8, scales and minimums (..., D / value_group)
    float16), per token over groups of channels."""
    x = x.float()
    grouped = x.view(*x.shape[:-1], -1, layout.value_group)
    scale, minimum = _params(grouped.amin(-1), grouped.amax(-1), layout)
    codes = _codes(grouped, scale[..., None], minimum[..., None], layout)
    return codes.flatten(-2), scale, minimum


def dequantize_values(
    codes: torch.Tensor,
    scale: torch.Tensor,
    minimum: torch.Tensor,
    layout: KiviLayout,
    dtype: torch.dtype,
) -> torch.Tensor:
    """codes (..., D), scale/minimum (..., nv) -> (..., D) in ``dtype``."""
    grouped = codes.float().view(*codes.shape[:-1], -1, layout.value_group)
    values = grouped * scale.float()[..., None] + minimum.float()[..., None]
    return values.flatten(-2).to(dtype)


# ---- a pass's writes -------------------------------------------------------------------


@dataclass(frozen=True)
class KiviWrites:
    """Where one pass's new K/V go in a KIVI pool, planned once, applied per layer.

    Groups the pass completes (N of them) are quantized into their slots, from their
    positions' floats: the window's (written by earlier passes) or the pass's own new
    tokens'. The pass's tokens past its rows' last whole group go to the windows.

    group_slots: (N, G) each completed group's slots, in position order.
    from_window: (N, G) True where the position's float is in the window.
    window_index: (N, G) its flat window index (row * G + p % G; 0 elsewhere).
    token_index: (N, G) else its flat index among the pass's new tokens (0 elsewhere).
    tail_window, tail_token: (W,) the window entries the pass writes, and from which
        of its new tokens.
    """

    group_slots: torch.Tensor
    from_window: torch.Tensor
    window_index: torch.Tensor
    token_index: torch.Tensor
    tail_window: torch.Tensor
    tail_token: torch.Tensor

    @classmethod
    def plan(
        cls,
        table: torch.Tensor,
        rows: list[int],
        prefix_lens: list[int],
        extend_lens: list[int],
        group: int,
        device: torch.device,
    ) -> KiviWrites:
        """table: req_to_token (this pass's slots written); rows, prefix_lens,
        extend_lens: the pass's requests (host ints)."""
        g_rows, g_pos, g_prefix, g_token = [], [], [], []  # per completed group
        tail_window, tail_token = [], []
        start = 0  # the pass's first new token of the request: its position s
        for row, s, n in zip(rows, prefix_lens, extend_lens):
            e = s + n
            for g in range(s // group, e // group):
                g_rows.append(row)
                g_pos.append(g * group)
                g_prefix.append(s)
                g_token.append(start - s)  # + p: the token index of position p >= s
            for p in range(max(s, e // group * group), e):
                tail_window.append(row * group + p % group)
                tail_token.append(start + p - s)
            start += n
        if g_rows:
            r = torch.tensor(g_rows)[:, None]
            pos = torch.tensor(g_pos)[:, None] + torch.arange(group)  # (N, G)
            from_window = pos < torch.tensor(g_prefix)[:, None]
            window_index = torch.where(from_window, r * group + pos % group, 0)
            token_index = torch.where(from_window, 0, torch.tensor(g_token)[:, None] + pos)
            slots = table[r.to(table.device), pos.to(table.device)]
        else:
            window_index = token_index = torch.empty(0, group, dtype=torch.int64)
            from_window = window_index.bool()
            slots = window_index.to(table.device)
        return cls(
            slots,
            from_window.to(device),
            window_index.to(device),
            token_index.to(device),
            torch.tensor(tail_window, dtype=torch.int64, device=device),
            torch.tensor(tail_token, dtype=torch.int64, device=device),
        )

    def store(self, pool: KVPool, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes the pass's new k/v (T, Hkv, D) of ``layer``: completed groups as codes,
        the rest to the windows."""
        layout = pool.kivi_layout
        window_k = pool.window_k[layer].view(-1, *k.shape[1:])  # (rows * G, Hkv, D): a view
        window_v = pool.window_v[layer].view(-1, *v.shape[1:])
        if self.group_slots.numel():
            # read the windows before the tail overwrites them
            take = self.from_window[..., None, None]
            kx = torch.where(take, window_k[self.window_index], k[self.token_index])
            vx = torch.where(take, window_v[self.window_index], v[self.token_index])
            k_codes, k_scale, k_min = quantize_keys(kx, layout)  # (N, G, Hkv, D), (N, Hkv, D)
            v_codes, v_scale, v_min = quantize_values(vx, layout)  # (N, G, Hkv, D), (N, G, Hkv, nv)
            n, heads, dim = k_scale.shape
            params = torch.cat((k_scale, k_min), -1)  # (N, Hkv, 2D)
            shares = params.view(n, heads, layout.group, -1).transpose(1, 2)  # (N, G, Hkv, c)
            meta = torch.cat((shares, v_scale, v_min), -1).flatten(0, 1)
            slots = self.group_slots.flatten()
            pool.k[layer].index_copy_(0, slots, pack(k_codes, layout).flatten(0, 1))
            pool.v[layer].index_copy_(0, slots, pack(v_codes, layout).flatten(0, 1))
            pool.meta[layer].index_copy_(0, slots, meta)
        if self.tail_window.numel():
            window_k.index_copy_(0, self.tail_window, k[self.tail_token])
            window_v.index_copy_(0, self.tail_window, v[self.tail_token])


def gather(
    pool: KVPool,
    layer: int,
    kv_slots: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of positions 0 .. S-1 of each request: (B, S, Hkv, D) each, in ``dtype``
    (the model's by default). kv_slots: (B, S) their slots in position order (padding ->
    the padding slot); rows: (B,) req_to_token rows; seq_lens: (B,) tokens stored.
    Positions at or past ``seq_lens`` read whatever their slot or window holds (finite):
    the caller masks them."""
    layout, dtype = pool.kivi_layout, dtype or pool.dtype
    group = layout.group
    b, s = kv_slots.shape
    width = -(-s // group) * group
    if width != s:
        kv_slots = torch.nn.functional.pad(kv_slots, (0, width - s))  # the padding slot, 0
    flat = kv_slots.flatten()
    heads, dim = pool.window_k.shape[3], pool.window_k.shape[4]
    chunk, nv = layout.key_chunk(dim), layout.value_groups(dim)
    meta = pool.meta[layer].index_select(0, flat).view(b, width // group, group, heads, -1)
    params = meta[..., :chunk].transpose(2, 3).reshape(b, width // group, heads, 2 * dim)
    k_codes = unpack(pool.k[layer].index_select(0, flat), layout)
    keys = dequantize_keys(
        k_codes.view(b * width // group, group, heads, dim),
        params[..., :dim].flatten(0, 1),
        params[..., dim:].flatten(0, 1),
        torch.float32,
    ).view(b, width, heads, dim)
    meta = meta.view(b, width, heads, -1)
    v_codes = unpack(pool.v[layer].index_select(0, flat), layout).view(b, width, heads, dim)
    values = dequantize_values(
        v_codes, meta[..., chunk : chunk + nv], meta[..., chunk + nv :], layout, torch.float32
    )
    positions = torch.arange(width, device=flat.device)
    in_window = (positions[None, :] >= (seq_lens // group * group)[:, None])[..., None, None]
    at = positions % group
    window_k = pool.window_k[layer].index_select(0, rows)[:, at].float()  # (B, width, Hkv, D)
    window_v = pool.window_v[layer].index_select(0, rows)[:, at].float()
    keys = torch.where(in_window, window_k, keys)[:, :s].to(dtype)
    values = torch.where(in_window, window_v, values)[:, :s].to(dtype)
    return keys, values
