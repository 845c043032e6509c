"""IncrementalDetokenizer on a real byte-level BPE that splits CJK and emoji across tokens."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from radixlm.runtime.io.detokenizer import IncrementalDetokenizer

REPLACEMENT = "\ufffd"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "Hello world, this is a small corpus for testing the detokenizer.",
    "The quick brown fox jumps over the lazy dog. User: hi Assistant: hello there",
    "你好，世界！今天天气很好。我们一起去公园散步吧。机器学习和自然语言处理",
    "emoji 😀🎉🚀 party 👍🏽 ok ✨ café naïve",
]
MIXED_TEXTS = [
    "龙凤呈祥，万事如意",
    "party 🎉🚀 time 👍🏽!",
    "Hello 世界 😀 café",
    "a\nb  c\t龙🐉d",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A 400-token byte-level BPE: too small to hold most CJK/emoji characters whole."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


def stream(
    tokenizer: Any,
    ids: Sequence[int],
    chunks: Sequence[int] | None = None,
    prompt_ids: Sequence[int] | None = None,
    **kwargs: Any,
) -> tuple[IncrementalDetokenizer, list[str]]:
    """Feed ``ids`` (one at a time, or in ``chunks`` sizes); returns the deltas, finish last."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, True, True, **kwargs)
    sizes = list(chunks) if chunks else [1] * len(ids)
    deltas, pos = [], 0
    for size in sizes:
        result = detok.feed(ids[pos : pos + size])
        pos += size
        deltas.append(result.text)
        if result.stopped:
            return detok, deltas
    deltas.append(detok.finish())
    return detok, deltas


def test_fixture_splits_multibyte_characters(tokenizer: Any) -> None:
    alone = []
    for text in MIXED_TEXTS:
        pieces = [tokenizer.decode([i]) for i in encode(tokenizer, text)]
        assert any(REPLACEMENT in p for p in pieces), text  # a character split across tokens
        alone += [p for p in pieces if p == REPLACEMENT]
    assert alone  # some token is nothing but part of one character


@pytest.mark.parametrize("text", MIXED_TEXTS)
def test_streamed_text_is_never_broken_and_adds_up(tokenizer: Any, text: str) -> None:
    ids = encode(tokenizer, text)
    detok, deltas = stream(tokenizer, ids)
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == detok.text == tokenizer.decode(ids) == text


def test_with_a_prompt_only_the_output_is_text(tokenizer: Any) -> None:
    prompt = encode(tokenizer, "User: 你好 Assistant:")
    ids = encode(tokenizer, " 龙🐉 ok")
    detok, deltas = stream(tokenizer, ids, prompt_ids=prompt)
    assert "".join(deltas) == detok.text == tokenizer.decode(ids)


