"""small_batch_quant_cpu.cpp's products over stored weights (``quant_linear``):
int4 codes in torch's packed CPU layout (whole blocks and the rows past them),
int8 codes in groups with and without zero points, int8 per row; held to the
dequantized weight's float32 product, for 1 to 9 rows; and bfloat16 weights in
oneDNN's blocked layout (``BlockedMatrix``), held to the exact product. The decode step over such
weights is tested with the model (tests/runtime/executor/test_small_batch_quantized_weights.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.int8_group import quantize_inputs_reference
from radixlm.kernels.cpu.native import KernelTarget
from radixlm.kernels.cpu.small_batch import (
    INT4,
    INT8,
    BlockedMatrix,
    QuantizedMatrix,
    SmallBatchKernels,
    load_small_batch_kernels,
)
from radixlm.runtime.executor.small_batch import _matrix
from radixlm.runtime.layers.linear import packed_bf16_available
from radixlm.runtime.layers.quantization import (
    Int4Weight,
    Int8Codes,
    Int8GroupWeight,
    Int8Weight,
    QuantizedLinear,
    QuantizedWeight,
    cpu_int4_block,
)
from radixlm.runtime.model_store import cache_root

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def kernels(kernel_target_and_native: KernelTarget) -> SmallBatchKernels:
    return load_small_batch_kernels(cache_root() / "kernels", kernel_target_and_native)


def _linear(kind: str, out_features: int, in_features: int, seed: int) -> QuantizedLinear:
    """A quantized layer with a bfloat16 bias, from random float rows."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=generator)
    weight = {
        "int4": lambda: Int4Weight(out_features, in_features, 32, BF16, "cpu"),
        "int8g": lambda: Int8GroupWeight(out_features, in_features, 16, BF16, "cpu"),
        "int8": lambda: Int8Weight(out_features, in_features, BF16, "cpu"),
    }[kind]()
    weight.quantize_rows(0, w)
    if kind == "int8g":  # zero points too (GGUF's Q4_1 / Q5_1 / Q5_K blocks have them)
        held = Int8Codes(weight.codes, weight.scales, 0.1 * torch.randn(weight.scales.shape))
        weight.set_codes(0, held)
    weight.pack()
    linear = QuantizedLinear(weight, True, BF16, "cpu")
    linear.bias.data = torch.randn(out_features, generator=generator).to(BF16)
    return linear


def product_reference(x: torch.Tensor, weight: QuantizedWeight, dot: bool) -> torch.Tensor:
    """x (rows, in) float32 times the quantized weight as the kernels compute it:
    times its dequantized values, the inputs as they are or, on dot products
    (``dot``), as rounded to int8 per 32. float32 (computed in float64)."""
    read = quantize_inputs_reference(x) if dot else x
    return (read.double() @ weight.dequantize(torch.float32).double().t()).float()


@pytest.mark.parametrize("kind", ["int4", "int8g", "int8"])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (160, 128), (96, 64)])
@pytest.mark.parametrize("rows", [1, 3, 4, 9])
def test_quant_linear_is_the_dequantized_product(
    kernels, kind: str, shape: tuple[int, int], rows: int
) -> None:
    """(160, 128) and (96, 64) have int4 rows past the last whole block."""
    if kind == "int4" and not cpu_int4_block():
        pytest.skip("torch's int4 layout on this CPU is not one radixlm reads")
    linear = _linear(kind, *shape, seed=rows)
    matrix = _matrix(linear)
    assert isinstance(matrix, QuantizedMatrix)
    assert matrix.kind == (INT4 if kind == "int4" else INT8)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(7))
    got = kernels.quant_linear(x, matrix, linear.bias)
    # on VNNI dot products the inputs are rounded to int8 per 32
    want = product_reference(x, linear.qweight, kernels.dot_products(matrix))
    want = want + linear.bias.float()
    # float32 sums of up to 1,536 terms (the int4 reference in float64)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-4)
    # without a bias
    alone = kernels.quant_linear(x[-1:].contiguous(), matrix)
    torch.testing.assert_close(alone, want[-1:] - linear.bias.float(), rtol=1e-5, atol=1e-4)
    # a row's result does not depend on the rows beside it, bit for bit (a row alone
    # takes one-row tiles, in a batch it shares tiles of several)
    for r in range(rows):
        assert torch.equal(kernels.quant_linear(x[r : r + 1], matrix, linear.bias), got[r : r + 1])


