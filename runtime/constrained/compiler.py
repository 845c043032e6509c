"""Compiles constraints once, in worker processes with a time limit, and caches them.

    caller (its thread or event loop)       compile driver thread       worker process
    ---------------------------------       ---------------------       --------------
    start(spec, backend) -> PendingGrammar
      cache hit: already done
      miss: spec_limits (refused at once
        past one), then workers.submit --->  its lane's queue --job--->  backend.compile
    wait for pending.future (the caller's                        <---  exported grammar,
      own way: blocking, or awaited)        future.set_result            its backend's name
    pending.result(): that backend's load, once, in the caller

The engine loop never compiles and never waits on one, and no compile waits on the
engine loop: a thread of the workers' own moves the bytes (``compile_worker``), so a
slow schema delays only its own caller, and a compile runs in a worker process that is
killed at ``grammar_compile_timeout`` after the request's arrival, so one that would run
on costs the limit and no more. A small spec (``spec_limits.is_small``) goes to the
workers' fast lane, which no slow compile holds, so it never waits behind one. Errors,
timeouts included, are cached: the same bad spec is refused again at once (one past a
limit is not compiled at all: the cheap check refuses it each time).

``grammar_backend="auto"`` on a JSON schema is not resolved here: it stays "auto" in the
cache key, and the worker tries llguidance, then xgrammar (``compile_worker.
auto_backends``), so a schema llguidance refuses and xgrammar enforces still compiles;
the loaded grammar's ``backend`` is the one that compiled it. Other kinds' "auto" is
their default backend.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

from radixlm.runtime.constrained.base import CompiledGrammar, GrammarBackend
from radixlm.runtime.constrained.compile_worker import (
    CompileJob,
    CompileResult,
    CompileWorkers,
    auto_backends,
    build_backend,
)
from radixlm.runtime.constrained.config import GrammarConfig
from radixlm.runtime.constrained.registry import AUTO
from radixlm.runtime.constrained.spec import JSON_KINDS, GrammarSpec
from radixlm.runtime.constrained.spec_limits import check_spec_limits, is_small
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError
from radixlm.runtime.histogram import Histogram

__all__ = ["GrammarCompiler", "CompileStats", "PendingGrammar"]

_Key = tuple[str, GrammarSpec]
# Compile times' bucket bounds in seconds (a cached schema takes none: only compiles count).
COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PendingGrammar:
    """One cached compile: in flight until ``future`` is done, then ``result()``.

    ``result`` loads the worker's export into this process once (the first caller to
    ask does it; later ones get the same object, with the backend that compiled it) and
    raises the compile's error. ``backend`` is what was asked: a name, or "auto".
    """

    def __init__(self, compiler: GrammarCompiler, backend: str, spec: GrammarSpec) -> None:
        self.backend = backend
        self.spec = spec
        self.future: Future[CompileResult] = Future()
        self._compiler = compiler
        self._lock = threading.Lock()
        self._loaded: CompiledGrammar | None = None

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> CompiledGrammar:
        """The compiled grammar (call once ``future`` is done).

        Raises:
            GrammarError: the spec is invalid, unsupported, accepts nothing, its
                backend is not installed, or it took over grammar_compile_timeout.
        """
        with self._lock:
            if self._loaded is None:
                self._loaded = self._compiler._load(self.spec, self.future.result())
            return self._loaded


class GrammarCompiler:
    """Thread-safe; one per engine (one vocabulary). ``close`` stops its workers."""

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig) -> None:
        self.vocab = vocab
        self.config = config
        self._lock = threading.Lock()
        self._cache: OrderedDict[_Key, PendingGrammar] = OrderedDict()
        # Here only to load what workers export (building one is slow: not under _lock).
        # Keyed by (name, special tokens): a grammar that writes special tokens is loaded
        # over the vocabulary variant it was compiled over.
        self._backends: dict[tuple[str, tuple[str, ...]], GrammarBackend] = {}
        self._backend_lock = threading.Lock()
        self.workers = CompileWorkers(vocab, config)
        self.stats = CompileStats()

    def backend_for(self, spec: GrammarSpec, requested: str | None) -> str:
        """The request's backend, else the engine's. "auto" (either's) stays "auto" for a
        JSON schema (its compile tries each backend in turn) and is the kind's default for
        any other kind."""
        choice = self.config.grammar_backend if requested is None else requested
        if choice != AUTO:
            return choice
        return AUTO if spec.kind == "json_schema" else spec.default_backend

    def warm(self) -> None:
        """Starts a compile worker now, in the background (an engine calls it at start)."""
        self.workers.warm()

    def wait_warm(self, timeout: float) -> bool:
        """After ``warm``: waits up to ``timeout`` seconds for that worker to be ready;
        whether it is (``CompileWorkers.wait_warm``)."""
        return self.workers.wait_warm(timeout)

    def start(self, spec: GrammarSpec, backend: str) -> PendingGrammar:
        """The cached compile of ``spec`` with ``backend``, started if it is new; its
        limits (``spec_limits``) are checked first, so one past them never queues.

        Raises:
            RequestLimitError: the spec is past grammar_max_chars,
                grammar_max_regex_size or grammar_max_enum_values.
            GrammarError: a schema nested past grammar_max_schema_depth.
        """
        key = (backend, self._resolved(spec))
        with self._lock:
            if (pending := self._hit(key)) is not None:
                return pending
        check_spec_limits(key[1], self.config)  # outside the lock: linear, not free
        with self._lock:
            if (pending := self._hit(key)) is not None:  # started meanwhile by another
                return pending
            self.stats.misses += 1
            pending = PendingGrammar(self, *key)
            self._cache[key] = pending
            while len(self._cache) > self.config.grammar_cache_size:
                self._cache.popitem(last=False)
        try:
            self._ready(backend, key[1])  # is it installed and known? (and ready to load)
        except GrammarError as e:
            pending.future.set_exception(e)
            return pending
        timeout = self.config.grammar_compile_timeout
        job = CompileJob(backend, key[1], timeout, pending.future, is_small(key[1], backend))
        job.future.add_done_callback(self._observe)
        self.workers.submit(job)
        return pending

    def _hit(self, key: _Key) -> PendingGrammar | None:
        """The cached compile of ``key`` (counted as a hit), if any; under ``_lock``."""
        pending = self._cache.get(key)
        if pending is not None:
            self._cache.move_to_end(key)
            self.stats.hits += 1
        return pending

    def compile(self, spec: GrammarSpec, backend: str) -> CompiledGrammar:
        """The compiled grammar for ``spec`` (cached), waiting in this thread.

        Raises:
            GrammarError: the spec is invalid, unsupported or accepts nothing.
            GrammarCompileTimeoutError: compiling took over grammar_compile_timeout.
        """
        pending = self.start(spec, backend)
        pending.future.exception()  # waits
        return pending.result()

    def close(self) -> None:
        """Stops the workers; compiles still queued or running fail."""
        self.workers.close()

    def _resolved(self, spec: GrammarSpec) -> GrammarSpec:
        """``spec`` with the engine's choice where it leaves one open, and only the special
        tokens this vocabulary has, so the cache key says what is compiled."""
        if spec.kind in JSON_KINDS and spec.bounded_numbers is None:
            spec = dataclasses.replace(spec, bounded_numbers=self.config.json_bounded_numbers)
        if spec.kind in JSON_KINDS and spec.max_string_length is None:
            length = self.config.json_max_string_length or 0  # 0: none, as a request's
            spec = dataclasses.replace(spec, max_string_length=length)
        if spec.special_tokens:  # only those the tokenizer has: the rest change nothing
            spec = dataclasses.replace(
                spec, special_tokens=self.vocab.special_among(spec.special_tokens)
            )
        return spec

    def _observe(self, future: Future[CompileResult]) -> None:
        if future.exception() is None:
            with self._lock:
                self.stats.seconds.observe(future.result().seconds)

    def _load(self, spec: GrammarSpec, done: CompileResult) -> CompiledGrammar:
        try:
            return self._backend(done.backend, spec.special_tokens).load(done.exported)
        except GrammarError:
            raise
        except Exception as e:  # a backend bug: still the caller's error
            raise GrammarError(spec.kind, f"{done.backend} failed: {e!r}") from e

    def _ready(self, name: str, spec: GrammarSpec) -> None:
        """Builds backend ``name`` here, to load what it compiles; for "auto", the first
        of ``auto_backends`` that is installed (the one that compiles most schemas; any
        other is built when it compiles one).

        Raises:
            UnsupportedGrammarError: no such backend, or none installed (the first's error).
        """
        if name != AUTO:
            self._backend(name, spec.special_tokens)
            return
        refusals: list[UnsupportedGrammarError] = []
        for other in auto_backends(spec):
            try:
                self._backend(other, spec.special_tokens)
                return
            except UnsupportedGrammarError as e:
                refusals.append(e)
        raise refusals[0]

    def _backend(self, name: str, special_tokens: tuple[str, ...] = ()) -> GrammarBackend:
        """Backend ``name`` over the vocabulary, or its variant spelling ``special_tokens``
        (each built once)."""
        key = (name, special_tokens)
        with self._backend_lock:
            if key not in self._backends:
                vocab = self.vocab.with_special_tokens(special_tokens)
                try:
                    self._backends[key] = build_backend(name, vocab, self.config)
                except ImportError as e:
                    raise UnsupportedGrammarError(
                        "grammar_backend",
                        f"the {name!r} grammar backend needs a package that is not "
                        f"installed ({e}); reinstall radixlm with its dependencies",
                    ) from e
            return self._backends[key]


@dataclass
class CompileStats:
    """Cache hits and misses (a miss starts a compile), and how long compiles took
    (each finished one, in ``seconds``; read ``snapshot()``)."""

    hits: int = 0
    misses: int = 0
    seconds: Histogram = field(default_factory=lambda: Histogram(COMPILE_BUCKETS))