def test_several_tokens_per_feed(tokenizer: Any) -> None:
    ids = encode(tokenizer, "".join(MIXED_TEXTS))
    rng = random.Random(0)
    chunks = []
    while sum(chunks) < len(ids):
        chunks.append(min(rng.randint(1, 4), len(ids) - sum(chunks)))
    detok, deltas = stream(tokenizer, ids, chunks)
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == tokenizer.decode(ids)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.sampled_from(["a", " ", "é", "你", "龙", "😀", "👍🏽", "\n", "ok", "🐉"]), max_size=30
    ),
    st.integers(min_value=1, max_value=3),
)
def test_any_text_any_chunking_adds_up(tokenizer: Any, pieces: list[str], chunk: int) -> None:
    ids = encode(tokenizer, "".join(pieces))
    chunks = [chunk] * (len(ids) // chunk) + ([len(ids) % chunk] if len(ids) % chunk else [])
    detok, deltas = stream(tokenizer, ids, chunks)
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == detok.text == "".join(pieces)


def test_incomplete_character_at_the_end_comes_out_of_finish(tokenizer: Any) -> None:
    ids = encode(tokenizer, "ok 🐉")
    partial = ids[:-1]
    assert tokenizer.decode(partial).endswith(REPLACEMENT)
    detok, deltas = stream(tokenizer, partial)
    assert REPLACEMENT not in "".join(deltas[:-1])
    assert REPLACEMENT in deltas[-1]  # finish() emits it as decode gives it
    assert "".join(deltas) == detok.text == tokenizer.decode(partial)


class CountingTokenizer:
    """Wraps a tokenizer, recording how many ids each decode call received."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.sizes.append(len(ids))
        return self.inner.decode(ids, **kwargs)


def test_each_step_decodes_a_small_window(tokenizer: Any) -> None:
    ids = encode(tokenizer, " ".join(MIXED_TEXTS * 10))
    counting = CountingTokenizer(tokenizer)
    prompt = encode(tokenizer, "User: hi " * 20)
    detok, deltas = stream(counting, ids, prompt_ids=prompt)
    assert len(ids) > 200
    assert max(counting.sizes) <= 12
    assert "".join(deltas) == tokenizer.decode(ids)


def spanning_stop(tokenizer: Any, text: str, start: int, length: int) -> tuple[list[int], str]:
    """``text``'s ids and its substring [start, start + length), checked to span tokens."""
    ids = encode(tokenizer, text)
    stop = text[start : start + length]
    ends = [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]
    assert any(start < end < start + length for end in ends), "stop must span two tokens"
    return ids, stop


@pytest.mark.parametrize(
    ("text", "start", "length"),
    [("Hello world, this is a test", 8, 5), ("你好，世界！今天天气很好", 3, 3)],
)
def test_stop_string_spanning_tokens_is_cut_and_never_streamed(
    tokenizer: Any, text: str, start: int, length: int
) -> None:
    ids, stop = spanning_stop(tokenizer, text, start, length)
    detok = IncrementalDetokenizer(tokenizer, None, True, True, stop=[stop])
    streamed = ""
    for token in ids:
        result = detok.feed([token])
        streamed += result.text
        assert len(streamed) <= start, "part of the stop string was streamed"
        if result.stopped:
            break
    assert result.stopped and result.matched_stop == stop
    assert streamed == detok.text == text[:start]
    after = detok.feed(ids[-1:])
    assert after.text == "" and after.stopped
    assert detok.finish() == ""


def test_no_stop_trim_keeps_the_stop_string(tokenizer: Any) -> None:
    text = "Hello world, this is a test"
    ids, stop = spanning_stop(tokenizer, text, 8, 5)
    detok, deltas = stream(tokenizer, ids, stop=[stop], no_stop_trim=True)
    assert detok.stopped
    assert "".join(deltas) == detok.text == text[: 8 + 5]


def test_earliest_stop_string_wins(tokenizer: Any) -> None:
    ids = encode(tokenizer, "one two three four")
    detok, deltas = stream(tokenizer, ids, stop=["four", "two"])
    assert detok.matched_stop == "two"
    assert "".join(deltas) == "one "


def test_a_stop_prefix_that_does_not_complete_is_released(tokenizer: Any) -> None:
    text = "hello world, bye"
    ids = encode(tokenizer, text)
    detok, deltas = stream(tokenizer, ids, stop=["world peace"])
    assert not detok.stopped
    assert "".join(deltas) == detok.text == text
    assert deltas[-1] == ""  # released as soon as "," ruled the stop out


def test_a_stop_prefix_at_the_end_comes_out_of_finish(tokenizer: Any) -> None:
    ids = encode(tokenizer, "we say wor")
    detok, deltas = stream(tokenizer, ids, stop=["world"])
    assert "".join(deltas[:-1]) == "we say "
    assert deltas[-1] == "wor"
    assert detok.text == "we say wor" and not detok.stopped


def test_stop_strings_are_searched_in_the_output_only(tokenizer: Any) -> None:
    prompt = encode(tokenizer, "User: hi Assistant:")
    ids = encode(tokenizer, " hello there")
    detok, deltas = stream(tokenizer, ids, prompt_ids=prompt, stop=["Assistant:"])
    assert not detok.stopped
    assert "".join(deltas) == " hello there"


def test_stop_string_in_a_single_token(tokenizer: Any) -> None:
    ids = encode(tokenizer, "say hello there")
    detok, deltas = stream(tokenizer, ids, stop=["e"])
    assert detok.matched_stop == "e" and "".join(deltas) == "say h"


# --- stop_regex ------------------------------------------------------------------------


def test_stop_regex_ends_at_its_first_match_and_never_streams_part_of_it(tokenizer: Any) -> None:
    text = "the quick brown fox jumps over the lazy dog"
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, None, True, True, stop_regex=[r"f\w+ j"])
    streamed = ""
    for token in ids:
        result = detok.feed([token])
        streamed += result.text
        assert "f" not in streamed.removeprefix("the quick brown "), "part of the match streamed"
        if result.stopped:
            break
    assert result.stopped and result.matched_stop == r"f\w+ j" and result.error is None
    assert streamed == detok.text == "the quick brown "


