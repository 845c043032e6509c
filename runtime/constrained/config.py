"""The constrained-decoding options: ``GrammarConfig``, one part of ``EngineConfig``
(radixlm.runtime.config composes it with the others)."""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.runtime.config_checks import check_positive, is_number
from radixlm.runtime.constrained.json_strings import MAX_STRING_LENGTH
from radixlm.runtime.constrained.registry import REGISTRY
from radixlm.runtime.errors import ConfigError

__all__ = ["GrammarConfig"]


@dataclass(frozen=True)
class GrammarConfig:
    """Constrained decoding (regex / JSON schema / EBNF / Lark / choices).

    grammar_backend: "auto" picks each kind's default (llguidance for Lark, xgrammar
        for EBNF and structural tags, outlines for regex and choices), and for a JSON
        schema the first of llguidance, then xgrammar, that enforces it
        (``compile_worker.auto_backends``); a backend's name
        (``runtime/constrained/registry.py`` lists them: "llguidance", "xgrammar",
        "outlines") forces one (a request's own ``grammar_backend``, "auto" included,
        overrides it).
    grammar_compile_timeout: seconds a compile may take before its request fails,
        counted from the request's arrival (a wait for a busy worker counts); the
        compile is then stopped (it runs in a worker process, which is killed).
    grammar_compile_workers: most general compile worker processes at once (started
        while all are busy); one more, the fast lane, is started with the engine and
        takes only small constraints (``constrained/compile_worker.py``).
    grammar_compile_memory_mb: each worker's address-space cap; a compile needing
        more fails alone.
    grammar_cache_size: compiled grammars kept (LRU).
    grammar_max_states: largest token-level FSM the outlines backend keeps.
    grammar_max_schema_depth: deepest JSON-schema nesting accepted.
    grammar_max_chars: the longest regex, EBNF or Lark grammar, or choices list (as
        JSON text), in characters.
    grammar_max_regex_size: the most positions a regex may expand to (counted repeats
        multiplied through nesting: ``a{100000}`` is 100,000).
    grammar_max_enum_values: the most ``enum`` values a JSON schema (or the schemas of
        one structural tag) may hold, all its enums together.
        These four are checked when the request arrives, before it waits for a compile
        worker (``constrained/spec_limits.py``).
    jump_forward: the default for requests that do not say: append forced text
        (e.g. ``,"age":``) in one pass instead of decoding it token by token. Off:
        greedy outputs with it equal those without it in only 61% of the constraint
        suite (benchmarks/bench_constrained.py), under the 95% the default needs.
    json_bounded_numbers: the default for requests that do not say: in JSON schema and
        structural tags, integers within +-(2^53 - 1) and numbers in that range with at
        most 6 fraction digits, where the schema sets no bound of its own (what JSON
        parsers hold exactly; greedy decoding otherwise writes digits until
        max_new_tokens). The bounds and their reasons: runtime/constrained/json_numbers.py.
    json_max_string_length: the default for requests that do not say: in JSON schema and
        structural tags (and tools' parameters), the ``maxLength`` of every string the
        schema leaves unbounded, 1 to 16,384 characters; None: off (a schema's own
        maxLength is always kept). Where it reaches, per backend:
        runtime/constrained/json_strings.py.
    """

    grammar_backend: str = "auto"
    grammar_compile_timeout: float = 10.0
    grammar_compile_workers: int = 2
    grammar_compile_memory_mb: int = 4096
    grammar_cache_size: int = 256
    grammar_max_states: int = 20_000
    grammar_max_schema_depth: int = 24
    grammar_max_chars: int = 65_536
    grammar_max_regex_size: int = 10_000
    grammar_max_enum_values: int = 10_000
    jump_forward: bool = False
    json_bounded_numbers: bool = True
    json_max_string_length: int | None = None

    def __post_init__(self) -> None:
        choices = REGISTRY.choices()
        if self.grammar_backend not in choices:
            raise ConfigError(
                f"grammar_backend must be one of {choices}, got {self.grammar_backend!r}"
            )
        timeout = self.grammar_compile_timeout
        if not is_number(timeout, above=0):
            raise ConfigError(f"grammar_compile_timeout must be > 0 seconds, got {timeout!r}")
        check_positive("grammar_compile_workers", self.grammar_compile_workers)
        check_positive("grammar_compile_memory_mb", self.grammar_compile_memory_mb)
        check_positive("grammar_cache_size", self.grammar_cache_size)
        check_positive("grammar_max_states", self.grammar_max_states)
        check_positive("grammar_max_schema_depth", self.grammar_max_schema_depth)
        check_positive("grammar_max_chars", self.grammar_max_chars)
        check_positive("grammar_max_regex_size", self.grammar_max_regex_size)
        check_positive("grammar_max_enum_values", self.grammar_max_enum_values)
        if not isinstance(self.jump_forward, bool):
            raise ConfigError(f"jump_forward must be a bool, got {self.jump_forward!r}")
        if not isinstance(self.json_bounded_numbers, bool):
            raise ConfigError(
                f"json_bounded_numbers must be a bool, got {self.json_bounded_numbers!r}"
            )
        length = self.json_max_string_length
        if length is not None and (
            isinstance(length, bool)
            or not isinstance(length, int)
            or not 1 <= length <= MAX_STRING_LENGTH
        ):
            raise ConfigError(
                f"json_max_string_length must be None (off) or an int in "
                f"[1, {MAX_STRING_LENGTH}], got {length!r}"
            )
