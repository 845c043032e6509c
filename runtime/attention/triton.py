"""Attention through radixlm's Triton kernels, straight from the KV pool (GPUs).

Every pass writes its new tokens' K/V into the pool first, then attends:

  decode pass (every row one new token)   ``decode_attention_triton``: each row's
      query over positions 0 .. prefix_len of its ``req_to_token`` row, split
      over the context and reduced (flash decoding); a launch whose grid depends
      on shapes alone, so a CUDA graph can capture it (``graph_capturable``).
      The split count follows the batch size (``KVSplits``: enough programs to
      fill the GPU, from the longest context a row may have; a short row leaves
      its last splits empty), so each captured batch size fixes its own.
  any other pass                          ``extend_attention_triton``: each
      request's new tokens over its cached prefix (read by slot) and, causally,
      themselves (read from this pass's k/v)

The model calls ``forward_rotating`` (``fuses_rope``) outside a compiled graph: q and
k arrive unrotated, and one launch rotates them in place and writes K/V to the pool
(``radixlm.kernels.triton.rope_kv``), where the model's rotation and the pool's two
copies were. ``forward`` takes them rotated, as every backend does.

Each layer's sliding window and the soft-cap (``AttentionScoring``) go to both
kernels as their ``window`` and ``softcap``; a layer with neither launches the
plain kernels. A compiled decode step (``enable_torch_compile``) attends in the
torch backend's staged form: torch.compile traces torch ops, not Triton
launches of our own.

A quantized pool (``kv_cache_dtype``) hands the kernels its codes and per token-head
scales: they read code * scale, rounded to the model's dtype; the store kernel
quantizes into an int8 pool. An extend's new tokens attend as stored (read back
from the pool), as every query does with the torch backend.

A KIVI pool (``kivi4``/``kivi2``) is written by the pass's ``KiviWrites`` (torch ops:
groups the pass completes quantized, the rest to the rows' windows) before its kernels
(``radixlm.kernels.triton.kivi_decode_attention``, ``...kivi_extend_attention``) read
every key by position, codes unpacked in place. Its writes are planned on the host and
change its windows as a pass goes, so over a KIVI pool the backend neither fuses the
rotation into a store (``fuses_rope`` False: the model rotates in torch ops) nor stages
a decode (``graph_capturable`` False; ``prepare_staged_decode`` raises ValueError).

Triton runs on CUDA tensors, and on CPU tensors only under ``TRITON_INTERPRET=1``
(the tests run this backend, an engine included, that way on CPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from radixlm.kernels.paged_attention import MIN_SPLIT_LEN, choose_kv_splits
from radixlm.kernels.rope_kv import rotate_in_place
from radixlm.runtime.attention.base import (
    PLAIN_SCORING,
    AttentionInputs,
    AttentionScoring,
    BackendContext,
    BackendEntry,
    RopeTables,
)
from radixlm.runtime.attention.torch_sdpa import (
    StagedDecodeMetadata,
    TorchAttentionBackend,
    kivi_writes,
    refuse_staged_kivi,
)
from radixlm.runtime.mem_cache.kivi import KiviWrites
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable

if TYPE_CHECKING:
    from radixlm.kernels.triton.kivi_cache import KiviCache
    from radixlm.runtime.models.config import ArchConfig

__all__ = [
    "TRITON_ENTRY",
    "KVSplits",
    "TritonAttentionBackend",
    "TritonDecodeMetadata",
    "TritonExtendMetadata",
    "TritonKiviMetadata",
]

# Head dims the kernels take (each block pads its dim to the next power of two);
# the tests cover 64, 80, 96, 128 and 256, the supported models' dims, and 16.
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Splits of each decode row's context on a CPU (Triton's interpreter, tests only),
# where each program runs in turn: few splits keep the tests fast; the result is the
# same up to rounding. On a GPU ``KVSplits.choose`` sizes them by batch and context.
CPU_KV_SPLITS = 2


@dataclass(frozen=True)
class KVSplits:
    """How a decode launch splits each row's context (flash decoding).

    fixed: every launch's split count (with no floor on a split's length), or None
        to choose by batch: ``choose_kv_splits(batch, num_kv_heads, max_context,
        num_sms)``, each split at least ``MIN_SPLIT_LEN`` positions.
    max_context: the longest row a pass may have (the ``req_to_token`` width), so
        the count depends on the batch size alone and a CUDA graph captured for a
        batch size stays right for every context it replays with.
    """

    num_kv_heads: int
    max_context: int
    num_sms: int
    fixed: int | None = None

    def choose(self, batch: int) -> tuple[int, int]:
        """(num_kv_splits, min_split_len) of a launch of ``batch`` rows."""
        if self.fixed is not None:
            return self.fixed, 1
        splits = choose_kv_splits(batch, self.num_kv_heads, self.max_context, self.num_sms)
        return splits, MIN_SPLIT_LEN

    @classmethod
    def for_pool(
        cls, kv_pool: KVPool, req_to_token: ReqToTokenTable, fixed: int | None
    ) -> KVSplits:
        """The pool's device's rule: ``fixed`` if given, 2 on a CPU, else by batch over
        the GPU's SMs."""
        device = kv_pool.k.device
        if fixed is None and device.type == "cpu":
            fixed = CPU_KV_SPLITS
        num_sms = 1
        if device.type == "cuda":
            num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        return cls(kv_pool.k.shape[2], req_to_token.host.shape[1], num_sms, fixed)


