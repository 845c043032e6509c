"""The C++ int4 dequantizer against the torch ops it replaces: the same values, bit
for bit, for torch's packed layout (whole blocks and a tail) in both output dtypes."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.dequant import DequantKernels, load_dequant_kernels
from radixlm.kernels.cpu.native import KernelTarget
from radixlm.runtime.layers.quantization import Int4Weight, cpu_int4_block
from radixlm.runtime.model_store import cache_root


@pytest.fixture(scope="module")
def kernels(kernel_target: KernelTarget) -> DequantKernels:
    return load_dequant_kernels(cache_root() / "kernels", kernel_target)


def _weight(out: int, inp: int, group: int) -> Int4Weight:
    gen = torch.Generator().manual_seed(out + inp)
    weight = Int4Weight(out, inp, group, torch.bfloat16, "cpu")
    weight.rows(0, out).copy_(torch.randn(out, inp, generator=gen) * 3)
    weight.pack()
    return weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("out", "inp", "group"), [(128, 64, 32), (96, 128, 64), (160, 256, 128), (16, 32, 32)]
)
def test_int4_equals_the_torch_dequantization(kernels, dtype, out, inp, group) -> None:
    """96 and 160 rows end in a partial block (16: all partial)."""
    weight = _weight(out, inp, group)
    want = weight.dequantize(dtype)  # no kernel attached: the torch ops
    block = cpu_int4_block()
    got = kernels.int4(weight.packed, weight.scales_zeros, out, inp, group, block, dtype)
    assert got.dtype == dtype and torch.equal(got, want)
    weight.dequantizer = kernels  # what use_dequant_kernels attaches
    assert torch.equal(weight.dequantize(dtype), want)


def test_shapes_that_cannot_be_are_refused(kernels) -> None:
    weight = _weight(32, 64, 32)
    args = (weight.packed, weight.scales_zeros)
    with pytest.raises(KernelShapeError, match="must hold 64 x 64"):
        kernels.int4(*args, 64, 64, 32, 64, torch.float32)
    with pytest.raises(KernelShapeError, match="scales_zeros"):
        kernels.int4(*args, 32, 64, 64, 64, torch.float32)
    with pytest.raises(KernelShapeError, match="float32 or bfloat16"):
        kernels.int4(*args, 32, 64, 32, 64, torch.float16)
    with pytest.raises(KernelShapeError, match="no layout of block 3"):
        kernels.int4(*args, 32, 64, 32, 3, torch.float32)
