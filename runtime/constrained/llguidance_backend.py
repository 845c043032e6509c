"""The llguidance backend: JSON schema, regex, EBNF and Lark grammars as an Earley parser
over a lazily built lexer, with the mask computed per step.

Covers the most of JSON Schema of the three backends (``allOf`` merged, ``oneOf``
proven exclusive, ``patternProperties``, string lengths with a pattern or format; see
``schema_check`` and ``registry.LLGUIDANCE``) and compiles real-world schemas quickly
(benchmarks/README.md): the lexer's automaton is built as masks need it, within
llguidance's per-step limits, so no step runs away.

The tokenizer is built from our ``TokenVocabulary`` (raw bytes per id; special and
unused ids are llguidance "special" tokens, which no grammar produces). llguidance
asks the tokenizer to tokenize text only to plan forced tokens, which we do not use:
a greedy longest-match over the same bytes serves.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance
import torch
from llguidance.gbnf_to_lark import gbnf_to_lark

from radixlm.runtime.constrained.base import GrammarMatcher
from radixlm.runtime.constrained.config import GrammarConfig
from radixlm.runtime.constrained.registry import LLGUIDANCE, REGISTRY
from radixlm.runtime.constrained.schema_check import check_schema
from radixlm.runtime.constrained.schema_refs import inline_recursive_refs
from radixlm.runtime.constrained.spec import GrammarSpec
from radixlm.runtime.constrained.unique_items import (
    UniqueItemsMatcher,
    UniqueItemsVocab,
    UniquePlan,
)
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError

# What crosses from the compile worker: the grammar, its warnings, the uniqueItems plan.
_Exported = tuple[str, tuple[str, ...], UniquePlan | None]

__all__ = ["LLGuidanceBackend"]

_WHITESPACE = r"[\x20\x0A\x0D\x09]"
# llguidance's refusal of a oneOf whose branches it cannot prove exclusive.
_ONE_OF_REFUSAL = "oneOf constraints are not supported"
# llguidance's refusal of a $ref with sibling keywords in a recursive schema (then
# retried with ``schema_refs.inline_recursive_refs``).
_CYCLE_REFUSAL = "circular references with sibling keys"
# The work llguidance may spend building a grammar's first lexer state (its default,
# 1M, refuses real schemas such as CityJSON's, which builds in ~1.5 s at 10M, measured
# 2026-12-06 on EPYC-512); each later step keeps llguidance's own limit.
_INITIAL_LEXER_FUEL = 10_000_000
# The most Earley items one parser row may hold (llguidance's default, 2,000, stops
# minecraft-recipe.json's matcher at its first token, "{": 12,594 items; measured
# 2026-12-06). Its mask was computed first, so the engine sampled a token the matcher
# then refused. Each step stays bounded by llguidance's step_max_items (50,000).
_MAX_ITEMS_IN_ROW = 20_000


def _limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(
        initial_lexer_fuel=_INITIAL_LEXER_FUEL, max_items_in_row=_MAX_ITEMS_IN_ROW
    )


class LLGuidanceBackend:
    name = LLGUIDANCE.name
    kinds = LLGUIDANCE.kinds

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig) -> None:
        self._tokenizer = llguidance.LLTokenizer(
            _VocabTokenizer(vocab), n_vocab=vocab.vocab_size, eos_token=sorted(vocab.eos_token_ids)
        )
        self._max_schema_depth = config.grammar_max_schema_depth
        self._vocab = vocab
        self._unique_tables: UniqueItemsVocab | None = None

    def compile(self, spec: GrammarSpec) -> LLGuidanceCompiled:
        """The spec as an llguidance grammar, checked against this vocabulary.

        Raises:
            GrammarError: the spec is invalid.
            UnsupportedGrammarError: a JSON-schema keyword llguidance cannot enforce.
        """
        REGISTRY.check_kind(self.name, spec.kind)
        if spec.kind != "json_schema":
            grammar = self._grammar(spec)
            return self._checked(grammar, self._validate(grammar), spec, ())
        checked = check_schema(
            spec.text,
            self.name,
            self._max_schema_depth,
            spec.lenient,
            spec.bounds_numbers,
            spec.string_bound,
        )
        warnings = checked.warnings
        text = checked.text
        grammar = self._json_grammar(text, spec.max_whitespace, coerce_one_of=False)
        verdict = self._validate(grammar)
        failed, messages = verdict
        if failed and _CYCLE_REFUSAL in messages[0]:  # only then: it hides oneOf branches
            text = json.dumps(inline_recursive_refs(json.loads(text)), ensure_ascii=False)
            grammar = self._json_grammar(text, spec.max_whitespace, coerce_one_of=False)
            verdict = self._validate(grammar)
            failed, messages = verdict
        if failed and _ONE_OF_REFUSAL in messages[0]:
            where = ", ".join(checked.open_one_ofs[:3]) + (
                ", ..." if len(checked.open_one_ofs) > 3 else ""
            )
            reason = (
                f"a oneOf (of those at {where or '#'}) has branches llguidance cannot prove "
                "exclusive (by type, const or enum values, or required properties), so it "
                "cannot enforce exactly one"
            )
            if not spec.lenient:
                raise UnsupportedGrammarError(
                    spec.kind, f"{reason}; set json_schema_lenient=True to treat it as anyOf"
                )
            warnings = (*warnings, f"oneOf read as anyOf: {reason}")
            grammar = self._json_grammar(text, spec.max_whitespace, coerce_one_of=True)
            verdict = self._validate(grammar)
        compiled = self._checked(grammar, verdict, spec, warnings)
        if checked.unique is None:
            return compiled
        plan = UniquePlan.from_schema(json.loads(checked.unique))
        return dataclasses.replace(compiled, unique=plan, unique_vocab=self._unique_vocab())

    def export(self, compiled: LLGuidanceCompiled) -> _Exported:
        return compiled.grammar, compiled.warnings, compiled.unique

    def load(self, exported: _Exported) -> LLGuidanceCompiled:
        grammar, warnings, unique = exported
        vocab = self._unique_vocab() if unique is not None else None
        return LLGuidanceCompiled(grammar, self._matcher(grammar, "grammar"), warnings,
                                  unique=unique, unique_vocab=vocab)  # fmt: skip

    def _unique_vocab(self) -> UniqueItemsVocab:
        """The uniqueItems guard's tables over this vocabulary (built on first use)."""
        if self._unique_tables is None:
            self._unique_tables = UniqueItemsVocab(self._vocab.token_bytes, self._vocab.vocab_size)
        return self._unique_tables

    def _matcher(self, grammar: str, kind: str) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            raise GrammarError(kind, f"llguidance cannot compile it: {matcher.get_error()}")
        return matcher

    def _grammar(self, spec: GrammarSpec) -> str:
        if spec.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(spec.text)
        if spec.kind == "ebnf":
            try:
                lark = gbnf_to_lark(spec.text)
            except Exception as e:  # its parser raises plain Exceptions with the position
                raise GrammarError(spec.kind, f"not a valid EBNF grammar: {e}") from e
            return llguidance.LLMatcher.grammar_from_lark(lark)
        regex = spec.as_regex()
        try:  # Python's verdict first: llguidance's own message spans many lines
            re.compile(regex)
        except re.error as e:
            raise GrammarError(spec.kind, f"not a valid regular expression: {e}") from e
        return llguidance.LLMatcher.grammar_from_regex(regex)

    def _json_grammar(self, schema: str, max_whitespace: int, coerce_one_of: bool) -> str:
        # Every option set here, so none can come from the schema's own "x-guidance".
        options = {
            "item_separator": ",",
            "key_separator": ":",
            "whitespace_flexible": max_whitespace > 0,
            "whitespace_pattern": f"{_WHITESPACE}{{0,{max_whitespace}}}"
            if max_whitespace
            else None,
            "coerce_one_of": coerce_one_of,
            "lenient": False,
        }
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options)

    def _validate(self, grammar: str) -> tuple[bool, list[str]]:
        return llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self._tokenizer, limits=_limits()
        )

    def _checked(
        self,
        grammar: str,
        verdict: tuple[bool, list[str]],
        spec: GrammarSpec,
        warnings: Sequence[str],
    ) -> LLGuidanceCompiled:
        """The compiled grammar, or the error llguidance's ``verdict`` on it gives."""
        failed, messages = verdict
        if failed:
            message = " ".join(messages[0].split())
            if "nsatisfiable" in message:
                raise GrammarError(spec.kind, f"the schema accepts nothing: {message}")
            # our checks ran first: what llguidance still refuses is what it lacks
            kind = UnsupportedGrammarError if spec.kind == "json_schema" else GrammarError
            raise kind(spec.kind, f"llguidance cannot compile it: {message}")
        return LLGuidanceCompiled(grammar, self._matcher(grammar, spec.kind), tuple(warnings))


