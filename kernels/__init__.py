"""Triton kernels, each beside a plain-torch reference (imports only torch/triton)."""

__all__: list[str] = []
