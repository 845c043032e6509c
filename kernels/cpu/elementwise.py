"""The eager model's elementwise steps as single C++ passes (float32 on CPU).

On CPU torch runs ``F.rms_norm`` as five ops (pow, mean, add, rsqrt, two muls),
RoPE as four and SwiGLU's ``silu(gate) * up`` as two over a strided half of the
projection. ``ElementwiseKernels`` runs each as one OpenMP pass over the rows,
from the same library as the few-row kernels (``small_batch_cpu.cpp``):

- ``add_rms_norm``: residual += x; returns rmsnorm(residual) * weight.
- ``rope``: in place on a fused QKV projection's q and k heads: per-head
  RMSNorm (Qwen3) if given, then the rotate-half rotation.
- ``silu_mul``: in place on a fused gate/up projection: gate = silu(gate) * up.

The model calls them in its eager passes of float32 on CPU once the runtime
attaches them (``DecoderForCausalLM.use_elementwise_kernels``); compiled graphs keep
the torch ops, which inductor fuses itself. In torch these steps are several
passes over the rows each (benchmarks/README.md, "CPU engine
choices").
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library
from radixlm.kernels.cpu.small_batch import SOURCE

__all__ = ["ElementwiseKernels", "load_elementwise_kernels"]


class ElementwiseKernels:
    """The built kernels; see the module doc. Every tensor is CPU float32."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        self._add_rms_norm = library.radixlm_add_rms_norm_f32
        self._add_rms_norm.argtypes = [ptr, ptr, ptr, f32, ptr, i64, i64]
        self._rope = library.radixlm_rope_f32
        self._rope.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, f32, ptr, ptr]
        self._silu_mul = library.radixlm_silu_mul_f32
        self._silu_mul.argtypes = [ptr, i64, i64]
        for function in (self._add_rms_norm, self._rope, self._silu_mul):
            function.restype = ctypes.c_int

    def add_rms_norm(
        self, residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual (T, n), contiguous, += x (same shape) unless None; returns
        rmsnorm(residual) * weight (n,) as a new (T, n) tensor."""
        _check("add_rms_norm", residual, x, weight)
        if x is not None and x.shape != residual.shape:
            raise KernelShapeError("add_rms_norm: x must have the residual's shape")
        if weight.shape != (residual.shape[1],):
            raise KernelShapeError(f"add_rms_norm: weight must have shape ({residual.shape[1]},)")
        rows, n = residual.shape
        out = torch.empty_like(residual)
        self._add_rms_norm(
            residual.data_ptr(), _ptr(x), weight.data_ptr(), eps, out.data_ptr(), rows, n
        )
        return out

    def rope(
        self,
        qkv: torch.Tensor,
        q_heads: int,
        kv_heads: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        norms: tuple[torch.Tensor, torch.Tensor, float] | None = None,
    ) -> None:
        """qkv (T, heads, D) with contiguous rows: its first q_heads + kv_heads heads
        rotated in place by cos/sin (T, D/2); norms: (q weight, k weight, eps) of a
        per-head RMSNorm applied first."""
        q_norm, k_norm, eps = norms if norms is not None else (None, None, 0.0)
        _check("rope", cos, sin, q_norm, k_norm)
        rows, heads, head_dim = qkv.shape
        if qkv.dtype != torch.float32 or qkv.device.type != "cpu" or head_dim % 2:
            raise KernelShapeError("rope: qkv must be a CPU float32 (T, heads, even D) tensor")
        if qkv.stride(2) != 1 or qkv.stride(1) != head_dim or q_heads + kv_heads > heads:
            raise KernelShapeError("rope: each row of qkv must be contiguous heads")
        if cos.shape != (rows, head_dim // 2) or sin.shape != cos.shape:
            raise KernelShapeError(f"rope: cos and sin must have shape ({rows}, {head_dim // 2})")
        self._rope(
            qkv.data_ptr(), qkv.stride(0), rows, q_heads, q_heads + kv_heads, head_dim,
            _ptr(q_norm), _ptr(k_norm), eps, cos.data_ptr(), sin.data_ptr(),
        )  # fmt: skip

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up (T, 2 I), contiguous = [gate | up]: gate = silu(gate) * up in place.
        Returns that gate half, a (T, I) view."""
        _check("silu_mul", gate_up)
        rows, width = gate_up.shape
        if width % 2:
            raise KernelShapeError("silu_mul: gate_up must have an even width")
        self._silu_mul(gate_up.data_ptr(), rows, width // 2)
        return gate_up[:, : width // 2]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(name: str, *tensors: torch.Tensor | None) -> None:
    for t in tensors:
        if t is not None and (
            t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous()
        ):
            raise KernelShapeError(f"{name}: every tensor must be a contiguous CPU float32 tensor")


@functools.cache
def load_elementwise_kernels(build_dir: Path, target: KernelTarget = NATIVE) -> ElementwiseKernels:
    """The process's kernels built for ``target``, into ``build_dir`` the first time.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
    """
    return ElementwiseKernels(load_library(SOURCE, build_dir, target))
