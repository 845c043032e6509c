"""A grammar's allowed-token bitmask applied to float32 logits in one C++ pass
(``bitmask_cpu.cpp``), for the sampler on CPU.

The contract is ``radixlm.kernels.bitmask.apply_token_bitmask_reference``'s: -inf at
every disallowed token of the masked rows, in place, the rest untouched. The reference
unpacks every bit into a word of its own before masking, a noticeable share of a
decode pass at large batches; this reads each word once and skips words of all ones
(benchmarks/README.md, "CPU engine choices", has what it buys).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from radixlm.kernels.bitmask import check_apply_args
from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.native import NATIVE, KernelTarget, load_library

__all__ = ["TokenBitmaskKernel", "load_token_bitmask_kernel"]

SOURCE = Path(__file__).with_name("bitmask_cpu.cpp")


class TokenBitmaskKernel:
    """The built kernel; see the module doc."""

    def __init__(self, library: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._apply = library.radixlm_apply_token_bitmask
        self._apply.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, i64]
        self._apply.restype = ctypes.c_int

    def apply(
        self, logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
    ) -> None:
        """-inf at every token of logits rows ``indices`` (None: row r for bitmask row r)
        that their bitmask rows forbid, in place.

        Raises:
            ValueError: as the reference, for shapes or dtypes that do not fit together.
            KernelShapeError: logits that are not float32 CPU rows of unit stride.
        """
        check_apply_args(logits, bitmask, indices)
        if logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.stride(1) != 1:
            raise KernelShapeError("token bitmask: logits must be float32 CPU rows of stride 1")
        if indices is None:
            indices = torch.arange(bitmask.shape[0])
        rows = indices.to(torch.int64).contiguous()
        words = bitmask.contiguous()
        status = self._apply(
            logits.data_ptr(), logits.shape[0], logits.stride(0), logits.shape[1],
            words.data_ptr(), words.shape[1], rows.data_ptr(), rows.numel(),
        )  # fmt: skip
        if status:
            raise KernelShapeError(f"token bitmask: rows {rows.tolist()} outside the logits")


@functools.cache
def load_token_bitmask_kernel(build_dir: Path, target: KernelTarget = NATIVE) -> TokenBitmaskKernel:
    """The process's kernel built for ``target``, into ``build_dir`` the first time.

    Raises KernelBuildError (radixlm.kernels.cpu.native) when it cannot be built.
    """
    return TokenBitmaskKernel(load_library(SOURCE, build_dir, target))