@dataclass(frozen=True)
class TritonDecodeMetadata:
    """A pass of decode rows: (B,) each, on the pool's device.

    rows: each row's ``req_to_token`` row; seq_lens: positions it attends
    (its cached prefix and its new token); out_cache_loc: its new token's slot;
    splits: (num_kv_splits, min_split_len) of its launches (``KVSplits``), host ints.
    """

    out_cache_loc: torch.Tensor
    rows: torch.Tensor
    seq_lens: torch.Tensor
    splits: tuple[int, int]

    def attend(
        self,
        backend: TritonAttentionBackend,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: RopeTables | None = None,
    ) -> torch.Tensor:
        pool = backend.kv_pool
        backend.store(layer, self.out_cache_loc, q, k, v, rope)
        window, softcap = backend.scoring.kernel_args(layer)
        k_scale, v_scale = _scales(pool, layer)
        return backend.kernels.decode(
            q,
            pool.k[layer],
            pool.v[layer],
            backend.req_to_token.table,
            self.rows,
            self.seq_lens,
            backend.scale,
            num_kv_splits=self.splits[0],
            window=window,
            softcap=softcap,
            min_split_len=self.splits[1],
            k_scale=k_scale,
            v_scale=v_scale,
        )

    def commit(self, pool: KVPool) -> None:
        """Nothing to store: ``attend`` wrote each layer's K/V as it went."""


@dataclass(frozen=True)
class TritonExtendMetadata:
    """Any other pass: (B,) per request, on the pool's device, plus the longest
    extend as a host int (it sizes the launch grid).

    extend_starts: flat index of each request's first new token.
    """

    out_cache_loc: torch.Tensor
    rows: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    extend_starts: torch.Tensor
    max_extend: int

    def attend(
        self,
        backend: TritonAttentionBackend,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: RopeTables | None = None,
    ) -> torch.Tensor:
        pool = backend.kv_pool
        backend.store(layer, self.out_cache_loc, q, k, v, rope)
        window, softcap = backend.scoring.kernel_args(layer)
        k_scale, v_scale = _scales(pool, layer)
        if pool.quantized:  # the new tokens too attend as stored (as the torch backend)
            k, v = pool.dequantized(layer, self.out_cache_loc)
        return backend.kernels.extend(
            q,
            k,
            v,
            pool.k[layer],
            pool.v[layer],
            backend.req_to_token.table,
            self.rows,
            self.prefix_lens,
            self.extend_lens,
            self.extend_starts,
            self.max_extend,
            backend.scale,
            window=window,
            softcap=softcap,
            k_scale=k_scale,
            v_scale=v_scale,
        )

    def commit(self, pool: KVPool) -> None:
        """Nothing to store: ``attend`` wrote each layer's K/V as it went."""


