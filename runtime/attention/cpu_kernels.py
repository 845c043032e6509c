"""Attention by radixlm's C++ CPU kernels, which read each request's K/V slots in
place instead of gathering them out of the pool: decode rows by the decode kernel,
prefill rows (fresh or on a cached prefix) by the extend kernel, or, without it,
by the torch backend's SDPA groups.

Its groups and staged metadata, like the torch backend's, each know how they
attend: the backend only decides the grouping (in ``prepare``). What only these
kernels need (their ISA, build, and whether "auto" takes each of them) is a
``CpuAttentionOptions``, given to the registry entry's factory (``cpu_entry``);
``kernel_attention`` tells the executor which rows a backend attends in C++.

A quantized pool (int8 or fp8 codes with bfloat16 scales, ``KVPool.k_scale``) is
read as stored: both kernels take a layer's codes and scales (``layer_scales``),
and the new tokens' K/V reach it through ``KVPool.write``/``write_layers``, which
quantize them.

A KIVI pool (``kivi4``/``kivi2``: packed codes, their parameters and the rows' float
windows) is read in place too, by kernels of its own (``radixlm.kernels.cpu.kivi_attention``;
its groups in ``cpu_kivi``): the pass's ``KiviWrites`` store its new tokens first, and
both kernels read every position from the pool. Without the extend kernel, prefill
rows over it attend through the torch backend's groups (``kivi.gather``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from radixlm.kernels.cpu.decode_attention import (
    DecodeAttention,
    check_cache,
    decode_attention_codes_op,
    decode_attention_op,
    load_decode_attention,
)
from radixlm.kernels.cpu.extend_attention import ExtendAttention, load_extend_attention
from radixlm.kernels.cpu.kivi_attention import KiviAttention, load_kivi_attention
from radixlm.kernels.cpu.native import NATIVE, KernelTarget
from radixlm.runtime.attention.base import (
    PLAIN_SCORING,
    AttentionBackend,
    AttentionInputs,
    AttentionScoring,
    BackendContext,
    BackendEntry,
)
from radixlm.runtime.attention.cpu_kivi import KiviDecodeRows, KiviExtendRows, check_kivi_pool
from radixlm.runtime.attention.torch_sdpa import (
    AttentionGroup,
    PoolAttention,
    ScatteredRows,
    TorchAttentionBackend,
    TorchAttentionMetadata,
    TorchPassMetadata,
    WrittenRows,
    as_stored,
    group_pass,
    kivi_writes,
    refuse_staged_kivi,
    staging_buffers,
)
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable
from radixlm.runtime.model_store import cache_root

if TYPE_CHECKING:
    from radixlm.runtime.models.config import ArchConfig

__all__ = [
    "NO_KERNEL_ISA",
    "CpuAttentionBackend",
    "CpuAttentionOptions",
    "KernelAttention",
    "KernelStagedDecodeMetadata",
    "cpu_entry",
    "kernel_attention",
    "layer_scales",
]

NO_KERNEL_ISA = "this CPU has neither AVX2 nor AVX-512, which radixlm's C++ kernels need"


def layer_scales(pool: KVPool, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A quantized pool's K and V scales of ``layer`` ((slots, Hkv) bfloat16 each),
    as the kernels take them; (None, None) for a float pool."""
    if pool.k_scale is None or pool.v_scale is None:
        return None, None
    return pool.k_scale[layer], pool.v_scale[layer]


def _default_build_dir() -> Path:
    return cache_root() / "kernels"


@dataclass(frozen=True)
class CpuAttentionOptions:
    """How the "cpu" backend is built and when "auto" takes it (the engine makes
    these from its config: ``cpu_kernel_isa``, and the measured table in
    runtime/executor/cpu_paths.py for the ISA and the model's dtype).

    isa: the kernels' ISA on this CPU ("avx2", "avx512"); None where they cannot
        be built (no AVX2, not x86): the backend is then unavailable.
    target, build_dir: what the kernels are built for, and where.
    decode_in_kernel: whether "auto" takes the backend (its decode kernel; the
        extend kernel rides on it).
    extend_in_kernel: whether "auto" gives it the extend kernel (else its prefill
        rows attend through SDPA). Asked for by name, it gets both kernels.
    """

    isa: str | None
    target: KernelTarget = NATIVE
    build_dir: Path = field(default_factory=_default_build_dir)
    decode_in_kernel: bool = True
    extend_in_kernel: bool = True

    @classmethod
    def native(cls) -> CpuAttentionOptions:
        """This CPU's own build, both kernels taken by "auto"."""
        return cls(NATIVE.resolved_isa())


