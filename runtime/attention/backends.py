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
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from radixlm.kernels.cpu.decode_attention import (
    DecodeAttention,
    check_cache,
    decode_attention_op,
    load_decode_attention,
)
from radixlm.kernels.cpu.extend_attention import ExtendAttention, load_extend_attention
from radixlm.kernels.cpu.native import NATIVE, KernelTarget
from radixlm.runtime.mem_cache.kv_pool import PAD_SLOT, KVPool, ReqToTokenTable

__all__ = [
    "AttentionInputs",
    "AttentionBackend",
    "CpuAttentionBackend",
    "KernelStagedDecodeMetadata",
    "StagedDecodeMetadata",
    "TorchAttentionBackend",
    "TorchAttentionMetadata",
]


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
class _PaddedGroup:
    """Requests attended in one padded SDPA call over K/V gathered from the pool.

    token_index: (B, Tq) flat index of each query token (padding repeats a real one).
    kv_slots: (B, S) slots of every key position (padding -> PAD_SLOT).
    mask: (B, 1, Tq, S) True where the query may attend the key; None when every
        query may attend every key (decode rows of one length: no padding).
    valid: (B, Tq) True for real query tokens.
    dest: (N,) flat index of each real query token, in (B, Tq) order; None when
        the group is every token of the pass in flat order (its output is the
        pass's output as is).
    """

    token_index: torch.Tensor
    kv_slots: torch.Tensor
    mask: torch.Tensor | None
    valid: torch.Tensor
    dest: torch.Tensor | None


@dataclass(frozen=True)
class _FreshGroup:
    """One request with no cached prefix: plain causal attention over its new
    tokens (flat range ``tokens``), straight from this pass's k/v: no gather, no mask."""

    tokens: slice


@dataclass(frozen=True)
class _DecodeRows:
    """Decode rows attended by ``CpuAttentionBackend``'s kernel straight from the pool.

    dest: (B,) flat index of each row's token; None when the rows are every
        token of the pass in flat order.
    rows, prefix_lens: (B,) req_to_token row and cached tokens of each row.
    """

    dest: torch.Tensor | None
    rows: torch.Tensor
    prefix_lens: torch.Tensor


@dataclass(frozen=True)
class _ExtendRows:
    """Prefill rows (fresh, or on a cached prefix) attended by ``CpuAttentionBackend``'s
    extend kernel straight from the pool, written into their rows of the output.

    rows, prefix_lens, extend_lens: (B,) req_to_token row, cached and new tokens.
    starts: (B,) flat index of each request's first new token.
    whole: the requests' tokens are every token of the pass.
    """

    rows: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    starts: torch.Tensor
    whole: bool


_Group = _PaddedGroup | _FreshGroup | _DecodeRows | _ExtendRows


def _is_whole_pass(group: _Group) -> bool:
    """Whether the group's output, in its own order, is the whole pass's output."""
    if isinstance(group, _FreshGroup):
        return True
    if isinstance(group, _ExtendRows):
        return group.whole
    return group.dest is None


@dataclass(frozen=True)
class TorchAttentionMetadata:
    out_cache_loc: torch.Tensor
    groups: tuple[_Group, ...]


@dataclass(frozen=True)
class StagedDecodeMetadata:
    """A pass of decode rows whose attention reads the KV pool but never writes it.

    The new tokens' K/V go to the staging buffers instead, and
    ``TorchAttentionBackend.commit`` stores them in the pool after the pass. A
    compiled decode step needs this: a write into the pool inside a
    ``torch.compile`` graph makes the graph copy the whole pool (gigabytes) on
    every call, while reads and small staging buffers cost nothing extra. Every
    field is a tensor, in pass order, so one compiled graph serves every step.

    out_cache_loc: (B,) slot of each row's new token.
    kv_slots: (B, S) slots of each row's cached prefix (padding -> PAD_SLOT).
    mask: (B, 1, 1, S + 1) True where the row may attend: its prefix, then its
        own new token (the last column).
    new_k, new_v: (L, B, Hkv, D) staging for the new tokens' K/V, every layer.
    """

    out_cache_loc: torch.Tensor
    kv_slots: torch.Tensor
    mask: torch.Tensor
    new_k: torch.Tensor
    new_v: torch.Tensor


