"""Linear: the kernel chosen by ``prepare()`` computes x W^T + b for every row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.small_batch import LINEAR_MAX_ROWS as SMALL_BATCH_MAX_ROWS
from radixlm.kernels.cpu.small_batch import load_small_batch_kernels
from radixlm.runtime.layers.linear import (
    PACKED_MAX_ROWS,
    Linear,
    gemm_dtype,
    packed_bf16_available,
    packed_float32_available,
    prepare_linears,
)
from radixlm.runtime.model_store import cache_root
from tests import numerics as num

needs_packed = pytest.mark.skipif(
    not packed_bf16_available(), reason="this CPU's oneDNN has no bf16 kernels"
)


def _linear(dtype: torch.dtype, bias: bool, seed: int = 0) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(96, 80, bias, dtype, "cpu")
    with torch.no_grad():
        layer.weight.copy_(torch.randn(80, 96, generator=gen))
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(80, generator=gen))
    layer.requires_grad_(False)
    return layer


def _reference(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """The exact product of the stored values, in float64, rounded to the layer dtype."""
    bias = None if layer.bias is None else layer.bias.double()
    return F.linear(x.double(), layer.weight.double(), bias).to(layer.weight.dtype)


def _product(layer: Linear, x: torch.Tensor, weight: torch.Tensor | None = None) -> num.Bounded:
    """x W^T + b computed in float32 from the stored (float32 or bf16) values."""
    w = layer.weight if weight is None else weight
    return num.linear(num.exact(x.reshape(-1, x.shape[-1])), w, layer.bias)


@pytest.mark.parametrize("num_rows", [1, 4, 16, 200])
def test_float32_is_stored_contiguous_with_the_same_values(num_rows: int) -> None:
    """Contiguous (out, in) storage (the few-row kernel's layout), and where oneDNN
    is there a blocked copy that every product runs on; the same values and results."""
    layer = _linear(torch.float32, bias=True)
    before = layer.weight.detach().clone()
    layer.prepare()
    assert (layer.packed is not None) == packed_float32_available()
    assert layer.weight.shape == (80, 96) and layer.weight.is_contiguous()
    assert torch.equal(layer.weight, before)
    layer.prepare()  # idempotent
    assert layer.weight.is_contiguous() and torch.equal(layer.weight, before)
    x = torch.randn(num_rows, 96)
    # oneDNN sums in another order than F.linear
    num.assert_within(
        layer(x), F.linear(x, before, layer.bias), num.between_two(_product(layer, x))
    )


@pytest.mark.parametrize("num_rows", [1, 3, SMALL_BATCH_MAX_ROWS, SMALL_BATCH_MAX_ROWS + 1, 40])
def test_float32_few_rows_take_the_small_batch_kernel(num_rows: int) -> None:
    layer = _linear(torch.float32, bias=True)
    layer.prepare()
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    layer.use_small_batch(kernels)
    x = torch.randn(2, num_rows, 96)  # any leading dims
    want = F.linear(x, layer.weight, layer.bias)
    got = layer(x)
    if 2 * num_rows <= SMALL_BATCH_MAX_ROWS:
        assert torch.equal(
            got, kernels.linear(x.reshape(-1, 96), layer.weight, layer.bias).view(2, num_rows, 80)
        )
        bound = num.between_two(_product(layer, x)).view(2, num_rows, 80)
        num.assert_within(got, want, bound)
    else:  # oneDNN's matmul on the packed copy, or MKL's GEMM where there is none
        num.assert_within(got, want, num.between_two(_product(layer, x)).view(2, num_rows, 80))
    layer.prepare()  # a new layout drops the kernel
    assert layer.small_batch is None


def test_only_contiguous_float32_or_bf16_weights_take_the_small_batch_kernel() -> None:
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    for dtype in (torch.float32, torch.bfloat16):
        layer = _linear(dtype, bias=False)
        layer.weight.data = layer.weight.data.t().contiguous().t()  # an (out, in) view
        with pytest.raises(KernelShapeError, match=r"contiguous \(out, in\) matrix"):
            layer.use_small_batch(kernels)
    half = _linear(torch.float16, bias=False)
    half.prepare()
    with pytest.raises(KernelShapeError, match="float32 or bfloat16"):
        half.use_small_batch(kernels)


@pytest.mark.parametrize("num_rows", [1, 5, SMALL_BATCH_MAX_ROWS + 1])
def test_bf16_few_rows_take_the_small_batch_kernel(num_rows: int) -> None:
    """The kernel computes in float32 and rounds once: the exact product, rounded."""
    layer = _linear(torch.bfloat16, bias=True)
    layer.prepare()
    assert layer.weight.is_contiguous()  # the kernel's layout
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    layer.use_small_batch(kernels)
    # the packed copy as the kernel reads it, where it can (AVX512-BF16, oneDNN's bf16)
    readable = kernels.bf16_blocked and packed_bf16_available()
    assert (layer.blocked is not None) == readable
    x = torch.randn(num_rows, 96).to(torch.bfloat16)
    got = layer(x)
    assert got.dtype == torch.bfloat16
    num.assert_within(got, _reference(layer, x), num.from_exact(_product(layer, x), torch.bfloat16))
    layer.prepare()  # a new copy: the kernel's view of the old one goes
    assert layer.blocked is None and layer.small_batch is None


def test_a_tied_weight_stays_shared() -> None:
    embedding = nn.Embedding(80, 96)
    head = Linear(96, 80, False, torch.float32, "cpu", shared_weight=embedding.weight)
    with pytest.raises(
        ValueError, match=r"shared weight has shape \(80, 96\), expected \(96, 80\)"
    ):
        Linear(80, 96, False, torch.float32, "cpu", shared_weight=embedding.weight)
    expected = embedding(torch.tensor([3, 79]))
    prepare_linears(nn.ModuleList([embedding, head]))
    assert head.weight is embedding.weight and head.weight.is_contiguous()
    assert torch.equal(embedding(torch.tensor([3, 79])), expected)


@needs_packed
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("num_rows", [1, 5, PACKED_MAX_ROWS - 1, PACKED_MAX_ROWS, 300])
def test_bf16_matches_the_exact_product(num_rows: int, bias: bool) -> None:
    layer = _linear(torch.bfloat16, bias)
    layer.prepare()
    assert layer.packed is not None
    x = torch.randn(num_rows, 96).bfloat16()
    with torch.inference_mode():
        out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (num_rows, 80)
    # Both kernels accumulate in float32 and round once.
    num.assert_within(out, _reference(layer, x), num.from_exact(_product(layer, x), torch.bfloat16))


@needs_packed
def test_bf16_takes_3d_and_strided_inputs() -> None:
    layer = _linear(torch.bfloat16, bias=True)
    layer.prepare()
    x = torch.randn(2, 3, 192).bfloat16()[..., ::2]  # (2, 3, 96), not contiguous
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (2, 3, 80)
    bound = num.from_exact(_product(layer, x), torch.bfloat16).view(2, 3, 80)
    num.assert_within(out, _reference(layer, x), bound)


@needs_packed
@pytest.mark.parametrize("native_bf16", [True, False])
def test_bf16_routes_few_rows_to_the_packed_copy(native_bf16: bool) -> None:
    """The packed copy is taken at prepare() time: after the weight changes, few rows
    still see the old weight, and many rows the old one too where the CPU computes bf16
    natively (``many_rows_packed``), else the new one (each path is really used)."""
    layer = _linear(torch.bfloat16, bias=False)
    layer.prepare()
    assert layer.many_rows_packed == (gemm_dtype(torch.bfloat16) == torch.bfloat16)
    layer.many_rows_packed = native_bf16  # both routes, whatever this CPU has
    old = layer.weight.clone()
    with torch.no_grad():
        layer.weight.neg_()
    with torch.inference_mode():
        few = torch.randn(PACKED_MAX_ROWS - 1, 96).bfloat16()
        many = torch.randn(PACKED_MAX_ROWS, 96).bfloat16()
        # each side: float32 sums of exact bf16 products, rounded once to bf16
        few_bound = num.between_two(_product(layer, few, old), torch.bfloat16)
        many_bound = num.between_two(_product(layer, many, old), torch.bfloat16)
        num.assert_within(layer(few), F.linear(few.float(), old.float()).bfloat16(), few_bound)
        sign = 1 if native_bf16 else -1
        want = sign * F.linear(many.float(), old.float()).bfloat16()
        num.assert_within(layer(many), want, many_bound)
        layer.prepare()
        num.assert_within(layer(few), -F.linear(few.float(), old.float()).bfloat16(), few_bound)


def test_prepare_linears_counts_packed_layers() -> None:
    model = nn.Sequential(_linear(torch.bfloat16, True), nn.ReLU(), _linear(torch.float32, False))
    expected = int(packed_bf16_available()) + int(packed_float32_available())
    assert prepare_linears(model) == expected
    assert (model[2].packed is not None) == packed_float32_available()
    half = nn.Sequential(_linear(torch.float16, False))
    assert prepare_linears(half) == 0 and half[0].packed is None


@needs_packed
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_packed_copy_under_torch_compile(bias: bool) -> None:
    """Compiled, few rows go through the ``packed_linear`` op on the packed copy: the
    same numbers as eager, for every row count the dynamic graph serves. A stale
    packed copy (weight negated after prepare) proves the copy is what runs."""
    layer = _linear(torch.bfloat16, bias)
    layer.prepare()
    with torch.no_grad():
        layer.weight.neg_()
    compiled = torch.compile(layer, dynamic=True, fullgraph=True)
    with torch.inference_mode():
        for num_rows in (2, 3, 17):
            x = torch.randn(num_rows, 96).bfloat16()
            eager = layer(x)
            assert torch.equal(compiled(x), eager)
            stale = F.linear(x.float(), -layer.weight.float(), None)
            if bias:
                stale = stale + layer.bias.float()
            bound = num.between_two(_product(layer, x, -layer.weight), torch.bfloat16)
            num.assert_within(eager, stale.bfloat16(), bound)