@dataclass(frozen=True)
class _DecodeRows(ScatteredRows):
    """Decode rows attended by ``CpuAttentionBackend``'s kernel straight from the pool.

    dest: (B,) flat index of each row's token; None when the rows are every
        token of the pass in flat order.
    rows, prefix_lens: (B,) req_to_token row and cached tokens of each row.
    kernel: the backend's decode kernel.
    """

    dest: torch.Tensor | None
    rows: torch.Tensor
    prefix_lens: torch.Tensor
    kernel: DecodeAttention

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
            q, k, v = (x.index_select(0, self.dest) for x in (q, k, v))
        # The model's q/k/v: the pool's dtype, row-strided slices of the fused QKV
        # projection (or index_select copies); rows and prefix_lens: made by prepare.
        pool = backend.kv_pool
        return self.kernel.launch(
            q,
            pool.k[layer],
            pool.v[layer],
            backend.req_to_token.table,
            self.rows,
            self.prefix_lens,
            k,
            v,
            backend.scale,
            *backend.scoring.kernel_args(layer),
            *layer_scales(pool, layer),
        )


@dataclass(frozen=True)
class _ExtendRows(WrittenRows):
    """Prefill rows (fresh, or on a cached prefix) attended by ``CpuAttentionBackend``'s
    extend kernel straight from the pool, written into their rows of the output.

    rows, prefix_lens, extend_lens: (B,) req_to_token row, cached and new tokens.
    starts: (B,) flat index of each request's first new token.
    whole: the requests' tokens are every token of the pass.
    kernel: the backend's extend kernel.
    """

    rows: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    starts: torch.Tensor
    whole: bool
    kernel: ExtendAttention

    def attend_into(
        self,
        backend: PoolAttention,
        out: torch.Tensor,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        # The new tokens' K/V are in the pool already (forward wrote them), so
        # the kernel reads every key of a request from its slots.
        pool = backend.kv_pool
        self.kernel.launch(
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
            *backend.scoring.kernel_args(layer),
            *layer_scales(pool, layer),
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
        backend: PoolAttention,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        self.new_k[layer].copy_(k)
        self.new_v[layer].copy_(v)
        pool = backend.kv_pool
        k, v = as_stored(pool, k, v)  # what commit will store of them, as a writing pass
        k_scale, v_scale = layer_scales(pool, layer)
        if k_scale is None or v_scale is None:
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
                *backend.scoring.kernel_args(layer),
            )
        return decode_attention_codes_op(
            q, pool.k[layer], pool.v[layer], self.req_to_token, self.rows, self.prefix_lens, k, v,
            k_scale, v_scale, backend.scale, *backend.scoring.kernel_args(layer),
        )  # fmt: skip

    def commit(self, pool: KVPool) -> None:
        """Stores the staged K/V of every layer in the rows' slots (quantized there
        for a quantized pool)."""
        pool.write_layers(self.out_cache_loc, self.new_k, self.new_v)


@dataclass(frozen=True)
class KernelAttention:
    """Which rows a backend attends through radixlm's C++ kernels, straight from
    its pool by ``req_to_token`` (both checked for it when the backend was built).

    decode: decode rows, by the decode kernel (so a runner may run a whole decode
        step, attention included, in one C++ call).
    extend: prefill rows, by the extend kernel.
    """

    decode: bool = False
    extend: bool = False


class CpuAttentionBackend:
    """Attention by radixlm's C++ kernels (see the module docstring):

    - decode rows by the decode kernel (``radixlm.kernels.cpu.decode_attention``),
      which reads each row's K/V slots in place where the torch backend gathers
      and pads them (benchmarks/README.md, "CPU paths and kernels");
    - prefill rows, fresh or on a cached prefix, by the extend kernel
      (``radixlm.kernels.cpu.extend_attention``), all in one call per layer,
      written straight into their rows of the output; without it, by the torch
      backend's SDPA groups.

    ``scoring``: each layer's sliding window and the soft-cap, which both kernels
    take per call (and the SDPA groups per layer).
    """

    name = "cpu"
    pads_staged_rows = False
    graph_capturable = False  # the kernels run on the CPU, outside any CUDA graph
    fuses_rope = False  # the model rotates q and k in torch ops

    def __init__(
        self,
        kv_pool: KVPool,
        req_to_token: ReqToTokenTable,
        scale: float,
        kernel: DecodeAttention,
        extend_kernel: ExtendAttention | None,
        scoring: AttentionScoring = PLAIN_SCORING,
        kivi_kernel: KiviAttention | None = None,
    ) -> None:
        """extend_kernel: None attends prefill rows as the torch backend does (SDPA);
        kivi_kernel: the kernels over a KIVI pool (required for one, unused otherwise).

        Raises ValueError for a KIVI pool without kivi_kernel."""
        if kv_pool.kivi:  # once: forward skips the checks
            if kivi_kernel is None:
                raise ValueError("a KIVI pool is read by the KIVI kernels: give kivi_kernel")
            check_kivi_pool(kv_pool)
        else:
            check_cache(kv_pool.k, kv_pool.v, req_to_token.table, kv_pool.k_scale, kv_pool.v_scale)
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.scale = scale
        self.scoring = scoring
        self.kernel = kernel
        self.extend_kernel = extend_kernel
        self.kivi_kernel = kivi_kernel
        self._sdpa = TorchAttentionBackend(kv_pool, req_to_token, scale, scoring)

    @property
    def in_kernel(self) -> KernelAttention:
        """Which rows attend through the C++ kernels: decode rows always."""
        return KernelAttention(decode=True, extend=self.extend_kernel is not None)

    @classmethod
    def load(
        cls,
        kv_pool: KVPool,
        req_to_token: ReqToTokenTable,
        scale: float,
        build_dir: Path,
        target: KernelTarget = NATIVE,
        extend: bool = True,
        scoring: AttentionScoring = PLAIN_SCORING,
    ) -> CpuAttentionBackend:
        """The backend with its kernels built for ``target``, into ``build_dir``
        the first time: the decode kernel, and the extend kernel unless ``extend``
        is False (prefill rows then attend through SDPA); over a KIVI pool, its
        kernels too.

        Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
        """
        extend_kernel = load_extend_attention(build_dir, target) if extend else None
        decode_kernel = load_decode_attention(build_dir, target)
        kivi_kernel = load_kivi_attention(build_dir, target) if kv_pool.kivi else None
        return cls(kv_pool, req_to_token, scale, decode_kernel, extend_kernel, scoring, kivi_kernel)

    def prepare(self, inputs: AttentionInputs) -> TorchAttentionMetadata:
        if self.kv_pool.kivi:  # its writes go first: every group reads the pool
            writes = kivi_writes(self.kv_pool, self.req_to_token, inputs)
            return group_pass(inputs, self._kivi_decode_groups, self._kivi_prefill_groups, writes)
        return group_pass(inputs, self._decode_groups, self._prefill_groups)

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: TorchPassMetadata,
    ) -> torch.Tensor:
        return metadata.attend(self, layer, q, k, v)

    def prepare_staged_decode(self, inputs: AttentionInputs) -> KernelStagedDecodeMetadata:
        """Metadata for a pass of decode rows only that leaves the pool untouched
        until ``commit``; the kernel reads the slots from ``req_to_token`` itself.
        Raises ValueError for any other pass, and over a KIVI pool."""
        refuse_staged_kivi(self.kv_pool)
        new_k, new_v = staging_buffers(self.kv_pool, inputs)  # the model's dtype
        return KernelStagedDecodeMetadata(
            inputs.out_cache_loc,
            inputs.rows,
            inputs.prefix_lens,
            self.req_to_token.table,
            new_k,
            new_v,
        )

    def commit(self, metadata: TorchPassMetadata) -> None:
        metadata.commit(self.kv_pool)

    def _prefill_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[AttentionGroup]:
        if self.extend_kernel is None:
            return self._sdpa.prefill_groups(inputs, starts, idx)
        whole = idx.numel() == inputs.rows.numel()
        return [
            _ExtendRows(
                inputs.rows[idx],
                inputs.prefix_lens[idx],
                inputs.extend_lens[idx],
                starts[idx],
                whole,
                self.extend_kernel,
            )
        ]

    def _decode_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[AttentionGroup]:
        dest = starts[idx]  # a decode row's one token sits at its start
        if dest.numel() == inputs.out_cache_loc.numel():  # every token: the pass in order
            dest = None
        return [_DecodeRows(dest, inputs.rows[idx], inputs.prefix_lens[idx], self.kernel)]

    def _kivi_decode_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[AttentionGroup]:
        assert self.kivi_kernel is not None  # a KIVI pool's backend has it (__init__)
        dest = starts[idx]
        if dest.numel() == inputs.out_cache_loc.numel():
            dest = None
        seq_lens = inputs.prefix_lens[idx] + 1  # the new token is stored already
        return [KiviDecodeRows(dest, inputs.rows[idx], seq_lens, self.kivi_kernel)]

    def _kivi_prefill_groups(
        self, inputs: AttentionInputs, starts: torch.Tensor, idx: torch.Tensor
    ) -> list[AttentionGroup]:
        assert self.kivi_kernel is not None
        if self.extend_kernel is None:  # the extend kernel off: SDPA over kivi.gather
            return self._sdpa.prefill_groups(inputs, starts, idx)
        whole = idx.numel() == inputs.rows.numel()
        return [
            KiviExtendRows(
                inputs.rows[idx],
                inputs.prefix_lens[idx],
                inputs.extend_lens[idx],
                starts[idx],
                whole,
                self.kivi_kernel,
            )
        ]