@dataclass(frozen=True)
class KernelStagedDecodeMetadata:
    """``StagedDecodeMetadata`` for ``CpuAttentionBackend``: its kernel reads each
    row's slots from ``req_to_token`` itself, so no slot list or mask is built.

    out_cache_loc: (B,) slot of each row's new token.
    rows, prefix_lens: (B,) req_to_token row and cached tokens of each row.
    req_to_token: the table (read, never written, inside the pass).
    new_k, new_v: (L, B, Hkv, D) staging for the new tokens' K/V, every layer.
    """

    out_cache_loc: torch.Tensor
    rows: torch.Tensor
    prefix_lens: torch.Tensor
    req_to_token: torch.Tensor
    new_k: torch.Tensor
    new_v: torch.Tensor


class TorchAttentionBackend:
    """Reference backend: gathers K/V by slot and calls torch SDPA (CPU or GPU).

    Grouping, decided once per pass in ``prepare``:
      - each fresh prefill (no cached prefix) attends causally over its own k/v;
      - decode rows, and extend rows on a cached prefix, are sorted by length and
        padded in groups of at most ``max_group_rows``, so a short request is
        never padded to the longest one in a big batch (on CPU the K/V gather is
        most of a decode step's attention cost, and padding is gathered too).
    """

    max_group_rows = 16
    pads_staged_rows = True  # prepare_staged_decode pads every row to the longest

    def __init__(self, kv_pool: KVPool, req_to_token: ReqToTokenTable, scale: float) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.scale = scale
        # CPU SDPA in bf16/fp16 is ~1.6x slower than in float32 (1,000 tokens, 9
        # heads: 12.6 vs 7.7 ms per layer), so fresh prefills attend in float32 and
        # round once (a 1,000-token bf16 prefill: 1.35 vs 1.43 s). Decode rows stay
        # in the pool dtype: there the conversions cost what the faster SDPA saves.
        self._layer_index = torch.arange(kv_pool.k.shape[0], device=kv_pool.k.device)[:, None]
        pool_dtype = kv_pool.k.dtype
        self._prefill_dtype = (
            torch.float32
            if kv_pool.k.device.type == "cpu" and pool_dtype in (torch.bfloat16, torch.float16)
            else pool_dtype
        )

    def prepare(self, inputs: AttentionInputs) -> TorchAttentionMetadata:
        starts = torch.cumsum(inputs.extend_lens, 0) - inputs.extend_lens
        is_decode = inputs.extend_lens == 1
        groups: list[_Group] = []
        decode = is_decode.nonzero().flatten()
        if decode.numel():
            groups += self._decode_groups(inputs, starts, decode)
        prefill = (~is_decode).nonzero().flatten()
        if prefill.numel():
            groups += self._prefill_groups(inputs, starts, prefill)
        return TorchAttentionMetadata(inputs.out_cache_loc, tuple(groups))

    def _prefill_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[_Group]:
        """The groups attending prefill rows ``idx`` (more than one new token each)."""
        is_fresh = inputs.prefix_lens[idx] == 0
        fresh, extend = idx[is_fresh], idx[~is_fresh]
        groups: list[_Group] = [
            _FreshGroup(slice(start, start + n))
            for start, n in zip(starts[fresh].tolist(), inputs.extend_lens[fresh].tolist())
        ]
        if extend.numel():
            groups += self._padded_groups(inputs, starts, extend)
        return groups

    def _decode_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[_Group]:
        """The groups attending decode rows ``idx``."""
        return self._padded_groups(inputs, starts, idx)

    def _padded_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[_Group]:
        seq_lens = inputs.prefix_lens[idx] + inputs.extend_lens[idx]
        by_length = idx[torch.argsort(seq_lens, stable=True)]
        return [
            self._padded_group(inputs, starts, chunk)
            for chunk in by_length.split(self.max_group_rows)
        ]

    def prepare_staged_decode(self, inputs: AttentionInputs) -> StagedDecodeMetadata:
        """Metadata for a pass of decode rows only (``extend_lens`` all 1) that
        leaves the pool untouched until ``commit``."""
        new_k, new_v = self._staging(inputs)
        prefix = inputs.prefix_lens  # (B,)
        kv_slots, cached = self._slots(inputs.rows, prefix, int(prefix.max()))  # (B, S) each
        mask = torch.cat((cached, cached.new_ones(cached.shape[0], 1)), dim=1)[:, None, None]
        return StagedDecodeMetadata(inputs.out_cache_loc, kv_slots, mask, new_k, new_v)

    def _staging(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, B, Hkv, D) buffers for a staged pass's new K and V; checks the pass."""
        if not bool((inputs.extend_lens == 1).all()):
            raise ValueError("a staged decode pass takes decode rows only (extend_lens == 1)")
        pool = self.kv_pool.k
        shape = (pool.shape[0], inputs.rows.numel(), *pool.shape[2:])
        return (
            torch.empty(shape, dtype=pool.dtype, device=pool.device),
            torch.empty(shape, dtype=pool.dtype, device=pool.device),
        )

    def commit(self, metadata: object) -> None:
        """Stores a staged pass's new K/V in the pool; other metadata has nothing to store."""
        if not isinstance(metadata, StagedDecodeMetadata | KernelStagedDecodeMetadata):
            return
        index = (self._layer_index, metadata.out_cache_loc[None, :])  # (L, 1) x (1, B) -> (L, B)
        self.kv_pool.k.index_put_(index, metadata.new_k)
        self.kv_pool.v.index_put_(index, metadata.new_v)

    def _slots(
        self, rows: torch.Tensor, lens: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``lens[i]`` slots of each row, padded with PAD_SLOT to ``width``.

        Returns (slots, valid), both (B, width).
        """
        valid = torch.arange(width)[None, :] < lens[:, None]
        return torch.where(valid, self.req_to_token.table[rows, :width], PAD_SLOT), valid

    def _padded_group(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> _PaddedGroup:
        prefix = inputs.prefix_lens[idx]  # (B,)
        extend = inputs.extend_lens[idx]
        seq = prefix + extend
        max_q, max_s = int(extend.max()), int(seq.max())
        q_pos = torch.arange(max_q)
        valid = q_pos[None, :] < extend[:, None]  # (B, Tq)
        token_index = starts[idx][:, None] + torch.minimum(q_pos[None, :], extend[:, None] - 1)
        k_pos = torch.arange(max_s)
        kv_slots, _ = self._slots(inputs.rows[idx], seq, max_s)
        mask = None  # decode rows of one length: every query sees every key
        if max_q > 1 or bool((seq < max_s).any()):
            # Query t of request i sits at position prefix[i] + t.
            q_abs = prefix[:, None] + q_pos[None, :]  # (B, Tq)
            mask = (k_pos[None, None, :] <= q_abs[:, :, None])[:, None]  # (B, 1, Tq, S), k < seq
        dest = token_index[valid]  # boolean indexing once per pass, not once per layer
        if dest.numel() == inputs.out_cache_loc.numel() and torch.equal(
            dest, torch.arange(dest.numel())
        ):
            dest = None
        return _PaddedGroup(token_index, kv_slots, mask, valid, dest)

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: TorchAttentionMetadata | StagedDecodeMetadata,
    ) -> torch.Tensor:
        if isinstance(metadata, StagedDecodeMetadata):
            return self._staged_decode(layer, q, k, v, metadata)
        self.kv_pool.write(layer, metadata.out_cache_loc, k, v)
        groups = metadata.groups
        if len(groups) == 1 and _is_whole_pass(groups[0]):
            return self._attend(layer, q, k, v, groups[0])  # the group is the pass: no scatter
        out = q.new_empty(q.shape)
        for group in groups:
            self._attend_into(out, layer, q, k, v, group)
        return out

    def _attend_into(
        self,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        group: _Group,
    ) -> None:
        """Writes the group's attention output into its tokens' rows of ``out``."""
        result = self._attend(layer, q, k, v, group)
        if isinstance(group, _FreshGroup):
            out[group.tokens] = result
        elif isinstance(group, _PaddedGroup | _DecodeRows):
            out.index_copy_(0, group.dest, result)
        else:
            raise TypeError(f"{type(self).__name__} does not attend {type(group).__name__}")

    def _attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: _Group
    ) -> torch.Tensor:
        """Attention output of the group's query tokens, in the group's order."""
        if isinstance(group, _FreshGroup):
            t = group.tokens
            return self._causal(q[t], k[t], v[t])
        if isinstance(group, _PaddedGroup):
            return self._attend_group(layer, q, group)
        raise TypeError(f"{type(self).__name__} does not attend {type(group).__name__}")

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # SDPA's enable_gqa, not K/V heads repeated up front: a whole 1,000-token
        # prefill of the default model, alternating runs in one process, took
        # 1,235 vs 1,243 ms in float32 and 1,349 vs 1,415 ms in bfloat16.
        out_dtype, dtype = q.dtype, self._prefill_dtype
        q, k, v = (x.to(dtype).transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # (1, H, T, D)
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=True
        )
        return out[0].transpose(0, 1).to(out_dtype)

    @staticmethod
    def _gather(cache: torch.Tensor, kv_slots: torch.Tensor) -> torch.Tensor:
        # index_select on the flat slot list copies whole rows: ~3x faster than
        # advanced indexing with a 2-D index on CPU.
        rows = cache.index_select(0, kv_slots.flatten())  # (B * S, Hkv, D)
        return rows.view(*kv_slots.shape, *cache.shape[1:]).transpose(1, 2)

    def _staged_decode(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: StagedDecodeMetadata,
    ) -> torch.Tensor:
        metadata.new_k[layer].copy_(k)
        metadata.new_v[layer].copy_(v)
        # The cached prefix from the pool, then the new token: (B, Hkv, S + 1, D).
        kg = torch.cat((self._gather(self.kv_pool.k[layer], metadata.kv_slots), k[:, :, None]), 2)
        vg = torch.cat((self._gather(self.kv_pool.v[layer], metadata.kv_slots), v[:, :, None]), 2)
        out = F.scaled_dot_product_attention(
            q[:, :, None], kg, vg, attn_mask=metadata.mask, scale=self.scale, enable_gqa=True
        )  # (B, H, 1, D)
        return out[:, :, 0]  # (B, H, D)

    def _attend_group(self, layer: int, q: torch.Tensor, group: _PaddedGroup) -> torch.Tensor:
        if group.dest is None and group.token_index.shape[1] == 1:
            qg = q[:, None].transpose(1, 2)  # decode rows in pass order: (B, H, 1, D), a view
        else:
            qg = q[group.token_index].transpose(1, 2)  # (B, H, Tq, D)
        kg = self._gather(self.kv_pool.k[layer], group.kv_slots)  # (B, Hkv, S, D)
        vg = self._gather(self.kv_pool.v[layer], group.kv_slots)
        out = F.scaled_dot_product_attention(
            qg, kg, vg, attn_mask=group.mask, scale=self.scale, enable_gqa=True
        ).transpose(1, 2)  # (B, Tq, H, D)
        if out.shape[1] == 1:  # decode rows: every query is real
            return out.flatten(0, 1)
        return out[group.valid]  # (num valid tokens, H, D)


class CpuAttentionBackend(TorchAttentionBackend):
    """The torch backend with every row attended by radixlm's C++ kernels, which
    read each request's K/V slots in place instead of gathering them out of the
    pool:

    - decode rows by the decode kernel (``radixlm.kernels.cpu.decode_attention``): a
      decode pass of 64 rows of 20-528 cached tokens over the default model's 30
      layers takes 57.5 ms against 304.1 ms in float32, 39.0 against 107.3 ms in
      bfloat16;
    - prefill rows, fresh or on a cached prefix, by the extend kernel
      (``radixlm.kernels.cpu.extend_attention``), all in one call per layer, written
      straight into their rows of the output (figures in benchmarks/README.md).
    """

    pads_staged_rows = False

    def __init__(
        self,
        kv_pool: KVPool,
        req_to_token: ReqToTokenTable,
        scale: float,
        kernel: DecodeAttention,
        extend_kernel: ExtendAttention | None,
    ) -> None:
        """extend_kernel: None attends prefill rows as the torch backend does (SDPA)."""
        super().__init__(kv_pool, req_to_token, scale)
        check_cache(kv_pool.k, kv_pool.v, req_to_token.table)  # once: forward skips the checks
        self.kernel = kernel
        self.extend_kernel = extend_kernel

    @classmethod
    def load(
        cls,
        kv_pool: KVPool,
        req_to_token: ReqToTokenTable,
        scale: float,
        build_dir: Path,
        target: KernelTarget = NATIVE,
        extend: bool = True,
    ) -> CpuAttentionBackend:
        """The backend with its kernels built for ``target``, into ``build_dir``
        the first time: the decode kernel, and the extend kernel unless ``extend``
        is False (prefill rows then attend through SDPA).

        Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
        """
        extend_kernel = load_extend_attention(build_dir, target) if extend else None
        return cls(
            kv_pool, req_to_token, scale, load_decode_attention(build_dir, target), extend_kernel
        )

    def _prefill_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[_Group]:
        if self.extend_kernel is None:
            return super()._prefill_groups(inputs, starts, idx)
        whole = idx.numel() == inputs.rows.numel()
        return [
            _ExtendRows(
                inputs.rows[idx],
                inputs.prefix_lens[idx],
                inputs.extend_lens[idx],
                starts[idx],
                whole,
            )
        ]

    def _decode_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[_Group]:
        dest = starts[idx]  # a decode row's one token sits at its start
        if dest.numel() == inputs.out_cache_loc.numel():  # every token: the pass in order
            dest = None
        return [_DecodeRows(dest, inputs.rows[idx], inputs.prefix_lens[idx])]

    def prepare_staged_decode(self, inputs: AttentionInputs) -> KernelStagedDecodeMetadata:
        """Metadata for a pass of decode rows only that leaves the pool untouched
        until ``commit``; the kernel reads the slots from ``req_to_token`` itself."""
        new_k, new_v = self._staging(inputs)
        return KernelStagedDecodeMetadata(
            inputs.out_cache_loc,
            inputs.rows,
            inputs.prefix_lens,
            self.req_to_token.table,
            new_k,
            new_v,
        )

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: TorchAttentionMetadata | StagedDecodeMetadata | KernelStagedDecodeMetadata,
    ) -> torch.Tensor:
        if not isinstance(metadata, KernelStagedDecodeMetadata):
            return super().forward(layer, q, k, v, metadata)
        metadata.new_k[layer].copy_(k)
        metadata.new_v[layer].copy_(v)
        return decode_attention_op(
            q,
            self.kv_pool.k[layer],
            self.kv_pool.v[layer],
            metadata.req_to_token,
            metadata.rows,
            metadata.prefix_lens,
            k,
            v,
            self.scale,
        )

    def _attend_into(
        self,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        group: _Group,
    ) -> None:
        if not isinstance(group, _ExtendRows):
            super()._attend_into(out, layer, q, k, v, group)
            return
        # The new tokens' K/V are in the pool already (forward wrote them), so
        # the kernel reads every key of a request from its slots.
        self.extend_kernel.launch(
            q,
            self.kv_pool.k[layer],
            self.kv_pool.v[layer],
            self.req_to_token.table,
            group.rows,
            group.prefix_lens,
            group.extend_lens,
            group.starts,
            self.scale,
            out,
        )

    def _attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: _Group
    ) -> torch.Tensor:
        if isinstance(group, _ExtendRows):  # the whole pass
            out = q.new_empty(q.shape)
            self._attend_into(out, layer, q, k, v, group)
            return out
        if not isinstance(group, _DecodeRows):
            return super()._attend(layer, q, k, v, group)
        if group.dest is not None:
            q, k, v = (x.index_select(0, group.dest) for x in (q, k, v))
        # The model's q/k/v: the pool's dtype, row-strided slices of the fused QKV
        # projection (or index_select copies); rows and prefix_lens: made by prepare.
        return self.kernel.launch(
            q,
            self.kv_pool.k[layer],
            self.kv_pool.v[layer],
            self.req_to_token.table,
            group.rows,
            group.prefix_lens,
            k,
            v,
            self.scale,
        )
