"""Which grammar backends there are: a registry of entries by name, the one place that
names them.

An entry says what its backend compiles (the spec kinds, and which of them it is the
default for), where its code lives (a module imported on first build: ``import
radixlm`` and an unconstrained engine never import a grammar package), and what it
makes of a JSON schema (``JsonSchemaSupport``: the keywords and formats it enforces
exactly, measured by ``tests/runtime/constrained/test_schema_check.py``). Everything that
lists, validates or picks backends reads ``REGISTRY``: ``GrammarConfig`` and
``SamplingParams`` (through ``spec.BACKEND_NAMES``), ``GrammarSpec.default_backend``,
the compile workers, ``schema_check`` and ``json_numbers``; and code outside this package
asks it what a backend compiles (``compiles``: the chat route's tool-call grammar) rather
than naming backends. A new backend is a module
(a class taking ``(vocab, config)`` and implementing ``base.GrammarBackend``) plus one
entry in ``REGISTRY``.

This module imports nothing heavy (no torch, no grammar package, no jsonschema).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.runtime.errors import UnsupportedGrammarError

if TYPE_CHECKING:
    from radixlm.runtime.constrained.base import GrammarBackend
    from radixlm.runtime.constrained.config import GrammarConfig
    from radixlm.runtime.constrained.vocab import TokenVocabulary

__all__ = [
    "AUTO",
    "DEFINED_FORMATS",
    "GrammarBackendEntry",
    "GrammarBackendRegistry",
    "JsonSchemaSupport",
    "SchemaNumbers",
    "REGISTRY",
]

AUTO = "auto"


@dataclass(frozen=True)
class SchemaNumbers:
    """How a backend reads the numeric keywords ``json_numbers.bound_schema`` adds
    (each measured; the module docstring there says what each changes).

    fraction_by_multiple_of: it bounds a number's fraction digits only through
        ``multipleOf`` (else it bounds them by itself).
    untyped_numeric_keywords: it applies numeric keywords beside no ``type`` to the
        numbers among the node's values (else it drops them).
    multiple_of_beside_range: it enforces ``multipleOf`` beside an added range (else a
        ``multipleOf`` node gets no default range).
    closes_listed_objects: it closes an object that lists its properties and an array
        with ``prefixItems`` by itself (strict mode), so only other open ones get the
        bounded JSON value.
    """

    fraction_by_multiple_of: bool
    untyped_numeric_keywords: bool
    multiple_of_beside_range: bool
    closes_listed_objects: bool


@dataclass(frozen=True)
class JsonSchemaSupport:
    """What a backend makes of a JSON schema (``schema_check`` reads it).

    keywords: the keywords (2020-12 spelling) it enforces exactly; any other keyword
        with validation meaning is refused by name, or dropped with a warning.
    formats: the defined ``format`` values it enforces exactly.
    rewrites: ``schema_check`` rewrites dependentRequired / dependentSchemas /
        propertyNames / not / counted properties into keywords it enforces, and closes
        objects that list their properties; and it enforces string keywords, pattern
        beside length bounds, and ``required`` beside ``anyOf`` as written.
    quiet_drops: it drops some keywords without a word (string keywords off a
        non-string node, ``required`` beside ``anyOf``, all but one of pattern / format /
        length bounds, ``multipleOf`` off integers or beside a wide range, numeric
        bounds off an untyped node): ``schema_check`` refuses those by name.
    numbers: how it reads the default number bounds put into the schema; None where
        the backend bounds numbers itself (outlines: in its regex).
    """

    keywords: frozenset[str]
    formats: frozenset[str]
    rewrites: bool = False
    quiet_drops: bool = False
    numbers: SchemaNumbers | None = None


@dataclass(frozen=True)
class GrammarBackendEntry:
    """One grammar backend.

    name: what ``grammar_backend`` calls it.
    module: its implementation, imported only when it is first built.
    class_name: the ``GrammarBackend`` class there; ``class_name(vocab, config)``
        builds it.
    kinds: the ``GrammarSpec`` kinds it compiles.
    default_for: the kinds it compiles when nothing names a backend (a subset of
        ``kinds``; each kind has one default across the registry). For a JSON schema
        "auto" tries it first, then the others (``compile_worker.auto_backends``).
    json_schema: what it enforces of JSON Schema (where ``kinds`` has "json_schema").
    slow_kinds: kinds it compiles slowly enough that a compile past its time limit
        suggests another backend.
    """

    name: str
    module: str
    class_name: str
    kinds: frozenset[str]
    default_for: frozenset[str] = frozenset()
    json_schema: JsonSchemaSupport | None = None
    slow_kinds: frozenset[str] = frozenset()

    def build(self, vocab: TokenVocabulary, config: GrammarConfig) -> GrammarBackend:
        """The backend over ``vocab``.

        Raises:
            ImportError: a package it needs is not installed.
        """
        cls = getattr(importlib.import_module(self.module), self.class_name)
        return cls(vocab, config)


class GrammarBackendRegistry:
    """Backends by name, in registration order (the order lists and suggestions use).
    Immutable once built."""

    def __init__(self, entries: Iterable[GrammarBackendEntry]) -> None:
        self._entries: dict[str, GrammarBackendEntry] = {}
        self._defaults: dict[str, str] = {}
        for entry in entries:
            self._add(entry)

    def _add(self, entry: GrammarBackendEntry) -> None:
        if entry.name in self._entries or entry.name == AUTO:
            raise ValueError(f"grammar backend {entry.name!r} is registered already")
        if not entry.default_for <= entry.kinds:
            extra = sorted(entry.default_for - entry.kinds)
            raise ValueError(
                f"grammar backend {entry.name!r} is the default for {extra}, which it "
                "does not compile"
            )
        if ("json_schema" in entry.kinds) != (entry.json_schema is not None):
            raise ValueError(
                f"grammar backend {entry.name!r}: json_schema support must be given exactly "
                "when it compiles json_schema"
            )
        for kind in entry.default_for:
            if kind in self._defaults:
                raise ValueError(
                    f"grammar backends {self._defaults[kind]!r} and {entry.name!r} are both "
                    f"the default for {kind!r}"
                )
            self._defaults[kind] = entry.name
        self._entries[entry.name] = entry

    def names(self) -> tuple[str, ...]:
        """Every backend's name, in registration order."""
        return tuple(self._entries)

    def choices(self) -> tuple[str, ...]:
        """What an engine's ``grammar_backend`` may be: "auto", then every name."""
        return (AUTO, *self._entries)

    def entries(self) -> tuple[GrammarBackendEntry, ...]:
        return tuple(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def entry(self, name: str) -> GrammarBackendEntry:
        """The entry called ``name``.

        Raises:
            UnsupportedGrammarError: no backend is called that (the message names them).
        """
        entry = self._entries.get(name)
        if entry is None:
            raise UnsupportedGrammarError(
                "grammar_backend", f"expected one of {self.names()}, got {name!r}"
            )
        return entry

    def json_schema(self, name: str) -> JsonSchemaSupport:
        """What backend ``name`` enforces of JSON Schema.

        Raises:
            UnsupportedGrammarError: no such backend, or it compiles no JSON schema.
        """
        support = self.entry(name).json_schema
        if support is None:
            hint = self._hint("json_schema")
            raise UnsupportedGrammarError(
                "json_schema", f"the {name} backend compiles no JSON schema{hint}"
            )
        return support

    def default_for(self, kind: str) -> str:
        """The backend that compiles ``kind`` when nothing names one.

        Raises:
            UnsupportedGrammarError: no backend is the default for ``kind``.
        """
        name = self._defaults.get(kind)
        if name is None:
            raise UnsupportedGrammarError(kind, f"no grammar backend compiles {kind!r} by default")
        return name

    def compiling(self, kind: str) -> tuple[str, ...]:
        """The backends that compile ``kind``: its default first, then registration order."""
        names = [n for n, e in self._entries.items() if kind in e.kinds]
        default = self._defaults.get(kind)
        return tuple(sorted(names, key=lambda n: n != default))

    def compiles(self, name: str, kind: str) -> bool:
        """Whether backend ``name`` compiles ``kind``; under "auto" a kind goes to its
        default backend, so "auto" compiles each kind that has one.

        Raises:
            UnsupportedGrammarError: no backend is called ``name``.
        """
        if name == AUTO:
            return kind in self._defaults
        return kind in self.entry(name).kinds

    def serving(self, name: str, kind: str) -> str:
        """The backend that compiles ``kind`` for an engine set to ``name``: ``name``
        itself, or under "auto" the kind's default (a JSON schema under "auto" tries the
        others after it: ``compile_worker.auto_backends``)."""
        return self.default_for(kind) if name == AUTO else name

    def check_kind(self, name: str, kind: str) -> None:
        """Refuses a ``kind`` backend ``name`` does not compile, naming the ones that do.

        Raises:
            UnsupportedGrammarError: ``name`` does not compile ``kind``.
        """
        if kind in self.entry(name).kinds:
            return
        own = ", ".join(sorted(self._entries[name].kinds))
        raise UnsupportedGrammarError(
            kind, f"the {name} backend compiles {own} only{self._hint(kind)}"
        )

    def build(self, name: str, vocab: TokenVocabulary, config: GrammarConfig) -> GrammarBackend:
        """Backend ``name`` over ``vocab`` (its packages are imported here, on first use).

        Raises:
            UnsupportedGrammarError: no backend is called that.
            ImportError: a package it needs is not installed.
        """
        return self.entry(name).build(vocab, config)

    def timeout_hint(self, name: str, kind: str) -> str:
        """What to try after backend ``name`` ran past its time limit on ``kind``: the
        first other backend that compiles it and not slowly ('' if none)."""
        if kind not in self.entry(name).slow_kinds:
            return ""
        for other in self.compiling(kind):
            if other != name and kind not in self._entries[other].slow_kinds:
                return f"; the {other} backend compiles these quickly"
        return ""

    def _hint(self, kind: str) -> str:
        names = self.compiling(kind)
        if not names:
            return ""
        quoted = " or ".join(repr(n) for n in names)
        return f"; {kind} needs grammar_backend={quoted}"


# What each backend enforces of JSON Schema was measured keyword by keyword (see the
# module docstring); the capability tables live here, not in the backends' modules, so
# that reading them imports no grammar package.
_COMMON = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems",
        "minItems", "maxItems", "enum", "const", "anyOf", "$ref", "$defs", "definitions",
        "minLength", "maxLength", "pattern", "format", "minProperties",
    }
)  # fmt: skip
_NUMERIC = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
# The formats the JSON Schema specification defines. Any other value ("int32",
# "textarea", ...) is the schema author's annotation: ignored, as the specification
# says of unknown formats. A defined format a backend does not enforce is refused.
DEFINED_FORMATS = frozenset(
    {
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname",
        "idn-hostname", "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference",
        "uuid", "uri-template", "json-pointer", "relative-json-pointer", "regex",
    }
)  # fmt: skip
_COMMON_FORMATS = frozenset({"email", "date", "date-time", "time", "uuid"})

