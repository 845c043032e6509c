"""The pass-time fit and the prompt budget it gives under ``target_tpot_ms``."""

from __future__ import annotations

import pytest

from radixlm.runtime.scheduling.pass_pace import MIN_PROMPT_TOKENS, WARMUP_PASSES, PassPace

SIZES = (16, 80, 16, 400, 32, 1024, 16, 200, 64, 16)  # decode passes and mixed ones


def timed(pace: PassPace, base: float, per_token: float, sizes=SIZES) -> PassPace:
    for n in sizes:
        pace.observe(n, base + per_token * n)
    return pace


def test_the_fit_recovers_a_linear_pass_time():
    base, per_token = timed(PassPace(0.2), 0.03, 0.0008).fit()
    assert base == pytest.approx(0.03) and per_token == pytest.approx(0.0008)


def test_the_budget_is_what_the_target_leaves_beside_the_decodes():
    pace = timed(PassPace(0.2), 0.03, 0.0008)
    # (0.2 - 0.03) / 0.0008 = 212.5 tokens a pass; 16 of them decodes
    assert pace.prompt_budget(16) == 196
    assert pace.prompt_budget(150) == MIN_PROMPT_TOKENS  # 62 left: the floor
    assert pace.prompt_budget(400) == MIN_PROMPT_TOKENS  # the decodes alone overrun it


def test_no_bound_without_a_target_without_decodes_or_while_warming_up():
    assert timed(PassPace(None), 0.03, 0.0008).prompt_budget(16) is None
    assert timed(PassPace(0.2), 0.03, 0.0008).prompt_budget(0) is None
    warming = timed(PassPace(0.2), 0.03, 0.0008, SIZES[: WARMUP_PASSES - 1])
    assert warming.fit() is None and warming.prompt_budget(16) is None
    warming.observe(16, 0.0428)
    assert warming.prompt_budget(16) == 196


def test_passes_of_one_size_are_read_as_all_per_token():
    pace = timed(PassPace(0.2), 0.03, 0.0008, [16] * WARMUP_PASSES)
    base, per_token = pace.fit()
    assert base == 0.0 and per_token == pytest.approx((0.03 + 0.0008 * 16) / 16)


def test_the_fit_follows_a_machine_that_slows_down():
    pace = timed(PassPace(0.2), 0.03, 0.0008, SIZES * 3)
    timed(pace, 0.03, 0.0016, SIZES * 10)  # another process took half the cores
    base, per_token = pace.fit()
    assert per_token == pytest.approx(0.0016, rel=0.02)
    assert pace.prompt_budget(16) == pytest.approx((0.2 - 0.03) / 0.0016 - 16, abs=3)


def test_passes_that_computed_nothing_or_took_no_time_are_ignored():
    pace = PassPace(0.2)
    for _ in range(WARMUP_PASSES):
        pace.observe(0, 0.05)
        pace.observe(16, 0.0)
    assert pace.fit() is None
