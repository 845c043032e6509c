"""The outlines backend: a regex (or choices, or a schema turned into a regex) as an
exact token-level FSM over the vocabulary, built with outlines-core.

Two automata per grammar::

    outlines_core.Index   token-level: state x token -> state; gives the masks
    interegular FSM       character-level: gives the forced string (jump-forward)
                          and proves a regex accepts something

Their state ids are unrelated, so the matcher walks the character FSM over the
characters of every accepted token itself (bytes buffered until a UTF-8
character is whole).
"""

from __future__ import annotations

import copyreg
import re
from dataclasses import dataclass, field
from typing import Any

import interegular
import outlines_core
import torch
from interegular.fsm import anything_else
from outlines_core.json_schema import build_regex_from_schema

from radixlm.runtime.constrained.config import GrammarConfig
from radixlm.runtime.constrained.json_numbers import bound_regex
from radixlm.runtime.constrained.json_strings import bound_string_regex
from radixlm.runtime.constrained.registry import OUTLINES, REGISTRY
from radixlm.runtime.constrained.schema_check import check_schema
from radixlm.runtime.constrained.spec import GrammarSpec
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError

__all__ = ["OutlinesBackend"]


def _anything_else() -> Any:
    return anything_else


# interegular compares its "any other symbol" marker by identity: unpickled, it must be
# the same object, not a copy (compile workers send FSMs back as pickles).
copyreg.pickle(type(anything_else), lambda _: (_anything_else, ()))

_MAX_ROLLBACK_TOKENS = 64
# A forced string longer than this is cut (the rest is forced again next step).
_MAX_FORCED_CHARS = 256


class OutlinesBackend:
    name = OUTLINES.name
    kinds = OUTLINES.kinds

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig) -> None:
        tokens: dict[bytes, list[int]] = {}
        for i, piece in enumerate(vocab.token_bytes):
            if piece:
                tokens.setdefault(piece, []).append(i)
        self._eos_id = min(vocab.eos_token_ids)
        self._vocabulary = outlines_core.Vocabulary(self._eos_id, tokens)
        self._token_bytes = vocab.token_bytes
        self._max_states = config.grammar_max_states
        self._max_schema_depth = config.grammar_max_schema_depth

    def export(self, compiled: OutlinesCompiled) -> tuple:
        """Both automata as pickles (outlines-core's Index and interegular's FSM pickle;
        see ``_anything_else``), without the vocabulary's bytes."""
        c = compiled
        return c.index, c.char_fsm, c.terminal_states, c.eos_id, c.warnings

    def load(self, exported: tuple) -> OutlinesCompiled:
        index, char_fsm, terminal, eos_id, warnings = exported
        return OutlinesCompiled(index, char_fsm, terminal, eos_id, self._token_bytes, warnings)

    def compile(self, spec: GrammarSpec) -> OutlinesCompiled:
        # EBNF and Lark grammars and structural tags are beyond any FSM
        REGISTRY.check_kind(self.name, spec.kind)
        regex, warnings = self._regex(spec)
        char_fsm = self._char_fsm(regex, spec.kind)
        try:
            index = outlines_core.Index(regex, self._vocabulary)
        except (ValueError, RuntimeError) as e:
            raise GrammarError(spec.kind, f"outlines-core cannot build its FSM: {e}") from e
        transitions = index.get_transitions()
        if len(transitions) > self._max_states:
            raise GrammarError(
                spec.kind,
                f"its token-level FSM has {len(transitions)} states, over grammar_max_states "
                f"{self._max_states}; use grammar_backend='xgrammar'",
            )
        initial = index.get_initial_state()
        if not transitions.get(initial) and not index.is_final_state(initial):
            raise GrammarError(spec.kind, "it accepts nothing this vocabulary can spell")
        terminal = frozenset(
            s for s in index.get_final_states() if set(transitions.get(s, {})) <= {self._eos_id}
        )
        return OutlinesCompiled(
            index, char_fsm, terminal, self._eos_id, self._token_bytes, warnings
        )

    def _regex(self, spec: GrammarSpec) -> tuple[str, tuple[str, ...]]:
        """The spec's regex, and what a lenient JSON-schema read dropped."""
        if spec.kind != "json_schema":
            regex = spec.as_regex()
            try:
                re.compile(regex)
            except re.error as e:
                raise GrammarError(spec.kind, f"not a valid regular expression: {e}") from e
            return regex, ()
        checked = check_schema(spec.text, self.name, self._max_schema_depth, spec.lenient)
        space = f"[ \\t\\n]{{0,{spec.max_whitespace}}}" if spec.max_whitespace else ""
        try:
            regex = build_regex_from_schema(checked.text, whitespace_pattern=space)
        except (ValueError, RuntimeError) as e:
            raise UnsupportedGrammarError("json_schema", f"outlines-core: {e}") from e
        if spec.bounds_numbers:  # outlines-core ignores minimum / maximum: in the regex
            regex = bound_regex(regex, checked.text)
        if spec.string_bound is not None:
            regex = bound_string_regex(regex, checked.text, spec.string_bound)
        return regex, checked.warnings

    def _char_fsm(self, regex: str, field_name: str) -> Any | None:
        """interegular's FSM, or None where it cannot parse the regex (jump-forward is then
        off for this grammar; the token-level FSM still enforces it)."""
        try:
            fsm = interegular.parse_pattern(regex).to_fsm()
        except Exception:  # interegular raises many types for syntax it lacks
            return None
        if fsm.empty():
            raise GrammarError(field_name, f"the regular expression {regex!r} accepts nothing")
        return fsm


