"""Which slice of the model each tensor-parallel rank holds (Megatron's split).

    attention   q/k/v projections: column-parallel by heads (a rank's query heads
                and the KV heads they read); o_proj: row-parallel over the same heads
    MLP         gate/up: column-parallel over the intermediate width; down: row-parallel
    experts     each expert's MLP split the same way, on every rank (the router is
                replicated, so every rank picks the same experts)
    vocabulary  embedding and LM head: rows split by token id (a tied pair shares them)
    the rest    norms, routers, gates: replicated

A row-parallel layer's output is a partial sum: the ranks add theirs with one
all-reduce per attention and per MLP block (``TensorParallelGroup``). Its bias is
added once, by rank 0 (the other ranks hold zeros).

Heads follow their KV head. With at least as many KV heads as ranks, each rank takes
a near-equal run of whole KV heads with their query heads (SmolLM2's 3 KV heads over
2 ranks: 2 and 1, i.e. 6 and 3 query heads); with fewer, each rank takes an equal run
of query heads and the one KV head they read, replicated on the ranks that share it.
Widths (intermediate, vocabulary) split into near-equal runs of a block that keeps
quantization groups whole (``split``).

Everything here is pure: the plan of rank r of n, and the slice of a checkpoint
tensor it keeps (``shard_tensor``), so loaders shard a tensor as they read it and the
whole model is never in one rank's memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from radixlm.runtime.errors import ModelLoadError
from radixlm.runtime.layers.quantization import (
    Codes,
    Int4Codes,
    Int8Codes,
    RowBlocks,
    same_order,
)
from radixlm.runtime.models.config import ArchConfig

__all__ = ["ShardPlan", "ShardingError"]

Weight = torch.Tensor | Codes

# The widest block a split keeps whole: a multiple of every int4 / int8 group size and
# of GGUF's 32-wide blocks, so a row-parallel layer's shard holds whole groups.
_SPLIT_BLOCKS = (256, 128, 64, 32, 16, 8, 4, 2, 1)


class ShardingError(ModelLoadError):
    """The model cannot be split over this many ranks (its heads or widths do not allow it)."""


@dataclass(frozen=True)
class ShardPlan:
    """Rank ``rank`` of ``size`` over the model ``arch`` (the whole model's config)."""

    rank: int
    size: int
    arch: ArchConfig

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ShardingError(f"rank {self.rank} is not in [0, {self.size})")
        self.heads()  # raises when the heads cannot be split

    # ---- what this rank holds ---------------------------------------------------------

    def heads(self) -> tuple[range, range]:
        """(query heads, KV heads) of this rank, as index ranges of the whole model's."""
        h, hkv, n, r = self.arch.num_heads, self.arch.num_kv_heads, self.size, self.rank
        group = h // hkv
        if hkv >= n:
            kv = _near_equal(hkv, n, r)
            return range(kv.start * group, kv.stop * group), kv
        if n % hkv or h % n:
            raise ShardingError(
                f"{h} query heads and {hkv} KV heads cannot be split over {n} ranks: with "
                f"fewer KV heads than ranks, the ranks must be a multiple of the KV heads "
                f"and divide the query heads"
            )
        q = range(r * h // n, (r + 1) * h // n)
        kv_head = r // (n // hkv)
        return q, range(kv_head, kv_head + 1)

    @property
    def holds_kv_sum(self) -> int:
        """1 where this rank counts its KV heads in a sum over the ranks, 0 where a rank
        before it holds the same (replicated) KV head."""
        hkv = self.arch.num_kv_heads
        return 1 if hkv >= self.size or self.rank % (self.size // hkv) == 0 else 0

    def split(self, width: int) -> range:
        """This rank's run of ``width`` (an intermediate width): near-equal runs of the
        widest block in ``_SPLIT_BLOCKS`` that divides it and leaves every rank some."""
        if width < self.size:
            raise ShardingError(f"a width of {width} cannot be split over {self.size} ranks")
        block = next(b for b in _SPLIT_BLOCKS if width % b == 0 and width // b >= self.size)
        blocks = _near_equal(width // block, self.size, self.rank)
        return range(blocks.start * block, blocks.stop * block)

    def vocab(self) -> range:
        """This rank's token ids: runs of ``vocab_shard`` ids (the last may be shorter)."""
        shard = self.vocab_shard
        return range(self.rank * shard, min(self.arch.vocab_size, (self.rank + 1) * shard))

    @property
    def vocab_shard(self) -> int:
        """Token ids per rank (every rank's logits are padded to it to be gathered)."""
        return -(-self.arch.vocab_size // self.size)

    def local_arch(self) -> ArchConfig:
        """The config this rank's model is built with: its heads, widths and vocabulary."""
        arch = self.arch
        q, kv = self.heads()
        moe = arch.moe
        if moe is not None:
            shared = moe.shared_expert_size
            moe = dataclasses.replace(
                moe,
                intermediate_size=len(self.split(moe.intermediate_size)),
                shared_expert_size=None if shared is None else len(self.split(shared)),
            )
        return dataclasses.replace(
            arch,
            num_heads=len(q),
            num_kv_heads=len(kv),
            intermediate_size=len(self.split(arch.intermediate_size)),
            vocab_size=len(self.vocab()),
            moe=moe,
        )

    # ---- what this rank keeps of a checkpoint tensor ------------------------------------

    def shard_tensors(
        self, tensors: Iterator[tuple[str, Weight | RowBlocks]]
    ) -> Iterator[tuple[str, Weight]]:
        """A loader's tensor stream, each tensor cut to this rank's slice as it passes
        (one read a block of rows at a time is read whole first)."""
        for name, tensor in tensors:
            whole = tensor.whole() if isinstance(tensor, RowBlocks) else tensor
            yield name, self.shard_tensor(name, whole)

    def shard_tensor(self, name: str, tensor: Weight) -> Weight:
        """This rank's slice of the checkpoint tensor ``name`` (canonical names:
        ``radixlm.runtime.models.loader.canonical_name``); the tensor itself when every
        rank holds it whole."""
        if self.size == 1:
            return tensor
        *_, module, leaf = name.split(".")
        d = self.arch.head_dim
        q, kv = self.heads()
        q_rows, kv_rows = _scaled(q, d), _scaled(kv, d)
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return _rows(name, tensor, self.vocab())
        if module in ("q_proj", "q_norm") and (module == "q_proj" or self._full_qk_norm):
            return _rows(name, tensor, q_rows)
        if module in ("k_proj", "v_proj", "k_norm") and (module != "k_norm" or self._full_qk_norm):
            return _rows(name, tensor, kv_rows)
        if module == "qkv_proj":  # fused (Phi-3): [q ; k ; v]
            h, hkv = self.arch.num_heads * d, self.arch.num_kv_heads * d
            parts = _split_rows(name, tensor, (h, hkv, hkv))
            shares = (q_rows, kv_rows, kv_rows)
            return _cat(name, [_rows(name, p, r) for p, r in zip(parts, shares)])
        if module in ("gate_proj", "up_proj"):
            return _rows(name, tensor, self.split(tensor.shape[0]))
        if module == "gate_up_proj":  # fused (Phi-3): [gate ; up]
            half = tensor.shape[0] // 2
            parts = _split_rows(name, tensor, (half, half))
            return _cat(name, [_rows(name, p, self.split(half)) for p in parts])
        if module in ("o_proj", "down_proj"):
            if leaf == "bias":  # added once, by rank 0
                return tensor if self.rank == 0 else torch.zeros_like(tensor)
            columns = q_rows if module == "o_proj" else self.split(tensor.shape[1])
            return _columns(name, tensor, columns)
        return tensor

    @property
    def _full_qk_norm(self) -> bool:
        """q/k norms over the whole projection (OLMoE): sharded with it."""
        return self.arch.qk_norm == "full"


def _near_equal(count: int, parts: int, index: int) -> range:
    """The ``index``-th of ``parts`` contiguous runs of ``count`` items whose lengths
    differ by at most one (the longer ones first)."""
    base, extra = divmod(count, parts)
    start = index * base + min(index, extra)
    return range(start, start + base + (index < extra))


def _scaled(heads: range, head_dim: int) -> range:
    return range(heads.start * head_dim, heads.stop * head_dim)


def _rows(name: str, tensor: Weight, rows: range) -> Weight:
    if isinstance(tensor, torch.Tensor):
        return tensor[rows.start : rows.stop].contiguous()
    parts = (t[rows.start : rows.stop].contiguous() for t in _code_parts(tensor))
    return type(tensor)(*parts, tensor.order)  # type: ignore[union-attr]


def _columns(name: str, tensor: Weight, columns: range) -> Weight:
    if isinstance(tensor, torch.Tensor):
        return tensor[:, columns.start : columns.stop].contiguous()
    if tensor.order is not None:
        raise ShardingError(
            f"tensor {name!r}: its act-order codes (GPTQ desc_act) group input columns out "
            "of order, and a rank's share of its inputs would split groups; serve it on one rank"
        )
    group = tensor.group_size
    if columns.start % group or columns.stop % group:
        raise ShardingError(
            f"tensor {name!r}: columns [{columns.start}, {columns.stop}) of this rank cut "
            f"its quantization groups of {group}; use fewer ranks"
        )
    g0, g1 = columns.start // group, columns.stop // group
    return type(tensor)(
        tensor.codes[:, columns.start : columns.stop].contiguous(),
        tensor.scale[:, g0:g1].contiguous(),
        tensor.zero[:, g0:g1].contiguous(),
    )


def _split_rows(name: str, tensor: Weight, sizes: tuple[int, ...]) -> list[Weight]:
    if tensor.shape[0] != sum(sizes):
        raise ShardingError(
            f"tensor {name!r} has {tensor.shape[0]} rows, expected {sum(sizes)} (fused parts)"
        )
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    return [_rows(name, tensor, range(a, b)) for a, b in zip(starts, starts[1:])]


def _cat(name: str, parts: list[Weight]) -> Weight:
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)  # type: ignore[arg-type]
    if not all(same_order(p.order, first.order) for p in parts):  # type: ignore[union-attr]
        raise ShardingError(f"the fused parts of {name!r} order their input columns differently")
    joined = (torch.cat(ts) for ts in zip(*(_code_parts(p) for p in parts)))
    return type(first)(*joined, first.order)


def _code_parts(codes: Codes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    assert isinstance(codes, Int4Codes | Int8Codes)
    return codes.codes, codes.scale, codes.zero