def test_stop_regex_with_no_stop_trim_keeps_the_match(tokenizer: Any) -> None:
    ids = encode(tokenizer, "one two three four")
    detok, deltas = stream(tokenizer, ids, stop_regex=[r"t\w+e"], no_stop_trim=True)
    assert "".join(deltas) == "one two thre"


def test_the_first_stop_to_complete_wins_between_strings_and_regexes(tokenizer: Any) -> None:
    ids = encode(tokenizer, "one two three four")
    detok, deltas = stream(tokenizer, ids, stop=["three"], stop_regex=[r"t\w"])
    assert detok.matched_stop == r"t\w" and "".join(deltas) == "one "
    detok, deltas = stream(tokenizer, ids, stop=["two"], stop_regex=[r"thr\w+"])
    assert detok.matched_stop == "two"


def test_a_partial_regex_match_at_the_end_comes_out_of_finish(tokenizer: Any) -> None:
    ids = encode(tokenizer, "we say wor")
    detok, deltas = stream(tokenizer, ids, stop_regex=[r"world\b"])
    assert not detok.stopped and "".join(deltas) == detok.text == "we say wor"


def test_a_stop_regex_that_times_out_ends_the_request_with_an_error(tokenizer: Any) -> None:
    ids = encode(tokenizer, "a" * 60 + "!")
    detok = IncrementalDetokenizer(tokenizer, None, True, True, stop_regex=[r"(a|aa)+b"])
    results = [detok.feed([token]) for token in ids]
    failed = [r for r in results if r.error is not None]
    assert failed and failed[0].stopped and "took over" in failed[0].error


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_skipped_or_kept(tokenizer: Any, skip: bool) -> None:
    ids = encode(tokenizer, "<|im_start|>assistant 你好<|im_end|>")
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in ids
    detok = IncrementalDetokenizer(tokenizer, None, skip, True)
    text = "".join(detok.feed([token]).text for token in ids) + detok.finish()
    assert text == detok.text == tokenizer.decode(ids, skip_special_tokens=skip)
    assert ("<|im_start|>" in text) is not skip


def test_special_tokens_read_as_text_stay_and_the_others_go(tokenizer):
    """A request with tools keeps its format's marker tokens (``skipped_ids``: every other
    special token), streamed and whole alike."""
    import copy

    from radixlm.runtime.constrained.vocab import special_tokens

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]", "[ARGS]"]})
    calls, args = tok.convert_tokens_to_ids(["[TOOL_CALLS]", "[ARGS]"])
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = [*encode(tok, "Sure."), calls, *encode(tok, "get_weather"), args]
    ids += [*encode(tok, '{"city": "你好"}'), im_end]
    skipped = frozenset(special_tokens(tok).values()) - {calls, args}  # as the engine does
    for chunks in (None, [1, 3, 2, 5, 100]):
        detok, deltas = stream(tok, ids, chunks, skipped_ids=skipped)
        assert "".join(deltas) == detok.text == 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "你好"}'
    _, plain = stream(tok, ids)  # skip_special_tokens alone: every marker goes
    assert "".join(plain) == 'Sure.get_weather{"city": "你好"}'
