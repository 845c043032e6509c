"""bench_quant_prompt.py's two sides compute the same product: radixlm's quantized
product of a layer's weights and the GEMM on the same weights dequantized, each the
float product of the stored weights (up to the product's input rounding)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_quant_prompt as bench  # noqa: E402

from radixlm.runtime.layers.quantization import kernel_matrix  # noqa: E402


@pytest.mark.parametrize("kind", ["int4", "int8g"])
def test_both_sides_are_the_product_of_the_stored_weights(kind, monkeypatch) -> None:
    monkeypatch.setitem(bench.SHAPES, "tiny", [(64, 64), (128, 64)])
    torch.manual_seed(0)
    linears = bench.layer("tiny", kind)
    x = torch.randn(40, 64).bfloat16()
    for lin in linears:
        kernels, matrix = lin.small_batch
        assert matrix.shape == kernel_matrix(lin.qweight).shape
        want = x.float() @ lin.qweight.dequantize(torch.float32).t()
        kernel = kernels.quant_product(x.float(), matrix)
        dequantized = F.linear(x, lin.qweight.dequantize(torch.bfloat16)).float()
        scale = want.abs().amax()
        for got in (kernel, dequantized):  # int8 inputs per 32 / bfloat16 rounding
            torch.testing.assert_close(got, want, rtol=0, atol=0.03 * float(scale))
    times = bench.measure(linears, 40, repeats=1)
    assert set(times) == {"kernel", "dequantized"} and min(times.values()) > 0
