"""The grouped-experts reference (``radixlm.kernels.moe``): ``sort_by_expert``'s order,
the reference against the layer's definition token by token (float64), within
bounds derived from the computation (tests/kernels/moe_cases.py), and the checks."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.moe import (
    ExpertArgumentError,
    check_grouped_experts_args,
    grouped_experts_reference,
    sort_by_expert,
)
from tests import numerics as num
from tests.kernels.moe_cases import BF16, F16, F32, moe_case, naive_per_token, output

# ---- sort_by_expert -------------------------------------------------------------------------


def test_sort_by_expert_on_the_documented_example():
    order = sort_by_expert(torch.tensor([[2, 0], [0, 1], [2, 0]]), num_experts=4)
    assert order.slots.tolist() == [1, 2, 5, 3, 0, 4]
    assert order.offsets.tolist() == [0, 3, 4, 6, 6]
    assert order.counts.tolist() == [3, 1, 2, 0]
    assert order.tokens().tolist() == [0, 1, 2, 1, 0, 2]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_sort_by_expert_groups_each_experts_slots_ascending(dtype):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (50, 3), generator=gen, dtype=dtype)
    ids[ids == 4] = 5  # expert 4: no slot
    order = sort_by_expert(ids, num_experts=8)
    flat = ids.flatten()
    assert sorted(order.slots.tolist()) == list(range(150))
    assert order.counts.tolist() == torch.bincount(flat.long(), minlength=8).tolist()
    assert order.offsets[0] == 0 and order.offsets[-1] == 150
    for e in range(8):
        slots = order.slots[order.offsets[e] : order.offsets[e + 1]]
        assert bool((flat[slots] == e).all()) and slots.tolist() == sorted(slots.tolist())


# ---- the reference against the definition ---------------------------------------------------


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_reference_is_the_per_token_definition(activation, dtype, top_k):
    case = moe_case(13, 40, 24, 8, top_k, dtype, activation, seed=top_k)
    got = grouped_experts_reference(*case.args())
    assert got.dtype == dtype and got.shape == case.x.shape
    bound = num.from_exact(output(case), None if dtype == F32 else dtype)
    num.assert_within(got, naive_per_token(case), bound, "reference")


def test_a_token_choosing_one_expert_twice_gets_both_contributions():
    case = moe_case(4, 16, 8, 4, 2, seed=1)
    case = case.with_routing(case.topk_weights, torch.tensor([[3, 3], [0, 3], [1, 1], [2, 0]]))
    got = grouped_experts_reference(*case.args())
    num.assert_within(got, naive_per_token(case), num.from_exact(output(case)), "twice")


def test_tied_weights_do_not_depend_on_the_choices_order():
    """Equal weights (a router's tie) and the k columns in either order: the same
    experts run on the same tokens in the same order, and two terms sum alike."""
    case = moe_case(9, 32, 16, 8, 2, BF16, seed=2)
    tied = case.with_routing(torch.full((9, 2), 0.5), case.topk_ids)
    got = grouped_experts_reference(*tied.args())
    swapped = tied.with_routing(tied.topk_weights, tied.topk_ids.flip(1))
    assert torch.equal(grouped_experts_reference(*swapped.args()), got)
    num.assert_within(got, naive_per_token(tied), num.from_exact(output(tied), BF16), "tied")


def test_an_unchosen_expert_is_never_read():
    logits = torch.randn(11, 8, generator=torch.Generator().manual_seed(3))
    logits[:, 5] = -torch.inf
    case = moe_case(11, 24, 16, 8, 2, logits=logits, seed=3)
    want = grouped_experts_reference(*case.args())
    case.gate_up[5] = torch.nan
    case.down[5] = torch.nan
    assert torch.equal(grouped_experts_reference(*case.args()), want)


def test_no_tokens():
    case = moe_case(0, 16, 8, 4, 2)
    assert grouped_experts_reference(*case.args()).shape == (0, 16)


def test_bound_catches_swapped_gate_and_up():
    """The reference with each expert's gate and up exchanged is off by far more than
    the bound, on every token: the bound is not vacuous."""
    case = moe_case(10, 40, 24, 8, 2, seed=4)
    inter = case.down.shape[2]
    gate_up = torch.cat((case.gate_up[:, inter:], case.gate_up[:, :inter]), dim=1)
    wrong = grouped_experts_reference(case.x, gate_up, *case.args()[2:])
    ratio = (wrong.double() - naive_per_token(case)).abs() / num.from_exact(output(case))
    assert ratio.amax(dim=1).min() > 100


# ---- argument checks ------------------------------------------------------------------------


def _bad(argument: str, **changes: object) -> tuple[str, dict[str, object]]:
    return argument, changes


BAD_ARGUMENTS = [
    _bad("x", x=torch.randn(3, 16, dtype=torch.float64)),
    _bad("x", x=torch.randn(3, 2, 8)),
    _bad("gate_up", gate_up=torch.randn(4, 15, 16)),  # 2I odd
    _bad("gate_up", gate_up=torch.randn(4, 16, 12)),  # H does not match x
    _bad("gate_up", gate_up=torch.randn(0, 16, 16)),  # no expert
    _bad("gate_up", gate_up=torch.randn(4, 16, 16, dtype=torch.bfloat16)),
    _bad("down", down=torch.randn(4, 16, 9)),  # I does not match gate_up's
    _bad("down", down=torch.randn(3, 16, 8)),  # E does not match
    _bad("topk_ids", topk_ids=torch.zeros(3, 5, dtype=torch.int64)),  # k > E
    _bad("topk_ids", topk_ids=torch.zeros(3, 0, dtype=torch.int64)),  # k = 0
    _bad("topk_ids", topk_ids=torch.zeros(2, 2, dtype=torch.int64)),  # T does not match
    _bad("topk_ids", topk_ids=torch.zeros(3, 2)),  # float
    _bad("topk_weights", topk_weights=torch.zeros(3, 2, dtype=torch.bfloat16)),
    _bad("topk_weights", topk_weights=torch.zeros(3, 1)),
    _bad("activation", activation="gelu"),
]


def good_arguments() -> dict[str, object]:
    return dict(
        x=torch.randn(3, 16),
        gate_up=torch.randn(4, 16, 16),
        down=torch.randn(4, 16, 8),
        topk_weights=torch.full((3, 2), 0.5),
        topk_ids=torch.tensor([[0, 1], [2, 3], [1, 0]]),
        activation="silu",
    )


@pytest.mark.parametrize("argument, changes", BAD_ARGUMENTS)
def test_checks_name_the_bad_argument(argument, changes):
    with pytest.raises(ExpertArgumentError) as raised:
        check_grouped_experts_args(**{**good_arguments(), **changes})
    assert raised.value.argument == argument and argument in str(raised.value)


def test_good_arguments_pass_and_the_reference_checks_id_values():
    check_grouped_experts_args(**good_arguments())
    with pytest.raises(ExpertArgumentError, match=r"\[0, 4\)") as raised:
        grouped_experts_reference(**{**good_arguments(), "topk_ids": torch.tensor([[0, 4]] * 3)})
    assert raised.value.argument == "topk_ids"
