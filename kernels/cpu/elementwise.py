"""The eager model's elementwise steps as single C++ passes (float32 or bfloat16 on CPU).

On CPU torch runs ``F.rms_norm`` as five ops (pow, mean, add, rsqrt, two muls),
RoPE as four and SwiGLU's ``silu(gate) * up`` as two over a strided half of the
projection. ``ElementwiseKernels`` runs each as one OpenMP pass over the rows,
from the same library as the few-row kernels (``small_batch_cpu.cpp``):

- ``add_rms_norm``: residual += x; returns rmsnorm(residual) * weight.
- ``rope``: in place on a fused QKV projection's q and k heads: per-head
  RMSNorm (Qwen3) if given, then the rotate-half rotation.
- ``silu_mul``: in place on a fused gate/up projection: gate = silu(gate) * up.

A bfloat16 row is widened to float32, computed as a float32 row is, and rounded
once (torch rounds after each of its ops); the residual stream stays bfloat16, its
sum rounded before it is normed, as torch's in-place add rounds it.

The model calls them in its eager passes of float32 or bfloat16 on CPU once the
runtime attaches them (``DecoderForCausalLM.use_elementwise_kernels``); compiled graphs keep
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

__all__ = ["ROW_DTYPES", "ElementwiseKernels", "load_elementwise_kernels"]

ROW_DTYPES = (torch.float32, torch.bfloat16)  # what the rows may hold


class ElementwiseKernels:
    """The built kernels; see the module doc. Rows are CPU float32 or bfloat16 (a
    bfloat16 row is computed in float32 and rounded once); norm weights are float32 or
    the rows' dtype; cos/sin the rows' dtype."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        norm_args = [ptr, ptr, ptr, f32, ptr, i64, i64]
        rope_args = [ptr, i64, i64, i64, i64, i64, ptr, ptr, f32, ptr, ptr]
        # (rows' dtype, weights' dtype) -> function
        self._add_rms_norm = {
            (torch.float32, torch.float32): library.radixlm_add_rms_norm_f32,
            (torch.bfloat16, torch.bfloat16): library.radixlm_add_rms_norm_bf16_wbf16,
            (torch.bfloat16, torch.float32): library.radixlm_add_rms_norm_bf16_wf32,
        }
        self._rope = {
            (torch.float32, torch.float32): library.radixlm_rope_f32,
            (torch.bfloat16, torch.bfloat16): library.radixlm_rope_bf16_wbf16,
            (torch.bfloat16, torch.float32): library.radixlm_rope_bf16_wf32,
        }
        self._silu_mul = {
            torch.float32: library.radixlm_silu_mul_f32,
            torch.bfloat16: library.radixlm_silu_mul_bf16,
        }
        for function in self._add_rms_norm.values():
            function.argtypes, function.restype = norm_args, ctypes.c_int
        for function in self._rope.values():
            function.argtypes, function.restype = rope_args, ctypes.c_int
        for function in self._silu_mul.values():
            function.argtypes, function.restype = [ptr, i64, i64], ctypes.c_int

    def add_rms_norm(
        self, residual: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """residual (T, n), contiguous, += x (same shape and dtype) unless None; returns
        rmsnorm(residual) * weight (n,) as a new (T, n) tensor."""
        _check("add_rms_norm", residual, x)
        _check_weights("add_rms_norm", residual.dtype, weight)
        if x is not None and (x.shape != residual.shape or x.dtype != residual.dtype):
            raise KernelShapeError("add_rms_norm: x must have the residual's shape and dtype")
        if weight.shape != (residual.shape[1],):
            raise KernelShapeError(f"add_rms_norm: weight must have shape ({residual.shape[1]},)")
        rows, n = residual.shape
        out = torch.empty_like(residual)
        self._add_rms_norm[(residual.dtype, weight.dtype)](
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
        rotated in place by cos/sin (T, D/2, qkv's dtype); norms: (q weight, k weight,
        eps) of a per-head RMSNorm applied first."""
        q_norm, k_norm, eps = norms if norms is not None else (None, None, 0.0)
        _check("rope", cos, sin)
        rows, heads, head_dim = qkv.shape
        if qkv.dtype not in ROW_DTYPES or qkv.device.type != "cpu" or head_dim % 2:
            raise KernelShapeError(
                "rope: qkv must be a CPU float32 or bfloat16 (T, heads, even D) tensor"
            )
        if qkv.stride(2) != 1 or qkv.stride(1) != head_dim or q_heads + kv_heads > heads:
            raise KernelShapeError("rope: each row of qkv must be contiguous heads")
        if cos.shape != (rows, head_dim // 2) or sin.shape != cos.shape:
            raise KernelShapeError(f"rope: cos and sin must have shape ({rows}, {head_dim // 2})")
        if cos.dtype != qkv.dtype or sin.dtype != qkv.dtype:
            raise KernelShapeError("rope: cos and sin must have qkv's dtype")
        weights = qkv.dtype
        if q_norm is not None and k_norm is not None:
            _check("rope", q_norm, k_norm)
            _check_weights("rope", qkv.dtype, q_norm)
            if k_norm.dtype != q_norm.dtype:
                raise KernelShapeError("rope: q_norm and k_norm must have one dtype")
            weights = q_norm.dtype
        self._rope[(qkv.dtype, weights)](
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
        self._silu_mul[gate_up.dtype](gate_up.data_ptr(), rows, width // 2)
        return gate_up[:, : width // 2]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(name: str, *tensors: torch.Tensor | None) -> None:
    for t in tensors:
        if t is not None and (
            t.dtype not in ROW_DTYPES or t.device.type != "cpu" or not t.is_contiguous()
        ):
            raise KernelShapeError(
                f"{name}: every tensor must be a contiguous CPU float32 or bfloat16 tensor"
            )


def _check_weights(name: str, rows: torch.dtype, weight: torch.Tensor) -> None:
    """Norm weights are float32 or the rows' dtype (float32 rows: float32 only)."""
    if weight.dtype not in (rows, torch.float32):
        raise KernelShapeError(f"{name}: norm weights must be float32 or {rows}")


@functools.cache
def load_elementwise_kernels(build_dir: Path, target: KernelTarget = NATIVE) -> ElementwiseKernels:
    """The process's kernels built for ``target``, into ``build_dir`` the first time.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
    """
    return ElementwiseKernels(load_library(SOURCE, build_dir, target))