LLGUIDANCE = GrammarBackendEntry(
    name="llguidance",
    module="radixlm.runtime.constrained.llguidance_backend",
    class_name="LLGuidanceBackend",
    kinds=frozenset({"json_schema", "regex", "ebnf", "lark", "choices"}),
    # JSON schema: it enforces the most of JSON Schema (benchmarks/README.md); Lark:
    # only it reads Lark grammars.
    default_for=frozenset({"json_schema", "lark"}),
    json_schema=JsonSchemaSupport(
        # allOf merged and oneOf proven exclusive by llguidance itself; dependentRequired,
        # dependentSchemas, propertyNames, not and if / then / else rewritten by
        # schema_check; uniqueItems (items of any kind) enforced by a guard around the matcher.
        keywords=_COMMON
        | _NUMERIC
        | {
            "maxProperties",
            "patternProperties",
            "allOf",
            "oneOf",
            "dependentRequired",
            "dependentSchemas",
            "propertyNames",
            "not",
            "if",
            "then",
            "else",
            "uniqueItems",
        },  # fmt: skip
        # uri-reference, json-pointer, relative-json-pointer and regex (a subset) as
        # schema_check's patterns; iri, iri-reference and idn-email as their ASCII subsets
        formats=_COMMON_FORMATS
        | {"duration", "ipv4", "ipv6", "uri", "hostname"}
        | {"uri-reference", "json-pointer", "relative-json-pointer", "regex"}
        | {"iri", "iri-reference", "idn-email"},
        rewrites=True,
        numbers=SchemaNumbers(
            fraction_by_multiple_of=True,
            untyped_numeric_keywords=True,
            multiple_of_beside_range=True,
            closes_listed_objects=False,
        ),
    ),
)
XGRAMMAR = GrammarBackendEntry(
    name="xgrammar",
    module="radixlm.runtime.constrained.xgrammar_backend",
    class_name="XGrammarBackend",
    kinds=frozenset({"json_schema", "regex", "ebnf", "choices", "structural_tag"}),
    # A pushdown automaton compiled quickly; only xgrammar has structural tags.
    default_for=frozenset({"ebnf", "structural_tag"}),
    json_schema=JsonSchemaSupport(
        keywords=_COMMON | _NUMERIC | {"maxProperties", "patternProperties", "propertyNames"},
        formats=_COMMON_FORMATS | {"ipv4", "uri"},
        quiet_drops=True,
        numbers=SchemaNumbers(
            fraction_by_multiple_of=False,
            untyped_numeric_keywords=False,
            multiple_of_beside_range=False,
            closes_listed_objects=True,
        ),
    ),
)
OUTLINES = GrammarBackendEntry(
    name="outlines",
    module="radixlm.runtime.constrained.outlines_backend",
    class_name="OutlinesBackend",
    kinds=frozenset({"regex", "choices", "json_schema"}),
    default_for=frozenset({"regex", "choices"}),  # an exact FSM over the vocabulary
    json_schema=JsonSchemaSupport(keywords=_COMMON, formats=_COMMON_FORMATS, quiet_drops=True),
    # its FSM over a schema's or many choices' regex can take past any sane time limit
    slow_kinds=frozenset({"json_schema", "choices"}),
)

REGISTRY = GrammarBackendRegistry([LLGUIDANCE, XGRAMMAR, OUTLINES])
