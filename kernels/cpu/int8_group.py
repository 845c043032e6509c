"""int8 weights in groups, with a float32 scale and zero point per group
(``int8_group_cpu.cpp``): the product of a few rows and the dequantized matrix.

    w[n][k] = q[n][k] * scale[n][k / group] + zero[n][k / group]

This is where llama.cpp's 5-, 6- and 8-bit blocks are held exactly (Q8_0, Q5_0,
Q5_1, Q5_K, Q6_K: radixlm.runtime.model_store.gguf_weights); torch has no kernel for
int8 in groups. ``matmul`` reads the codes once (a decode pass); ``dequantize`` writes
the float matrix a prompt pass's GEMM takes. ``*_reference`` are the same in torch.

Where the build has AVX512-VNNI (``dot``), ``matmul`` runs on int8 dot products of
its inputs quantized per 32, as llama.cpp's Q8_0 activations are (``int8_dot_cpu.h``;
``dot_matmul_reference``): one instruction for 64 products, the inputs rounded to
8 bits (about 0.4% of a group's largest value at most).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library

__all__ = [
    "DOT_GROUP",
    "Int8GroupKernels",
    "dequantize_reference",
    "dot_matmul_reference",
    "load_int8_group_kernels",
    "matmul_reference",
    "quantize_inputs_reference",
]

SOURCE = Path(__file__).with_name("int8_group_cpu.cpp")
_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}
DOT_GROUP = 32  # inputs per activation scale of the dot products (int8_dot_cpu.h)


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
        self._dot = library.radixlm_int8_group_dot
        self._dot.argtypes, self._dot.restype = [i64, i64], ctypes.c_int

    def dot(self, k: int, group_size: int) -> bool:
        """Whether ``matmul`` of k inputs in groups of ``group_size`` runs on VNNI dot
        products of int8-quantized inputs here (``dot_matmul_reference``'s numbers)."""
        return bool(self._dot(k, group_size))

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


def quantize_inputs_reference(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) as the dot products read it: each 32 of a row rounded to
    int8 x dx, dx = max|x| / 127 (float32), values round(x / dx) (ties to even;
    0 where dx is 0). Returns those values (M, K) float32."""
    m, k = x.shape
    groups = x.float().reshape(m, k // DOT_GROUP, DOT_GROUP)
    dx = groups.abs().amax(dim=-1, keepdim=True) / 127
    codes = torch.where(dx > 0, torch.round(groups / dx), torch.zeros_like(groups))
    return (codes.clamp(-127, 127) * dx).reshape(m, k)


def dot_matmul_reference(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None
) -> torch.Tensor:
    """(M, N) float32: what ``matmul`` computes on dot products: the stored weights
    times the inputs as ``quantize_inputs_reference`` rounds them."""
    return quantize_inputs_reference(x.float()) @ dequantize_reference(codes, scale, zero).t()


@functools.cache
def load_int8_group_kernels(build_dir: Path, target: KernelTarget = NATIVE) -> Int8GroupKernels:
    """The process's kernels built for ``target``, into ``build_dir`` the first time.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
    """
    return Int8GroupKernels(load_library(SOURCE, build_dir, target))
