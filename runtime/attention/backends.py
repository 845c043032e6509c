"""The attention names' former home, kept only for imports not yet switched
(runtime/scheduling/scheduler.py imports ``AttentionInputs`` from here): import
from ``radixlm.runtime.attention`` instead; this module goes once none is left."""

from radixlm.runtime.attention.base import AttentionBackend, AttentionInputs
from radixlm.runtime.attention.cpu_kernels import CpuAttentionBackend, KernelStagedDecodeMetadata
from radixlm.runtime.attention.torch_sdpa import (
    StagedDecodeMetadata,
    TorchAttentionBackend,
    TorchAttentionMetadata,
)

__all__ = [
    "AttentionBackend",
    "AttentionInputs",
    "CpuAttentionBackend",
    "KernelStagedDecodeMetadata",
    "StagedDecodeMetadata",
    "TorchAttentionBackend",
    "TorchAttentionMetadata",
]
