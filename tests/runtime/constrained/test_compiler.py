"""The compile cache: hits, cached errors, the time limit, and backend choice."""

from __future__ import annotations

import threading
import time

import pytest

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained import GrammarCompiler, GrammarSpec
from radixlm.runtime.errors import GrammarCompileTimeoutError, GrammarError

PHONE = GrammarSpec("regex", r"[0-9]{3}-[0-9]{4}")
SCHEMA = GrammarSpec("json_schema", '{"type":"integer"}')


class _SlowBackend:
    """Counts compiles; each takes ``seconds`` (unless released early)."""

    name = "slow"
    kinds = frozenset({"regex"})

    def __init__(self, inner, seconds: float) -> None:
        self.inner, self.seconds, self.calls = inner, seconds, 0
        self.release = threading.Event()

    def compile(self, spec):
        self.calls += 1
        self.release.wait(self.seconds)
        return self.inner.compile(spec)


@pytest.fixture
def xgrammar_backend(compiler):
    return compiler._backend("xgrammar")


def test_same_spec_compiles_once(vocab):
    compiler = GrammarCompiler(vocab, GrammarConfig())
    first = compiler.compile(PHONE, "xgrammar")
    assert compiler.compile(PHONE, "xgrammar") is first
    assert (compiler.stats.hits, compiler.stats.misses) == (1, 1)
    assert compiler.compile(PHONE, "outlines") is not first  # keyed by backend too


def test_errors_are_cached_and_raised_again(vocab):
    compiler = GrammarCompiler(vocab, GrammarConfig())
    bad = GrammarSpec("regex", "(unclosed")
    for _ in range(2):
        with pytest.raises(GrammarError, match="regular expression"):
            compiler.compile(bad, "outlines")
    assert compiler.stats.misses == 1


def test_lru_keeps_grammar_cache_size_entries(vocab):
    compiler = GrammarCompiler(vocab, GrammarConfig(grammar_cache_size=2))
    specs = [GrammarSpec("regex", f"[0-9]{{{n}}}") for n in (1, 2, 3)]
    for spec in specs:
        compiler.compile(spec, "xgrammar")
    compiler.compile(specs[2], "xgrammar")
    compiler.compile(specs[0], "xgrammar")  # evicted: compiled again
    assert (compiler.stats.hits, compiler.stats.misses) == (1, 4)


def test_a_slow_compile_times_out_and_the_retry_fails_at_once(vocab, xgrammar_backend):
    slow = _SlowBackend(xgrammar_backend, seconds=30)
    compiler = GrammarCompiler(
        vocab, GrammarConfig(grammar_compile_timeout=0.5), backends={"xgrammar": lambda: slow}
    )
    with pytest.raises(GrammarCompileTimeoutError, match="0.5 s") as info:
        compiler.compile(PHONE, "xgrammar")
    assert info.value.field == "regex"
    start = time.perf_counter()
    with pytest.raises(GrammarCompileTimeoutError, match="still compiling"):
        compiler.compile(PHONE, "xgrammar")
    assert time.perf_counter() - start < 0.1 and slow.calls == 1  # not another 0.5 s
    # other specs are not held up by the one still compiling
    assert compiler.compile(SCHEMA, "outlines").backend == "outlines"
    slow.release.set()


def test_a_timed_out_compile_that_finishes_later_serves_the_retry(vocab, xgrammar_backend):
    slow = _SlowBackend(xgrammar_backend, seconds=30)
    compiler = GrammarCompiler(
        vocab, GrammarConfig(grammar_compile_timeout=0.2), backends={"xgrammar": lambda: slow}
    )
    with pytest.raises(GrammarCompileTimeoutError):
        compiler.compile(PHONE, "xgrammar")
    slow.release.set()  # the compile completes after its caller gave up
    deadline = time.perf_counter() + 10
    while True:
        try:
            assert compiler.compile(PHONE, "xgrammar").backend == "xgrammar"
            break
        except GrammarCompileTimeoutError:
            assert time.perf_counter() < deadline
            time.sleep(0.05)
    assert slow.calls == 1


def test_concurrent_callers_share_one_compile(vocab, xgrammar_backend):
    slow = _SlowBackend(xgrammar_backend, seconds=0.3)
    compiler = GrammarCompiler(vocab, GrammarConfig(), backends={"xgrammar": lambda: slow})
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(compiler.compile(PHONE, "xgrammar")))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert slow.calls == 1 and len({id(r) for r in results}) == 1


@pytest.mark.parametrize(
    ("engine_choice", "request_choice", "spec", "expected"),
    [
        ("auto", None, SCHEMA, "xgrammar"),
        ("auto", None, PHONE, "outlines"),
        ("auto", None, GrammarSpec("ebnf", 'root ::= "a"'), "xgrammar"),
        ("auto", None, GrammarSpec("choices", '["a"]'), "outlines"),
        ("xgrammar", None, PHONE, "xgrammar"),
        ("xgrammar", "outlines", PHONE, "outlines"),
    ],
)
def test_backend_choice(vocab, engine_choice, request_choice, spec, expected):
    compiler = GrammarCompiler(vocab, GrammarConfig(grammar_backend=engine_choice))
    assert compiler.backend_for(spec, request_choice) == expected
