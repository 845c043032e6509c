"""The pass cost model: the start-up calibration fits what a (fake) device's passes cost,
and the planner proposes nothing where that cost says speculation cannot pay."""

from __future__ import annotations

import pytest

from radixlm.runtime.config import SpeculativeConfig
from radixlm.runtime.io.sampling_params import SamplingParams
from radixlm.runtime.mem_cache.radix_cache import DisabledCache
from radixlm.runtime.scheduling.request import Request
from radixlm.runtime.speculative.controller import PROBE_INTERVAL, Speculator, plan_num_tokens
from radixlm.runtime.speculative.cost import PassCost, calibrate, calibration_rows

# shaped as an H200's figures, in ms: decode passes replay
# CUDA graphs (2.4 ms at batch 1, 5 ms at 32, 8.7 ms at 128), a verify pass runs the extend
# path eagerly (its launches alone cost a few ms) and pays more per token
GPU_LIKE = PassCost(
    decode_base=3.0, decode_per_row=0.045, verify_base=6.0, verify_per_row=0.0,
    verify_per_token=0.1,
)  # fmt: skip


def _fake_device(cost: PassCost, slow_first: float = 0.0):
    """A pass timer that returns ``cost``'s times (the first pass of each shape
    ``slow_first`` slower, as a warm-up or the machine's noise would make it)."""
    calls: list[tuple[int, int]] = []

    def time_pass(num_rows: int, num_tokens: int) -> float:
        first = (num_rows, num_tokens) not in calls
        calls.append((num_rows, num_tokens))
        if num_tokens == num_rows:
            t = cost.decode(num_rows)
        else:
            t = cost.verify(num_rows, num_tokens)
        return t + (slow_first if first else 0.0)

    return time_pass, calls


def test_calibration_fits_the_device_cost() -> None:
    time_pass, calls = _fake_device(GPU_LIKE, slow_first=50.0)
    fitted = calibrate(time_pass, (1, 32, 128), num_tokens=4, repeats=2)
    for name in ("decode_base", "decode_per_row", "verify_base", "verify_per_token"):
        assert getattr(fitted, name) == pytest.approx(getattr(GPU_LIKE, name), abs=1e-6), name
    assert fitted.verify_per_row == pytest.approx(0.0, abs=1e-6)
    # decode and both verify shapes at each batch size, twice each
    assert sorted(set(calls)) == sorted({(b, n) for b in (1, 32, 128) for n in (b, b + 1, 5 * b)})
    assert len(calls) == 2 + 2 * 9  # a warm-up pass of each path first
    assert fitted.plausible((1, 32, 128))
    assert fitted.max_rows == 128  # the largest batch timed


def test_no_proposal_past_the_batches_the_costs_were_timed_at() -> None:
    """A CPU's costs are timed at 1 and 8 rows; a verify pass of 32 rows ran at 3x its
    fitted time there (bench_speculative, 2026-12-05): past the largest batch timed the
    planner proposes nothing, at it the fit still decides."""
    cpu_like = PassCost(0.0115, 0.00217, 0.0166, 0.00208, 0.00129, max_rows=8)
    sure = [0.95] * 8
    assert any(plan_num_tokens(sure, [4] * 8, cpu_like))
    assert plan_num_tokens(sure + [0.95], [4] * 9, cpu_like) == [0] * 9
    assert cpu_like.can_pay(8, 4) and not cpu_like.can_pay(9, 4)
    assert PassCost.per_token(0.1).trusted(10_000)  # a given model holds at any batch


def test_calibration_keeps_coefficients_non_negative() -> None:
    """Noisy times can pull a least-squares coefficient below zero: it is dropped."""
    times = {(1, 1): 10.0, (8, 8): 9.0, (1, 2): 20.0, (1, 5): 21.0, (8, 9): 19.0, (8, 40): 30.0}
    fitted = calibrate(lambda b, n: times[b, n], (1, 8), num_tokens=4, repeats=1)
    assert fitted.decode_per_row == 0.0 and fitted.decode_base == pytest.approx(9.5)
    assert min(fitted.verify_base, fitted.verify_per_row, fitted.verify_per_token) >= 0.0


def test_a_fit_where_verifying_is_cheaper_than_decoding_is_noise() -> None:
    """Decode passes slowed by other processes: the fit says a verify pass costs less
    than the decode pass it extends, which no device does."""
    times = {(1, 1): 3.5, (8, 8): 3.6, (1, 2): 1.2, (1, 5): 1.1, (8, 9): 1.2, (8, 40): 1.2}
    fitted = calibrate(lambda b, n: times[b, n], (1, 8), num_tokens=4, repeats=1)
    assert not fitted.plausible((1, 8))
    assert PassCost.per_token(0.1).plausible((1, 8, 128))