def test_int8_zero_points_are_applied(kernels) -> None:
    linear = _linear("int8g", 64, 64, seed=0)
    matrix = _matrix(linear)
    assert matrix.zeros is not None and bool(matrix.zeros.ne(0).any())
    without = dataclasses.replace(matrix, zeros=None)
    x = torch.ones(1, 64)
    offset = kernels.quant_linear(x, matrix) - kernels.quant_linear(x, without)
    groups = matrix.zeros.view(64, 4, 1).expand(64, 4, 16).sum(dim=(1, 2))  # zero x 16 inputs
    torch.testing.assert_close(offset[0], groups, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"group": 24}, "group 24 must divide its 64 inputs"),
        ({"kind": 7}, "unknown kind 7"),
        ({"block": 24}, "blocks of 24 rows do not suit this build"),
        ({"shape": (64, 32)}, "must hold 64 x 32 packed codes"),
    ],
)
def test_an_int4_matrix_the_build_cannot_read_is_refused(kernels, change: dict, message) -> None:
    if not cpu_int4_block():
        pytest.skip("torch's int4 layout on this CPU is not one radixlm reads")
    matrix = dataclasses.replace(_matrix(_linear("int4", 64, 64, seed=1)), **change)
    x = torch.zeros(1, matrix.shape[1])
    with pytest.raises(KernelShapeError, match=message):
        kernels.quant_linear(x, matrix)


def test_int8_groups_must_be_whole_vectors(kernels) -> None:
    matrix = _matrix(_linear("int8", 64, 64, seed=2))
    odd = dataclasses.replace(
        matrix, group=4, scales=torch.ones(64, 16)
    )  # 4 inputs a group: no vector width
    with pytest.raises(KernelShapeError, match="int8 groups of 4 are no multiple"):
        kernels.quant_linear(torch.zeros(1, 64), odd)
    with pytest.raises(KernelShapeError, match="x must be contiguous with 64 columns"):
        kernels.quant_linear(torch.zeros(1, 63), matrix)


# bfloat16 weights in oneDNN's blocked layout (BlockedMatrix): the copy Linear.prepare
# makes for oneDNN's matmul, read by the same products.


def _blocked(kernels: SmallBatchKernels, weight: torch.Tensor) -> BlockedMatrix | None:
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
    return kernels.blocked_matrix(weight, packed)


def _bf16_weight(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(out_features, in_features, generator=generator) * 0.1).to(BF16)


needs_onednn_bf16 = pytest.mark.skipif(
    not packed_bf16_available(), reason="this torch's oneDNN has no bfloat16 kernels here"
)


@needs_onednn_bf16
@pytest.mark.parametrize(
    "shape", [(960, 576), (576, 1536), (100, 64), (17, 32), (3072, 128), (80, 136), (70, 31)]
)
@pytest.mark.parametrize("rows", [1, 3, 4, 6, 7, 9, 13])
def test_blocked_bf16_is_the_weight_times_the_rounded_inputs(
    kernels, shape: tuple[int, int], rows: int
) -> None:
    """Output rows in whole blocks of 64 and past them (100, 17, 80, 70); inputs padded
    to a multiple of 32 (136, 31: an odd last one); input rows 6 at a time (7, 9, 13:
    a chunk more). A build without AVX512-BF16 refuses it."""
    weight = _bf16_weight(*shape, seed=rows)
    matrix = _blocked(kernels, weight)
    if not kernels.bf16_blocked:
        assert matrix is None
        return
    assert isinstance(matrix, BlockedMatrix) and matrix.shape == shape
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, shape[1], generator=generator)
    bias = torch.randn(shape[0], generator=generator).to(BF16)
    got = kernels.quant_linear(x, matrix, bias)
    # the inputs rounded to bfloat16, products exact in float32, float32 sums
    exact = x.to(BF16).double() @ weight.double().t() + bias.double()
    torch.testing.assert_close(got, exact.float(), rtol=1e-4, atol=1e-4)
    # a row's result does not depend on the rows beside it, bit for bit
    for r in range(rows):
        assert torch.equal(kernels.quant_linear(x[r : r + 1], matrix, bias), got[r : r + 1])


@needs_onednn_bf16
def test_a_blocked_copy_of_other_values_is_refused(kernels) -> None:
    """``blocked_matrix`` compares every value of the copy with the weight's."""
    if not kernels.bf16_blocked:
        pytest.skip("this build has no AVX512-BF16 dot products")
    weight = _bf16_weight(96, 64, seed=3)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
    assert kernels.blocked_matrix(weight, packed) is not None
    other = weight.clone()
    other[95, 63] += 1  # the last value of the last (padded) block
    assert kernels.blocked_matrix(other, packed) is None
    assert kernels.blocked_matrix(weight.float(), packed) is None  # not bfloat16
    assert kernels.blocked_matrix(weight, weight) is None  # not oneDNN's copy
    padded = _bf16_weight(64, 33, seed=4)  # 33 inputs padded to 64 in the copy
    matrix = kernels.blocked_matrix(padded, torch.ops.mkldnn._reorder_linear_weight(padded, 1))
    assert matrix is not None and matrix.padded_in == 64
