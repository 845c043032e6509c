"""kv_quant's int8/fp8 format: bfloat16 scales rounded from float32, codes from the
rounded scale, two bytes of scale per token and head."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.mem_cache.kv_quant import (
    bfloat16_rounded,
    dequantize,
    kv_format,
    quantize,
)
from tests.kernels.cpu.quantized_kv import FORMATS, scale_ties


@pytest.mark.parametrize("name", FORMATS)
def test_the_scale_is_the_float32_scale_rounded_to_bfloat16(name: str) -> None:
    """amax / max_code in float32, rounded to nearest even: at ties (to the even
    pattern, carrying into the exponent where the mantissa is all ones), beside
    them and in bfloat16's subnormals."""
    fmt = kv_format(name, torch.float32)
    x = scale_ties(fmt)
    exact = x.abs().amax(-1) / fmt.max_code  # float32
    low = exact.view(torch.int32) & 0xFFFF
    assert (low == 0x8000).sum() >= 8 and (low < 0x8000).any() and (low > 0x8000).any()
    _, scales = quantize(x, fmt)
    assert scales.dtype == torch.bfloat16
    # round to nearest even by hand: add half a unit less one, plus the kept last bit
    bits = exact.view(torch.int32)
    want = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(torch.int16)
    assert torch.equal(scales.view(torch.int16), want)
    assert torch.equal(scales.view(torch.int16), exact.to(torch.bfloat16).view(torch.int16))
    ties = low == 0x8000
    assert ((want[ties] & 1) == 0).all()  # every tie went to the even pattern


def test_bfloat16_rounded_is_torchs_cast_to_bfloat16() -> None:
    """Every sign and exponent, subnormals, infinities, ties and NaN: the value
    ``.to(torch.bfloat16)`` rounds to, bit for bit (a NaN stays a NaN)."""
    bits = torch.randint(
        -(2**31), 2**31 - 1, (200_000,), generator=torch.Generator().manual_seed(0)
    )
    bits = bits.to(torch.int32)
    bits[:1000] = (bits[:1000] & -0x10000) | 0x8000  # ties
    x = torch.cat((bits.view(torch.float32), torch.tensor([float("inf"), -float("inf"), 0.0])))
    got = bfloat16_rounded(x)
    want = x.to(torch.bfloat16).float()
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert torch.equal(got[keep].view(torch.int32), want[keep].view(torch.int32))


@pytest.mark.parametrize("name", FORMATS)
def test_codes_come_from_the_rounded_scale_and_stay_in_range(name: str) -> None:
    """x / scale with the bfloat16 scale: a scale rounded down puts the largest
    magnitude past the top code, which clamps to it; every other value within half
    a code step (the code's spacing) of x / scale."""
    fmt = kv_format(name, torch.float32)
    x = torch.cat((scale_ties(fmt), torch.randn(64, 32)))
    codes, scales = quantize(x, fmt)
    wide = scales.float()[:, None]
    assert codes.float().abs().max() <= fmt.max_code
    normal = scales.float() >= torch.finfo(torch.bfloat16).smallest_normal
    top = codes.float().abs().amax(-1)
    assert (top[normal] == fmt.max_code).all()  # a normal scale is within 2^-8 of amax's
    back = dequantize(codes, scales, torch.float64)
    assert torch.equal(back, codes.double() * wide.double())  # exact in float32
    scaled = (x / wide).double()  # as quantize divides
    if fmt.code_dtype == torch.int8:
        step = torch.ones_like(scaled)
    else:  # the fp8 code's spacing at its magnitude: 2^exponent times eps
        info = torch.finfo(fmt.code_dtype)
        step = torch.exp2(torch.floor(torch.log2(scaled.abs().clamp_min(info.tiny)))) * info.eps
    assert ((scaled.clamp(-fmt.max_code, fmt.max_code) - codes.double()).abs() <= step / 2).all()


def test_a_zero_vector_has_scale_zero_and_codes_zero() -> None:
    fmt = kv_format("int8", torch.bfloat16)
    codes, scales = quantize(torch.zeros(2, 3, 8), fmt)
    assert (codes == 0).all() and (scales == 0).all() and scales.dtype == torch.bfloat16


@pytest.mark.parametrize("name", FORMATS)
def test_a_token_takes_a_byte_a_value_and_two_bytes_of_scale_a_head(name: str) -> None:
    fmt = kv_format(name, torch.bfloat16)
    assert fmt.bytes_per_token(30, 3, 64) == 2 * 30 * 3 * (64 + 2)
    auto = kv_format("auto", torch.bfloat16).bytes_per_token(30, 3, 64)
    assert auto / fmt.bytes_per_token(30, 3, 64) == pytest.approx(128 / 66)
