"""``format_regex``: each format's pattern accepts exactly the format's strings (the
RFCs' examples and edge cases both ways; uri-reference against rfc3986-validator on
random strings), and llguidance enforces each as a schema's format."""

from __future__ import annotations

import json
import random
import re

import pytest
from rfc3986_validator import validate_rfc3986

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.format_regex import FORMAT_PATTERNS
from tests.runtime.constrained.conftest import accepts_text

CASES = {
    "uri-reference": (
        [
            "",
            "#frag",
            "?q",
            "//host",
            "/a/b",
            "a/b",
            "./a:b",
            "a:b",
            "../x",
            "//u@h:80",
            "http://[::1]:80/p?q#f",
            "http://[v7.x]/",
            "http://[1:2:3:4:5:6:7:8]/",
            "http://[::ffff:1.2.3.4]/",
            "http://[1::]/",
            "mailto:a@b.c",
            "urn:isbn:0451450523",
            "http://user:pw@h:8080/a%20b?x=1&y=2#top",
            "a?b?c#d/e?",
            "%41",
        ],
        [
            "%zz",
            "a b",
            "http://a/%",
            "[::1]",
            ":x",
            "http://[1::2::3]/",
            "http://[::1/",
            "a\nb",
            "é",
            'a"b',
            "a\\b",
            "http://a#b#c",
            "1a:b:c/d[",
            "http://[12345::]/",
        ],
    ),  # fmt: skip
    "json-pointer": (
        [
            "",
            "/foo",
            "/foo/0",
            "/",
            "/a~1b",
            "/c%d",
            "/e^f",
            "/g|h",
            "/i\\j",
            '/k"l',
            "/ ",
            "/m~0n",
            "/é",
        ],
        ["foo", "/a~2", "/a~", "#/foo", "~0"],
    ),  # fmt: skip
    "relative-json-pointer": (
        ["0", "1/0", "2/highly/nested/objects", "0#", "1#", "10/a~1b"],
        ["", "/a", "01/a", "-1/a", "0##", "a/b", "1~0"],
    ),  # fmt: skip
}
URI_CHARACTERS = "abAZ09:/?#[]@!$&'()*+,;=%-._~ v"


@pytest.mark.parametrize("fmt", sorted(FORMAT_PATTERNS))
def test_each_pattern_takes_exactly_the_format(fmt):
    good, bad = CASES[fmt]
    regex = re.compile(FORMAT_PATTERNS[fmt])
    assert [s for s in good if not regex.fullmatch(s)] == []
    assert [s for s in bad if regex.fullmatch(s)] == []


def test_uri_reference_agrees_with_rfc3986_validator_on_random_strings():
    regex = re.compile(FORMAT_PATTERNS["uri-reference"])
    rng = random.Random(0)
    strings = [
        "".join(rng.choice(URI_CHARACTERS) for _ in range(rng.randint(0, 14))) for _ in range(5000)
    ]
    differ = [
        s
        for s in strings
        if bool(regex.fullmatch(s)) != bool(validate_rfc3986(s, rule="URI_reference"))
    ]
    assert differ == []
    assert 500 < sum(1 for s in strings if regex.fullmatch(s)) < 4500  # both sides probed


@pytest.mark.parametrize("fmt", sorted(FORMAT_PATTERNS))
def test_llguidance_enforces_each_format(compiler, hf_tokenizer, fmt):
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}},
              "required": ["v"]}  # fmt: skip
    compiled = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
    good, bad = CASES[fmt]
    for text in good:
        assert accepts_text(
            compiled,
            hf_tokenizer,
            json.dumps({"v": text}, separators=(",", ":"), ensure_ascii=False),
        ), text
    for text in bad:
        assert not accepts_text(
            compiled,
            hf_tokenizer,
            json.dumps({"v": text}, separators=(",", ":"), ensure_ascii=False),
        ), text


def test_a_format_beside_a_pattern_is_refused_by_name(compiler):
    from radixlm.runtime.errors import UnsupportedGrammarError

    schema = {"type": "string", "format": "uri-reference", "pattern": "^a"}
    with pytest.raises(UnsupportedGrammarError, match="format at # .*one is already there"):
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)), "llguidance")
