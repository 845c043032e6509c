"""The dense gated MLP: every Llama-family layer's, and each expert of a mixture."""

from __future__ import annotations

from typing import TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu.elementwise import ElementwiseKernels
from radixlm.runtime.layers.factory import LayerFactory
from radixlm.runtime.layers.linear import Linear

__all__ = ["MLP", "MLP_CHUNK_BYTES", "MLP_CHUNK_MIN_ROWS", "elementwise_ready"]

# A prompt pass's gate/up output is T x 2I values: 32 MB for 1,000 tokens of a
# Llama-3.2-1B shape. glibc gives a block that size to the engine's thread from fresh
# pages every time (~8,000 page faults, each page zeroed by the kernel: 72 against 67
# ms for that layer's gate/up product), where blocks of 8 MiB are kept and reused. So
# on CPU the rows of a float MLP go through in chunks whose gate/up output stays
# within MLP_CHUNK_BYTES, and of at least MLP_CHUNK_MIN_ROWS rows: at 128 rows oneDNN's
# GEMM lost what the faults saved. A 1,000-token prefill of the 1B shape: 1.02-1.05x
# where the blocks fault, the same where they happen not to (bench_mlp_chunks.py).
MLP_CHUNK_BYTES = 8 << 20
MLP_CHUNK_MIN_ROWS = 256


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
        """x: (T, hidden) -> (T, hidden); see MLP_CHUNK_BYTES for long passes."""
        chunk = self._chunk_rows(x)
        if chunk >= x.shape[0]:
            return self._forward(x)
        out = x.new_empty(x.shape)
        for start in range(0, x.shape[0], chunk):
            out[start : start + chunk] = self._forward(x[start : start + chunk])
        return out

    def _chunk_rows(self, x: torch.Tensor) -> int:
        """The most rows of x one pass through the MLP takes (all of them but for a
        long pass of a float MLP on CPU, in eager mode)."""
        gate_up = self.gate_up_proj
        if (
            x.shape[0] <= MLP_CHUNK_MIN_ROWS  # a decode step's rows: no more checks
            or x.dim() != 2
            or x.device.type != "cpu"
            or not isinstance(gate_up, Linear)
            or torch.compiler.is_compiling()
        ):
            return x.shape[0]
        row_bytes = gate_up.weight.shape[0] * gate_up.weight.element_size()
        return max(MLP_CHUNK_MIN_ROWS, MLP_CHUNK_BYTES // row_bytes)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "silu" and elementwise_ready(self.elementwise):
            return self.down_proj(self.elementwise.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, I) each, views
        if self.activation == "silu":
            return self.down_proj(F.silu(gate, inplace=True).mul_(up))  # (T, hidden)
        return self.down_proj(F.gelu(gate, approximate="tanh").mul_(up))


def elementwise_ready(kernels: ElementwiseKernels | None) -> TypeGuard[ElementwiseKernels]:
    """Whether to run an elementwise step through ``kernels`` (not while compiling)."""
    return kernels is not None and not torch.compiler.is_compiling()
