"""The Triton grouped-experts kernel (``radixlm.kernels.triton.moe``) against its
plain-torch reference (``radixlm.kernels.moe``), within bounds derived from the
computation (tests/kernels/moe_cases.py): on CUDA, else on CPU through Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET); skipped without triton.

Sizes are small (H = 72, I = 40: no tile size divides them; E = 8) so the
interpreter runs them in seconds; they still take several weight tiles, reduction
steps and row blocks an expert (float32 tiles: 32 wide; 16-bit: 64)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from radixlm.kernels.moe import ExpertArgumentError, grouped_experts_reference  # noqa: E402
from radixlm.kernels.triton import grouped_experts_triton  # noqa: E402
from tests import numerics as num  # noqa: E402
from tests.kernels.moe_cases import (  # noqa: E402
    BF16,
    F16,
    F32,
    MoECase,
    between_kernel_and_reference,
    moe_case,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HIDDEN, INTER, EXPERTS = 72, 40, 8


def run(case: MoECase) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel, reference) outputs, on the CPU."""
    got = grouped_experts_triton(*case.args(DEVICE))
    return got.cpu(), grouped_experts_reference(*case.args())


def check(case: MoECase, msg: str = "moe") -> torch.Tensor:
    got, want = run(case)
    assert got.dtype == case.x.dtype and got.shape == case.x.shape
    num.assert_within(got, want, between_kernel_and_reference(case), msg)
    return got


# One token (decode: every expert a partial block); a few; more tokens than a row block.
TOKENS_AND_CHOICES = [(1, 1), (1, 2), (7, 2), (40, 1), (40, 2)]


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("num_tokens, top_k", TOKENS_AND_CHOICES)
def test_matches_reference(num_tokens, top_k, activation, dtype):
    check(moe_case(num_tokens, HIDDEN, INTER, EXPERTS, top_k, dtype, activation, seed=num_tokens))


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_crowded_experts_take_several_row_blocks(dtype):
    """Two experts share 60 tokens' first choices (30 each: two 16-row blocks, the
    second partial) and one takes every second choice; four experts get nothing."""
    logits = torch.full((60, EXPERTS), -torch.inf)
    logits[0::2, 2], logits[1::2, 6] = 2.0, 2.0
    logits[:, 4] = 1.0
    case = moe_case(60, HIDDEN, INTER, EXPERTS, 2, dtype, logits=logits, seed=5)
    check(case, f"crowded {dtype}")


def test_an_unchosen_expert_is_never_read():
    """Expert 3's weights are NaN and no token chooses it: any read of them (a
    product, even masked out later) would put NaN in some output."""
    logits = torch.randn(25, EXPERTS, generator=torch.Generator().manual_seed(6))
    logits[:, 3] = -torch.inf
    case = moe_case(25, HIDDEN, INTER, EXPERTS, 2, BF16, "gelu_tanh", seed=6, logits=logits)
    want = grouped_experts_reference(*case.args())
    poisoned = case.gate_up.clone(), case.down.clone()
    poisoned[0][3], poisoned[1][3] = torch.nan, torch.nan
    on_device = (t.to(DEVICE) for t in poisoned)  # a GPU's kernel reads GPU tensors only
    got = grouped_experts_triton(case.x.to(DEVICE), *on_device, *case.args(DEVICE)[3:]).cpu()
    assert bool(got.isfinite().all())
    num.assert_within(got, want, between_kernel_and_reference(case), "unchosen")


def test_tied_weights_do_not_depend_on_the_choices_order():
    """Equal weights and the k columns in either order: bit for bit the same (the
    same rows meet the same tiles; two terms sum alike)."""
    case = moe_case(20, HIDDEN, INTER, EXPERTS, 2, BF16, seed=7)
    tied = case.with_routing(torch.full((20, 2), 0.5), case.topk_ids)
    got = check(tied, "tied")
    swapped = tied.with_routing(tied.topk_weights, tied.topk_ids.flip(1))
    assert torch.equal(grouped_experts_triton(*swapped.args(DEVICE)).cpu(), got)


def test_row_strided_x_int32_ids_and_no_tokens():
    case = moe_case(9, HIDDEN, INTER, EXPERTS, 2, seed=8)
    case = case.with_routing(case.topk_weights, case.topk_ids.int())
    wide = torch.randn(9, 2 * HIDDEN)
    wide[:, 5 : 5 + HIDDEN] = case.x  # x as a slice of a wider activation
    strided = grouped_experts_triton(wide.to(DEVICE)[:, 5 : 5 + HIDDEN], *case.args(DEVICE)[1:])
    num.assert_within(strided.cpu(), run(case)[1], between_kernel_and_reference(case), "strided")
    empty = moe_case(0, HIDDEN, INTER, EXPERTS, 2)
    assert grouped_experts_triton(*empty.args(DEVICE)).shape == (0, HIDDEN)


# In bfloat16 the bound is mostly the roundings to bfloat16 (0.4% of an output each),
# of the size of a second choice's small contribution: tens of times over, not hundreds.
@pytest.mark.parametrize("dtype, margin", [(F32, 100), (BF16, 10)])
def test_bound_catches_a_dropped_choice(dtype, margin):
    """The reference without each token's second choice is off by far more than the
    bound, on every token: the bound is not vacuous."""
    case = moe_case(12, HIDDEN, INTER, EXPERTS, 2, dtype, seed=9)
    got, _ = run(case)
    first = case.with_routing(case.topk_weights[:, :1].contiguous(), case.topk_ids[:, :1])
    short = grouped_experts_reference(*first.args())
    ratio = (got.double() - short.double()).abs() / between_kernel_and_reference(case)
    assert ratio.amax(dim=1).min() > margin


def test_checks_name_the_bad_argument():
    case = moe_case(3, HIDDEN, INTER, EXPERTS, 2)
    x, gate_up, down, weights, ids, _ = case.args(DEVICE)
    with pytest.raises(ExpertArgumentError) as raised:
        grouped_experts_triton(x, gate_up, down, weights, ids, "relu")
    assert raised.value.argument == "activation"
    strided_down = down.transpose(1, 2).contiguous().transpose(1, 2)  # (E, H, I), I strided
    with pytest.raises(ExpertArgumentError) as raised:
        grouped_experts_triton(x, gate_up, strided_down, weights, ids, "silu")
    assert raised.value.argument == "down"