@dataclass(frozen=True)
class LLGuidanceCompiled:
    """grammar: llguidance's serialized grammar; prototype: a fresh matcher, copied for
    each request; warnings: what a lenient JSON-schema read dropped."""

    grammar: str
    prototype: llguidance.LLMatcher
    warnings: tuple[str, ...] = ()
    backend: str = "llguidance"
    unique: UniquePlan | None = None  # arrays whose items must differ (the guard's plan)
    unique_vocab: UniqueItemsVocab | None = None

    def new_matcher(self) -> GrammarMatcher:
        matcher = LLGuidanceMatcher(self.prototype.deep_copy())
        if self.unique is None or self.unique_vocab is None:
            return matcher
        return UniqueItemsMatcher(matcher, self.unique, self.unique_vocab)


class LLGuidanceMatcher:
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        # try_consume leaves the state as it was when the token is refused (consume
        # would put the matcher in its error state for good).
        return self._matcher.try_consume_tokens([token_id]) == 1

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        target = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)
        if self._matcher.is_error():  # it then allows EOS: no token at all is the truth
            target.zero_()

    def is_terminal(self) -> bool:
        # A matcher past a resource limit is stopped too: that is an error (its mask is
        # then empty, so the request fails), never a complete output.
        return self._matcher.is_stopped() and not self._matcher.is_error()

    def forced_string(self) -> str:
        return _whole_characters(self._matcher.compute_ff_bytes())


