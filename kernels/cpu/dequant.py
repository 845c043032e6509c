"""Dequantizing a packed int4 weight in one C++ pass (``dequant_cpu.cpp``).

A prompt pass over quantized weights runs the float GEMM on the weight dequantized
for that pass (radixlm.runtime.layers.quantization). In torch ops that is eight
passes over the matrix (unpack the nibbles, widen, subtract, scale, shift, round);
``DequantKernels.int4`` reads the packed bytes once and writes the float32 or
bfloat16 matrix once (benchmarks/README.md, "CPU engine choices" and "Quantized
weights", has what it buys).

The layout is torch's (``torch._convert_weight_to_int4pack_for_cpu``), described by
its block size, which the caller reads from torch once per process
(``radixlm.runtime.layers.quantization.cpu_int4_block``).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library

__all__ = ["DequantKernels", "load_dequant_kernels"]

SOURCE = Path(__file__).with_name("dequant_cpu.cpp")


class DequantKernels:
    """The built kernels; see the module doc."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._entry = {
            torch.float32: library.radixlm_dequant_int4_f32,
            torch.bfloat16: library.radixlm_dequant_int4_bf16,
        }
        for function in self._entry.values():
            function.argtypes = [ptr, ptr, ptr, i64, i64, i64, i64]
            function.restype = ctypes.c_int

    def int4(
        self,
        packed: torch.Tensor,
        scales_zeros: torch.Tensor,
        out_features: int,
        in_features: int,
        group_size: int,
        block: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """(out_features, in_features) in ``dtype`` (float32 or bfloat16): w = (code - 8)
        * scale + zero, computed in float32 and rounded once.

        packed: torch's packed CPU int4 weight (uint8, out * in / 2 bytes);
        scales_zeros: (in / group, out, 2) bfloat16; block: the layout's rows per block.
        """
        n, k = out_features, in_features
        if packed.dtype != torch.uint8 or packed.numel() * 2 != n * k or not packed.is_contiguous():
            raise KernelShapeError(f"int4: packed must hold {n} x {k} codes, contiguous uint8")
        if scales_zeros.dtype != torch.bfloat16 or scales_zeros.shape != (k // group_size, n, 2):
            raise KernelShapeError(
                f"int4: scales_zeros must be bfloat16 of shape ({k // group_size}, {n}, 2)"
            )
        if dtype not in self._entry:
            raise KernelShapeError(f"int4: dequantizes to float32 or bfloat16, not {dtype}")
        out = torch.empty(n, k, dtype=dtype)
        status = self._entry[dtype](
            packed.data_ptr(), scales_zeros.contiguous().data_ptr(), out.data_ptr(),
            n, k, group_size, block,
        )  # fmt: skip
        if status:
            raise KernelShapeError(
                f"int4: no layout of block {block} holds {n} x {k} in groups of {group_size}"
            )
        return out


@functools.cache
def load_dequant_kernels(build_dir: Path, target: KernelTarget = NATIVE) -> DequantKernels:
    """The process's kernels built for ``target``, into ``build_dir`` the first time.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when they cannot be built.
    """
    return DequantKernels(load_library(SOURCE, build_dir, target))
