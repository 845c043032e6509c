"""The C++ single-pass elementwise kernels against the torch ops they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.cpu.decode_attention import KernelShapeError
from radixlm.kernels.cpu.elementwise import ElementwiseKernels, load_elementwise_kernels
from radixlm.kernels.cpu.native import KernelTarget
from radixlm.runtime.model_store import cache_root
from radixlm.runtime.models.rope import apply_rope
from tests import numerics as num


@pytest.fixture(scope="module")
def kernels(kernel_target_and_native: KernelTarget) -> ElementwiseKernels:
    return load_elementwise_kernels(cache_root() / "kernels", kernel_target_and_native)


def _rounded(dtype: torch.dtype) -> torch.dtype | None:
    """What the kernel's float32 results are rounded to once: bfloat16 rows, else none."""
    return None if dtype == torch.float32 else dtype


# (rows, weights): float32 models; bfloat16 ones, with their own norms or float32 ones
DTYPES = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
]


@pytest.mark.parametrize(("dtype", "weight_dtype"), DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("n", [576, 40])
def test_add_rms_norm_matches_torch(kernels, rows: int, n: int, dtype, weight_dtype) -> None:
    """The residual's sum is rounded to its dtype before it is normed (torch's
    in-place add); the norm is computed in float32 and rounded once."""
    gen = torch.Generator().manual_seed(rows)
    residual = torch.randn(rows, n, generator=gen).to(dtype)
    x = torch.randn(rows, n, generator=gen).to(dtype)
    weight = (torch.rand(n, generator=gen) + 0.5).to(weight_dtype)
    ours = residual.clone()
    got = kernels.add_rms_norm(ours, x, weight, 1e-5)
    assert got.dtype == dtype
    assert torch.equal(ours, residual + x)  # one rounding of each sum, both sides
    want = F.rms_norm(ours.float(), (n,), weight.float(), 1e-5)
    bound = num.between_two(num.rms_norm(num.exact(ours.float()), weight, 1e-5), _rounded(dtype))
    num.assert_within(got, want, bound)
    kept = ours.clone()
    first = kernels.add_rms_norm(ours, None, weight, 1e-5)  # nothing to add
    assert torch.equal(ours, kept)
    num.assert_within(first, F.rms_norm(kept.float(), (n,), weight.float(), 1e-5), bound)


@pytest.mark.parametrize(("dtype", "weight_dtype"), DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 2, 24), (2, 2, 6)])
def test_rope_matches_the_model(
    kernels, qk_norm: bool, heads: int, kv_heads: int, head_dim: int, dtype, weight_dtype
):
    """In place on the q and k heads of a fused QKV projection; v is left alone."""
    gen = torch.Generator().manual_seed(heads)
    rows = 33
    qkv = torch.randn(rows, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 50
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    qk = qkv[:, : heads + kv_heads].float()
    exact = num.exact(qk)
    norms = None
    if qk_norm:
        q_w = (torch.rand(head_dim, generator=gen) + 0.5).to(weight_dtype)
        k_w = (torch.rand(head_dim, generator=gen) + 0.5).to(weight_dtype)
        norms = (q_w, k_w, 1e-6)
        weight = torch.cat((q_w.expand(heads, head_dim), k_w.expand(kv_heads, head_dim)))
        qk = F.rms_norm(qk, (head_dim,), None, 1e-6) * weight.float()
        exact = num.rms_norm(exact, weight, 1e-6)
    rotated = apply_rope(qk, cos.float(), sin.float())
    want = torch.cat((rotated, qkv[:, heads + kv_heads :].float()), dim=1)
    exact = num.rope(exact, cos[:, None].float(), sin[:, None].float())
    bound = num.between_two(exact, _rounded(dtype))
    v_bound = torch.zeros(rows, kv_heads, head_dim)  # v: left alone, bit for bit
    kernels.rope(qkv, heads, kv_heads, cos, sin, norms)
    num.assert_within(qkv, want, torch.cat((bound, v_bound), dim=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "inter"), [(1, 1536), (5, 37), (64, 16)])
def test_silu_mul_matches_torch(kernels, rows: int, inter: int, dtype) -> None:
    gen = torch.Generator().manual_seed(inter)
    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 4
    gate_up[0, :8] = torch.tensor([-200.0, -88.0, -20.0, -1e-8, 0.0, 1e-8, 20.0, 200.0])
    gate_up = gate_up.to(dtype)
    gate, up = gate_up.float().clone().chunk(2, dim=-1)
    out = kernels.silu_mul(gate_up)
    assert out.data_ptr() == gate_up.data_ptr() and out.shape == (rows, inter)
    want = F.silu(gate) * up
    exact = num.silu_mul(num.exact(gate), num.exact(up))
    num.assert_within(out, want, num.between_two(exact, _rounded(dtype)))
    assert torch.equal(gate_up[:, inter:].float(), up)


def test_inputs_the_kernels_cannot_read_are_refused(kernels) -> None:
    with pytest.raises(KernelShapeError, match="contiguous CPU float32 or bfloat16"):
        kernels.add_rms_norm(torch.randn(4, 8).double(), None, torch.ones(8), 1e-5)
    with pytest.raises(KernelShapeError, match="weight must have shape"):
        kernels.add_rms_norm(torch.randn(4, 8), None, torch.ones(9), 1e-5)
    with pytest.raises(KernelShapeError, match="x must have"):
        kernels.add_rms_norm(torch.randn(4, 8), torch.randn(3, 8), torch.ones(8), 1e-5)
    qkv, cs = torch.randn(4, 6, 8), torch.ones(4, 4)
    with pytest.raises(KernelShapeError, match="contiguous heads"):
        kernels.rope(qkv.transpose(1, 2), 2, 1, cs, cs)
    with pytest.raises(KernelShapeError, match="cos and sin"):
        kernels.rope(qkv, 2, 1, torch.ones(4, 3), torch.ones(4, 3))
    with pytest.raises(KernelShapeError, match="even"):
        kernels.rope(torch.randn(4, 6, 7), 2, 1, torch.ones(4, 3), torch.ones(4, 3))
    with pytest.raises(KernelShapeError, match="even width"):
        kernels.silu_mul(torch.randn(4, 9))
    rows = torch.randn(4, 8).bfloat16()
    with pytest.raises(KernelShapeError, match="x must have the residual's shape and dtype"):
        kernels.add_rms_norm(rows, torch.randn(4, 8), torch.ones(8), 1e-5)
    with pytest.raises(KernelShapeError, match="norm weights must be float32 or torch.float32"):
        kernels.add_rms_norm(torch.randn(4, 8), None, torch.ones(8).bfloat16(), 1e-5)
    with pytest.raises(KernelShapeError, match="must have qkv's dtype"):
        kernels.rope(qkv.bfloat16(), 2, 1, cs, cs)
    norms = (torch.ones(8).bfloat16(), torch.ones(8), 1e-6)
    with pytest.raises(KernelShapeError, match="one dtype"):
        kernels.rope(qkv.bfloat16(), 2, 1, cs.bfloat16(), cs.bfloat16(), norms)