def _whole_characters(data: bytes) -> str:
    """The longest prefix of ``data`` made of whole UTF-8 characters."""
    for end in range(len(data), max(len(data) - 4, 0) - 1, -1):
        try:
            return data[:end].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class _VocabTokenizer:
    """What ``llguidance.LLTokenizer`` reads from a tokenizer (the shape of its
    ``TokenizerWrapper``), over our vocabulary's bytes."""

    is_tokenizer_wrapper = True
    bos_token_id = None

    def __init__(self, vocab: TokenVocabulary) -> None:
        self.eos_token_id = min(vocab.eos_token_ids)
        # A grammar never produces a special token; llguidance still wants its bytes.
        self.tokens = [piece if piece is not None else b"<special>" for piece in vocab.token_bytes]
        self.special_token_ids = [i for i, piece in enumerate(vocab.token_bytes) if piece is None]
        self._ids = {piece: i for i, piece in enumerate(vocab.token_bytes) if piece}
        self._longest = max((len(piece) for piece in self._ids), default=1)

    def __call__(self, text: str | bytes) -> list[int]:
        """Greedy longest-match tokenization (bytes no token spells are skipped)."""
        data = text.encode() if isinstance(text, str) else text
        out: list[int] = []
        i = 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                token = self._ids.get(data[i : i + n])
                if token is not None:
                    out.append(token)
                    i += n
                    break
            else:
                i += 1
        return out
