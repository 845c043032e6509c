"""The int8-group kernels against plain torch: the product for every row count around
the register tiles (and weight rows around their width), with and without zero
points, both input dtypes; the dequantized matrix; the shapes they refuse."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.int8_group import (
    Int8GroupKernels,
    dequantize_reference,
    load_int8_group_kernels,
    quantize_inputs_reference,
)
from radixlm.kernels.cpu.native import KernelTarget
from radixlm.runtime.model_store import cache_root
from tests import numerics as num


@pytest.fixture(scope="module")
def kernels(kernel_target_and_native: KernelTarget) -> Int8GroupKernels:
    return load_int8_group_kernels(cache_root() / "kernels", kernel_target_and_native)


def _weight(n: int, k: int, group: int, zeros: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, k // group, generator=gen) * 0.01
    zero = torch.randn(n, k // group, generator=gen) * 0.1 if zeros else torch.zeros_like(scale)
    return codes, scale, zero


@pytest.mark.parametrize("zeros", [False, True], ids=["no-zero-points", "zero-points"])
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "n"), [(1, 64), (3, 37), (4, 64), (9, 66), (32, 40)])
def test_products_equal_the_float_product_of_the_stored_weights(
    kernels, m, n, dtype, group, zeros
) -> None:
    """Every term's weight is code * scale (one rounding) plus the group's zero point
    times the group's input sum, so the sum is within gamma_{k + groups + 2} of the
    exact product's magnitude; bfloat16 results round once more. On VNNI dot products
    the weights multiply the inputs as rounded to int8 per 32 (``dot``)."""
    k = 128
    codes, scale, zero = _weight(n, k, group, zeros, seed=m * n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = kernels.matmul(x, codes, scale, zero if zeros else None)
    assert got.dtype == dtype and got.shape == (m, n)
    read = quantize_inputs_reference(x.float()) if kernels.dot(k, group) else x.float()
    scaled = dequantize_reference(codes.double(), scale.double(), None)  # (n, k)
    sums = read.double().reshape(m, -1, group).sum(dim=-1)  # (m, groups)
    want = read.double() @ scaled.t() + sums @ zero.double().t()
    magnitude = read.double().abs() @ scaled.abs().t()
    magnitude += read.double().abs().reshape(m, -1, group).sum(dim=-1) @ zero.double().abs().t()
    bound = num.gamma(k + k // group + 2) * magnitude
    if dtype == torch.bfloat16:
        bound = bound + num.unit_roundoff(torch.bfloat16) * (want.abs() + bound)
    num.assert_within(got, want, bound)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [16, 32])
def test_dequantized_values_are_code_times_scale_plus_zero(kernels, dtype, group) -> None:
    """One FMA per value (one rounding) where torch rounds twice: within 2 units of
    float32 of the value's terms, then one rounding to the output dtype."""
    codes, scale, zero = _weight(48, 96, group, zeros=True)
    got = kernels.dequantize(codes, scale, zero, dtype)
    assert got.dtype == dtype and got.shape == (48, 96)
    want = dequantize_reference(codes.double(), scale.double(), zero.double())
    terms = dequantize_reference(codes.double().abs(), scale.double(), zero.double().abs())
    bound = 2 * num.U * terms + num.unit_roundoff(dtype) * want.abs() * (dtype != torch.float32)
    num.assert_within(got, want, bound)


def test_what_the_kernels_cannot_read_is_refused(kernels) -> None:
    codes, scale, zero = _weight(16, 64, 16, zeros=False)
    x = torch.randn(2, 64)
    with pytest.raises(KernelShapeError, match="x must be float32 or bfloat16"):
        kernels.matmul(x.half(), codes, scale, zero)
    with pytest.raises(KernelShapeError, match="x must be .* \\(M, 64\\)"):
        kernels.matmul(torch.randn(2, 32), codes, scale, zero)
    with pytest.raises(KernelShapeError, match="codes must be contiguous int8"):
        kernels.matmul(x, codes.to(torch.int16), scale, zero)
    with pytest.raises(KernelShapeError, match="scale must be contiguous float32"):
        kernels.matmul(x, codes, scale.double(), zero)
    with pytest.raises(KernelShapeError, match="3 groups do not divide 64"):
        kernels.matmul(x, codes, scale[:, :3].contiguous(), zero[:, :3].contiguous())
    with pytest.raises(KernelShapeError, match="float32 or bfloat16, not torch.float16"):
        kernels.dequantize(codes, scale, zero, torch.float16)
    narrow = 2 * 64 // kernels.lanes  # groups of half a vector
    assert not kernels.supports(kernels.lanes // 2)
    with pytest.raises(KernelShapeError, match="no multiple of"):
        kernels.matmul(x, codes, *(torch.rand(16, narrow),) * 2)
