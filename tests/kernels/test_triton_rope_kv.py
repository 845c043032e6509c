"""The Triton rotary-embedding + KV-pool-write kernel against its plain-torch
reference (``radixlm.kernels.rope_kv``) and the model's own rotation."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.rope_kv import rotate_and_store_reference
from radixlm.kernels.triton.rope_kv import rotate_and_store_triton
from radixlm.runtime.mem_cache.kv_quant import kv_format, quantize
from radixlm.runtime.models.rope import apply_rope
from tests import numerics as num
from tests.kernels.cpu.quantized_kv import scale_ties

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton's interpreter
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NUM_SLOTS = 40


def _case(tokens: int, heads: int, kv_heads: int, head_dim: int, rotary: int, dtype):
    """A fused QKV buffer (q, k, v are views of it, as the model hands them over),
    cos/sin of random positions in ``dtype``, pools holding garbage, distinct slots."""
    gen = torch.Generator().manual_seed(tokens * 100 + head_dim)
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    angles = torch.rand(tokens, rotary // 2, generator=gen) * 100
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    pools = torch.randn(2, NUM_SLOTS, kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(NUM_SLOTS - 1, generator=gen)[:tokens] + 1
    return (t.to(DEVICE) for t in (qkv, cos, sin, pools, slots))


def _split(qkv: torch.Tensor, heads: int, kv_heads: int):
    return qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]


def _rotation_bound(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Two float32 evaluations of the rotation of stored x, each rounded once to x's
    dtype (bfloat16 on the interpreter truncates: one more unit). Dims past R: exact."""
    r = 2 * cos.shape[-1]
    x64 = x.cpu().float()
    rotated = num.rope(
        num.exact(x64[..., :r]), cos.cpu().float()[:, None], sin.cpu().float()[:, None]
    )
    bound = num.between_two(rotated, rounded_to=x.dtype)
    if x.dtype == torch.bfloat16:
        bound = bound + num.unit_roundoff(x.dtype) * 2 * rotated.value.abs()
    return torch.cat((bound, torch.zeros_like(x64[..., r:], dtype=torch.float64)), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "rotary"),
    [(4, 2, 64, 64), (6, 2, 80, 80), (3, 3, 128, 96), (8, 1, 16, 16)],
    ids=["gqa-64", "gqa-80", "partial-96-of-128", "mqa-16"],
)
def test_matches_the_reference(dtype, heads: int, kv_heads: int, head_dim: int, rotary: int):
    tokens = 7
    qkv, cos, sin, pools, slots = _case(tokens, heads, kv_heads, head_dim, rotary, dtype)
    ours, theirs = qkv.clone(), qkv.clone()
    our_pools, their_pools = pools.clone(), pools.clone()
    rotate_and_store_triton(*_split(ours, heads, kv_heads), cos, sin, *our_pools, slots)
    rotate_and_store_reference(*_split(theirs, heads, kv_heads), cos, sin, *their_pools, slots)
    q0, k0, v0 = _split(qkv, heads, kv_heads)
    q, k, v = _split(ours, heads, kv_heads)
    want_q, want_k, _ = _split(theirs, heads, kv_heads)
    num.assert_within(q.cpu(), want_q.cpu(), _rotation_bound(q0, cos, sin), "q")
    num.assert_within(k.cpu(), want_k.cpu(), _rotation_bound(k0, cos, sin), "k")
    assert torch.equal(v, v0)  # v is left alone
    assert torch.equal(our_pools[0][slots], k)  # the pool holds k as rotated, bit for bit
    assert torch.equal(our_pools[1][slots], v0)
    untouched = torch.ones(NUM_SLOTS, dtype=torch.bool, device=slots.device)
    untouched[slots] = False
    assert torch.equal(our_pools[:, untouched], pools[:, untouched])


def test_matches_the_models_rotation() -> None:
    """Full rotary dims: the model's ``apply_rope`` (the unfused path), float32."""
    heads, kv_heads, head_dim = 4, 2, 32
    qkv, cos, sin, pools, slots = _case(5, heads, kv_heads, head_dim, head_dim, torch.float32)
    want = apply_rope(qkv[:, : heads + kv_heads], cos, sin)
    ours = qkv.clone()
    rotate_and_store_triton(*_split(ours, heads, kv_heads), cos, sin, *pools, slots)
    bound = _rotation_bound(qkv[:, : heads + kv_heads], cos, sin)
    num.assert_within(ours[:, : heads + kv_heads].cpu(), want.cpu(), bound)


