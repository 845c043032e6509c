"""The dtype regexes: SGLang's semantics (``sglang.lang.ir``'s REGEX_*), importable
from ``radixlm.ir``; and the JSON string literal kept as ``REGEX_JSON_STR``."""

from __future__ import annotations

import json
import re

import pytest

from radixlm.ir import (
    DTYPE_REGEX,
    DTYPE_STOP,
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_JSON_STR,
    REGEX_STR,
)


@pytest.mark.parametrize(
    ("regex", "accepted", "refused"),
    [
        (REGEX_INT, ["42", "-7", "+3", "12 \n", "007"], ["", "1.5", "a1", " 1", "1e3"]),
        (REGEX_FLOAT, ["3.5", ".5", "-2", "+0.25\n"], ["1.", "1e5", "", "--1", "1.2.3"]),
        (REGEX_BOOL, ["True", "False"], ["true", "1", "Trueish"]),
        (REGEX_STR, ['"Paris"', '"two words"', '""', '"tab\tx_9"'], ['"a,b"', '"a\\"b"', "x"]),
    ],
    ids=["int", "float", "bool", "str"],
)
def test_sglangs_dtype_regexes(regex, accepted, refused):
    assert all(re.fullmatch(regex, text) for text in accepted)
    assert not any(re.fullmatch(regex, text) for text in refused)


def test_each_dtype_has_its_regex_and_numbers_stop_at_whitespace():
    assert DTYPE_REGEX == {
        "int": REGEX_INT,
        "float": REGEX_FLOAT,
        "bool": REGEX_BOOL,
        "str": REGEX_STR,
    }
    assert DTYPE_STOP == {"int": (" ", "\n"), "float": (" ", "\n")}


@pytest.mark.parametrize("value", ["", "plain", 'say "hi"', "a\\b/c", "line\nbreak\t", "é\u0001"])
def test_the_json_string_regex_takes_every_json_string_literal(value):
    for literal in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        assert re.fullmatch(REGEX_JSON_STR, literal) and json.loads(literal) == value


@pytest.mark.parametrize(
    "text", ['"unterminated', '"bad \\x escape"', '"raw \x01 control"', "bare"]
)
def test_the_json_string_regex_refuses_what_json_refuses(text):
    assert not re.fullmatch(REGEX_JSON_STR, text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