@dataclass(frozen=True)
class TritonKiviMetadata:
    """A pass over a KIVI pool: its writes (``kivi_writes``), then the decode kernel when
    every row has one new token (``splits``: its launches'), else the extend kernel.
    (B,) per request on the pool's device; extend_starts as ``TritonExtendMetadata``'s."""

    writes: KiviWrites
    rows: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    extend_starts: torch.Tensor
    max_extend: int
    splits: tuple[int, int]

    def attend(
        self,
        backend: TritonAttentionBackend,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: RopeTables | None = None,
    ) -> torch.Tensor:
        pool, table = backend.kv_pool, backend.req_to_token.table
        if rope is not None:  # not the model's way (fuses_rope is False): a caller's own
            rotate_in_place(q, k, *rope)
        self.writes.store(pool, layer, k, v)  # every key is then read from the pool
        window, softcap = backend.scoring.kernel_args(layer)
        cache = backend.kernels.kivi_cache(pool, layer)
        if self.max_extend == 1:
            return backend.kernels.decode_kivi(
                q,
                cache,
                table,
                self.rows,
                self.prefix_lens + 1,
                backend.scale,
                num_kv_splits=self.splits[0],
                window=window,
                softcap=softcap,
                min_split_len=self.splits[1],
            )
        return backend.kernels.extend_kivi(
            q,
            cache,
            table,
            self.rows,
            self.prefix_lens,
            self.extend_lens,
            self.extend_starts,
            self.max_extend,
            backend.scale,
            window=window,
            softcap=softcap,
        )

    def commit(self, pool: KVPool) -> None:
        """Nothing to store: ``attend`` wrote each layer's K/V as it went."""


