"""Compiles constraints once, off the engine loop, with a time limit, and caches them.

    caller thread (request builder)        compile thread         worker process
    -------------------------------        --------------         --------------
    compile(spec, backend)
      cache hit? -> CompiledGrammar
      else start / join the key's Future --> workers.compile -->  backend.compile
                                             (killed past the limit)
                                             backend.load   <--   exported grammar
      wait for it                        <-- result or GrammarError

The engine loop never compiles, so a slow schema delays only its own caller; and a
compile runs in a worker process (``compile_worker``) that is killed at
``grammar_compile_timeout``, so one that would run on costs the limit and no more.
Errors, timeouts included, are cached: the same bad spec is refused again at once.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained.base import CompiledGrammar, GrammarBackend
from radixlm.runtime.constrained.compile_worker import CompileWorkers, build_backend
from radixlm.runtime.constrained.spec import JSON_KINDS, GrammarSpec
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.errors import GrammarError, UnsupportedGrammarError
from radixlm.runtime.histogram import Histogram

__all__ = ["GrammarCompiler", "CompileStats"]

_Key = tuple[str, GrammarSpec]
# Compile times' bucket bounds in seconds (a cached schema takes none: only compiles count).
COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GrammarCompiler:
    """Thread-safe; one per engine (one vocabulary). ``close`` stops its workers."""

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig) -> None:
        self.vocab = vocab
        self.config = config
        self._lock = threading.Lock()
        self._cache: OrderedDict[_Key, Future[CompiledGrammar]] = OrderedDict()
        # Here only to load what workers export (building one takes ~0.5 s: not under _lock).
        self._backends: dict[str, GrammarBackend] = {}
        self._backend_lock = threading.Lock()
        self.workers = CompileWorkers(vocab, config)
        self.stats = CompileStats()

    def backend_for(self, spec: GrammarSpec, requested: str | None) -> str:
        """The request's backend, else the engine's, else the kind's default."""
        if requested is not None:
            return requested
        if self.config.grammar_backend != "auto":
            return self.config.grammar_backend
        return spec.default_backend

    def warm(self) -> None:
        """Starts a compile worker now, in the background (an engine calls it at start)."""
        self.workers.warm()

    def compile(self, spec: GrammarSpec, backend: str) -> CompiledGrammar:
        """The compiled grammar for ``spec`` (cached).

        Raises:
            GrammarError: the spec is invalid, unsupported or accepts nothing.
            GrammarCompileTimeoutError: compiling took over grammar_compile_timeout.
        """
        return self._future((backend, self._resolved(spec))).result()

    def close(self) -> None:
        self.workers.close()

    def _resolved(self, spec: GrammarSpec) -> GrammarSpec:
        """``spec`` with the engine's choice where it leaves one open, so the cache key
        says what is compiled."""
        if spec.kind in JSON_KINDS and spec.bounded_numbers is None:
            return dataclasses.replace(spec, bounded_numbers=self.config.json_bounded_numbers)
        return spec

    def _future(self, key: _Key) -> Future[CompiledGrammar]:
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                self.stats.hits += 1
                return future
            self.stats.misses += 1
            future = Future()
            self._cache[key] = future
            while len(self._cache) > self.config.grammar_cache_size:
                self._cache.popitem(last=False)
        worker = threading.Thread(
            target=self._run, args=(key, future), name="radixlm-grammar", daemon=True
        )
        worker.start()
        return future

    def _run(self, key: _Key, future: Future[CompiledGrammar]) -> None:
        backend_name, spec = key
        try:
            backend = self._backend(backend_name)  # also: is it installed and known?
            done = self.workers.compile(backend_name, spec, self.config.grammar_compile_timeout)
            future.set_result(backend.load(done.exported))
            with self._lock:
                self.stats.seconds.observe(done.seconds)
        except GrammarError as e:
            future.set_exception(e)
        except Exception as e:  # a backend bug: still the caller's error, never a hang
            future.set_exception(GrammarError(spec.kind, f"{backend_name} failed: {e!r}"))

    def _backend(self, name: str) -> GrammarBackend:
        with self._backend_lock:
            if name not in self._backends:
                try:
                    self._backends[name] = build_backend(name, self.vocab, self.config)
                except ImportError as e:
                    raise UnsupportedGrammarError(
                        "grammar_backend",
                        f"the {name!r} grammar backend needs a package that is not "
                        f"installed ({e}); reinstall radixlm with its dependencies",
                    ) from e
            return self._backends[name]


@dataclass
class CompileStats:
    """Cache hits and misses (a miss starts a compile), and how long compiles took
    (each finished one, in ``seconds``; read ``snapshot()``)."""

    hits: int = 0
    misses: int = 0
    seconds: Histogram = field(default_factory=lambda: Histogram(COMPILE_BUCKETS))
