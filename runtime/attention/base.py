"""What a forward pass tells attention, and the one protocol every backend implements.

The model runner describes a forward pass once (``AttentionInputs``); the
backend turns that into its own metadata once per pass (``prepare``), and every
layer then calls ``forward`` with that metadata. Requests in a pass are either
*decode* rows (one new token) or *extend* rows (a prefill chunk, possibly on
top of a cached prefix)::

    request i:   [ prefix_lens[i] cached tokens | extend_lens[i] new tokens ]
                  slots: req_to_token[rows[i], 0 : prefix_lens[i] + extend_lens[i]]
    flat tokens: request 0's new tokens, request 1's new tokens, ...  (T total)

New token t of request i sits at position prefix_lens[i] + t and attends to
positions 0 .. prefix_lens[i] + t (causal), or, in a layer with a sliding window
W, to the last W of them (``AttentionScoring``)::

    query at position p:   keys k with  p - W < k <= p      (W keys, itself included)

The pool keeps every token of a sequence whatever the windows (the radix cache
shares whole prefixes), so a window is a mask by absolute position alone: a
cached prefix longer than the window is attended as is, and a chunk extending
it masks by its tokens' positions.

The metadata is opaque to callers (``AttentionMetadata``): each backend's
metadata knows how its pass attends and commits, so no caller (nor the backend
itself) asks its type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from radixlm.runtime.device import counting_traffic, to_device
from radixlm.runtime.mem_cache.kv_pool import KVPool, ReqToTokenTable

if TYPE_CHECKING:
    from radixlm.runtime.models.config import ArchConfig

__all__ = [
    "AttentionBackend",
    "AttentionInputs",
    "AttentionMetadata",
    "AttentionScoring",
    "BackendContext",
    "BackendEntry",
    "PLAIN_SCORING",
    "RopeTables",
    "RotatingBackend",
]

RopeTables = tuple[torch.Tensor, torch.Tensor]
"""cos, sin: (T, R/2) each, the rotation of each new token's leading R dims (neox)."""


@dataclass(frozen=True)
class AttentionScoring:
    """How a model's layers score keys beyond causal softmax(scale q.k), as
    transformers computes it; every backend takes one (``scoring=``) and applies
    it layer by layer. The default is plain causal attention in every layer.

    windows: each layer's sliding window W (the query at position p attends the
        keys at positions p - W < k <= p), None for full attention; empty: every
        layer attends fully.
    softcap: each score s = scale q.k becomes c tanh(s / c) before masking and
        softmax (Gemma 2: c = 50), in every layer; None: scores as they are.

    A layer with neither must attend exactly as a backend does without any
    scoring: its fast paths (an unmasked causal prefill, unmasked decode rows of
    one length, the kernels' plain loops) stay as they are.

    Raises ValueError for a window or cap that is not positive.
    """

    windows: tuple[int | None, ...] = ()
    softcap: float | None = None

    def __post_init__(self) -> None:
        for window in self.windows:
            if window is not None and window <= 0:
                raise ValueError(f"a sliding window must be positive, got {window}")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"an attention soft-cap must be positive, got {self.softcap}")

    @classmethod
    def of(cls, arch: ArchConfig) -> AttentionScoring:
        """The scoring ``arch``'s layers need (its windows and attention soft-cap)."""
        return cls(arch.layer_windows, arch.attn_logit_softcap)

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window, None for full attention."""
        return self.windows[layer] if self.windows else None

    @property
    def distinct_windows(self) -> frozenset[int]:
        """Every window some layer has (a pass builds one mask per window, not per layer)."""
        return frozenset(w for w in self.windows if w is not None)

    def kernel_args(self, layer: int) -> tuple[int, float]:
        """(window, softcap) of layer ``layer`` as radixlm's kernels take them:
        0 for no window and 0.0 for no cap."""
        return self.window(layer) or 0, self.softcap or 0.0


PLAIN_SCORING = AttentionScoring()
"""No window, no cap in any layer: a backend's scoring when it is given none."""


@dataclass(frozen=True)
class AttentionInputs:
    """Backend-agnostic description of one forward pass (int64 tensors, one device).

    rows: (B,) req_to_token row of each request.
    prefix_lens: (B,) tokens already in the KV pool before this pass.
    extend_lens: (B,) new tokens this pass (1 for a decode row).
    out_cache_loc: (T,) slot for each new token, T = extend_lens.sum().
    max_extend_len: ``extend_lens.max()`` as a host int, told by whoever built the
        tensors (the batch builder), so a backend on a GPU need not wait for the
        device to learn it; None: read from ``extend_lens`` when asked.
    """

    rows: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    max_extend_len: int | None = None

    @property
    def longest_extend(self) -> int:
        """The most new tokens of one request (1: a pass of decode rows only)."""
        if self.max_extend_len is not None:
            return self.max_extend_len
        return int(self.extend_lens.max())

    def to(self, device: torch.device) -> AttentionInputs:
        """These inputs on ``device``: ``self`` when they are there already (and device
        traffic is not being counted)."""
        if self.rows.device == device and not counting_traffic():
            return self
        return AttentionInputs(
            *(
                to_device(t, device)
                for t in (self.rows, self.prefix_lens, self.extend_lens, self.out_cache_loc)
            ),
            max_extend_len=self.longest_extend,  # from the host copy: no device sync later
        )