def _scales(pool: KVPool, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A quantized pool's (k_scale, v_scale) of ``layer`` for the kernels; (None, None)."""
    if pool.k_scale is None or pool.v_scale is None:
        return None, None
    return pool.k_scale[layer], pool.v_scale[layer]


class _Metadata(Protocol):
    """What ``TritonAttentionBackend.forward`` and ``commit`` need of a pass's
    metadata (its own two, and the torch backend's staged decode)."""

    def attend(
        self,
        backend: TritonAttentionBackend,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor: ...

    def commit(self, pool: KVPool) -> None: ...


class TritonKernels:
    """The Triton launches (imported on first build: importing them imports triton)."""

    def __init__(self) -> None:
        # lazy: importing the kernels imports triton (optional)
        from radixlm.kernels.triton.decode_attention import decode_attention_triton
        from radixlm.kernels.triton.extend_attention import extend_attention_triton
        from radixlm.kernels.triton.kivi_cache import KiviCache
        from radixlm.kernels.triton.kivi_decode_attention import decode_attention_kivi_triton
        from radixlm.kernels.triton.kivi_extend_attention import extend_attention_kivi_triton
        from radixlm.kernels.triton.rope_kv import rotate_and_store_triton

        self.decode = decode_attention_triton
        self.extend = extend_attention_triton
        self.rotate_and_store = rotate_and_store_triton
        self.decode_kivi = decode_attention_kivi_triton
        self.extend_kivi = extend_attention_kivi_triton
        self._kivi_cache = KiviCache

    def kivi_cache(self, pool: KVPool, layer: int) -> KiviCache:
        """Layer ``layer`` of a KIVI pool as its kernels read it."""
        layout = pool.kivi_layout
        return self._kivi_cache(
            pool.k[layer],
            pool.v[layer],
            pool.meta[layer],
            pool.window_k[layer],
            pool.window_v[layer],
            layout.bits,
            layout.group,
            layout.value_group,
        )


class TritonAttentionBackend:
    """Triton kernels over the pool, with slots looked up in ``req_to_token``; see
    the module docstring."""

    name = "triton"
    pads_staged_rows = True  # its staged (compiled) decode is the torch backend's
    graph_capturable = True  # both False over a KIVI pool (see the module)
    fuses_rope = True

    def __init__(
        self,
        kv_pool: KVPool,
        req_to_token: ReqToTokenTable,
        scale: float,
        kernels: TritonKernels | None = None,
        num_kv_splits: int | None = None,
        scoring: AttentionScoring = PLAIN_SCORING,
    ) -> None:
        """num_kv_splits: every decode launch's split count; None: chosen by batch
        (``KVSplits``); scoring: each layer's sliding window and the soft-cap."""
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.scale = scale
        self.scoring = scoring
        self.kernels = kernels or TritonKernels()
        self.kv_splits = KVSplits.for_pool(kv_pool, req_to_token, num_kv_splits)
        self._staged = TorchAttentionBackend(kv_pool, req_to_token, scale, scoring)
        if kv_pool.kivi:  # its writes are planned on the host, in torch ops
            self.graph_capturable = self.fuses_rope = False

    def prepare(
        self, inputs: AttentionInputs
    ) -> TritonDecodeMetadata | TritonExtendMetadata | TritonKiviMetadata:
        """Decode metadata when every row has one new token (device ops only: no
        host sync, so a CUDA graph may capture it), else extend metadata; over a KIVI
        pool, its metadata (planned on the host)."""
        longest = inputs.longest_extend
        if self.kv_pool.kivi:
            return self._prepare_kivi(inputs, longest)
        if longest == 1:
            splits = self.kv_splits.choose(inputs.rows.numel())  # a shape: no device read
            return TritonDecodeMetadata(
                inputs.out_cache_loc, inputs.rows, inputs.prefix_lens + 1, splits
            )
        starts = torch.cumsum(inputs.extend_lens, 0) - inputs.extend_lens
        return TritonExtendMetadata(
            inputs.out_cache_loc,
            inputs.rows,
            inputs.prefix_lens,
            inputs.extend_lens,
            starts,
            longest,
        )

    def _prepare_kivi(self, inputs: AttentionInputs, longest: int) -> TritonKiviMetadata:
        writes = kivi_writes(self.kv_pool, self.req_to_token, inputs)
        assert writes is not None  # a KIVI pool's
        return TritonKiviMetadata(
            writes,
            inputs.rows,
            inputs.prefix_lens,
            inputs.extend_lens,
            torch.cumsum(inputs.extend_lens, 0) - inputs.extend_lens,
            longest,
            self.kv_splits.choose(inputs.rows.numel()),
        )

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: _Metadata
    ) -> torch.Tensor:
        return metadata.attend(self, layer, q, k, v)

    def forward_rotating(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: RopeTables,
        metadata: TritonDecodeMetadata | TritonExtendMetadata | TritonKiviMetadata,
    ) -> torch.Tensor:
        """``forward`` of q and k not yet rotated (``RotatingBackend``): the rotation
        and the pool write are one launch. Metadata from ``prepare`` only (a staged
        pass is traced by torch.compile, which rotates in torch ops)."""
        return metadata.attend(self, layer, q, k, v, rope)

    def store(
        self,
        layer: int,
        slots: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: RopeTables | None,
    ) -> None:
        """Writes k/v at ``slots`` of ``layer``; with ``rope``, rotates q and k in place
        first, in the same launch (``radixlm.kernels.triton.rope_kv``; it quantizes
        into an int8 pool). An fp8 pool's codes are cast by ``KVPool.write`` after a
        rotation in torch ops (see the kernel's module for why)."""
        pool = self.kv_pool
        if rope is None:
            pool.write(layer, slots, k, v)
            return
        cos, sin = rope
        if pool.quantized and pool.format.code_dtype != torch.int8:
            rotate_in_place(q, k, cos, sin)
            pool.write(layer, slots, k, v)
            return
        k_scale, v_scale = _scales(pool, layer)
        self.kernels.rotate_and_store(
            q, k, v, cos, sin, pool.k[layer], pool.v[layer], slots, k_scale, v_scale
        )

    def prepare_staged_decode(self, inputs: AttentionInputs) -> StagedDecodeMetadata:
        """The torch backend's staged decode (what a compiled decode step traces).
        Raises ValueError over a KIVI pool."""
        refuse_staged_kivi(self.kv_pool)
        return self._staged.prepare_staged_decode(inputs)

    def commit(self, metadata: _Metadata) -> None:
        metadata.commit(self.kv_pool)


def _supports(arch: ArchConfig, dtype: torch.dtype, device: str) -> str | None:
    if MIN_HEAD_DIM <= arch.head_dim <= MAX_HEAD_DIM and dtype in DTYPES:
        return None
    return (
        f"its kernels do not take {dtype} with head dim {arch.head_dim} (they take "
        f"head dims {MIN_HEAD_DIM} to {MAX_HEAD_DIM} in float16, bfloat16 or float32)"
    )


def _unavailable(context: BackendContext) -> str | None:
    if context.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton runs on GPUs (on a CPU only under TRITON_INTERPRET=1, for tests)"
    try:
        import triton  # noqa: F401  # lazy: optional; probes whether it is installed
    except ImportError:
        return "triton is not installed (pip install triton)"
    return None


def _preferred(context: BackendContext) -> bool:
    return context.device == "cuda"  # on a CPU the interpreter is for tests, never "auto"


def _build(context: BackendContext, by_name: bool) -> TritonAttentionBackend:
    return TritonAttentionBackend(
        context.kv_pool,
        context.req_to_token,
        context.arch.attention_scale,
        scoring=context.scoring,
    )


TRITON_ENTRY = BackendEntry(
    TritonAttentionBackend.name,
    _build,
    supports=_supports,
    unavailable=_unavailable,
    preferred=_preferred,
)
