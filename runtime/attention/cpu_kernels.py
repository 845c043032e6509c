"""The torch backend with every row attended by radixlm's C++ CPU kernels, which
read each request's K/V slots in place instead of gathering them out of the pool.

Its groups and staged metadata, like the torch backend's, each know how they
attend: the backend only decides the grouping (in ``prepare``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from radixlm.kernels.cpu.decode_attention import (
    DecodeAttention,
    check_cache,
    decode_attention_op,
    load_decode_attention,
)
from radixlm.kernels.cpu.extend_attention import ExtendAttention, load_extend_attention
from radixlm.kernels.cpu.native import NATIVE, KernelTarget
from radixlm.runtime.attention.base import AttentionInputs, BackendContext, BackendEntry
from radixlm.runtime.attention.torch_sdpa import AttentionGroup, TorchAttentionBackend
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable

if TYPE_CHECKING:
    from radixlm.runtime.models.config import ArchConfig

__all__ = ["CPU_ENTRY", "NO_KERNEL_ISA", "CpuAttentionBackend", "KernelStagedDecodeMetadata"]

NO_KERNEL_ISA = "this CPU has neither AVX2 nor AVX-512, which radixlm's C++ kernels need"


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

    @property
    def whole(self) -> bool:
        return self.dest is None

    def attend(
        self,
        backend: CpuAttentionBackend,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        if self.dest is not None:
            q, k, v = (x.index_select(0, self.dest) for x in (q, k, v))
        # The model's q/k/v: the pool's dtype, row-strided slices of the fused QKV
        # projection (or index_select copies); rows and prefix_lens: made by prepare.
        pool = backend.kv_pool
        return backend.kernel.launch(
            q,
            pool.k[layer],
            pool.v[layer],
            backend.req_to_token.table,
            self.rows,
            self.prefix_lens,
            k,
            v,
            backend.scale,
        )

    def attend_into(
        self,
        backend: CpuAttentionBackend,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        out.index_copy_(0, self.dest, self.attend(backend, layer, q, k, v))


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

    def attend(
        self,
        backend: CpuAttentionBackend,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        out = q.new_empty(q.shape)  # the whole pass
        self.attend_into(backend, out, layer, q, k, v)
        return out

    def attend_into(
        self,
        backend: CpuAttentionBackend,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        # The new tokens' K/V are in the pool already (forward wrote them), so
        # the kernel reads every key of a request from its slots.
        pool = backend.kv_pool
        backend.extend_kernel.launch(
            q,
            pool.k[layer],
            pool.v[layer],
            backend.req_to_token.table,
            self.rows,
            self.prefix_lens,
            self.extend_lens,
            self.starts,
            backend.scale,
            out,
        )


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

    def attend(
        self,
        backend: TorchAttentionBackend,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        self.new_k[layer].copy_(k)
        self.new_v[layer].copy_(v)
        pool = backend.kv_pool
        return decode_attention_op(
            q,
            pool.k[layer],
            pool.v[layer],
            self.req_to_token,
            self.rows,
            self.prefix_lens,
            k,
            v,
            backend.scale,
        )

    def commit(self, pool: KVPool) -> None:
        """Stores the staged K/V of every layer in the rows' slots."""
        pool.write_layers(self.out_cache_loc, self.new_k, self.new_v)


class CpuAttentionBackend(TorchAttentionBackend):
    """The torch backend with every row attended by radixlm's C++ kernels:

    - decode rows by the decode kernel (``radixlm.kernels.cpu.decode_attention``): a
      decode pass of 64 rows of 20-528 cached tokens over the default model's 30
      layers takes 57.5 ms against 304.1 ms in float32, 39.0 against 107.3 ms in
      bfloat16;
    - prefill rows, fresh or on a cached prefix, by the extend kernel
      (``radixlm.kernels.cpu.extend_attention``), all in one call per layer, written
      straight into their rows of the output (figures in benchmarks/README.md).
    """

    name = "cpu"
    pads_staged_rows = False
    decode_in_kernel = True

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

    @property
    def extend_in_kernel(self) -> bool:
        return self.extend_kernel is not None

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

    def _prefill_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[AttentionGroup]:
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
    ) -> list[AttentionGroup]:
        dest = starts[idx]  # a decode row's one token sits at its start
        if dest.numel() == inputs.out_cache_loc.numel():  # every token: the pass in order
            dest = None
        return [_DecodeRows(dest, inputs.rows[idx], inputs.prefix_lens[idx])]


def _supports(arch: ArchConfig, dtype: torch.dtype, device: str) -> str | None:
    shape = (arch.num_heads, arch.num_kv_heads, arch.head_dim, dtype)
    if DecodeAttention.supports(*shape) and ExtendAttention.supports(*shape):
        return None
    return (
        f"its kernels do not take {dtype} with {arch.num_heads} heads and "
        f"{arch.num_kv_heads} KV heads of dim {arch.head_dim} (it takes float32 and "
        "bfloat16, head dims that are multiples of 16 up to 256, and at most 8 query "
        "heads per KV head)"
    )


def _unavailable(context: BackendContext) -> str | None:
    return NO_KERNEL_ISA if context.isa is None else None


def _preferred(context: BackendContext) -> bool:
    # The decode kernel's rule decides: the extend kernel rides on its backend.
    return context.kernel_is_faster["decode_attention"]


def _build(context: BackendContext, by_name: bool) -> CpuAttentionBackend:
    return CpuAttentionBackend.load(
        context.kv_pool,
        context.req_to_token,
        context.arch.attention_scale,
        context.build_dir,
        context.target,
        extend=by_name or context.kernel_is_faster["extend_attention"],
    )


CPU_ENTRY = BackendEntry(
    CpuAttentionBackend.name,
    _build,
    device_type="cpu",
    supports=_supports,
    unavailable=_unavailable,
    preferred=_preferred,
)
