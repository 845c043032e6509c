"""The reference attention backend: K/V gathered from the pool by slot, then torch
SDPA (any device).

A pass is split into *groups* once, in ``prepare``; each group knows how its
tokens attend (``attend``: its output in its own order; ``attend_into``: written
into its tokens' rows of the pass's output), so ``forward`` never asks which
kind of group it holds. The staged (compiled-decode) metadata likewise knows how
it attends and commits.

The pieces other backends compose (the cpu backend groups its decode rows, and
prefill rows without its extend kernel, with these): ``PoolAttention`` (what a
group reads of its backend), ``group_pass``, ``TorchAttentionBackend.prefill_groups``
and ``staging_buffers``.

A quantized pool (``kv_cache_dtype``: int8 or fp8 codes, a scale per token and head)
is read the same way, its gathered codes dequantized to the model's dtype; every
query attends K/V as stored, its own pass's tokens included (written, then read
back), so a prompt's tokens attend what decoding them one by one would, and a
perplexity measures what the format costs. A KIVI pool (``kivi4``/``kivi2``) is
written by the pass's ``KiviWrites`` and read by position (``kivi.gather``: codes
below a sequence's last whole group, its float window past it); every prefill row
then reads its keys from the pool too (a padded group).

Sliding windows and the soft-cap (``AttentionScoring``) enter per layer. A
window is one more mask, built in ``prepare`` once per distinct window (not per
layer) and only where it hides a key: a prompt no longer than the window still
attends with ``is_causal``, decode rows of one length shorter than it without a
mask. Soft-capped scores c tanh(s / c) cannot go through SDPA, so a capped
layer attends explicitly in float32 (``_capped_attention``: matmul, cap, mask,
softmax, matmul, grouped heads without copies).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F

from radixlm.runtime.attention.base import (
    PLAIN_SCORING,
    AttentionInputs,
    AttentionScoring,
    BackendContext,
    BackendEntry,
)
from radixlm.runtime.mem_cache import kivi
from radixlm.runtime.mem_cache.kivi import KiviWrites
from radixlm.runtime.mem_cache.kv_pool import PAD_SLOT, KVPool, ReqToTokenTable
from radixlm.runtime.mem_cache.kv_quant import dequantize, quantize

__all__ = [
    "TORCH_ENTRY",
    "AttentionGroup",
    "GroupRows",
    "PoolAttention",
    "ScatteredRows",
    "StagedDecodeMetadata",
    "TorchAttentionBackend",
    "TorchAttentionMetadata",
    "TorchPassMetadata",
    "WrittenRows",
    "as_stored",
    "group_pass",
    "kivi_writes",
    "refuse_staged_kivi",
    "staging_buffers",
]


class PoolAttention(Protocol):
    """What a pass's groups and metadata read of the backend that attends them
    (every backend has these): the pool, its slot table, the softmax scale, and
    each layer's window and the soft-cap."""

    kv_pool: KVPool
    req_to_token: ReqToTokenTable
    scale: float
    scoring: AttentionScoring