class AttentionMetadata(Protocol):
    """One pass's metadata, built by a backend's ``prepare`` (or
    ``prepare_staged_decode``) and handed back to that backend's ``forward`` and
    ``commit``. Each backend's metadata types know how their pass attends and
    commits, so no caller (nor the backend itself) asks which type it holds."""

    def commit(self, pool: KVPool) -> None:
        """Stores what the pass staged in ``pool`` (nothing, for a pass whose
        ``forward`` wrote each layer's K/V as it went)."""
        ...


M = TypeVar("M", bound=AttentionMetadata)


class AttentionBackend(Protocol[M]):
    """Attention over ``kv_pool``, its slots looked up in ``req_to_token``; ``M``:
    the metadata type its ``prepare`` builds and its ``forward`` reads.

    Capabilities, read by the runtime instead of asking a backend's type:
      name: the ``attention_backend`` name it is registered under.
      pads_staged_rows: a staged pass pads every row to the longest (its cost
        grows with rows x longest; the compiled decode step limits it).
      graph_capturable: ``prepare`` of a pass of decode rows (``max_extend_len``
        1) and ``forward`` with its metadata run device ops alone (no host sync,
        nothing sized by a tensor's values), so a CUDA graph can capture them
        with the model and replay them on new inputs in the same buffers.
      fuses_rope: it is a ``RotatingBackend`` too: the model hands it q and k
        unrotated, and it rotates them in the launch that stores K/V.

    scale: the softmax scale; scoring: each layer's sliding window and the
    soft-cap (``AttentionScoring``), which ``forward`` applies by its ``layer``.
    """

    kv_pool: KVPool
    req_to_token: ReqToTokenTable
    scale: float
    scoring: AttentionScoring

    @property
    def name(self) -> str: ...

    @property
    def pads_staged_rows(self) -> bool: ...

    @property
    def graph_capturable(self) -> bool: ...

    @property
    def fuses_rope(self) -> bool: ...

    def prepare(self, inputs: AttentionInputs) -> M:
        """Builds the per-pass metadata every layer's ``forward`` reads."""
        ...

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: M
    ) -> torch.Tensor:
        """Stores k/v of the new tokens (or stages them, for staged metadata) and
        attends. q: (T, H, D), k/v: (T, Hkv, D). Returns (T, H, D)."""
        ...

    def prepare_staged_decode(self, inputs: AttentionInputs) -> M:
        """Metadata for a pass of decode rows only (``extend_lens`` all 1) whose
        ``forward`` reads the pool but never writes it: the new K/V are staged
        until ``commit``. Raises ValueError for any other pass."""
        ...

    def commit(self, metadata: M) -> None:
        """Stores a staged pass's new K/V in the pool; metadata from ``prepare``
        has nothing to store (its ``forward`` wrote them)."""
        ...


class RotatingBackend(Protocol):
    """What a backend with ``fuses_rope`` adds: ``forward`` of q and k not yet rotated."""

    def forward_rotating(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: RopeTables,
        metadata: Any,
    ) -> torch.Tensor:
        """``forward`` after rotating q: (T, H, D) and k: (T, Hkv, D) in place over
        their leading R dims by ``rope`` (neox style, the rest passing through).
        ``metadata``: from ``prepare`` (a staged pass rotates in torch ops)."""
        ...


@dataclass(frozen=True)
class BackendContext:
    """Everything a backend's registry entry may read to decide and to build:
    what every backend shares. What one backend alone needs (the C++ kernels'
    ISA and build directory, for "cpu") is given to its entry when the entry is
    made (``cpu_kernels.cpu_entry``).

    arch, dtype, device: the model, its dtype, and the configured device.
    kv_pool, req_to_token: what the backend attends over.
    """

    arch: ArchConfig
    dtype: torch.dtype
    device: str
    kv_pool: KVPool
    req_to_token: ReqToTokenTable

    @property
    def scoring(self) -> AttentionScoring:
        """The model's windows and soft-cap, which every backend is built with."""
        return AttentionScoring.of(self.arch)


def _serves_any_model(arch: ArchConfig, dtype: torch.dtype, device: str) -> str | None:
    return None


def _always_available(context: BackendContext) -> str | None:
    return None


def _always_preferred(context: BackendContext) -> bool:
    return True


@dataclass(frozen=True)
class BackendEntry:
    """How the registry (``registry.py``) knows one backend.

    name: its ``attention_backend`` name.
    build: (context, by_name) -> the backend. by_name: asked for by name (build
        all it can), not chosen by "auto". Raises KernelBuildError
        (radixlm.kernels.cpu.native) when its kernels cannot be built.
    device_type: the one device type it runs on ("cpu"); None: any device.
    supports: (arch, dtype, device) -> why it cannot serve this model, or None.
    unavailable: (context) -> why it cannot be built on this machine, or None.
    preferred: (context) -> whether "auto" should take it here (a measured rule).
    """

    name: str
    build: Callable[[BackendContext, bool], AttentionBackend[Any]]
    device_type: str | None = None
    supports: Callable[[ArchConfig, torch.dtype, str], str | None] = _serves_any_model
    unavailable: Callable[[BackendContext], str | None] = _always_available
    preferred: Callable[[BackendContext], bool] = _always_preferred
