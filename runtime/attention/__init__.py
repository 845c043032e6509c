"""Attention over the KV pool, behind one backend protocol (``base``): torch SDPA
(``torch_sdpa``; any device, the reference), radixlm's C++ CPU kernels
(``cpu_kernels``) and radixlm's Triton kernels (``triton``; GPUs), chosen by name
or "auto" through a registry (``registry``)."""

from radixlm.runtime.attention.base import (
    PLAIN_SCORING,
    AttentionBackend,
    AttentionInputs,
    AttentionMetadata,
    AttentionScoring,
    BackendContext,
    BackendEntry,
    RopeTables,
    RotatingBackend,
)
from radixlm.runtime.attention.cpu_kernels import (
    NO_KERNEL_ISA,
    CpuAttentionBackend,
    CpuAttentionOptions,
    KernelAttention,
    KernelStagedDecodeMetadata,
    cpu_entry,
    kernel_attention,
)
from radixlm.runtime.attention.registry import (
    BackendRegistry,
    default_registry,
    select_backend,
)
from radixlm.runtime.attention.torch_sdpa import (
    TORCH_ENTRY,
    StagedDecodeMetadata,
    TorchAttentionBackend,
    TorchAttentionMetadata,
    TorchPassMetadata,
)
from radixlm.runtime.attention.triton import TRITON_ENTRY, TritonAttentionBackend

__all__ = [
    "NO_KERNEL_ISA",
    "PLAIN_SCORING",
    "TORCH_ENTRY",
    "TRITON_ENTRY",
    "AttentionBackend",
    "AttentionInputs",
    "AttentionMetadata",
    "AttentionScoring",
    "BackendContext",
    "BackendEntry",
    "BackendRegistry",
    "CpuAttentionBackend",
    "RopeTables",
    "RotatingBackend",
    "CpuAttentionOptions",
    "KernelAttention",
    "KernelStagedDecodeMetadata",
    "StagedDecodeMetadata",
    "TorchAttentionBackend",
    "TorchAttentionMetadata",
    "TorchPassMetadata",
    "TritonAttentionBackend",
    "cpu_entry",
    "default_registry",
    "kernel_attention",
    "select_backend",
]
