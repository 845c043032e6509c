"""Compiles constraints once, off the engine loop, with a time limit, and caches them.

    caller thread (request builder)            compile worker thread
    ---------------------------------          -----------------------------
    compile(spec, backend)
      cache hit? -> CompiledGrammar
      else start / join the key's Future  -->   backend.compile(spec)
      wait up to grammar_compile_timeout  <--   result or GrammarError
      timeout -> GrammarCompileTimeoutError

The engine loop never compiles, so a slow schema delays only its own caller.
A compile that times out keeps running in its (daemon) worker, because a
native compile cannot be interrupted; its key remembers the timeout, so a
retry fails at once (instead of waiting the limit again or starting another)
until that compile ends, and is then served from the cache. Errors are cached too: the
same bad spec is rejected without recompiling.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

import torch

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained.base import CompiledGrammar, GrammarBackend
from radixlm.runtime.constrained.spec import GrammarSpec
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.errors import (
    GrammarCompileTimeoutError,
    GrammarError,
    UnsupportedGrammarError,
)
from radixlm.runtime.histogram import Histogram

__all__ = ["GrammarCompiler", "CompileStats"]

_Key = tuple[str, GrammarSpec]
# Compile times' bucket bounds in seconds (a cached schema takes none: only compiles count).
COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GrammarCompiler:
    """Thread-safe; one per engine (one vocabulary)."""

    def __init__(
        self,
        vocab: TokenVocabulary,
        config: GrammarConfig,
        backends: dict[str, Callable[[], GrammarBackend]] | None = None,
    ) -> None:
        """``backends`` replaces the backend factories by name (tests inject slow ones)."""
        self.vocab = vocab
        self.config = config
        self._lock = threading.Lock()
        self._cache: OrderedDict[_Key, Future[CompiledGrammar]] = OrderedDict()
        self._timed_out: set[_Key] = set()  # keys a caller stopped waiting for
        self._backends: dict[str, GrammarBackend] = {}
        self._backend_lock = threading.Lock()  # building one takes ~0.5 s: not under _lock
        self._factories: dict[str, Callable[[], GrammarBackend]] = {
            "outlines": self._outlines,
            "xgrammar": self._xgrammar,
            **(backends or {}),
        }
        self.stats = CompileStats()

    def backend_for(self, spec: GrammarSpec, requested: str | None) -> str:
        """The request's backend, else the engine's, else the kind's default."""
        if requested is not None:
            return requested
        if self.config.grammar_backend != "auto":
            return self.config.grammar_backend
        return spec.default_backend

    def compile(self, spec: GrammarSpec, backend: str) -> CompiledGrammar:
        """The compiled grammar for ``spec`` (cached).

        Raises:
            GrammarError: the spec is invalid, unsupported or accepts nothing.
            GrammarCompileTimeoutError: compiling took over grammar_compile_timeout.
        """
        self._backend(backend)  # built once (~0.5 s for outlines): not part of the limit
        key = (backend, spec)
        future = self._future(key)
        timeout = self.config.grammar_compile_timeout
        with self._lock:
            gave_up = key in self._timed_out and not future.done()
        if gave_up:  # a caller already waited the whole limit for this compile
            raise GrammarCompileTimeoutError(
                spec.kind,
                f"it is still compiling with the {backend} backend after an earlier "
                f"request waited {timeout:g} s for it (grammar_compile_timeout); a retry "
                f"succeeds once that compile ends{_hint(spec, backend)}",
            )
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            with self._lock:
                self._timed_out.add(key)
            raise GrammarCompileTimeoutError(
                spec.kind,
                f"compiling it with the {backend} backend took over {timeout:g} s "
                f"(grammar_compile_timeout){_hint(spec, backend)}",
            ) from None

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
            self._timed_out.discard(key)  # a fresh compile (the old one was evicted)
            while len(self._cache) > self.config.grammar_cache_size:
                evicted, _ = self._cache.popitem(last=False)
                self._timed_out.discard(evicted)
        worker = threading.Thread(
            target=self._run, args=(key, future), name="radixlm-grammar", daemon=True
        )
        worker.start()
        return future

    def _run(self, key: _Key, future: Future[CompiledGrammar]) -> None:
        backend_name, spec = key
        start = time.perf_counter()
        try:
            compiled = self._backend(backend_name).compile(spec)
            self._check_accepts_something(compiled, spec)
            future.set_result(compiled)
        except GrammarError as e:
            future.set_exception(e)
        except Exception as e:  # a backend bug: still the caller's error, never a hang
            future.set_exception(GrammarError(spec.kind, f"{backend_name} failed: {e!r}"))
        finally:
            with self._lock:
                self.stats.seconds.observe(time.perf_counter() - start)

    def _check_accepts_something(self, compiled: CompiledGrammar, spec: GrammarSpec) -> None:
        """A grammar that allows no first token and is not already complete accepts
        nothing (backends catch most such specs earlier, with a sharper message)."""
        matcher = compiled.new_matcher()
        bitmask = torch.zeros(1, self.vocab.bitmask_width, dtype=torch.int32)
        matcher.fill_bitmask(bitmask, 0)
        if not bool(bitmask.any()) and not matcher.is_terminal():
            raise GrammarError(spec.kind, "it accepts nothing this vocabulary can spell")

    def _backend(self, name: str) -> GrammarBackend:
        with self._backend_lock:
            if name not in self._backends:
                try:
                    self._backends[name] = self._factories[name]()
                except ImportError as e:  # the backend's packages are imported here, first
                    raise UnsupportedGrammarError(
                        "grammar_backend",
                        f"the {name!r} grammar backend needs a package that is not "
                        f"installed ({e}); reinstall radixlm with its dependencies",
                    ) from e
            return self._backends[name]

    def _outlines(self) -> GrammarBackend:
        from radixlm.runtime.constrained.outlines_backend import OutlinesBackend

        max_states, max_depth = self.config.grammar_max_states, self.config.grammar_max_schema_depth
        return OutlinesBackend(self.vocab, max_states, max_depth)

    def _xgrammar(self) -> GrammarBackend:
        from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(self.vocab, self.config.grammar_max_schema_depth)


@dataclass
class CompileStats:
    """Cache hits and misses (a miss starts a compile), and how long compiles took
    (each finished one, failed ones included, in ``seconds``; read ``snapshot()``)."""

    hits: int = 0
    misses: int = 0
    seconds: Histogram = field(default_factory=lambda: Histogram(COMPILE_BUCKETS))


def _hint(spec: GrammarSpec, backend: str) -> str:
    if backend == "outlines" and spec.kind == "json_schema":
        return "; the xgrammar backend compiles JSON schemas in milliseconds"
    return ""
