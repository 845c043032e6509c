"""StopRegexes: the first full match, what to hold back, invalid and slow patterns."""

from __future__ import annotations

import pytest

from radixlm.runtime.errors import InvalidSamplingParamsError
from radixlm.runtime.io.stop_regex import WINDOW, StopRegexes, StopRegexTimeout


def test_a_full_match_and_nothing_held_after_it():
    scan = StopRegexes([r"answer is \d+\."]).scan("so the answer is 42. Then")
    assert scan.match == (7, 20, r"answer is \d+\.")


def test_a_partial_match_is_held_back_from_its_start():
    scan = StopRegexes([r"answer is \d+\."]).scan("so the answer is 4")
    assert scan.match is None and scan.hold_from == len("so the ")


def test_text_that_cannot_start_a_match_is_not_held():
    scan = StopRegexes([r"\d+\."]).scan("no digits here")
    assert scan == type(scan)(None, len("no digits here"))


def test_the_match_that_ends_first_wins_across_patterns():
    scan = StopRegexes([r"b+c", r"ab"]).scan("xabbbc")
    assert scan.match == (1, 3, "ab")


def test_holding_back_is_bounded_by_the_window():
    text = "<" + "x" * (2 * WINDOW)
    scan = StopRegexes([r"<x*>"]).scan(text)
    assert scan.match is None and scan.hold_from == len(text) - WINDOW


def test_an_invalid_pattern_names_the_field():
    with pytest.raises(InvalidSamplingParamsError) as info:
        StopRegexes(["(unclosed"])
    assert info.value.field == "stop_regex" and "(unclosed" in str(info.value)


def test_a_pattern_that_backtracks_too_long_times_out():
    with pytest.raises(StopRegexTimeout, match="took over"):
        StopRegexes([r"(a|aa)+b"]).scan("a" * 40 + "!")


# ---- through the engine and the server (the default model) ---------------------------------

PROMPT = "List the numbers from one to ten in words:"
GREEDY = {"temperature": 0.0, "max_new_tokens": 24}


def test_the_engine_ends_at_the_first_match_for_every_caller(engine):
    free = engine.generate(PROMPT, GREEDY)
    word = next(w for w in free["text"].split() if len(w) >= 3)  # some word it writes
    pattern = f"{word[:2]}\\w*"  # matches that word (or an earlier one)
    out = engine.generate(PROMPT, {**GREEDY, "stop_regex": pattern})
    import re

    first = re.search(pattern, free["text"])
    assert out["text"] == free["text"][: first.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = engine.generate(PROMPT, {**GREEDY, "stop_regex": [pattern], "no_stop_trim": True})
    assert kept["text"] == free["text"][: first.end()] or kept["text"].startswith(
        free["text"][: first.end()]
    )


def test_generate_over_http_takes_sglang_shapes(engine):
    import httpx

    from tests.servers import running_server

    with running_server(engine) as server:
        body = {"text": PROMPT, "sampling_params": {**GREEDY, "stop_regex": [], "top_k": None}}
        response = httpx.post(server.base_url + "/generate", json=body, timeout=300)
        assert response.status_code == 200
        assert response.json()["text"] == engine.generate(PROMPT, GREEDY)["text"]
        bad = {"text": PROMPT, "sampling_params": {"stop_regex": "(unclosed"}}
        error = httpx.post(server.base_url + "/generate", json=bad, timeout=300).json()["error"]
        assert error["param"] == "stop_regex"
