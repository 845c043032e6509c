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
def kernels(kernel_target: KernelTarget) -> ElementwiseKernels:
    return load_elementwise_kernels(cache_root() / "kernels", kernel_target)


@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("n", [576, 40])
def test_add_rms_norm_matches_torch(kernels, rows: int, n: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    residual, x = torch.randn(rows, n, generator=gen), torch.randn(rows, n, generator=gen)
    weight = torch.rand(n, generator=gen) + 0.5
    ours = residual.clone()
    got = kernels.add_rms_norm(ours, x, weight, 1e-5)
    assert torch.equal(ours, residual + x)  # one rounding of each sum, both sides
    want = F.rms_norm(residual + x, (n,), weight, 1e-5)
    bound = num.between_two(num.rms_norm(num.exact(ours), weight, 1e-5))
    num.assert_within(got, want, bound)
    kept = ours.clone()
    first = kernels.add_rms_norm(ours, None, weight, 1e-5)  # nothing to add
    assert torch.equal(ours, kept)
    num.assert_within(first, F.rms_norm(kept, (n,), weight, 1e-5), bound)


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 2, 24), (2, 2, 6)])
def test_rope_matches_the_model(kernels, qk_norm: bool, heads: int, kv_heads: int, head_dim: int):
    """In place on the q and k heads of a fused QKV projection; v is left alone."""
    gen = torch.Generator().manual_seed(heads)
    rows = 33
    qkv = torch.randn(rows, heads + 2 * kv_heads, head_dim, generator=gen)
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 50
    cos, sin = angles.cos(), angles.sin()
    qk = qkv[:, : heads + kv_heads]
    exact = num.exact(qk)
    norms = None
    if qk_norm:
        q_w = torch.rand(head_dim, generator=gen) + 0.5
        k_w = torch.rand(head_dim, generator=gen) + 0.5
        norms = (q_w, k_w, 1e-6)
        weight = torch.cat((q_w.expand(heads, head_dim), k_w.expand(kv_heads, head_dim)))
        qk = F.rms_norm(qk, (head_dim,), None, 1e-6) * weight
        exact = num.rms_norm(exact, weight, 1e-6)
    want = torch.cat((apply_rope(qk, cos, sin), qkv[:, heads + kv_heads :]), dim=1)
    bound = num.between_two(num.rope(exact, cos[:, None], sin[:, None]))
    v_bound = torch.zeros(rows, kv_heads, head_dim)  # v: left alone, bit for bit
    kernels.rope(qkv, heads, kv_heads, cos, sin, norms)
    num.assert_within(qkv, want, torch.cat((bound, v_bound), dim=1))


@pytest.mark.parametrize(("rows", "inter"), [(1, 1536), (5, 37), (64, 16)])
def test_silu_mul_matches_torch(kernels, rows: int, inter: int) -> None:
    gen = torch.Generator().manual_seed(inter)
    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 4
    gate_up[0, :8] = torch.tensor([-200.0, -88.0, -20.0, -1e-8, 0.0, 1e-8, 20.0, 200.0])
    gate, up = gate_up.clone().chunk(2, dim=-1)
    out = kernels.silu_mul(gate_up)
    assert out.data_ptr() == gate_up.data_ptr() and out.shape == (rows, inter)
    want = F.silu(gate) * up
    num.assert_within(out, want, num.between_two(num.silu_mul(num.exact(gate), num.exact(up))))
    assert torch.equal(gate_up[:, inter:], up)


def test_inputs_the_kernels_cannot_read_are_refused(kernels) -> None:
    with pytest.raises(KernelShapeError, match="contiguous CPU float32"):
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