class AttentionGroup(Protocol):
    """Some requests of a pass, attended together.

    whole: the group's output, in its own order, is the whole pass's output (when
        it is the pass's only group, ``forward`` returns it with no scatter).
    """

    @property
    def whole(self) -> bool: ...

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        """Attention output of the group's query tokens, in the group's order."""
        ...

    def attend_into(
        self,
        backend: PoolAttention,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Writes the group's attention output into its tokens' rows of ``out``."""
        ...


# Float32 scores a soft-capped group computes at once: longer prompts attend a
# block of query rows at a time (64 MiB of scores, not gigabytes).
_CAPPED_SCORES = 1 << 24


class ScatteredRows:
    """A group whose ``attend`` gives its tokens' outputs in its own order and whose
    ``dest`` (their flat indices in the pass; set when the group is not the whole pass)
    places them: ``attend_into`` is one ``index_copy_``."""

    dest: torch.Tensor | None

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        raise NotImplementedError

    def attend_into(
        self,
        backend: PoolAttention,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        assert self.dest is not None  # a group that is the whole pass returns as is
        out.index_copy_(0, self.dest, self.attend(backend, layer, q, k, v))


class WrittenRows:
    """A group that writes its tokens' outputs into the pass's output itself
    (``attend_into``): ``attend`` gives a whole pass's output."""

    def attend_into(
        self,
        backend: PoolAttention,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        raise NotImplementedError

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        out = q.new_empty(q.shape)  # the whole pass
        self.attend_into(backend, out, layer, q, k, v)
        return out


def _capped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """softmax(mask(c tanh(scale q k^T / c))) v in float32, rounded to q's dtype once.

    q: (B, H, Tq, D); k, v: (B, Hkv, S, D), query head h reading KV head h // G
    (a view of q's heads in groups, not K/V repeated); mask: (B or 1, 1, Tq, S)
    bool, True where the query may attend the key, or None (every key).
    Returns (B, H, Tq, D).
    """
    b, h, tq, d = q.shape
    hkv = k.shape[1]
    qg = q.float().reshape(b, hkv, h // hkv, tq, d)  # (B, Hkv, G, Tq, D)
    scores = qg @ k.float()[:, :, None].transpose(-1, -2) * scale  # (B, Hkv, G, Tq, S)
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask[:, :, None], float("-inf"))
    out = scores.softmax(-1) @ v.float()[:, :, None]  # (B, Hkv, G, Tq, D)
    return out.reshape(b, h, tq, d).to(q.dtype)


def _capped_in_blocks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """``_capped_attention`` a block of query rows at a time (at most ``_CAPPED_SCORES``
    scores each): the same rows, as each row's softmax is its own."""
    b, h, tq, _ = q.shape
    rows = max(1, _CAPPED_SCORES // (b * h * k.shape[2]))
    if rows >= tq:
        return _capped_attention(q, k, v, mask, scale, softcap)
    blocks = [
        _capped_attention(
            q[:, :, i : i + rows],
            k,
            v,
            None if mask is None else mask[:, :, i : i + rows],
            scale,
            softcap,
        )
        for i in range(0, tq, rows)
    ]
    return torch.cat(blocks, dim=2)


def _inside(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """True where key position k is inside the window of query position q:
    q - window < k (broadcast; the causal k <= q is the caller's)."""
    return k_pos > q_pos - window


def _gather(cache: torch.Tensor, kv_slots: torch.Tensor) -> torch.Tensor:
    # index_select on the flat slot list copies whole rows, where advanced
    # indexing with a 2-D index goes element by element on CPU
    # (benchmarks/README.md, "CPU engine choices").
    rows = cache.index_select(0, kv_slots.flatten())  # (B * S, Hkv, D)
    return rows.view(*kv_slots.shape, *cache.shape[1:]).transpose(1, 2)


def _gather_kv(
    pool: KVPool, layer: int, kv_slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``kv_slots`` (B, S) in ``layer``: (B, Hkv, S, D) each, in the model's
    dtype; a quantized pool's codes and scales gathered, then dequantized (as
    ``KVPool.dequantized``: code * scale in float32, rounded once)."""
    if not pool.quantized:
        return _gather(pool.k[layer], kv_slots), _gather(pool.v[layer], kv_slots)
    fmt, flat = pool.format, kv_slots.flatten()
    out = []
    for codes, scales in ((pool.k, pool.k_scale), (pool.v, pool.v_scale)):
        # bytes: torch has no fp8 index_select on CPU
        rows = codes[layer].view(torch.uint8).index_select(0, flat).view(fmt.code_dtype)
        scale = scales[layer].index_select(0, flat)  # type: ignore[index]  # (B * S, Hkv)
        values = dequantize(rows, scale, pool.dtype)  # (B * S, Hkv, D)
        out.append(values.view(*kv_slots.shape, *values.shape[1:]).transpose(1, 2))
    return out[0], out[1]


def as_stored(pool: KVPool, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """New tokens' k/v (T, Hkv, D) as the pool holds them once written: through a
    quantized pool's codes and back, so a pass's own tokens read what later passes
    read of them (as is for a float pool)."""
    if not pool.quantized:
        return k, v
    k_codes, k_scales = quantize(k, pool.format)
    v_codes, v_scales = quantize(v, pool.format)
    return dequantize(k_codes, k_scales, pool.dtype), dequantize(v_codes, v_scales, pool.dtype)


@dataclass(frozen=True)
class _PaddedGroup(ScatteredRows):
    """Requests attended in one padded SDPA call over K/V gathered from the pool.

    token_index: (B, Tq) flat index of each query token (padding repeats a real one).
    kv_slots: (B, S) slots of every key position (padding -> PAD_SLOT).
    mask: (B, 1, Tq, S) True where the query may attend the key (full attention);
        None when every query may attend every key (decode rows of one length: no
        padding).
    window_masks: the same for each sliding window of the model's layers; None
        where the window hides no key either.
    valid: (B, Tq) True for real query tokens.
    dest: (N,) flat index of each real query token, in (B, Tq) order; None when
        the group is every token of the pass in flat order (its output is the
        pass's output as is).
    rows, seq_lens: (B,) req_to_token rows and tokens stored, for a KIVI pool's
        reading by position (None for the others).
    """

    token_index: torch.Tensor
    kv_slots: torch.Tensor
    mask: torch.Tensor | None
    window_masks: Mapping[int, torch.Tensor | None]
    valid: torch.Tensor
    dest: torch.Tensor | None
    rows: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None

    @property
    def whole(self) -> bool:
        return self.dest is None

    def mask_of(self, window: int | None) -> torch.Tensor | None:
        """The mask of a layer with this window (None: full attention)."""
        return self.mask if window is None else self.window_masks[window]

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        if self.dest is None and self.token_index.shape[1] == 1:
            qg = q[:, None].transpose(1, 2)  # decode rows in pass order: (B, H, 1, D), a view
        else:
            qg = q[self.token_index].transpose(1, 2)  # (B, H, Tq, D)
        pool, scoring = backend.kv_pool, backend.scoring
        if self.rows is not None and self.seq_lens is not None:  # a KIVI pool
            kg, vg = (
                x.transpose(1, 2)
                for x in kivi.gather(pool, layer, self.kv_slots, self.rows, self.seq_lens)
            )
        else:
            kg, vg = _gather_kv(pool, layer, self.kv_slots)  # (B, Hkv, S, D) each
        mask = self.mask_of(scoring.window(layer))
        if scoring.softcap is None:
            out = F.scaled_dot_product_attention(
                qg, kg, vg, attn_mask=mask, scale=backend.scale, enable_gqa=True
            )
        else:
            out = _capped_in_blocks(qg, kg, vg, mask, backend.scale, scoring.softcap)
        out = out.transpose(1, 2)  # (B, Tq, H, D)
        if out.shape[1] == 1:  # decode rows: every query is real
            return out.flatten(0, 1)
        return out[self.valid]  # (num valid tokens, H, D)


@dataclass(frozen=True)
class _FreshGroup:
    """One request with no cached prefix: causal attention over its new tokens
    (flat range ``tokens``), straight from this pass's k/v: no gather, and no mask
    but where a window or the cap needs one; attended in ``dtype``
    (``TorchAttentionBackend.prefill_dtype``).

    masks: (1, 1, T, T) masks by layer window, where ``is_causal`` is not enough:
    each window narrower than the prompt, and, soft-capped (no SDPA), every
    window's and full attention's (None's); empty for a plain model.
    """

    tokens: slice
    dtype: torch.dtype
    masks: Mapping[int | None, torch.Tensor]
    whole: ClassVar[bool] = True  # as the pass's only group, it is the only request

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        # SDPA's enable_gqa, not K/V heads repeated up front: no copy of K/V per
        # query head, and the whole prefill was no slower in either dtype
        # (benchmarks/README.md, "CPU engine choices").
        t, scoring = self.tokens, backend.scoring
        out_dtype, dtype = q.dtype, self.dtype
        qt, kt, vt = (x[t].to(dtype).transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        mask = self.masks.get(scoring.window(layer))
        if scoring.softcap is not None:  # masks holds every layer's
            out = _capped_in_blocks(qt, kt, vt, mask, backend.scale, scoring.softcap)
        elif mask is None:
            out = F.scaled_dot_product_attention(
                qt, kt, vt, is_causal=True, scale=backend.scale, enable_gqa=True
            )  # (1, H, T, D)
        else:
            out = F.scaled_dot_product_attention(
                qt, kt, vt, attn_mask=mask, scale=backend.scale, enable_gqa=True
            )
        return out[0].transpose(0, 1).to(out_dtype)

    def attend_into(
        self,
        backend: PoolAttention,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        out[self.tokens] = self.attend(backend, layer, q, k, v)


@dataclass(frozen=True)
class TorchAttentionMetadata:
    """A pass that writes its new K/V into the pool, then attends group by group.

    kivi: where a KIVI pool's writes go (``kivi_writes``); None for the other pools.
    """

    out_cache_loc: torch.Tensor
    groups: tuple[AttentionGroup, ...]
    kivi: KiviWrites | None = None

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        pool = backend.kv_pool
        if self.kivi is not None:  # its groups read every key from the pool
            self.kivi.store(pool, layer, k, v)
        else:
            pool.write(layer, self.out_cache_loc, k, v)
        if pool.quantized:  # every query attends the stored K/V, its own pass's too
            k, v = pool.dequantized(layer, self.out_cache_loc)
        groups = self.groups
        if len(groups) == 1 and groups[0].whole:
            return groups[0].attend(backend, layer, q, k, v)  # the group is the pass: no scatter
        out = q.new_empty(q.shape)
        for group in groups:
            group.attend_into(backend, out, layer, q, k, v)
        return out

    def commit(self, pool: KVPool) -> None:
        """Nothing to store: ``attend`` wrote each layer's K/V as it went."""


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
    window_masks: the same for each sliding window of the model's layers (the
        last window - 1 of its prefix, then its new token).
    new_k, new_v: (L, B, Hkv, D) staging for the new tokens' K/V, every layer.
    """

    out_cache_loc: torch.Tensor
    kv_slots: torch.Tensor
    mask: torch.Tensor
    window_masks: Mapping[int, torch.Tensor]
    new_k: torch.Tensor
    new_v: torch.Tensor

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        self.new_k[layer].copy_(k)
        self.new_v[layer].copy_(v)
        pool, scoring = backend.kv_pool, backend.scoring
        k, v = as_stored(pool, k, v)  # what commit will store of them
        # The cached prefix from the pool, then the new token: (B, Hkv, S + 1, D).
        prefix_k, prefix_v = _gather_kv(pool, layer, self.kv_slots)
        kg = torch.cat((prefix_k, k[:, :, None]), 2)
        vg = torch.cat((prefix_v, v[:, :, None]), 2)
        window = scoring.window(layer)
        mask = self.mask if window is None else self.window_masks[window]
        if scoring.softcap is None:
            out = F.scaled_dot_product_attention(
                q[:, :, None], kg, vg, attn_mask=mask, scale=backend.scale, enable_gqa=True
            )  # (B, H, 1, D)
        else:
            out = _capped_attention(q[:, :, None], kg, vg, mask, backend.scale, scoring.softcap)
        return out[:, :, 0]  # (B, H, D)

    def commit(self, pool: KVPool) -> None:
        """Stores the staged K/V of every layer in the rows' slots."""
        pool.write_layers(self.out_cache_loc, self.new_k, self.new_v)


class TorchPassMetadata(Protocol):
    """What ``TorchAttentionBackend.forward`` and ``commit`` need of a pass's
    metadata (``TorchAttentionMetadata``, ``StagedDecodeMetadata``, and the cpu
    backend's, which reuses this protocol)."""

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor: ...

    def commit(self, pool: KVPool) -> None: ...


GroupRows = Callable[[AttentionInputs, torch.Tensor, torch.Tensor], list[AttentionGroup]]
"""(inputs, starts, idx) -> the groups attending rows ``idx`` of the pass; starts:
(B,) flat index of each request's first new token."""


def group_pass(
    inputs: AttentionInputs,
    decode_groups: GroupRows,
    prefill_groups: GroupRows,
    kivi: KiviWrites | None = None,
) -> TorchAttentionMetadata:
    """A pass's metadata: its decode rows (one new token) grouped by
    ``decode_groups``, then its prefill rows by ``prefill_groups``; ``kivi``: a KIVI
    pool's writes (``kivi_writes``)."""
    starts = torch.cumsum(inputs.extend_lens, 0) - inputs.extend_lens
    is_decode = inputs.extend_lens == 1
    groups: list[AttentionGroup] = []
    decode = is_decode.nonzero().flatten()
    if decode.numel():
        groups += decode_groups(inputs, starts, decode)
    prefill = (~is_decode).nonzero().flatten()
    if prefill.numel():
        groups += prefill_groups(inputs, starts, prefill)
    return TorchAttentionMetadata(inputs.out_cache_loc, tuple(groups), kivi)


def kivi_writes(
    pool: KVPool, req_to_token: ReqToTokenTable, inputs: AttentionInputs
) -> KiviWrites | None:
    """A KIVI pool's writes of this pass (read from the host: a pass over a KIVI pool
    is planned on the host); None for any other pool."""
    if not pool.kivi:
        return None
    return KiviWrites.plan(
        req_to_token.table,
        inputs.rows.tolist(),
        inputs.prefix_lens.tolist(),
        inputs.extend_lens.tolist(),
        pool.kivi_layout.group,
        inputs.rows.device,
    )


def refuse_staged_kivi(pool: KVPool) -> None:
    """Raises ValueError for a KIVI pool: a staged pass (a compiled decode step, a CUDA
    graph) cannot hold its writes back, as a pass's windows and groups change as it
    goes."""
    if pool.kivi:
        raise ValueError(
            "a KIVI KV cache (kivi4/kivi2) has no staged decode: its windows are written "
            "as a pass goes (no compiled decode step or CUDA graph over it)"
        )


def staging_buffers(kv_pool: KVPool, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, B, Hkv, D) buffers for a staged pass's new K and V.

    Raises ValueError unless the pass is decode rows only (``extend_lens`` all 1).
    """
    if not bool((inputs.extend_lens == 1).all()):
        raise ValueError("a staged decode pass takes decode rows only (extend_lens == 1)")
    pool = kv_pool.k  # staged in the model's dtype: commit quantizes a quantized pool's
    shape = (pool.shape[0], inputs.rows.numel(), *pool.shape[2:])
    return (
        torch.empty(shape, dtype=kv_pool.dtype, device=pool.device),
        torch.empty(shape, dtype=kv_pool.dtype, device=pool.device),
    )


class TorchAttentionBackend:
    """Reference backend: gathers K/V by slot and calls torch SDPA (CPU or GPU).

    Grouping, decided once per pass in ``prepare``:
      - each fresh prefill (no cached prefix) attends causally over its own k/v;
      - decode rows, and extend rows on a cached prefix, are sorted by length and
        padded in groups of at most ``max_group_rows``, so a short request is
        never padded to the longest one in a big batch (on CPU the K/V gather is
        most of a decode step's attention cost, and padding is gathered too).

    ``scoring``: each layer's sliding window and the soft-cap (see the module).
    """

    name = "torch"
    max_group_rows = 16
    pads_staged_rows = True  # prepare_staged_decode pads every row to the longest
    graph_capturable = False  # prepare reads lengths on the host to group rows
    fuses_rope = False  # the model rotates q and k in torch ops

    def __init__(
        self,
        kv_pool: KVPool,
        req_to_token: ReqToTokenTable,
        scale: float,
        scoring: AttentionScoring = PLAIN_SCORING,
    ) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.scale = scale
        self.scoring = scoring
        self.prefill_dtype = _prefill_dtype(kv_pool)

    def prepare(self, inputs: AttentionInputs) -> TorchAttentionMetadata:
        kivi = kivi_writes(self.kv_pool, self.req_to_token, inputs)
        return group_pass(inputs, self._padded_groups, self.prefill_groups, kivi)

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: TorchPassMetadata,
    ) -> torch.Tensor:
        return metadata.attend(self, layer, q, k, v)

    def prepare_staged_decode(self, inputs: AttentionInputs) -> StagedDecodeMetadata:
        """Metadata for a pass of decode rows only (``extend_lens`` all 1) that
        leaves the pool untouched until ``commit``. Raises ValueError over a KIVI pool
        (its windows are written as a pass goes)."""
        refuse_staged_kivi(self.kv_pool)
        new_k, new_v = staging_buffers(self.kv_pool, inputs)
        prefix = inputs.prefix_lens  # (B,)
        width = int(prefix.max())
        kv_slots, cached = self._slots(inputs.rows, prefix, width)  # (B, S) each
        own = cached.new_ones(cached.shape[0], 1)  # the new token, at position prefix
        mask = torch.cat((cached, own), dim=1)[:, None, None]
        positions = torch.arange(width, device=prefix.device)[None, :]
        window_masks = {
            w: torch.cat((cached & _inside(prefix[:, None], positions, w), own), 1)[:, None, None]
            for w in self.scoring.distinct_windows
        }
        return StagedDecodeMetadata(
            inputs.out_cache_loc, kv_slots, mask, window_masks, new_k, new_v
        )

    def commit(self, metadata: TorchPassMetadata) -> None:
        metadata.commit(self.kv_pool)

    def prefill_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[AttentionGroup]:
        """The groups attending prefill rows ``idx`` (more than one new token each)."""
        if self.kv_pool.kivi:  # every query reads its keys as stored, from the pool
            return self._padded_groups(inputs, starts, idx)
        is_fresh = inputs.prefix_lens[idx] == 0
        fresh, extend = idx[is_fresh], idx[~is_fresh]
        dtype, device = self.prefill_dtype, idx.device
        groups: list[AttentionGroup] = [
            _FreshGroup(slice(start, start + n), dtype, self._fresh_masks(n, device))
            for start, n in zip(starts[fresh].tolist(), inputs.extend_lens[fresh].tolist())
        ]
        if extend.numel():
            groups += self._padded_groups(inputs, starts, extend)
        return groups

    def _fresh_masks(self, num_tokens: int, device: torch.device) -> dict[int | None, torch.Tensor]:
        """A fresh prompt's masks by layer window (``_FreshGroup.masks``)."""
        scoring = self.scoring
        narrower = [w for w in scoring.distinct_windows if w < num_tokens]
        if not narrower and scoring.softcap is None:
            return {}  # every layer attends with is_causal
        positions = torch.arange(num_tokens, device=device)
        q_pos, k_pos = positions[:, None], positions[None, :]
        causal = (k_pos <= q_pos)[None, None]  # (1, 1, T, T)
        masks = {w: causal & _inside(q_pos, k_pos, w) for w in narrower}
        if scoring.softcap is not None:
            for window in (None, *scoring.distinct_windows):
                masks.setdefault(window, causal)
        return masks

    def _padded_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[AttentionGroup]:
        seq_lens = inputs.prefix_lens[idx] + inputs.extend_lens[idx]
        by_length = idx[torch.argsort(seq_lens, stable=True)]
        return [
            self._padded_group(inputs, starts, chunk)
            for chunk in by_length.split(self.max_group_rows)
        ]

    def _padded_group(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> _PaddedGroup:
        prefix = inputs.prefix_lens[idx]  # (B,)
        extend = inputs.extend_lens[idx]
        seq = prefix + extend
        max_q, max_s = int(extend.max()), int(seq.max())
        device = idx.device
        q_pos = torch.arange(max_q, device=device)
        valid = q_pos[None, :] < extend[:, None]  # (B, Tq)
        token = torch.minimum(q_pos[None, :], extend[:, None] - 1)  # padding repeats the last
        token_index = starts[idx][:, None] + token
        k_pos = torch.arange(max_s, device=device)[None, None, :]
        kv_slots, _ = self._slots(inputs.rows[idx], seq, max_s)
        # Query t of request i sits at position prefix[i] + t: (B, Tq, 1).
        q_abs = (prefix[:, None] + token)[:, :, None]
        mask = None  # decode rows of one length: every query sees every key
        if max_q > 1 or bool((seq < max_s).any()):
            mask = (k_pos <= q_abs)[:, None]  # (B, 1, Tq, S), k < seq
        window_masks = self._window_masks(mask, q_abs, k_pos)
        dest = token_index[valid]  # boolean indexing once per pass, not once per layer
        if dest.numel() == inputs.out_cache_loc.numel() and torch.equal(
            dest, torch.arange(dest.numel(), device=device)
        ):
            dest = None
        rows = inputs.rows[idx] if self.kv_pool.kivi else None
        return _PaddedGroup(
            token_index,
            kv_slots,
            mask,
            window_masks,
            valid,
            dest,
            rows,
            seq if rows is not None else None,
        )

    def _window_masks(
        self, mask: torch.Tensor | None, q_abs: torch.Tensor, k_pos: torch.Tensor
    ) -> dict[int, torch.Tensor | None]:
        """A padded group's ``mask`` narrowed to each window of the model's layers.

        q_abs: (B, Tq, 1) query positions; k_pos: (1, 1, S) key positions.
        """
        masks: dict[int, torch.Tensor | None] = {}
        for window in self.scoring.distinct_windows:
            if k_pos.shape[-1] <= window:  # it hides no key
                masks[window] = mask
                continue
            inside = _inside(q_abs, k_pos, window)[:, None]  # (B, 1, Tq, S)
            masks[window] = inside if mask is None else mask & inside
        return masks

    def _slots(
        self, rows: torch.Tensor, lens: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``lens[i]`` slots of each row, padded with PAD_SLOT to ``width``.

        Returns (slots, valid), both (B, width).
        """
        valid = torch.arange(width, device=lens.device)[None, :] < lens[:, None]
        return torch.where(valid, self.req_to_token.table[rows, :width], PAD_SLOT), valid


def _prefill_dtype(kv_pool: KVPool) -> torch.dtype:
    """The dtype fresh prefills attend in: float32 for a bfloat16/float16 model on a
    CPU, else the model's (what a pool holds, or what a quantized one dequantizes to)."""
    # CPU SDPA in bf16/fp16 is slower than in float32, so fresh prefills attend
    # in float32 and round once, which makes a whole bf16 prefill faster. Decode
    # rows stay in the pool dtype: there the conversions cost what the faster
    # SDPA saves (benchmarks/README.md, "CPU engine choices").
    pool_dtype = kv_pool.dtype
    if kv_pool.k.device.type == "cpu" and pool_dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return pool_dtype


def _build(context: BackendContext, by_name: bool) -> TorchAttentionBackend:
    scale = context.arch.attention_scale
    return TorchAttentionBackend(
        context.kv_pool, context.req_to_token, scale, scoring=context.scoring
    )


# Any device, any model: the registry's fallback.
TORCH_ENTRY = BackendEntry(TorchAttentionBackend.name, _build)
