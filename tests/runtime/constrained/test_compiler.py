"""The compile cache: hits, cached errors, the time limit (a compile past it is stopped),
the compile workers, and backend choice ("auto" on a JSON schema: the first that enforces
it)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained import GrammarCompiler, GrammarSpec
from radixlm.runtime.constrained.compile_worker import _compile_job, auto_backends
from radixlm.runtime.constrained.registry import REGISTRY
from radixlm.runtime.errors import (
    GrammarCompileTimeoutError,
    GrammarError,
    UnsupportedGrammarError,
)
from radixlm.runtime.io.sampling_params import SamplingParams
from tests.runtime.constrained.conftest import accepts_text

PHONE = GrammarSpec("regex", r"[0-9]{3}-[0-9]{4}")
SCHEMA = GrammarSpec("json_schema", '{"type":"integer"}')
# llguidance refuses maxProperties beside optional properties; xgrammar enforces it.
# llguidance counts an open object's properties only when every one is required.
AT_MOST_ONE = GrammarSpec(
    "json_schema",
    '{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},'
    '"additionalProperties":{"type":"integer"},"maxProperties":1}',
)
# Neither enforces contains.
CONTAINS = GrammarSpec("json_schema", '{"type":"array","contains":{"type":"integer"}}')
INVALID = GrammarSpec("json_schema", '{"type":"object","minProperties":-1}')


@pytest.fixture
def new_compiler(vocab):
    """Builds compilers that are closed (their workers stopped) after the test."""
    built: list[GrammarCompiler] = []

    def build(config: GrammarConfig) -> GrammarCompiler:
        built.append(GrammarCompiler(vocab, config))
        return built[-1]

    yield build
    for compiler in built:
        compiler.close()


def test_same_spec_compiles_once(new_compiler):
    compiler = new_compiler(GrammarConfig())
    first = compiler.compile(PHONE, "xgrammar")
    assert compiler.compile(PHONE, "xgrammar") is first
    assert (compiler.stats.hits, compiler.stats.misses) == (1, 1)
    assert compiler.compile(PHONE, "outlines") is not first  # keyed by backend too


def test_errors_are_cached_and_raised_again(new_compiler):
    compiler = new_compiler(GrammarConfig())
    bad = GrammarSpec("regex", "(unclosed")
    for _ in range(2):
        with pytest.raises(GrammarError, match="regular expression"):
            compiler.compile(bad, "outlines")
    assert compiler.stats.misses == 1


def test_lru_keeps_grammar_cache_size_entries(new_compiler):
    compiler = new_compiler(GrammarConfig(grammar_cache_size=2))
    specs = [GrammarSpec("regex", f"[0-9]{{{n}}}") for n in (1, 2, 3)]
    for spec in specs:
        compiler.compile(spec, "xgrammar")
    compiler.compile(specs[2], "xgrammar")
    compiler.compile(specs[0], "xgrammar")  # evicted: compiled again
    assert (compiler.stats.hits, compiler.stats.misses) == (1, 4)


def test_a_compile_past_its_limit_is_stopped_and_refused_again_at_once(new_compiler):
    compiler = new_compiler(GrammarConfig(grammar_compile_timeout=1.0))
    compiler.warm()  # the fast lane's worker starts beside the general one, not after
    compiler.compile(GrammarSpec("regex", "[0-9]{40}"), "outlines")  # not small: a general
    (pid,) = compiler.workers.lane_pids("general")  # worker is up
    hostile = GrammarSpec("regex", ".{0,5000}")  # outlines-core's FSM would take minutes
    start = time.perf_counter()
    with pytest.raises(GrammarCompileTimeoutError, match="over 1 s .* the compile was stopped"):
        compiler.compile(hostile, "outlines")
    assert time.perf_counter() - start < 5
    assert not _alive(pid)  # killed: no CPU left burning on it
    misses = compiler.stats.misses
    start = time.perf_counter()
    with pytest.raises(GrammarCompileTimeoutError):  # the refusal is cached
        compiler.compile(hostile, "outlines")
    assert time.perf_counter() - start < 0.1 and compiler.stats.misses == misses
    # another worker serves what comes next (the killed one is gone)
    assert compiler.compile(SCHEMA, "llguidance").backend == "llguidance"
    assert pid not in compiler.workers.pids()
    compiler.close()


def test_a_worker_that_died_while_idle_is_replaced(new_compiler):
    compiler = new_compiler(GrammarConfig())
    compiler.compile(PHONE, "xgrammar")
    (pid,) = compiler.workers.pids()
    os.kill(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.01)
    assert compiler.compile(SCHEMA, "xgrammar").backend == "xgrammar"
    compiler.close()


def test_close_stops_the_workers(new_compiler):
    compiler = new_compiler(GrammarConfig())
    compiler.compile(PHONE, "xgrammar")
    (pid,) = compiler.workers.pids()
    compiler.close()
    assert not _alive(pid) and compiler.workers.pids() == []
    with pytest.raises(GrammarError, match="shutting down"):
        compiler.compile(SCHEMA, "xgrammar")


def test_concurrent_callers_share_one_compile(compiler):
    spec = GrammarSpec("regex", r"[0-9]{5}-[a-z]{2}")
    misses = compiler.stats.misses
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(compiler.compile(spec, "xgrammar")))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compiler.stats.misses == misses + 1 and len({id(r) for r in results}) == 1


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie awaiting its parent's wait does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("engine_choice", "request_choice", "spec", "expected"),
    [
        ("auto", None, SCHEMA, "auto"),  # the compile tries each backend
        ("auto", "auto", SCHEMA, "auto"),
        ("xgrammar", "auto", SCHEMA, "auto"),  # the request's "auto" wins
        ("llguidance", None, SCHEMA, "llguidance"),
        ("xgrammar", "auto", PHONE, "outlines"),  # other kinds: their default
        ("auto", None, GrammarSpec("lark", 'start: "a"'), "llguidance"),
        ("auto", None, GrammarSpec("structural_tag", "{}"), "xgrammar"),
        ("auto", None, PHONE, "outlines"),
        ("auto", None, GrammarSpec("ebnf", 'root ::= "a"'), "xgrammar"),
        ("auto", None, GrammarSpec("choices", '["a"]'), "outlines"),
        ("xgrammar", None, PHONE, "xgrammar"),
        ("xgrammar", "outlines", PHONE, "outlines"),
        ("llguidance", None, PHONE, "llguidance"),
    ],
)
def test_backend_choice(new_compiler, engine_choice, request_choice, spec, expected):
    compiler = new_compiler(GrammarConfig(grammar_backend=engine_choice))
    assert compiler.backend_for(spec, request_choice) == expected


def test_a_request_may_ask_for_auto():
    params = SamplingParams.from_dict(
        {"json_schema": {"type": "integer"}, "grammar_backend": "auto"}
    )
    assert params.grammar_backend == "auto"


def test_auto_tries_llguidance_then_xgrammar_and_no_slow_backend():
    assert auto_backends(SCHEMA) == ("llguidance", "xgrammar")
    assert all("json_schema" not in REGISTRY.entry(n).slow_kinds for n in auto_backends(SCHEMA))
    lenient = GrammarSpec("json_schema", SCHEMA.text, lenient=True)
    assert auto_backends(lenient) == ("llguidance",)


def test_auto_compiles_a_plain_schema_with_llguidance(compiler):
    assert compiler.compile(SCHEMA, "auto").backend == "llguidance"


def test_auto_gives_xgrammar_a_schema_llguidance_refuses(compiler, hf_tokenizer):
    with pytest.raises(UnsupportedGrammarError, match="maxProperties"):
        compiler.compile(AT_MOST_ONE, "llguidance")
    compiled = compiler.compile(AT_MOST_ONE, compiler.backend_for(AT_MOST_ONE, None))
    assert compiled.backend == "xgrammar"
    assert compiler.compile(AT_MOST_ONE, "auto") is compiled  # cached under "auto"
    assert accepts_text(compiled, hf_tokenizer, '{"a":1}')
    assert not accepts_text(compiled, hf_tokenizer, '{"a":1,"b":2}')


def test_auto_with_a_lenient_schema_keeps_llguidance_and_its_warnings(compiler):
    lenient = GrammarSpec("json_schema", AT_MOST_ONE.text, lenient=True)
    compiled = compiler.compile(lenient, "auto")
    assert compiled.backend == "llguidance" and any("maxProperties" in w for w in compiled.warnings)


def test_auto_refused_by_all_gives_llguidances_refusal(compiler):
    with pytest.raises(UnsupportedGrammarError) as info:
        compiler.compile(CONTAINS, "auto")
    assert info.value.field == "json_schema"
    assert "contains at # are not enforced by the llguidance backend" in info.value.reason
    assert info.value.reason.endswith(
        "grammar_backend='auto' tried xgrammar too, which refused it as well"
    )


def test_auto_stops_at_an_invalid_schema(compiler, vocab):
    """An invalid schema is every backend's error alike: the second is never asked."""
    with pytest.raises(GrammarError, match="not a valid JSON Schema") as info:
        compiler.compile(INVALID, "auto")
    assert type(info.value) is GrammarError
    config = GrammarConfig()
    asked: list[str] = []

    class Spy:
        def compile(self, spec):
            asked.append(spec.text)
            raise AssertionError("asked")

    backends = {"llguidance": REGISTRY.build("llguidance", vocab, config), "xgrammar": Spy()}
    status, kind, field, reason = _compile_job(backends, "auto", INVALID, vocab, config)
    assert (status, kind, field) == ("error", "GrammarError", "json_schema")
    assert "not a valid JSON Schema" in reason and asked == []
