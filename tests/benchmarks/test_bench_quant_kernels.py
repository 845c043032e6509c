"""bench_quant_kernels.py's quantizers and the torch ops it measures compute what the
benchmark says: each quantized product equals the float product of its dequantized
weights up to bfloat16 rounding, and the quantizers' error is within their step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_quant_kernels as bench  # noqa: E402

TINY = bench.Shape(hidden=64, intermediate=128, q_heads=2, kv_heads=1, head_dim=32, layers=2)


def _weights() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(o, i, generator=gen) for o, i in TINY.matrices()]


def test_int8_round_trip_is_within_half_a_step():
    w = _weights()[0]
    q, scale = bench.quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (w.shape[0],)
    step = scale.float()[:, None]
    # half a step, plus the scale's own bfloat16 rounding times the largest code
    assert ((bench.dequantize_int8(q, scale) - w).abs() <= step * (0.5 + 127 * 2**-8)).all()


@pytest.mark.parametrize("group", [32, 64])
def test_int4_round_trip_is_within_half_a_step(group):
    w = _weights()[0]
    codes, scales_zeros = bench.quantize_int4(w, group)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    assert scales_zeros.shape == (w.shape[1] // group, w.shape[0], 2)
    back = bench.dequantize_int4(codes, scales_zeros, group)
    scale = scales_zeros[..., 0].float().t().repeat_interleave(group, dim=1)
    # half a step, plus bfloat16's rounding of the scale and zero point
    assert ((back - w).abs() <= scale * 0.6 + w.abs().amax() * 2**-7).all()


def test_every_quantized_side_is_its_dequantized_product():
    weights = _weights()
    sides = {"int8": bench.int8_side(weights)}
    for g in bench.INT4_GROUPS[:1]:
        sides[f"int4/g{g}"] = bench.int4_side(weights, g)
    x = torch.randn(3, weights[0].shape[1]).to(torch.bfloat16)
    want_int8 = x.float() @ bench.dequantize_int8(*bench.quantize_int8(weights[0])).t()
    got = sides["int8"][0](x).float()
    assert (got - want_int8).abs().max() <= 2**-7 * want_int8.abs().max()
    g = bench.INT4_GROUPS[0]
    want_int4 = x.float() @ bench.dequantize_int4(*bench.quantize_int4(weights[0], g), g).t()
    got = sides[f"int4/g{g}"][0](x).float()
    assert (got - want_int4).abs().max() <= 2**-6 * want_int4.abs().max()
    # a transposed or shuffled layout would be far off
    assert (got - x.float() @ weights[0].flip(1).t()).abs().max() > 0.1


def test_the_bytes_each_side_reads():
    weights = _weights()
    params = sum(w.numel() for w in weights)
    nbytes = bench.side_bytes(weights)
    assert nbytes["bfloat16"] == 2 * params and nbytes["float32"] == 4 * params
    assert params < nbytes["int8"] < 1.1 * params
    assert params / 2 < nbytes["int4/g32"] < nbytes["int8"]