def kernel_attention(backend: AttentionBackend[Any]) -> KernelAttention:
    """Which rows ``backend`` attends through radixlm's C++ kernels: those of the
    "cpu" backend's kernels, none for any other backend."""
    if isinstance(backend, CpuAttentionBackend):
        return backend.in_kernel
    return KernelAttention()


def _supports(arch: ArchConfig, dtype: torch.dtype, device: str) -> str | None:
    """Why the kernels cannot serve this model, or None. The pool's format does not
    matter: they read float32/bfloat16 pools, int8/fp8 ones and KIVI ones alike (the
    KIVI kernels take the shapes both others take)."""
    shape = (arch.num_heads, arch.num_kv_heads, arch.head_dim, dtype)
    if DecodeAttention.supports(*shape) and ExtendAttention.supports(*shape):
        return None
    return (
        f"its kernels do not take {dtype} with {arch.num_heads} heads and "
        f"{arch.num_kv_heads} KV heads of dim {arch.head_dim} (it takes float32 and "
        "bfloat16, head dims that are multiples of 16 up to 256, and at most 8 query "
        "heads per KV head)"
    )


def cpu_entry(options: CpuAttentionOptions) -> BackendEntry:
    """The registry entry of the "cpu" backend built and chosen as ``options`` say."""

    def unavailable(context: BackendContext) -> str | None:
        return NO_KERNEL_ISA if options.isa is None else None

    def preferred(context: BackendContext) -> bool:
        return options.decode_in_kernel  # the extend kernel rides on the decode one

    def build(context: BackendContext, by_name: bool) -> CpuAttentionBackend:
        return CpuAttentionBackend.load(
            context.kv_pool,
            context.req_to_token,
            context.arch.attention_scale,
            options.build_dir,
            options.target,
            extend=by_name or options.extend_in_kernel,
            scoring=context.scoring,
        )

    return BackendEntry(
        CpuAttentionBackend.name,
        build,
        device_type="cpu",
        supports=_supports,
        unavailable=unavailable,
        preferred=preferred,
    )
