"""The Triton residual-add + RMSNorm kernel against its plain-torch reference
(``radixlm.kernels.norm``) and against the unfused torch ops the decoder runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.norm import add_rms_norm, add_rms_norm_reference
from radixlm.kernels.triton.norm import add_rms_norm_triton
from tests import numerics as num

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton's interpreter
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _case(rows: int, n: int, dtype: torch.dtype, weight_dtype: torch.dtype | None = None):
    gen = torch.Generator().manual_seed(rows * 1000 + n)
    residual = (torch.randn(rows, n, generator=gen) * 3).to(dtype)
    x = torch.randn(rows, n, generator=gen).to(dtype)
    weight = (torch.rand(n, generator=gen) + 0.5).to(weight_dtype or dtype)
    return residual.to(DEVICE), x.to(DEVICE), weight.to(DEVICE)


def _bound(summed: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Two float32 evaluations of one norm over the same (stored) sum, each rounded
    once to the stream's dtype."""
    exact = num.rms_norm(num.exact(summed.cpu().float()), weight.cpu().float(), eps)
    return num.between_two(exact, rounded_to=summed.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "n"), [(1, 64), (5, 576), (3, 1000)])
def test_add_rms_norm_matches_the_reference(dtype: torch.dtype, rows: int, n: int) -> None:
    residual, x, weight = _case(rows, n, dtype)
    ours, theirs = residual.clone(), residual.clone()
    got = add_rms_norm_triton(ours, x, weight, 1e-6)
    want = add_rms_norm_reference(theirs, x, weight, 1e-6)
    assert torch.equal(ours, theirs)  # the stream: one rounding of each sum, both sides
    assert torch.equal(ours, residual + x)
    assert got.dtype == dtype and got.shape == (rows, n)
    num.assert_within(got.cpu(), want.cpu(), _bound(ours, weight, 1e-6), f"{dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_without_x_the_stream_is_left_alone(dtype: torch.dtype) -> None:
    residual, _, weight = _case(4, 96, dtype)
    kept = residual.clone()
    got = add_rms_norm_triton(residual, None, weight, 1e-5)
    assert torch.equal(residual, kept)
    want = add_rms_norm_reference(kept.clone(), None, weight, 1e-5)
    num.assert_within(got.cpu(), want.cpu(), _bound(kept, weight, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_float32_weight_norms_16_bit_rows(dtype: torch.dtype) -> None:
    """Gemma's norms: float32 weights (``1 + w``) over 16-bit activations."""
    residual, x, weight = _case(6, 200, dtype, torch.float32)
    ours = residual.clone()
    got = add_rms_norm_triton(ours, x, weight, 1e-6)
    want = F.rms_norm(ours.float(), (200,), weight, 1e-6).to(dtype)  # the unfused path
    num.assert_within(got.cpu(), want.cpu(), _bound(ours, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_torchs_rms_norm_within_the_dtypes_rounding(dtype: torch.dtype) -> None:
    """What the decoder ran before: an add, then F.rms_norm in the stream's dtype, which
    rounds the normalised row and its product by the weight each (two roundings where
    the kernel makes one)."""
    residual, x, weight = _case(7, 320, dtype)
    ours = residual.clone()
    got = add_rms_norm_triton(ours, x, weight, 1e-6)
    stream = residual + x
    want = F.rms_norm(stream, (320,), weight, 1e-6)
    extra = num.unit_roundoff(dtype) * want.cpu().double().abs() * 2
    num.assert_within(got.cpu(), want.cpu(), _bound(stream, weight, 1e-6) + extra)


def test_strided_rows_are_read_in_place() -> None:
    """A row slice of a wider buffer (``output_rows``' gather is not needed for it)."""
    wide, x, weight = _case(4, 256, torch.float32)
    residual = wide[:, :128]
    x, weight = x[:, :128].contiguous(), weight[:128].contiguous()
    kept = residual.clone()
    got = add_rms_norm_triton(residual, x, weight, 1e-6)
    assert torch.equal(residual, kept + x)
    assert torch.equal(wide[:, 128:], _case(4, 256, torch.float32)[0][:, 128:])
    want = add_rms_norm_reference(kept + 0, x, weight, 1e-6)
    num.assert_within(got.cpu(), want.cpu(), _bound(residual, weight, 1e-6))


def test_empty_and_mismatched_inputs() -> None:
    residual, x, weight = _case(0, 64, torch.float32)
    assert add_rms_norm_triton(residual, x, weight, 1e-6).shape == (0, 64)
    residual, x, weight = _case(2, 64, torch.float32)
    with pytest.raises(ValueError, match="x must match"):
        add_rms_norm_triton(residual, x[:, :32], weight, 1e-6)
    with pytest.raises(ValueError, match="weight must be"):
        add_rms_norm_triton(residual, x, weight[:32], 1e-6)


def test_the_dispatcher_runs_the_reference_off_cuda() -> None:
    residual, x, weight = (t.cpu() for t in _case(3, 64, torch.float32))
    ours, theirs = residual.clone(), residual.clone()
    assert torch.equal(
        add_rms_norm(ours, x, weight, 1e-6), add_rms_norm_reference(theirs, x, weight, 1e-6)
    )
