"""Quantized weights: what they store, and that their products are the float products
of what they store, for every row count and both kernels (packed, dequantized)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.cpu.int8_group import load_int8_group_kernels
from radixlm.kernels.cpu.small_batch import load_small_batch_kernels
from radixlm.runtime.layers.factory import LayerFactory, prepare_layers
from radixlm.runtime.layers.linear import gemm_dtype
from radixlm.runtime.layers.quantization import (
    FEW_ROWS_MAX,
    Int4Codes,
    Int4Weight,
    Int8Codes,
    Int8GroupWeight,
    Int8Weight,
    Quantization,
    QuantizationError,
    QuantizedEmbedding,
    QuantizedLinear,
    RowBlocks,
    cpu_int4_block,
    quant_kernel_max_rows,
    unpack_cpu_int4,
)
from radixlm.runtime.model_store import cache_root
from tests import numerics as num
from tests.kernels.cpu.test_small_batch_quant import product_reference

BF16 = torch.bfloat16


def _weights(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen)


def _layer(quantization: Quantization, w: torch.Tensor, bias: bool) -> QuantizedLinear:
    layer = LayerFactory(BF16, "cpu", quantization).linear(w.shape[1], w.shape[0], bias)
    assert isinstance(layer, QuantizedLinear)
    layer.qweight.rows(0, w.shape[0]).copy_(w)
    if layer.bias is not None:
        layer.bias.data.copy_(torch.linspace(-1, 1, w.shape[0]))
    layer.prepare()
    return layer


def test_int8_rows_round_to_the_nearest_step_of_their_own_scale() -> None:
    w = _weights(48, 64)
    weight = Int8Weight(48, 64, BF16, "cpu")
    weight.rows(0, 48).copy_(w)
    scale = weight.scales.float()
    assert torch.equal(weight.scales, (w.abs().amax(1) / 127).to(BF16))
    assert int(weight.qweight.abs().max()) <= 127
    num.assert_within(weight.dequantize(torch.float32), w, scale[:, None] / 2 * (1 + 2**-7))


def test_int4_groups_span_their_minimum_to_maximum_in_16_steps() -> None:
    w = _weights(32, 128)
    weight = Int4Weight(32, 128, 32, BF16, "cpu")
    weight.rows(0, 32).copy_(w)
    assert weight.codes is None  # on a CPU the codes go straight into the packed layout
    assert int(weight._unpacked_codes().max()) <= 15
    scale = weight.scales_zeros[..., 0].t().float().repeat_interleave(32, dim=1)  # (out, in)
    zero = weight.scales_zeros[..., 1].t().float().repeat_interleave(32, dim=1)
    # half a step, plus what rounding the zero point to bf16 moved it (code 8's value)
    bound = scale / 2 + zero.abs() * 2**-8
    num.assert_within(weight.dequantize(torch.float32), w, bound)


@pytest.mark.parametrize("out_features", [16, 32, 64, 96, 960])
def test_torch_int4_layout_is_read_back_exactly(out_features: int) -> None:
    """The packed layout (torch's, per CPU) unpacks to the codes that went in: the
    many-row path dequantizes from it."""
    assert cpu_int4_block() in (16, 32, 64)
    codes = torch.randint(0, 16, (out_features, 64), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert torch.equal(unpack_cpu_int4(packed, out_features, 64).to(torch.int32), codes)


def test_a_matrix_filled_part_by_part_equals_one_filled_whole() -> None:
    """Rows quantize independently: fused parts (or a shard's rows) fill alike."""
    w = _weights(96, 64)
    for quantization in (Quantization("int8"), Quantization("int4", 32)):
        whole = quantization.weight(96, 64, BF16, "cpu")
        whole.rows(0, 96).copy_(w)
        parts = quantization.weight(96, 64, BF16, "cpu")
        for start, stop in ((0, 48), (48, 64), (64, 96)):
            parts.rows(start, stop).copy_(w[start:stop])
        whole.pack(), parts.pack()
        assert torch.equal(whole.dequantize(torch.float32), parts.dequantize(torch.float32))


@pytest.mark.parametrize("out_features", [16, 80, 96, 160, 960])
def test_int4_codes_packed_as_their_rows_arrive_equal_codes_packed_whole(
    out_features: int,
) -> None:
    """A CPU int4 weight keeps no byte a code: each block of the layout is packed once
    its rows are in, whichever order and cuts they come in (a fused layer's parts, a
    shard's rows), to the bytes the whole matrix packs to."""
    codes = torch.randint(0, 16, (out_features, 64), dtype=torch.uint8)
    whole = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    cuts = sorted({0, out_features, *(int(c) for c in torch.randint(1, out_features, (5,)))})
    pieces = list(zip(cuts, cuts[1:]))
    weight = Int4Weight(out_features, 64, 32, BF16, "cpu")
    assert weight.codes is None and weight.packed is not None
    for start, stop in reversed(pieces):
        scale, zero = torch.ones(stop - start, 2), torch.zeros(stop - start, 2)
        weight.rows(start, stop).copy_(Int4Codes(codes[start:stop], scale, zero))
    weight.pack()
    assert torch.equal(weight.packed.view(torch.uint8).reshape(-1), whole.reshape(-1))


def test_a_matrix_read_by_row_blocks_fills_as_it_does_whole() -> None:
    """RowBlocks: rows read a block at a time, codes kept or float values quantized."""
    codes, w = _int4_codes(96, 64), _weights(96, 64)
    sources = [
        ("int4", codes, lambda a, b: codes.row_range(a, b)),
        ("int8g", codes, lambda a, b: codes.row_range(a, b)),
        ("int4", w, lambda a, b: w[a:b]),
    ]
    for method, source, read in sources:
        quantization = Quantization(method, 32)  # type: ignore[arg-type]
        whole = quantization.weight(96, 64, BF16, "cpu")
        whole.rows(0, 96).copy_(source)
        by_blocks = quantization.weight(96, 64, BF16, "cpu")
        by_blocks.rows(0, 96).copy_(RowBlocks(torch.Size((96, 64)), read, 32))
        whole.pack(), by_blocks.pack()
        assert torch.equal(whole.dequantize(torch.float32), by_blocks.dequantize(torch.float32))


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("num_rows", [1, 7, FEW_ROWS_MAX, FEW_ROWS_MAX + 1, 100])
def test_products_are_the_float_products_of_the_stored_weights(method: str, num_rows: int) -> None:
    """Packed kernel up to FEW_ROWS_MAX rows, dequantized GEMM above: each the product
    of the bf16 input and the dequantized weight, computed in float32, rounded once."""
    w = _weights(80, 128)
    layer = _layer(Quantization(method, 32), w, bias=True)
    stored = layer.qweight.dequantize(torch.float32)
    x = torch.randn(2, num_rows, 128).to(BF16)  # any leading dims
    got = layer(x)
    assert got.dtype == BF16 and got.shape == (2, num_rows, 80)
    product = num.linear(num.exact(x.reshape(-1, 128)), stored, layer.bias)
    bound = num.from_exact(product, rounded_to=BF16)
    # the packed kernels round x W^T to bf16 before adding the bias (one rounding more)
    unbiased = num.linear(num.exact(x.reshape(-1, 128)), stored).value.abs()
    bound = bound + 2 * num.unit_roundoff(BF16) * (unbiased + product.value.abs())
    if 2 * num_rows > FEW_ROWS_MAX and gemm_dtype(BF16) == BF16:
        # a native-bf16 CPU's GEMM takes the dequantized weight rounded to bf16
        magnitude = x.reshape(-1, 128).double().abs() @ stored.double().abs().t()
        bound = bound + num.unit_roundoff(BF16) * magnitude
    want = product.value.to(BF16).view(2, num_rows, 80)
    num.assert_within(got, want, bound.view(2, num_rows, 80))


def test_a_tied_quantized_vocabulary_is_one_int8_matrix() -> None:
    factory = LayerFactory(BF16, "cpu", Quantization("int4", 32))
    embedding, head = factory.vocab_layers(64, 32, tied=True)
    assert isinstance(embedding, QuantizedEmbedding) and isinstance(head.qweight, Int8Weight)
    assert embedding.qweight is head.qweight
    w = _weights(64, 32)
    head.qweight.rows(0, 64).copy_(w)
    prepare_layers(torch.nn.ModuleList([embedding, head]))
    ids = torch.tensor([3, 0, 63, 3])
    want = head.qweight.dequantize(BF16)[ids]
    assert torch.equal(embedding(ids), want)
    untied, _ = factory.vocab_layers(64, 32, tied=False)
    assert untied.qweight is not head.qweight


def test_widths_the_kernels_cannot_take_are_refused_with_the_reason() -> None:
    with pytest.raises(QuantizationError, match="group size 128 does not divide .* 576"):
        Int4Weight(64, 576, 128, BF16, "cpu")
    with pytest.raises(QuantizationError, match="multiple of 16"):
        Int4Weight(40, 64, 32, BF16, "cpu")
    with pytest.raises(QuantizationError, match="one of"):
        Quantization("int3")  # type: ignore[arg-type]
    with pytest.raises(QuantizationError, match="group size must be one of"):
        Quantization("int4", 48)
    assert issubclass(QuantizationError, ValueError)


def test_quantized_bytes_are_a_half_and_a_quarter_of_bf16() -> None:
    int8 = _layer(Quantization("int8"), _weights(256, 512), bias=False).qweight
    int4 = _layer(Quantization("int4", 64), _weights(256, 512), bias=False).qweight
    bf16 = 256 * 512 * 2
    assert int8.nbytes() == bf16 // 2 + 256 * 2  # one bf16 scale a row
    assert int4.nbytes() == bf16 // 4 + (512 // 64) * 256 * 2 * 2  # a scale and zero a group
    assert int4.codes is None  # the one-per-byte codes are gone once packed


def test_float_reference_matches_a_plain_linear_on_the_dequantized_weight() -> None:
    """End to end through the factory: a quantized layer is F.linear on its values."""
    w = _weights(64, 64, seed=3)
    layer = _layer(Quantization("int8"), w, bias=False)
    x = torch.randn(3, 64).to(BF16)
    want = F.linear(x.float(), layer.qweight.dequantize(torch.float32))
    num.assert_within(layer(x).float(), want, want.abs() * 2**-7 + 1e-3)


def _int4_codes(rows: int, cols: int) -> Int4Codes:
    gen = torch.Generator().manual_seed(rows)
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=gen)
    scale = torch.rand(rows, cols // 32, generator=gen)
    return Int4Codes(codes, scale, torch.randn(rows, cols // 32, generator=gen))


def test_int8_groups_hold_int4_and_int8_codes_exactly() -> None:
    """A GGUF layer whose parts are Q4_* and Q6_K (groups of 32 and 16) keeps every
    part's values: int4 codes become code - 8, a group of 32 two of 16."""
    int4 = _int4_codes(32, 64)
    gen = torch.Generator().manual_seed(1)
    int8 = Int8Codes(
        torch.randint(-32, 32, (16, 64), dtype=torch.int8, generator=gen),
        torch.rand(16, 4, generator=gen),
        torch.zeros(16, 4),
    )
    weight = Quantization("int8g", 16).weight(48, 64, BF16, "cpu")
    assert isinstance(weight, Int8GroupWeight)
    assert weight.rows(0, 32).takes_codes(int4) and weight.rows(32, 48).takes_codes(int8)
    weight.rows(0, 32).copy_(int4)
    weight.rows(32, 48).copy_(int8)
    want = torch.cat((int4.dequantize(), int8.dequantize()))
    assert torch.equal(weight.dequantize(torch.float32), want)
    # groups of 32 cannot take groups of 16, nor int4 weights int8 codes
    assert not Quantization("int8g", 32).weight(16, 64, BF16, "cpu").rows(0, 16).takes_codes(int8)
    assert not Int4Weight(16, 64, 32, BF16, "cpu").rows(0, 16).takes_codes(int8)


def test_int8_groups_quantize_a_float_row_symmetrically_per_group() -> None:
    """And, packed, drop their zero points when all are 0 (a byte a weight, plus a
    float32 scale a group)."""
    w = _weights(16, 64)
    weight = Int8GroupWeight(16, 64, 32, BF16, "cpu")
    weight.rows(0, 16).copy_(w)
    assert torch.equal(weight.zeros, torch.zeros(16, 2))
    assert torch.equal(weight.scales, w.reshape(16, 2, 32).abs().amax(-1) / 127)
    step = weight.scales.repeat_interleave(32, dim=1)
    stored = weight.dequantize(torch.float32)
    num.assert_within(stored, w, step / 2 * (1 + 2**-20))
    weight.pack()
    assert weight.zeros is None and weight.nbytes() == 16 * 64 + 16 * 2 * 4
    assert torch.equal(weight.dequantize(torch.float32), stored)
    assert torch.equal(weight.dequantize_rows(torch.tensor([2, 0])), stored[[2, 0]].to(BF16))


@pytest.mark.parametrize("kernels", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("num_rows", [1, 9, FEW_ROWS_MAX + 1])
def test_int8_group_products_are_the_float_products_of_the_stored_weights(
    kernels: bool, num_rows: int
) -> None:
    """Few rows through radixlm's kernel when attached (float32 sums, one rounding to
    bf16), else and for many rows a GEMM on the weight dequantized to the GEMM dtype."""
    weight = Int8GroupWeight(48, 64, 16, BF16, "cpu")
    weight.rows(0, 48).copy_(torch.cat([_int4_codes(32, 64).dequantize(), _weights(16, 64)]))
    layer = QuantizedLinear(weight, False, BF16, "cpu")
    layer.prepare()
    stored = weight.dequantize(torch.float32)  # the torch ops: code * scale + zero
    if kernels:
        weight.kernels = load_int8_group_kernels(cache_root() / "kernels")
    x = torch.randn(num_rows, 64).to(BF16)
    product = num.linear(num.exact(x), stored)
    terms = x.double().abs() @ stored.double().abs().t()
    # the weight rounded to bf16 (a GEMM on it), or float32 terms (the kernel's)
    bound = num.from_exact(product, rounded_to=BF16) + 2**-8 * terms + 1e-6 * terms
    num.assert_within(layer(x), product.value.to(BF16), bound)


def test_a_tied_int8_group_vocabulary_is_one_matrix_read_by_rows() -> None:
    embedding, head = LayerFactory(BF16, "cpu", Quantization("int8g", 32)).vocab_layers(
        64, 32, tied=True
    )
    assert isinstance(head.qweight, Int8GroupWeight) and embedding.qweight is head.qweight
    head.qweight.rows(0, 64).copy_(_int4_codes(64, 32))
    ids = torch.tensor([[3, 0], [63, 3]])
    assert torch.equal(embedding(ids), head.qweight.dequantize(BF16)[ids])


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_few_rows_take_radixlms_product_once_attached(method: str) -> None:
    """``use_small_batch``: passes of up to FEW_ROWS_MAX rows through radixlm's
    quantized product (the whole decode step's: float32 inputs, or rounded to int8 per
    32 on VNNI dot products), larger ones the dequantized GEMM as before."""
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    layer = _layer(Quantization(method, 32), _weights(128, 64), bias=True)
    x = torch.randn(FEW_ROWS_MAX + 1, 64, generator=torch.Generator().manual_seed(1))
    before = layer(x.to(BF16))
    assert layer.small_batch is None and layer.use_small_batch(kernels)
    matrix = layer.small_batch[1]
    few = x[:3].to(BF16).float()  # what the layer is given
    want = product_reference(few, layer.qweight, kernels.dot_products(matrix)) + layer.bias.float()
    got = layer(few.to(BF16))
    assert got.dtype == BF16
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)  # bfloat16 in and out
    assert torch.equal(layer(x.to(BF16)), before)  # past FEW_ROWS_MAX rows: as before


def test_the_product_takes_more_rows_of_wider_int4_weights_and_few_of_int8_groups() -> None:
    """quant_kernel_max_rows: int4 up to a ninth of its output rows (FEW_ROWS_MAX to
    512), int8 groups up to 12, the rest FEW_ROWS_MAX."""
    cases = {(960, 576): 106, (2048, 8192): 227, (16384, 2048): 512, (128, 64): FEW_ROWS_MAX}
    for (out, inputs), limit in cases.items():
        assert quant_kernel_max_rows(Int4Weight(out, inputs, 32, BF16, "cpu")) == limit
    assert quant_kernel_max_rows(Int8GroupWeight(960, 576, 32, BF16, "cpu")) == 12
    assert quant_kernel_max_rows(Int8Weight(960, 576, BF16, "cpu")) == FEW_ROWS_MAX


class _CountedKernels:
    """The small-batch kernels, counting the rows of each quantized product."""

    def __init__(self, kernels) -> None:
        self.kernels, self.rows = kernels, []

    def quant_product(self, x, matrix, bias=None):
        self.rows.append(x.shape[0])
        return self.kernels.quant_product(x, matrix, bias)


@pytest.mark.parametrize(("method", "shape", "taken", "past"), [
    ("int4", (400, 64), 44, 45),  # a prompt pass of 33-44 rows: the product
    ("int8g", (128, 64), 12, 13),  # 13 rows on: the dequantized GEMM, not int8g's own
])  # fmt: skip
def test_prompt_passes_take_the_product_up_to_the_weights_limit(
    method: str, shape: tuple[int, int], taken: int, past: int
) -> None:
    kernels = load_small_batch_kernels(cache_root() / "kernels")
    layer = _layer(Quantization(method, 32), _weights(*shape), bias=False)
    if method == "int8g":
        layer.qweight.kernels = load_int8_group_kernels(cache_root() / "kernels")
    assert layer.use_small_batch(kernels) and layer.small_batch_max_rows == taken
    counted = _CountedKernels(kernels)
    layer.small_batch = (counted, layer.small_batch[1])
    x = torch.randn(past, shape[1], generator=torch.Generator().manual_seed(2)).to(BF16)
    want = product_reference(
        x[:taken].float(), layer.qweight, kernels.dot_products(layer.small_batch[1])
    )
    torch.testing.assert_close(layer(x[:taken]).float(), want, rtol=1e-2, atol=1e-2)
    assert counted.rows == [taken]
    compute = gemm_dtype(BF16)
    dequantized = F.linear(x.to(compute), layer.qweight.dequantize(compute)).to(BF16)
    assert torch.equal(layer(x), dequantized) and counted.rows == [taken]