def test_a_verify_path_a_little_faster_than_the_decode_path_is_believed() -> None:
    """On a CPU the decode pass (the C++ whole step) and the verify pass (layer by
    layer) are different code: a verify pass of one row and two tokens measured 7%
    under the decode pass (default model, float32). Such a fit is kept; one 21% under
    is not."""
    times = {(1, 1): 23.0, (8, 8): 27.0, (1, 2): 21.4, (1, 5): 24.0, (8, 9): 25.1, (8, 40): 40.0}
    fitted = calibrate(lambda b, n: times[b, n], (1, 8), num_tokens=4, repeats=1)
    assert fitted.plausible((1, 8))
    assert fitted.verify(1, 2) < fitted.decode(1)
    assert not PassCost(1.0, 0.0, 0.79, 0.0, 0.0).plausible((1,))
    assert PassCost(1.0, 0.0, 0.81, 0.0, 0.0).plausible((1,))


def test_calibration_checks_its_arguments() -> None:
    time_pass, _ = _fake_device(GPU_LIKE)
    with pytest.raises(ValueError, match="two row counts"):
        calibrate(time_pass, (8, 8), num_tokens=4)
    with pytest.raises(ValueError, match="num_tokens"):
        calibrate(time_pass, (1, 8), num_tokens=0)
    with pytest.raises(ValueError, match=">= 0"):
        PassCost(1.0, -0.1, 1.0, 0.0, 0.1)


def test_calibration_rows_by_device() -> None:
    assert calibration_rows("cuda", 256) == (1, 32, 128)
    assert calibration_rows("cuda", 48) == (1, 32, 48)
    assert calibration_rows("cpu", 128) == (1, 8)
    assert calibration_rows("cpu", 1) == (1,)


def test_the_fixed_model_is_one_pass_plus_a_share_per_token() -> None:
    fixed = PassCost.per_token(0.1)
    assert fixed.decode(1) == pytest.approx(1.0)
    assert fixed.decode(8) == fixed.verify(8, 8) == pytest.approx(1.7)
    assert fixed.verify(1, 5) == pytest.approx(1.4)
    assert fixed.can_pay(32, 4)


def test_the_planner_refuses_a_batch_whose_verify_pass_cannot_pay() -> None:
    """Eight rows accepted 60% of the time: under the fixed model each proposes (0.6
    clears its bar of ~0.47), but on the GPU-like device their verify pass (10 ms for
    ~18 expected tokens) emits slower than the graphed decode pass (8 tokens in 3.4 ms)."""
    assert plan_num_tokens([0.6] * 8, [4] * 8, 0.1) != [0] * 8
    assert plan_num_tokens([0.6] * 8, [4] * 8, GPU_LIKE) == [0] * 8
    assert not GPU_LIKE.can_pay(128, 4)  # not even with every proposal accepted
    # alone and accepted often, a row still pays for its verify pass there
    assert plan_num_tokens([0.95], [4], GPU_LIKE) == [4]
    # a pass that verifies anyway (text a grammar forces) adds proposals at their own cost
    forced = plan_num_tokens([0.6] * 8, [4] * 8, GPU_LIKE, num_tokens=10, expected=10)
    assert min(forced) >= 2


PERIOD = [11, 12, 13, 14, 15]


def _requests(spec: Speculator, n: int) -> list[Request]:
    params = SamplingParams(temperature=0, max_new_tokens=500)
    reqs = []
    for i in range(n):
        req = Request(f"r{i}", i, PERIOD * 4, params, frozenset(), None)  # type: ignore[arg-type]
        req.spec = spec.new_state(req.all_ids, params)
        reqs.append(req)
    return reqs


def test_the_speculator_proposes_nothing_where_the_measured_cost_cannot_pay() -> None:
    """With the GPU-like cost, a batch of 32 rows accepted ~86% of the time proposes
    nothing, probes included; the same rows under the fixed model, and one row alone
    (at its probe), do propose."""
    config = SpeculativeConfig(speculative="ngram", speculative_num_tokens=4)
    spec = Speculator(config, DisabledCache(lambda slots: None))
    reqs = _requests(spec, 32)
    for req in reqs:  # each accepted ~86% of the time lately
        req.spec.accepted, req.spec.tried = 9.0, 10.0  # type: ignore[union-attr]
    assert any(p.token_ids for p in spec.propose_all(reqs, room=1000))
    spec.use_pass_cost(GPU_LIKE)
    for _ in range(2 * PROBE_INTERVAL):
        assert not any(p.token_ids for p in spec.propose_all(reqs, room=1000))
    alone = _requests(spec, 1)  # at the prior a = 0.5: a verify pass would not pay ...
    proposals = [spec.propose_all(alone, room=1000)[0] for _ in range(PROBE_INTERVAL)]
    sizes = [p.num_tokens for p in proposals]
    assert sizes == [0] * (PROBE_INTERVAL - 1) + [1]  # ... but its probe does
    spec.record(alone[0], proposals[-1], 1)  # accepted: it proposes K now
    assert spec.propose_all(alone, room=1000)[0].token_ids == (11, 12, 13, 14)
