"""int8 weights in groups, with a float32 scale and zero point per group
(``int8_group_cpu.cpp``): the product of a few rows and the dequantized matrix.

    w[n][k] = q[n][k] * scale[n][k / group] + zero[n][k / group]

This is where llama.cpp's 5-, 6- and 8-bit blocks are held exactly (Q8_0, Q5_0,
Q5_1, Q5_K, Q6_K: radixlm.runtime.model_store.gguf_weights); torch has no kernel for
int8 in groups. ``matmul`` reads the codes once (a decode pass); ``dequantize`` writes
the float matrix a prompt pass's GEMM takes. ``*_reference`` are the same in torch.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library

__all__ = [
    "Int8GroupKernels",
    "dequantize_reference",
    "load_int8_group_kernels",
    "matmul_reference",
]

SOURCE = Path(__file__).with_name("int8_group_cpu.cpp")
_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}


class Int8GroupKernels:
    """The built kernels; see the module doc."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self.lanes = int(library.radixlm_vector_lanes())
        self._gemm, self._dequantize = {}, {}
        for dtype, suffix in _SUFFIXES.items():
            gemm = getattr(library, f"radixlm_int8_group_gemm_{suffix}")
            gemm.argtypes = [ptr] * 5 + [i64] * 4
            dequantize = getattr(library, f"radixlm_int8_group_dequantize_{suffix}")
            dequantize.argtypes = [ptr] * 4 + [i64] * 3
            gemm.restype = dequantize.restype = ctypes.c_int
            self._gemm[dtype], self._dequantize[dtype] = gemm, dequantize

    def supports(self, group_size: int) -> bool:
        """Whether a group is whole vectors of this build (16 floats on AVX-512)."""
        return group_size % self.lanes == 0

    def matmul(
        self,
        x: torch.Tensor,
        codes: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
    ) -> torch.Tensor:
        """x (M, K) float32 or bfloat16 -> (M, N) in x's dtype; codes (N, K) int8;
        scale, zero (N, K / group) float32 (zero None: every zero point 0)."""
        group = _check(codes, scale, zero)
        if x.dtype not in self._gemm or x.dim() != 2 or x.shape[1] != codes.shape[1]:
            raise KernelShapeError(
                f"int8 group: x must be float32 or bfloat16 (M, {codes.shape[1]}), "
                f"got {x.dtype} {tuple(x.shape)}"
            )
        x = x.contiguous()
        y = torch.empty(x.shape[0], codes.shape[0], dtype=x.dtype)
        status = self._gemm[x.dtype](
            x.data_ptr(), codes.data_ptr(), scale.data_ptr(), _pointer(zero), y.data_ptr(),
            x.shape[0], codes.shape[0], codes.shape[1], group,
        )  # fmt: skip
        _raise_for(status, group, self.lanes)
        return y

    def dequantize(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        zero: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """(N, K) in ``dtype`` (float32 or bfloat16), computed in float32, rounded once."""
        group = _check(codes, scale, zero)
        if dtype not in self._dequantize:
            raise KernelShapeError(f"int8 group: dequantizes to float32 or bfloat16, not {dtype}")
        out = torch.empty(codes.shape, dtype=dtype)
        status = self._dequantize[dtype](
            codes.data_ptr(), scale.data_ptr(), _pointer(zero), out.data_ptr(),
            codes.shape[0], codes.shape[1], group,
        )  # fmt: skip
        _raise_for(status, group, self.lanes)
        return out


def _pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> int:
    """The group size; raises KernelShapeError for tensors the kernels cannot read."""
    if codes.dtype != torch.int8 or codes.dim() != 2 or not codes.is_contiguous():
        raise KernelShapeError("int8 group: codes must be contiguous int8 (N, K)")
    n, k = codes.shape
    for name, t in (("scale", scale), ("zero", scale if zero is None else zero)):
        if t.dtype != torch.float32 or t.dim() != 2 or t.shape[0] != n or not t.is_contiguous():
            raise KernelShapeError(f"int8 group: {name} must be contiguous float32 ({n}, groups)")
    if (zero is not None and scale.shape != zero.shape) or k % scale.shape[1]:
        raise KernelShapeError(f"int8 group: {scale.shape[1]} groups do not divide {k} inputs")
    return k // scale.shape[1]


def _raise_for(status: int, group: int, lanes: int) -> None:
    if status:
        raise KernelShapeError(f"int8 group: a group of {group} is no multiple of {lanes} lanes")


def dequantize_reference(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None
) -> torch.Tensor:
    """(N, K) in scale's dtype."""
    n, k = codes.shape
    grouped = codes.reshape(n, scale.shape[1], -1).to(scale.dtype) * scale[..., None]
    if zero is not None:
        grouped = grouped + zero[..., None]
    return grouped.reshape(n, k)


def matmul_reference(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None
) -> torch.Tensor:
    """(M, N) float32."""
    return x.float() @ dequantize_reference(codes, scale, zero).t()


@functools.cache
def load_int8_group_kernels(build_dir: Path, target: KernelTarget = NATIVE) -> Int8GroupKernels:
    """The process's kernels built for ``target``, into ``build_dir`` the first time.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
    """
    return Int8GroupKernels(load_library(SOURCE, build_dir, target))
