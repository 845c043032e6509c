"""Attention over the KV pool, behind a small backend interface.

The model runner describes a forward pass once (``AttentionInputs``); the
backend turns that into its own metadata once per pass (``prepare``), and every
layer then calls ``forward`` with that metadata. Requests in a pass are either
*decode* rows (one new token) or *extend* rows (a prefill chunk, possibly on
top of a cached prefix)::

    request i:   [ prefix_lens[i] cached tokens | extend_lens[i] new tokens ]
                  slots: req_to_token[rows[i], 0 : prefix_lens[i] + extend_lens[i]]
    flat tokens: request 0's new tokens, request 1's new tokens, ...  (T total)

New token t of request i sits at position prefix_lens[i] + t and attends to
positions 0 .. prefix_lens[i] + t (causal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from radixlm.runtime.kv_pool import PAD_SLOT, KVPool, ReqToTokenTable

__all__ = ["AttentionInputs", "AttentionBackend", "TorchAttentionBackend", "TorchAttentionMetadata"]


@dataclass(frozen=True)
class AttentionInputs:
    """Backend-agnostic description of one forward pass (CPU int64 tensors).

    rows: (B,) req_to_token row of each request.
    prefix_lens: (B,) tokens already in the KV pool before this pass.
    extend_lens: (B,) new tokens this pass (1 for a decode row).
    out_cache_loc: (T,) slot for each new token, T = extend_lens.sum().
    """

    rows: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    out_cache_loc: torch.Tensor


class AttentionBackend(Protocol):
    def prepare(self, inputs: AttentionInputs) -> object:
        """Builds the per-pass metadata every layer's ``forward`` reads."""
        ...

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: object
    ) -> torch.Tensor:
        """Stores k/v of the new tokens and attends. q: (T, H, D), k/v: (T, Hkv, D).

        Returns (T, H, D).
        """
        ...


@dataclass(frozen=True)
class _Group:
    """Requests attended in one padded SDPA call.

    token_index: (B, Tq) flat index of each query token (padding repeats a real one).
    kv_slots: (B, S) slots of every key position (padding -> PAD_SLOT).
    mask: (B, 1, Tq, S) True where the query may attend the key.
    valid: (B, Tq) True for real query tokens.
    fresh: set when the group is one request with no cached prefix: its flat
        token range, attended with plain causal attention (no gather, no mask).
    """

    token_index: torch.Tensor
    kv_slots: torch.Tensor
    mask: torch.Tensor
    valid: torch.Tensor
    fresh: slice | None


@dataclass(frozen=True)
class TorchAttentionMetadata:
    out_cache_loc: torch.Tensor
    groups: tuple[_Group, ...]


class TorchAttentionBackend:
    """Reference backend: gathers K/V by slot and calls torch SDPA (CPU or GPU).

    Decode rows form one group and extend rows another, so a step costs two
    SDPA calls per layer at most, whatever the batch size.
    """

    def __init__(self, kv_pool: KVPool, req_to_token: ReqToTokenTable, scale: float) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.scale = scale

    def prepare(self, inputs: AttentionInputs) -> TorchAttentionMetadata:
        starts = torch.cumsum(inputs.extend_lens, 0) - inputs.extend_lens
        is_decode = inputs.extend_lens == 1
        groups = []
        for selected in (is_decode, ~is_decode):
            idx = selected.nonzero().flatten()
            if idx.numel():
                groups.append(self._build_group(inputs, starts, idx))
        return TorchAttentionMetadata(inputs.out_cache_loc, tuple(groups))

    def _build_group(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> _Group:
        prefix = inputs.prefix_lens[idx]  # (B,)
        extend = inputs.extend_lens[idx]
        seq = prefix + extend
        max_q, max_s = int(extend.max()), int(seq.max())
        q_pos = torch.arange(max_q)
        valid = q_pos[None, :] < extend[:, None]  # (B, Tq)
        token_index = starts[idx][:, None] + torch.minimum(q_pos[None, :], extend[:, None] - 1)
        k_pos = torch.arange(max_s)
        kv_slots = self.req_to_token.table[inputs.rows[idx], :max_s]
        kv_slots = torch.where(k_pos[None, :] < seq[:, None], kv_slots, PAD_SLOT)
        # Query t of request i sits at position prefix[i] + t.
        q_abs = prefix[:, None] + q_pos[None, :]  # (B, Tq)
        mask = k_pos[None, None, :] <= q_abs[:, :, None]  # (B, Tq, S); implies k < seq
        fresh = None
        if idx.numel() == 1 and int(prefix[0]) == 0 and max_q > 1:
            start = int(starts[idx[0]])
            fresh = slice(start, start + max_q)
        return _Group(token_index, kv_slots, mask[:, None], valid, fresh)

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: TorchAttentionMetadata,
    ) -> torch.Tensor:
        self.kv_pool.write(layer, metadata.out_cache_loc, k, v)
        groups = metadata.groups
        if len(groups) == 1 and groups[0].fresh is not None:
            return self._causal(q, k, v)
        out = torch.empty_like(q)
        for group in groups:
            if group.fresh is not None:
                s = group.fresh
                out[s] = self._causal(q[s], k[s], v[s])
            else:
                out[group.token_index[group.valid]] = self._attend_group(layer, q, group)
        return out

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # (T, H, D) -> (1, H, T, D)
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=True
        )
        return out[0].transpose(0, 1)

    @staticmethod
    def _gather(cache: torch.Tensor, kv_slots: torch.Tensor) -> torch.Tensor:
        # index_select on the flat slot list copies whole rows: ~3x faster than
        # advanced indexing with a 2-D index on CPU.
        rows = cache.index_select(0, kv_slots.flatten())  # (B * S, Hkv, D)
        return rows.view(*kv_slots.shape, *cache.shape[1:]).transpose(1, 2)

    def _attend_group(self, layer: int, q: torch.Tensor, group: _Group) -> torch.Tensor:
        qg = q[group.token_index].transpose(1, 2)  # (B, H, Tq, D)
        kg = self._gather(self.kv_pool.k[layer], group.kv_slots)  # (B, Hkv, S, D)
        vg = self._gather(self.kv_pool.v[layer], group.kv_slots)
        out = F.scaled_dot_product_attention(
            qg, kg, vg, attn_mask=group.mask, scale=self.scale, enable_gqa=True
        )
        return out.transpose(1, 2)[group.valid]  # (num valid tokens, H, D)
