"""The grammar-backend registry: the one list of backends, their kinds, defaults and
capability tables, and what derives from it (no model, no compile worker)."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from radixlm.runtime.config import ConfigError, GrammarConfig
from radixlm.runtime.constrained.compile_worker import build_backend
from radixlm.runtime.constrained.registry import (
    REGISTRY,
    GrammarBackendEntry,
    GrammarBackendRegistry,
    JsonSchemaSupport,
)
from radixlm.runtime.constrained.spec import BACKEND_NAMES, GRAMMAR_KINDS, GrammarSpec
from radixlm.runtime.errors import UnsupportedGrammarError


class EchoBackend:
    """A stand-in plug-in: records what it was built with."""

    def __init__(self, vocab, config) -> None:
        self.vocab, self.config = vocab, config


ECHO = GrammarBackendEntry(
    name="echo",
    module=__name__,
    class_name="EchoBackend",
    kinds=frozenset({"regex", "json_schema"}),
    json_schema=JsonSchemaSupport(keywords=frozenset({"type"}), formats=frozenset()),
)


def test_the_names_in_order_and_the_engine_choices():
    assert REGISTRY.names() == ("llguidance", "xgrammar", "outlines")
    # an engine's and a request's grammar_backend alike
    assert REGISTRY.choices() == ("auto", "llguidance", "xgrammar", "outlines") == BACKEND_NAMES


def test_every_kind_has_one_default_and_each_entry_compiles_known_kinds():
    defaults = {kind: GrammarSpec(kind, "x").default_backend for kind in GRAMMAR_KINDS}
    assert defaults == {
        "regex": "outlines",
        "json_schema": "llguidance",
        "ebnf": "xgrammar",
        "lark": "llguidance",
        "choices": "outlines",
        "structural_tag": "xgrammar",
    }
    for entry in REGISTRY.entries():
        assert entry.kinds <= set(GRAMMAR_KINDS), entry.name


def test_each_backend_class_takes_its_name_and_kinds_from_its_entry():
    for entry in REGISTRY.entries():
        cls = getattr(importlib.import_module(entry.module), entry.class_name)
        assert (cls.name, cls.kinds) == (entry.name, entry.kinds)


def test_compiling_puts_the_default_first():
    assert REGISTRY.compiling("json_schema") == ("llguidance", "xgrammar", "outlines")
    assert REGISTRY.compiling("ebnf") == ("xgrammar", "llguidance")
    assert REGISTRY.compiling("lark") == ("llguidance",)
    assert REGISTRY.compiling("structural_tag") == ("xgrammar",)


def test_compiles_answers_for_a_name_or_auto_and_serving_names_the_backend():
    """What callers outside the package ask (the tool-call grammar's kind) instead of
    naming backends: "auto" compiles each kind that has a default."""
    assert REGISTRY.compiles("xgrammar", "structural_tag")
    assert not REGISTRY.compiles("llguidance", "structural_tag")
    assert REGISTRY.compiles("llguidance", "lark") and not REGISTRY.compiles("outlines", "lark")
    assert all(REGISTRY.compiles("auto", kind) for kind in GRAMMAR_KINDS)
    assert REGISTRY.serving("auto", "lark") == "llguidance"
    assert REGISTRY.serving("auto", "structural_tag") == "xgrammar"
    assert REGISTRY.serving("xgrammar", "ebnf") == "xgrammar"
    with pytest.raises(UnsupportedGrammarError, match="got 'guidance'"):
        REGISTRY.compiles("guidance", "regex")


def test_an_unknown_name_is_refused_naming_the_choices():
    wanted = r"expected one of \('llguidance', 'xgrammar', 'outlines'\), got 'guidance'"
    with pytest.raises(UnsupportedGrammarError, match=wanted) as info:
        REGISTRY.entry("guidance")
    assert info.value.field == "grammar_backend"
    with pytest.raises(UnsupportedGrammarError, match="got 'guidance'"):
        build_backend("guidance", None, GrammarConfig())


def test_a_kind_a_backend_does_not_compile_names_those_that_do():
    REGISTRY.check_kind("outlines", "regex")
    with pytest.raises(UnsupportedGrammarError) as info:
        REGISTRY.check_kind("outlines", "ebnf")
    assert info.value.field == "ebnf"
    assert info.value.reason == (
        "the outlines backend compiles choices, json_schema, regex only; "
        "ebnf needs grammar_backend='xgrammar' or 'llguidance'"
    )
    with pytest.raises(UnsupportedGrammarError, match="needs grammar_backend='xgrammar'$"):
        REGISTRY.check_kind("llguidance", "structural_tag")


def test_the_timeout_hint_names_a_backend_that_compiles_the_kind_quickly():
    assert REGISTRY.timeout_hint("outlines", "json_schema") == (
        "; the llguidance backend compiles these quickly"
    )
    assert REGISTRY.timeout_hint("outlines", "choices").startswith("; the llguidance")
    assert REGISTRY.timeout_hint("outlines", "regex") == ""
    assert REGISTRY.timeout_hint("xgrammar", "json_schema") == ""


def test_a_plug_in_is_one_entry():
    registry = GrammarBackendRegistry([*REGISTRY.entries(), ECHO])
    assert registry.names()[-1] == "echo" and "echo" in registry
    config = GrammarConfig()
    backend = registry.build("echo", "vocab", config)
    assert isinstance(backend, EchoBackend) and backend.config is config
    assert registry.json_schema("echo").keywords == {"type"}
    assert registry.compiling("regex")[0] == "outlines"  # defaults are unchanged


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([ECHO, ECHO], "'echo' is registered already"),
        ([dataclasses.replace(ECHO, name="auto")], "'auto' is registered already"),
        ([dataclasses.replace(ECHO, default_for=frozenset({"lark"}))], r"\['lark'\]"),
        ([dataclasses.replace(ECHO, json_schema=None)], "json_schema support"),
        (
            [dataclasses.replace(ECHO, default_for=frozenset({"regex"})), *REGISTRY.entries()],
            "'echo' and 'outlines' are both the default for 'regex'",
        ),
    ],
)
def test_a_registry_refuses_inconsistent_entries(entries, message):
    with pytest.raises(ValueError, match=message):
        GrammarBackendRegistry(entries)


def test_a_backend_without_json_schema_support_says_which_have_it():
    lark_only = dataclasses.replace(
        ECHO, name="larkish", kinds=frozenset({"lark"}), json_schema=None
    )
    registry = GrammarBackendRegistry([*REGISTRY.entries(), lark_only])
    wanted = (
        "compiles no JSON schema; json_schema needs grammar_backend='llguidance' or "
        "'xgrammar' or 'outlines'"
    )
    with pytest.raises(UnsupportedGrammarError, match=wanted):
        registry.json_schema("larkish")


def test_the_engine_config_validates_against_the_registry():
    for name in REGISTRY.choices():
        assert GrammarConfig(grammar_backend=name).grammar_backend == name
    with pytest.raises(ConfigError) as info:
        GrammarConfig(grammar_backend="guidance")
    assert str(info.value) == (
        "grammar_backend must be one of ('auto', 'llguidance', 'xgrammar', 'outlines'), "
        "got 'guidance'"
    )
