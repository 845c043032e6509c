"""Model building blocks shared by every architecture."""

from radixlm.runtime.layers.attention import (
    AttentionBackend,
    AttentionInputs,
    TorchAttentionBackend,
    TorchAttentionMetadata,
)

__all__ = [
    "AttentionBackend",
    "AttentionInputs",
    "TorchAttentionBackend",
    "TorchAttentionMetadata",
]
