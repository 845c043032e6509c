"""What the per-format tool-call tests share: tools with bounded schemas (so a random walk
under a grammar ends), a byte-level BPE tokenizer trained here on every format's text
(no model needed), and a random "model" that picks among the tokens a grammar allows."""

from __future__ import annotations

import json
import random
from functools import cache

import jsonschema
import torch

from radixlm.kernels.bitmask import allowed_token_ids
from radixlm.runtime.tools.format import FORMATS, ToolFormat
from radixlm.runtime.tools.parser import ParsedOutput, ToolCallParser
from radixlm.runtime.tools.plan import FunctionTool

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
SEARCH = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
        "exact": {"type": "boolean"},
        "when": {"type": "string", "format": "date"},
    },
    "required": ["tags"],
    "additionalProperties": False,
}
TOOLS = (
    FunctionTool("get_weather", "The weather in a city.", WEATHER),
    FunctionTool("search_notes", None, SEARCH),
    FunctionTool("get_time"),
)
SCHEMAS = {tool.name: tool.parameters for tool in TOOLS}
EOS = "<|endoftext|>"
_ENGLISH = "Sure, let me check the weather in Paris for you. The answer is 42 degrees. "


def sample_arguments(fmt: ToolFormat) -> dict[str, str]:
    """Each tool's arguments as ``fmt`` writes them."""
    return {
        "get_weather": fmt.render_arguments({"city": "Paris", "unit": "celsius", "days": 3}),
        "search_notes": fmt.render_arguments({"tags": ["a", "bc"], "exact": True}),
        "get_time": fmt.render_arguments({}),
    }


def sample_section(fmt: ToolFormat, names: tuple[str, ...] = ("get_weather",)) -> str:
    args = sample_arguments(fmt)
    return fmt.render_section([(name, args[name]) for name in names])


@cache
def tokenizer():
    """A 600-token byte-level BPE trained on every format's calls and some English."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [_ENGLISH]
    for fmt in FORMATS.values():
        corpus.append(sample_section(fmt, ("get_weather", "search_notes", "get_time")))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOS],
        show_progress=False,
    )
    bpe.train_from_iterator(corpus * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS)


@cache
def vocabulary():
    from radixlm.runtime.constrained.vocab import TokenVocabulary

    tok = tokenizer()
    return TokenVocabulary.from_tokenizer(tok, len(tok), frozenset({tok.eos_token_id}))


@cache
def marked_tokenizer():
    """``tokenizer()`` with every format's ``tokens`` added as special tokens, as many
    families' tokenizers have them (``[TOOL_CALLS]``, ``<|python_tag|>``, ...)."""
    import copy

    tok = copy.deepcopy(tokenizer())
    markers = sorted({text for fmt in FORMATS.values() for text in fmt.tokens})
    tok.add_special_tokens({"additional_special_tokens": markers})
    return tok


@cache
def marked_vocabulary():
    from radixlm.runtime.constrained.vocab import TokenVocabulary

    tok = marked_tokenizer()
    return TokenVocabulary.from_tokenizer(tok, len(tok), frozenset({tok.eos_token_id}))


def walk(
    compiled, seed: int, prefix: str = "", max_tokens: int = 2000, marked: bool = False
) -> str:
    """A random model's output under ``compiled``: ``prefix`` first (its tokens must be
    allowed), then tokens drawn from the mask, EOS taken half the times it is allowed.
    ``marked``: over ``marked_tokenizer()`` (the text keeps its special tokens).

    Raises:
        AssertionError: the grammar refused the prefix, or left no token to pick.
    """
    tok, vocab = (
        (marked_tokenizer(), marked_vocabulary()) if marked else (tokenizer(), vocabulary())
    )
    rng = random.Random(seed)
    matcher = compiled.new_matcher()
    ids: list[int] = []
    for token in tok.encode(prefix, add_special_tokens=False):
        assert matcher.accept_token(token), f"the grammar refused {prefix!r}"
        ids.append(token)
    bitmask = torch.zeros(1, vocab.bitmask_width, dtype=torch.int32)
    for _ in range(max_tokens):
        if matcher.is_terminal():
            break
        bitmask.zero_()
        matcher.fill_bitmask(bitmask, 0)
        allowed = allowed_token_ids(bitmask[0], vocab.vocab_size).tolist()
        assert allowed, f"no token allowed after {tok.decode(ids)!r}"
        eos = tok.eos_token_id
        if eos in allowed and (len(allowed) == 1 or rng.random() < 0.5):
            break
        token = rng.choice([t for t in allowed if t != eos])
        assert matcher.accept_token(token)
        ids.append(token)
    else:
        raise AssertionError(f"no end within {max_tokens} tokens: {tok.decode(ids)!r}")
    return tok.decode(ids, skip_special_tokens=False)


def assert_valid_calls(
    fmt: ToolFormat, text: str, names=tuple(SCHEMAS), strict: bool = True
) -> ParsedOutput:
    """Every call in ``text`` is whole, names one of ``names`` and its arguments
    validate against that tool's schema; returns the parse. ``strict``: JSON strings
    hold no raw control characters (xgrammar 0.2.9 lets a string with ``maxLength``
    hold them: Python reads them with strict=False)."""
    parsed = ToolCallParser(fmt, TOOLS).parse(text)
    for call in parsed.calls:
        assert call.complete, (text, call)
        assert call.name in names, (text, call)
        jsonschema.validate(json.loads(call.arguments, strict=strict), SCHEMAS[call.name])
    return parsed
