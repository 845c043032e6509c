"""The xgrammar backend: JSON schema, regex, EBNF and structural tags as a pushdown automaton.

Compiles realistic schemas quickly, where outlines-core's FSM construction can
run past any time limit on the same ones (benchmarks/README.md). The
vocabulary is passed as raw bytes with every special token blanked, which is
how xgrammar learns they are special: it detects none by itself for byte-level
tokenizers such as SmolLM2's, and would then allow ``<|im_start|>`` inside a
JSON string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import torch
import xgrammar

from radixlm.kernels.bitmask import bitmask_from_allowed
from radixlm.runtime.constrained.config import GrammarConfig
from radixlm.runtime.constrained.registry import REGISTRY, XGRAMMAR
from radixlm.runtime.constrained.schema_check import check_schema
from radixlm.runtime.constrained.spec import GrammarSpec
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.errors import GrammarError

__all__ = ["XGrammarBackend"]

_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class XGrammarBackend:
    name = XGRAMMAR.name
    kinds = XGRAMMAR.kinds

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig) -> None:
        encoded = [piece if piece is not None else b"" for piece in vocab.token_bytes]
        self._info = info = xgrammar.TokenizerInfo(
            encoded,
            xgrammar.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=sorted(vocab.eos_token_ids),
        )
        # One compile thread each: the engine already runs torch on every core.
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._max_schema_depth = config.grammar_max_schema_depth
        self._not_stop = _not_stop_mask(vocab)

    def compile(self, spec: GrammarSpec) -> XGrammarCompiled:
        try:
            grammar, warnings = self._compile(spec)
        except (RuntimeError, ValueError) as e:
            if isinstance(e, GrammarError):
                raise
            raise GrammarError(spec.kind, f"xgrammar cannot compile it: {_first_line(e)}") from e
        return XGrammarCompiled(grammar, self._not_stop, warnings)

    def export(self, compiled: XGrammarCompiled) -> tuple[str, tuple[str, ...]]:
        return compiled.grammar.serialize_json(), compiled.warnings

    def load(self, exported: tuple[str, tuple[str, ...]]) -> XGrammarCompiled:
        text, warnings = exported
        grammar = xgrammar.CompiledGrammar.deserialize_json(text, self._info)
        return XGrammarCompiled(grammar, self._not_stop, warnings)

    def _compile(self, spec: GrammarSpec) -> tuple[xgrammar.CompiledGrammar, tuple[str, ...]]:
        if spec.kind == "json_schema":
            checked = check_schema(
                spec.text,
                self.name,
                self._max_schema_depth,
                spec.lenient,
                spec.bounds_numbers,
                spec.string_bound,
            )
            if spec.max_whitespace:
                grammar = self._compiler.compile_json_schema(
                    checked.text, any_whitespace=True, max_whitespace_cnt=spec.max_whitespace
                )
            else:
                grammar = self._compiler.compile_json_schema(
                    checked.text, any_whitespace=False, separators=(",", ":")
                )
            return grammar, checked.warnings
        if spec.kind == "ebnf":
            return self._compiler.compile_grammar(spec.text), ()
        if spec.kind == "structural_tag":
            tag = self._with_checked_schemas(json.loads(spec.text), spec)
            return self._compiler.compile_structural_tag(json.dumps(tag)), ()
        REGISTRY.check_kind(self.name, spec.kind)
        return self._compiler.compile_regex(spec.as_regex()), ()

    def _with_checked_schemas(self, node: object, spec: GrammarSpec) -> object:
        """The structural tag with each embedded JSON schema as check_schema reads it
        (the same keyword check, and number and string bounds, as a json_schema request)."""
        if isinstance(node, dict):
            schema = node.get("json_schema")
            if node.get("type") == "json_schema" and isinstance(schema, dict):
                depth, bounded = self._max_schema_depth, spec.bounds_numbers
                text = json.dumps(schema)
                try:
                    checked = check_schema(
                        text, self.name, depth, False, bounded, spec.string_bound
                    )
                except GrammarError as e:  # the request's field is the structural tag
                    raise type(e)(spec.kind, f"an embedded JSON schema: {e.reason}") from e
                return {**node, "json_schema": json.loads(checked.text)}
            return {key: self._with_checked_schemas(value, spec) for key, value in node.items()}
        if isinstance(node, list):
            return [self._with_checked_schemas(item, spec) for item in node]
        return node


@dataclass(frozen=True)
class XGrammarCompiled:
    """grammar: xgrammar's compiled form; not_stop: (W,) int32 mask of every non-stop
    token; warnings: what a lenient JSON-schema read dropped."""

    grammar: xgrammar.CompiledGrammar
    not_stop: torch.Tensor
    warnings: tuple[str, ...] = ()
    backend: str = "xgrammar"

    def new_matcher(self) -> XGrammarMatcher:
        matcher = xgrammar.GrammarMatcher(self.grammar)
        return XGrammarMatcher(matcher, self.not_stop)


class XGrammarMatcher:
    def __init__(self, matcher: xgrammar.GrammarMatcher, not_stop: torch.Tensor) -> None:
        self._matcher = matcher
        self._not_stop = not_stop
        self._probe = torch.empty(1, not_stop.numel(), dtype=torch.int32)

    def accept_token(self, token_id: int) -> bool:
        return self._matcher.accept_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminal(self) -> bool:
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        # Complete: terminal unless some ordinary token may still follow.
        self._matcher.fill_next_token_bitmask(self._probe, 0)
        return not bool((self._probe[0] & self._not_stop).any())

    def forced_string(self) -> str:
        return self._matcher.find_jump_forward_string()


def _not_stop_mask(vocab: TokenVocabulary) -> torch.Tensor:
    """(W,) int32: every token of the vocab but the stop tokens."""
    not_stop = [t for t in range(vocab.vocab_size) if t not in vocab.eos_token_ids]
    return bitmask_from_allowed([not_stop], vocab.vocab_size)[0]


def _first_line(e: Exception) -> str:
    """xgrammar's message without its log prefix ("[12:00:00] /project/cpp/x.cc:94: ")."""
    lines = str(e).strip().splitlines()
    return _LOG_PREFIX.sub("", lines[0]) if lines else type(e).__name__
