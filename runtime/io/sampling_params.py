"""Per-request sampling parameters, named like SGLang's ``sampling_params`` dict.

``SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 16})`` accepts
the dicts written for SGLang's offline ``Engine.generate``. Everything that can
be checked without the model is checked in ``__post_init__``; the one that needs the
vocabulary size in ``validate_for_model``; whether prompt and output fit the context is
``context_room.ContextRoom``'s rule.

Constrained decoding: at most one of ``regex``, ``json_schema``, ``ebnf``, ``lark``,
``choices`` and ``structural_tag`` (``spec.check_one_constraint``, the rule the HTTP
routes apply too); ``grammar`` gives it as a ``GrammarSpec``. The spec is only
normalised here; it is compiled (and rejected if it cannot be) by the request
builder, before the request is queued.

The types and bounds of the numeric and boolean fields are ``sampling_fields``' table,
which the DSL and the HTTP routes check against too.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixlm.kernels.sampling import GREEDY_TEMPERATURE
from radixlm.runtime.constrained.spec import (
    BACKEND_NAMES,
    GRAMMAR_KINDS,
    GrammarSpec,
    check_one_constraint,
    schema_text,
)
from radixlm.runtime.errors import InvalidSamplingParamsError
from radixlm.runtime.io.sampling_fields import CHECKED_KINDS, SAMPLING_FIELDS

__all__ = ["SamplingParams"]

# The fields whose values the table checks (bounds, types); the rest are shapes that
# the normalisers below (stop lists, token ids) and the grammar checks read.
_CHECKED = tuple(f for f in SAMPLING_FIELDS if f.kind in CHECKED_KINDS)
# Every field's default is the table's: declared there once
_DEFAULT = {f.name: f.default for f in SAMPLING_FIELDS}
_PLAIN_TYPES: dict[str, type] = {"float": float, "int": int}


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples its output tokens.

    Attributes:
        max_new_tokens: the most tokens to generate (0 scores the prompt only).
        min_new_tokens: stop tokens are suppressed until this many were generated.
        n: number of samples for this prompt (the engine fans them out).
        stop: strings that end generation; normalised to a tuple.
        stop_token_ids: token ids that end generation besides EOS; a tuple.
        stop_regex: regular expressions (Python ``re`` syntax) that end generation at
            their first match in the output text, trimmed like a stop string;
            normalised to a tuple (SGLang's ``stop_regex``).
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
            Values below 1e-6 are treated as greedy (as SGLang does): dividing
            by them overflows float32. At most 100.
        top_p: nucleus sampling mass, in (0, 1]; the most likely token is always kept.
        top_k: keep the k most likely tokens; -1 keeps all.
        min_p: drop tokens less likely than ``min_p`` times the most likely one.
        repetition_penalty: HF-style multiplicative penalty on prompt and output tokens,
            in [0.01, 100].
        frequency_penalty: subtracted once per earlier occurrence in the output.
        presence_penalty: subtracted once if the token occurs in the output.
        ignore_eos: keep generating after EOS.
        skip_special_tokens: leave special tokens out of the decoded text.
        spaces_between_special_tokens: slow tokenizers only; fast ones ignore it.
        seed: per-request seed; same seed + same prompt gives the same output.
        no_stop_trim: keep the matched stop string at the end of the text.
        regex: the output must match this regular expression (whole output).
        json_schema: the output must be JSON valid under this schema (a dict, a
            JSON string or a pydantic model class; stored as compact JSON text).
        ebnf: the output must derive from this EBNF grammar's ``root`` rule.
        lark: the output must derive from this Lark-style grammar's ``start`` rule
            (llguidance's syntax; llguidance backend only).
        choices: the output must be exactly one of these strings.
        structural_tag: the output must match this xgrammar structural tag
            (``{"type": "structural_tag", "format": {...}}``, a dict or JSON text;
            stored as compact JSON text; xgrammar backend only). Tool calls use it.
        grammar_backend: "llguidance", "xgrammar" or "outlines" for this request, or
            "auto" (a JSON schema: the first backend that enforces it; other kinds: the
            kind's default); None: the engine's choice.
        jump_forward: append text the constraint forces in one pass (None: the
            engine's default).
        json_max_whitespace: whitespace characters allowed between JSON tokens
            (0: compact JSON).
        json_schema_lenient: generate without the schema keywords the backend cannot
            enforce (``uniqueItems``, ``contains``, ...) instead of refusing the schema;
            each dropped keyword is named in the output's ``grammar_warnings``.
        json_bounded_numbers: JSON schema and structural tags: integers within
            +-(2^53 - 1) and numbers in that range with at most 6 fraction digits where
            the schema sets no bound (False: any length). None: the engine's choice.
        json_max_string_length: JSON schema and structural tags: the ``maxLength`` of
            every string the schema leaves unbounded (runtime/constrained/json_strings.py
            says where it reaches on each backend); 0: none; None: the engine's choice.
        max_reasoning_tokens: on an engine with a reasoning parser, the most tokens of
            the reply's reasoning section (``<think>...``); when reached, the end marker
            is forced and the answer starts (0: at once). None: unbounded (the section
            still counts in ``max_new_tokens``). See radixlm.runtime.reasoning.
        special_tokens_as_text: special tokens (by content) this request reads as text:
            its constraint may write them (one token each) and the output text keeps them
            under ``skip_special_tokens``. The chat route sets a tool format's markers
            (``[TOOL_CALLS]``, ``<|python_tag|>``) for a request with tools; contents that
            are no special token of the model's tokenizer change nothing.
        speculative_num_tokens: on an engine that speculates, the most tokens proposed
            for this request per step (0: none; None: the engine's
            ``speculative_num_tokens``, which also caps it). Outputs do not change.
    """

    max_new_tokens: int = _DEFAULT["max_new_tokens"]
    min_new_tokens: int = _DEFAULT["min_new_tokens"]
    n: int = _DEFAULT["n"]
    # Also accept str / list / None on construction; always tuples afterwards.
    stop: tuple[str, ...] = _DEFAULT["stop"]
    stop_token_ids: tuple[int, ...] = _DEFAULT["stop_token_ids"]
    stop_regex: tuple[str, ...] = _DEFAULT["stop_regex"]  # also accepts str / list / None
    temperature: float = _DEFAULT["temperature"]
    top_p: float = _DEFAULT["top_p"]
    top_k: int = _DEFAULT["top_k"]
    min_p: float = _DEFAULT["min_p"]
    repetition_penalty: float = _DEFAULT["repetition_penalty"]
    frequency_penalty: float = _DEFAULT["frequency_penalty"]
    presence_penalty: float = _DEFAULT["presence_penalty"]
    ignore_eos: bool = _DEFAULT["ignore_eos"]
    skip_special_tokens: bool = _DEFAULT["skip_special_tokens"]
    spaces_between_special_tokens: bool = _DEFAULT["spaces_between_special_tokens"]
    seed: int | None = _DEFAULT["seed"]
    no_stop_trim: bool = _DEFAULT["no_stop_trim"]
    regex: str | None = _DEFAULT["regex"]
    # also accepts a dict or a pydantic model class
    json_schema: str | None = _DEFAULT["json_schema"]
    ebnf: str | None = _DEFAULT["ebnf"]
    lark: str | None = _DEFAULT["lark"]
    choices: tuple[str, ...] | None = _DEFAULT["choices"]  # also accepts a list
    structural_tag: str | None = _DEFAULT["structural_tag"]  # also accepts a dict
    grammar_backend: str | None = _DEFAULT["grammar_backend"]
    jump_forward: bool | None = _DEFAULT["jump_forward"]
    json_max_whitespace: int = _DEFAULT["json_max_whitespace"]
    json_schema_lenient: bool = _DEFAULT["json_schema_lenient"]
    json_bounded_numbers: bool | None = _DEFAULT["json_bounded_numbers"]
    max_reasoning_tokens: int | None = _DEFAULT["max_reasoning_tokens"]
    speculative_num_tokens: int | None = _DEFAULT["speculative_num_tokens"]
    special_tokens_as_text: tuple[str, ...] = _DEFAULT["special_tokens_as_text"]
    json_max_string_length: int | None = _DEFAULT["json_max_string_length"]

    def __post_init__(self) -> None:
        # Types and bounds come from one table (sampling_fields), which every other
        # surface (gen, the OpenAI routes) checks against too.
        for spec in _CHECKED:
            spec.check(getattr(self, spec.name))
        if self.min_new_tokens > self.max_new_tokens:
            raise InvalidSamplingParamsError(
                "min_new_tokens",
                f"{self.min_new_tokens} is larger than max_new_tokens {self.max_new_tokens}",
            )
        self._check_grammar()
        self._normalize()

    @property
    def grammar(self) -> GrammarSpec | None:
        """The constraint, if any (normalised: a schema is canonical JSON text)."""
        spec = self._grammar()
        if spec is None or not self.special_tokens_as_text:
            return spec
        return dataclasses.replace(spec, special_tokens=self.special_tokens_as_text)

    def _grammar(self) -> GrammarSpec | None:
        if self.regex is not None:
            return GrammarSpec("regex", self.regex)
        if self.json_schema is not None:
            return GrammarSpec(
                "json_schema",
                self.json_schema,
                self.json_max_whitespace,
                self.json_schema_lenient,
                self.json_bounded_numbers,
                self.json_max_string_length,
            )
        if self.ebnf is not None:
            return GrammarSpec("ebnf", self.ebnf)
        if self.lark is not None:
            return GrammarSpec("lark", self.lark)
        if self.choices is not None:
            return GrammarSpec("choices", json.dumps(list(self.choices), ensure_ascii=False))
        if self.structural_tag is not None:
            return GrammarSpec(
                "structural_tag",
                self.structural_tag,
                bounded_numbers=self.json_bounded_numbers,
                max_string_length=self.json_max_string_length,
            )
        return None

    def _normalize(self) -> None:
        """Plain Python types from here on (``0`` -> ``0.0``, numpy ints -> int)."""
        for spec in _CHECKED:
            value, plain = getattr(self, spec.name), _PLAIN_TYPES.get(spec.kind)
            if plain is not None and value is not None:
                object.__setattr__(self, spec.name, plain(value))
        object.__setattr__(self, "stop", _normalize_stop(self.stop))
        object.__setattr__(self, "stop_regex", _normalize_stop(self.stop_regex, "stop_regex"))
        object.__setattr__(self, "stop_token_ids", _normalize_stop_token_ids(self.stop_token_ids))
        specials = _normalize_stop(self.special_tokens_as_text, "special_tokens_as_text")
        object.__setattr__(self, "special_tokens_as_text", tuple(sorted(set(specials))))

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | None) -> SamplingParams:
        """Build from an SGLang-style dict; ``None`` or ``{}`` gives the defaults, and
        so does a null value for any known key.

        Raises:
            InvalidSamplingParamsError: an unknown key (named) or a bad value.
        """
        if params is not None and not isinstance(params, Mapping):
            raise InvalidSamplingParamsError(
                "sampling_params", f"expected a dict, got {type(params).__name__}"
            )
        params = dict(params or {})
        known = {f.name for f in dataclasses.fields(cls)}
        for key in params:
            if key not in known:
                raise InvalidSamplingParamsError(
                    str(key), f"unknown sampling parameter; known ones are {sorted(known)}"
                )
        # null means the default, for every field (SGLang's clients send nulls).
        return cls(**{k: v for k, v in params.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON view (lists for sequences); ``from_dict`` reads it back."""
        out = dataclasses.asdict(self)
        out["stop"] = list(self.stop)
        out["stop_regex"] = list(self.stop_regex)
        out["stop_token_ids"] = list(self.stop_token_ids)
        out["special_tokens_as_text"] = list(self.special_tokens_as_text)
        if self.choices is not None:
            out["choices"] = list(self.choices)
        return out

    @property
    def is_greedy(self) -> bool:
        """Whether sampling reduces to argmax (temperature 0 or top_k 1)."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def for_sample(self, seed: int | None) -> SamplingParams:
        """These parameters for one of the request's ``n`` samples (``n`` 1, ``seed``),
        copied without checking or normalising again: that was done when these were
        made (a JSON schema is read once, not once per sample)."""
        sample = copy.copy(self)
        object.__setattr__(sample, "n", 1)
        object.__setattr__(sample, "seed", seed)
        return sample

    def validate_for_model(self, vocab_size: int) -> None:
        """The check that needs the model: stop token ids within its vocabulary (whether
        prompt and output fit its context is ``ContextRoom``'s rule).

        Raises:
            InvalidSamplingParamsError: a stop token id outside [0, vocab_size).
        """
        for token_id in self.stop_token_ids:
            if not 0 <= token_id < vocab_size:
                raise InvalidSamplingParamsError(
                    "stop_token_ids", f"token id {token_id} is outside [0, {vocab_size})"
                )

    def _check_grammar(self) -> None:
        check_one_constraint((k, k) for k in GRAMMAR_KINDS if getattr(self, k) is not None)
        for name in ("regex", "ebnf", "lark"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidSamplingParamsError(name, f"expected a non-empty str, got {value!r}")
        if self.json_schema is not None:
            object.__setattr__(self, "json_schema", schema_text(self.json_schema))
        if self.choices is not None:
            object.__setattr__(self, "choices", _normalize_choices(self.choices))
        if self.structural_tag is not None:
            text = schema_text(self.structural_tag, field="structural_tag")
            object.__setattr__(self, "structural_tag", text)
        if self.grammar_backend is not None and self.grammar_backend not in BACKEND_NAMES:
            raise InvalidSamplingParamsError(
                "grammar_backend",
                f"expected one of {BACKEND_NAMES} or None, got {self.grammar_backend!r}",
            )


def _normalize_choices(choices: Any) -> tuple[str, ...]:
    if not isinstance(choices, (list, tuple)) or not choices:
        raise InvalidSamplingParamsError(
            "choices", f"expected a non-empty list of str, got {choices!r}"
        )
    for item in choices:
        if not isinstance(item, str) or not item:
            raise InvalidSamplingParamsError("choices", f"expected non-empty strings, got {item!r}")
    if len(set(choices)) != len(choices):
        raise InvalidSamplingParamsError("choices", f"options repeat: {list(choices)!r}")
    return tuple(choices)


def _normalize_stop(stop: Any, field: str = "stop") -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)):
        raise InvalidSamplingParamsError(field, f"expected a str or a list of str, got {stop!r}")
    for item in stop:
        if not isinstance(item, str) or not item:
            raise InvalidSamplingParamsError(field, f"expected non-empty strings, got {item!r}")
    return tuple(stop)


def _normalize_stop_token_ids(ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    if not isinstance(ids, (list, tuple)):
        raise InvalidSamplingParamsError("stop_token_ids", f"expected a list of int, got {ids!r}")
    for token_id in ids:
        # bool is an int subclass, but True as a token id is always a mistake.
        if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
            raise InvalidSamplingParamsError("stop_token_ids", f"expected an int, got {token_id!r}")
        if token_id < 0:
            raise InvalidSamplingParamsError("stop_token_ids", f"expected >= 0, got {token_id}")
    return tuple(int(token_id) for token_id in ids)
