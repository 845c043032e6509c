"""Attention over the KV pool, behind one backend protocol: torch SDPA (any device,
the reference) and radixlm's C++ CPU kernels."""

from radixlm.runtime.attention.backends import (
    AttentionBackend,
    AttentionInputs,
    CpuAttentionBackend,
    TorchAttentionBackend,
)

__all__ = ["AttentionBackend", "AttentionInputs", "CpuAttentionBackend", "TorchAttentionBackend"]