@dataclass(frozen=True)
class OutlinesCompiled:
    index: Any  # outlines_core.Index
    char_fsm: Any | None  # interegular FSM
    terminal_states: frozenset[int]
    eos_id: int
    token_bytes: tuple[bytes | None, ...] = field(repr=False, compare=False)
    warnings: tuple[str, ...] = ()  # what a lenient JSON-schema read dropped
    backend: str = "outlines"

    def new_matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self)

    def chars_of(self, key: Any) -> list:
        """The characters of one character-FSM transition key (for forced strings)."""
        return self.char_fsm.alphabet.by_transition.get(key, [])


class OutlinesMatcher:
    def __init__(self, compiled: OutlinesCompiled) -> None:
        self._compiled = compiled
        self._guide = outlines_core.Guide(compiled.index, max_rollback=_MAX_ROLLBACK_TOKENS)
        fsm = compiled.char_fsm
        self._char_state = fsm.initial if fsm is not None else None
        self._pending = b""  # bytes of an unfinished UTF-8 character
        self._history: list[tuple[Any, bytes]] = []  # char-FSM state before each token
        self._ended = False

    def accept_token(self, token_id: int) -> bool:
        if self._ended:
            return False
        if token_id == self._compiled.eos_id:
            self._ended = self._guide.is_finished()
            return self._ended
        if not self._guide.accepts_tokens([token_id]):
            return False
        self._history.append((self._char_state, self._pending))
        self._guide.advance(token_id, return_tokens=False)
        self._walk_chars(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._ended:
            self._ended = False
            num_tokens -= 1
        if num_tokens:
            self._guide.rollback_state(num_tokens)
            self._char_state, self._pending = self._history[-num_tokens]
            del self._history[-num_tokens:]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        target = bitmask[row]
        self._guide.write_mask_into(target.data_ptr(), target.numel(), target.element_size())

    def is_terminal(self) -> bool:
        return self._ended or self._guide.get_state() in self._compiled.terminal_states

    def forced_string(self) -> str:
        fsm = self._compiled.char_fsm
        state = self._char_state
        if fsm is None or state is None or self._pending:
            return ""
        out: list[str] = []
        while state not in fsm.finals and len(out) < _MAX_FORCED_CHARS:
            moves = fsm.map.get(state, {})
            if len(moves) != 1:
                break
            key, state = next(iter(moves.items()))
            chars = self._compiled.chars_of(key)
            if len(chars) != 1 or chars[0] is anything_else:
                break
            out.append(chars[0])
        return "".join(out)

    def _walk_chars(self, token_id: int) -> None:
        """Advances the character FSM over the token's complete characters."""
        fsm = self._compiled.char_fsm
        if fsm is None or self._char_state is None:
            return
        data = self._pending + (self._compiled.token_bytes[token_id] or b"")
        text, self._pending = _split_utf8(data)
        state = self._char_state
        for char in text:
            state = fsm.map.get(state, {}).get(fsm.alphabet[char])  # unlisted -> anything_else
            if state is None:
                break  # cannot happen when both automata agree; jump-forward stops
        self._char_state = state


def _split_utf8(data: bytes) -> tuple[str, bytes]:
    """Decodes the whole characters of ``data``; returns them and the unfinished tail."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode(), data[cut:]
        except UnicodeDecodeError:
            continue
    return data.decode(errors="replace"), b""  # not UTF-8 at all: give up on the tail
