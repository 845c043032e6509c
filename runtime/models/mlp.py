"""The dense gated MLP: every Llama-family layer's, and each expert of a mixture."""

from __future__ import annotations

from typing import TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu.elementwise import ElementwiseKernels
from radixlm.runtime.layers.factory import LayerFactory

__all__ = ["MLP", "elementwise_ready"]


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)), gate and up in one matmul; act is
    silu (SwiGLU) or tanh-approximated gelu (GeGLU)."""

    def __init__(
        self,
        hidden: int,
        inter: int,
        bias: bool,
        activation: str,
        layers: LayerFactory,
    ) -> None:
        super().__init__()
        self.gate_up_proj = layers.linear(hidden, 2 * inter, bias)
        self.down_proj = layers.linear(inter, hidden, bias)
        self.activation = activation
        self.elementwise: ElementwiseKernels | None = None  # see use_elementwise_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "silu" and elementwise_ready(self.elementwise):
            return self.down_proj(self.elementwise.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, I) each, views
        if self.activation == "silu":
            return self.down_proj(F.silu(gate, inplace=True).mul_(up))  # (T, hidden)
        return self.down_proj(F.gelu(gate, approximate="tanh").mul_(up))


def elementwise_ready(kernels: ElementwiseKernels | None) -> TypeGuard[ElementwiseKernels]:
    """Whether to run an elementwise step through ``kernels`` (not while compiling)."""
    return kernels is not None and not torch.compiler.is_compiling()