def test_no_tokens_and_mismatched_inputs() -> None:
    qkv, cos, sin, pools, slots = _case(3, 4, 2, 32, 32, torch.float32)
    q, k, v = _split(qkv, 4, 2)
    rotate_and_store_triton(q[:0], k[:0], v[:0], cos[:0], sin[:0], *pools, slots[:0])
    with pytest.raises(ValueError, match="k and v must be"):
        rotate_and_store_triton(q, k[:, :1], v, cos, sin, *pools, slots)
    with pytest.raises(ValueError, match="cos and sin"):
        rotate_and_store_triton(q, k, v, cos[:, :3], sin, *pools, slots)
    with pytest.raises(ValueError, match="slots must be"):
        rotate_and_store_triton(q, k, v, cos, sin, *pools, slots.int())


@pytest.mark.parametrize(("head_dim", "rotary"), [(32, 32), (32, 16)], ids=["full", "partial"])
def test_an_int8_pool_gets_kv_quants_codes_and_scales(head_dim: int, rotary: int) -> None:
    """With scales, the launch stores ``kv_quant.quantize``'s codes and scales of the
    rotated k (its dims past R included) and of v, bit for bit, at the slots only."""
    qkv, cos, sin, pools, slots = _case(5, 4, 2, head_dim, rotary, torch.float32)
    ours, theirs = qkv.clone(), qkv.clone()
    fmt = kv_format("int8", torch.float32)
    codes = torch.zeros(2, NUM_SLOTS, 2, head_dim, dtype=torch.int8, device=DEVICE)
    scales = torch.full((2, NUM_SLOTS, 2), -1.0, dtype=torch.bfloat16, device=DEVICE)
    rotate_and_store_triton(*_split(ours, 4, 2), cos, sin, *codes, slots, *scales)
    rotate_and_store_reference(*_split(theirs, 4, 2), cos, sin, *pools.clone(), slots)
    _, k, v = _split(ours, 4, 2)
    for i, x in enumerate((k, v)):
        want_codes, want_scales = quantize(x, fmt)
        assert torch.equal(codes[i, slots], want_codes)
        assert torch.equal(scales[i, slots], want_scales)
    untouched = torch.ones(NUM_SLOTS, dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    assert (codes[:, untouched] == 0).all() and (scales[:, untouched] == -1).all()
    num.assert_within(k.cpu(), _split(theirs, 4, 2)[1].cpu(), _rotation_bound(k, cos, sin), "k")


def test_an_int8_pools_scales_round_to_bfloat16_as_kv_quant_does() -> None:
    """Head vectors whose float32 scale is a bfloat16 rounding tie or a few units from
    one, rotated by the identity (cos 1, sin 0: k unchanged): the stored scales are
    torch's rounding to nearest even (by bits under the interpreter, whose cast
    truncates) and the codes come from them, bit for bit."""
    fmt = kv_format("int8", torch.float32)
    heads = scale_ties(fmt)  # (n, 32)
    heads = torch.cat((heads, heads[: len(heads) % 2]))  # whole tokens of 2 KV heads
    tokens = len(heads) // 2
    kv = heads.view(tokens, 2, 32)
    qkv = torch.cat((torch.ones(tokens, 4, 32), kv, kv.flip(0)), 1).to(DEVICE)
    cos, sin = torch.ones(tokens, 16, device=DEVICE), torch.zeros(tokens, 16, device=DEVICE)
    slots = torch.arange(1, tokens + 1, device=DEVICE)
    codes = torch.zeros(2, NUM_SLOTS, 2, 32, dtype=torch.int8, device=DEVICE)
    scales = torch.zeros(2, NUM_SLOTS, 2, dtype=torch.bfloat16, device=DEVICE)
    rotate_and_store_triton(*_split(qkv, 4, 2), cos, sin, *codes, slots, *scales)
    for i, x in enumerate((kv, kv.flip(0))):
        want_codes, want_scales = quantize(x, fmt)
        assert torch.equal(scales[i, slots].cpu().view(torch.int16), want_scales.view(torch.int16))
        assert torch.equal(codes[i, slots].cpu(), want_codes)


def test_a_quantized_pool_must_be_int8_with_scales_of_its_shape() -> None:
    qkv, cos, sin, _, slots = _case(3, 4, 2, 32, 32, torch.float32)
    q, k, v = _split(qkv, 4, 2)
    scales = torch.zeros(2, NUM_SLOTS, 2, dtype=torch.bfloat16, device=DEVICE)
    fp8 = torch.zeros(2, NUM_SLOTS, 2, 32, device=DEVICE).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="quantizes to int8 only"):
        rotate_and_store_triton(q, k, v, cos, sin, *fp8, slots, *scales)
    codes = torch.zeros(2, NUM_SLOTS, 2, 32, dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match="expected k_scale of shape"):
        rotate_and_store_triton(q, k, v, cos, sin, *codes, slots, scales[0, :, :1], scales[1])
