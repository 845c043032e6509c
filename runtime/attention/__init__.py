"""Attention over the KV pool, behind one backend protocol (``base``): torch SDPA
(``torch_sdpa``; any device, the reference), radixlm's C++ CPU kernels
(``cpu_kernels``) and radixlm's Triton kernels (``triton``; GPUs), chosen by name
or "auto" through a registry (``registry``)."""

from radixlm.runtime.attention.base import (
    AttentionBackend,
    AttentionInputs,
    BackendContext,
    BackendEntry,
)
from radixlm.runtime.attention.cpu_kernels import (
    CPU_ENTRY,
    NO_KERNEL_ISA,
    CpuAttentionBackend,
    KernelStagedDecodeMetadata,
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
)
from radixlm.runtime.attention.triton import TRITON_ENTRY, TritonAttentionBackend

__all__ = [
    "CPU_ENTRY",
    "NO_KERNEL_ISA",
    "TORCH_ENTRY",
    "TRITON_ENTRY",
    "AttentionBackend",
    "AttentionInputs",
    "BackendContext",
    "BackendEntry",
    "BackendRegistry",
    "CpuAttentionBackend",
    "KernelStagedDecodeMetadata",
    "StagedDecodeMetadata",
    "TorchAttentionBackend",
    "TorchAttentionMetadata",
    "TritonAttentionBackend",
    "default_registry",
    "select_backend",
]
