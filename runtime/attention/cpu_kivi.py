"""The "cpu" backend's groups over a KIVI pool (kivi4, kivi2): decode rows and prefill
rows attended by the C++ kernels of ``radixlm.kernels.cpu.kivi_attention``, which
read the pool's packed codes, parameters and windows in place.

A pass over a KIVI pool stores its new tokens first (``TorchAttentionMetadata``
applies its ``KiviWrites`` before the groups attend), so every position of a
request, the pass's own included, is read from the pool: a decode row attends its
``prefix_lens + 1`` stored tokens, a prefill row its prefix and new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.kivi_attention import KiviAttention, KiviCache
from radixlm.runtime.attention.torch_sdpa import PoolAttention, ScatteredRows, WrittenRows
from radixlm.runtime.mem_cache.kv_pool import KVPool

__all__ = ["KiviDecodeRows", "KiviExtendRows", "check_kivi_pool", "kivi_cache"]


def kivi_cache(pool: KVPool, layer: int) -> KiviCache:
    """One layer of a KIVI pool, as the kernels take it (views, no copy)."""
    layout = pool.kivi_layout
    return KiviCache(
        pool.k[layer],
        pool.v[layer],
        pool.meta[layer],
        pool.window_k[layer],
        pool.window_v[layer],
        layout.bits,
        layout.group,
        layout.value_group,
    )


def check_kivi_pool(pool: KVPool) -> None:
    """Checks once, on layer 0 (every layer's views have its shapes and layout), what
    the kernels' unchecked calls assume of the pool.

    Raises KernelShapeError when they cannot read it."""
    problems = kivi_cache(pool, 0).problems(pool.dtype)
    if problems:
        raise KernelShapeError("KIVI attention kernels: " + "; ".join(problems))


@dataclass(frozen=True)
class KiviDecodeRows(ScatteredRows):
    """Decode rows attended by the KIVI decode kernel.

    dest: (B,) flat index of each row's token; None when the rows are every token
        of the pass in flat order.
    rows, seq_lens: (B,) req_to_token row and tokens stored (the new one's included).
    """

    dest: torch.Tensor | None
    rows: torch.Tensor
    seq_lens: torch.Tensor
    kernel: KiviAttention

    @property
    def whole(self) -> bool:
        return self.dest is None

    def attend(
        self,
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        if self.dest is not None:
            q = q.index_select(0, self.dest)
        return self.kernel.launch_decode(
            q,
            kivi_cache(backend.kv_pool, layer),
            backend.req_to_token.table,
            self.rows,
            self.seq_lens,
            backend.scale,
            *backend.scoring.kernel_args(layer),
        )


@dataclass(frozen=True)
class KiviExtendRows(WrittenRows):
    """Prefill rows (fresh, or on a cached prefix) attended by the KIVI extend kernel,
    written into their rows of the output.

    rows, prefix_lens, extend_lens: (B,) req_to_token row, cached and new tokens.
    starts: (B,) flat index of each request's first new token.
    whole: the requests' tokens are every token of the pass.
    """

    rows: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    starts: torch.Tensor
    whole: bool
    kernel: KiviAttention

    def attend_into(
        self,
        backend: PoolAttention,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        self.kernel.launch_extend(
            q,
            kivi_cache(backend.kv_pool, layer),
            backend.req_to_token.table,
            self.rows,
            self.prefix_lens,
            self.extend_lens,
            self.starts,
            backend.scale,
            out,
            *backend.scoring.kernel_args(layer),
        )
