"""Reply text into reasoning and content: whole, and streamed in any pieces alike."""

from __future__ import annotations

import time

import pytest

from radixlm.runtime.reasoning import (
    Phase,
    ReasoningDelta,
    ReasoningSplitter,
    reasoning_format,
    split_reasoning,
)

THINK = reasoning_format("think")
KIMI = reasoning_format("kimi")

CASES = [
    # (text, starting phase, reasoning, content)
    ('<think>\nLet me see.\n</think>\n\n{"a": 1}', Phase.MAY_OPEN, "Let me see.", '{"a": 1}'),
    ("  <think>x</think>y", Phase.MAY_OPEN, "x", "y"),
    ("no thinking here", Phase.MAY_OPEN, "", "no thinking here"),
    ("  spaced answer", Phase.MAY_OPEN, "", "  spaced answer"),
    ("<thin", Phase.MAY_OPEN, "", "<thin"),  # a prefix that never became the marker
    ("opened by the template</think>\n42", Phase.REASONING, "opened by the template", "42"),
    ("<think>\nrepeated start</think>ok", Phase.REASONING, "repeated start", "ok"),
    ("cut off while thinking  ", Phase.REASONING, "cut off while thinking", ""),
    ("</think>", Phase.REASONING, "", ""),
    ("x</think>  \n", Phase.REASONING, "x", ""),
    ("a</think>b</think>c", Phase.REASONING, "a", "b</think>c"),  # the first end only
    ("\n\n{}", Phase.ANSWER, "", "\n\n{}"),  # closed in the prompt: all content, as is
]


@pytest.mark.parametrize(("text", "phase", "reasoning", "content"), CASES)
def test_whole_split(text, phase, reasoning, content):
    assert split_reasoning(text, THINK, phase) == ReasoningDelta(reasoning, content)


@pytest.mark.parametrize(("text", "phase", "reasoning", "content"), CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_streamed_pieces_concatenate_to_the_whole_split(text, phase, reasoning, content, size):
    splitter = ReasoningSplitter(THINK, phase)
    pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    deltas = [splitter.feed(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    assert "".join(d.reasoning for d in deltas) == reasoning
    assert "".join(d.content for d in deltas) == content


def test_a_stream_sends_reasoning_before_the_end_marker_arrives():
    splitter = ReasoningSplitter(THINK, Phase.REASONING)
    assert splitter.feed("step one, ") == ReasoningDelta("step one,", "")
    assert splitter.feed("step two\n</th") == ReasoningDelta(" step two", "")  # "\n</th" held
    assert splitter.feed("ink>\n\n{") == ReasoningDelta("", "{")
    assert splitter.feed("}", final=True) == ReasoningDelta("", "}")


def test_first_block_anywhere_is_the_dsls_split():
    parts = split_reasoning("a<think>b\nc</think>  d", THINK, anywhere=True)
    assert parts == ReasoningDelta("b\nc", "ad")
    assert split_reasoning("plain", THINK, anywhere=True) == ReasoningDelta("", "plain")


def test_other_markers():
    text = "\u25c1think\u25b7hmm\u25c1/think\u25b7 ok"
    assert split_reasoning(text, KIMI) == ReasoningDelta("hmm", "ok")


@pytest.mark.parametrize("phase", [Phase.MAY_OPEN, Phase.REASONING])
def test_repeated_start_markers_and_the_whitespace_around_them_are_dropped(phase):
    text = "<think> <think>\n\n<think>\tx y </think> z"
    assert split_reasoning(text, THINK, phase) == ReasoningDelta("x y", "z")
    splitter = ReasoningSplitter(THINK, phase)
    deltas = [splitter.feed(c) for c in text] + [splitter.feed("", final=True)]
    assert "".join(d.reasoning for d in deltas) == "x y"
    assert "".join(d.content for d in deltas) == "z"


def test_a_million_start_markers_split_in_linear_time():
    """Each repeated marker once cost a copy of the rest of the text: 100 s for these
    7 MB; linear, it is well under a second (5 s leaves room for a loaded machine)."""
    start = time.perf_counter()
    parts = split_reasoning("<think>" * 1_000_000 + "x</think>y", THINK, Phase.MAY_OPEN)
    assert parts == ReasoningDelta("x", "y")
    assert time.perf_counter() - start < 5
