"""Model building blocks shared by every architecture: the linear layers (with the
CPU few-row product and oneDNN-packed float32 weights)."""

from radixlm.runtime.layers.linear import Linear

__all__ = ["Linear"]
