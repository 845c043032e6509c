"""Grammar compiles in child processes that can be stopped: one past its time limit is
killed, so a hostile grammar (a 10 MB regex, 5,000 choices on the FSM backend) costs its
limit and no more, and leaves no CPU burning after its refusal.

    engine process (a compile thread)                worker (python -m ...worker_main)
    ---------------------------------                ------------------------------
    CompileWorkers.compile(backend, spec, limit)
      take an idle worker (start one if none is)
      send the job                          --job-->  backend.compile(spec), checked
      wait up to the limit                  <--ok--   backend.export(compiled)
        past it: SIGKILL the worker (the next compile starts a fresh one),
                 raise GrammarCompileTimeoutError
    backend.load(exported) here: the grammar's home is the engine process

A worker is a fresh interpreter (not a fork: the engine runs OpenMP and threads, and
a fork of a user's script would run it again), started with the vocabulary and the
grammar config, single-threaded, under an address-space cap
(``grammar_compile_memory_mb``): a compile that needs more fails in the worker alone.
Frames on its stdin / stdout are an 8-byte length and a pickle (both ends are ours);
anything a library prints goes to stderr. A worker whose parent dies reads EOF and
exits.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, BinaryIO

from radixlm.runtime.config import GrammarConfig
from radixlm.runtime.constrained.spec import BACKEND_NAMES, GrammarSpec
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.errors import (
    GrammarCompileTimeoutError,
    GrammarError,
    UnsupportedGrammarError,
)

__all__ = ["CompileWorkers", "CompileResult", "build_backend"]

_HEADER = struct.Struct(">Q")
# Starting a worker imports torch and the three backends: seconds, not the grammar's
# fault, so not part of its limit; past this the worker is broken.
_START_TIMEOUT = 120.0
_ERRORS = {"GrammarError": GrammarError, "UnsupportedGrammarError": UnsupportedGrammarError}


@dataclass(frozen=True)
class CompileResult:
    """A compiled grammar as a worker sends it back (``backend.load`` rebuilds it)."""

    exported: Any
    seconds: float  # the compile's own time in the worker


class _WorkerGone(Exception):
    """The worker died or was killed mid-job."""


class _Worker:
    """One child process and its pipes."""

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "radixlm.runtime.constrained.worker_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._out: BinaryIO = self.process.stdin
        self._in: BinaryIO = self.process.stdout
        try:
            _write_frame(self._out, (vocab, config))
            reply = self._read(_START_TIMEOUT)
        except (TimeoutError, OSError, _WorkerGone) as e:
            self.kill()
            raise _WorkerGone(f"it did not start: {e!r}") from None
        if reply != "ready":
            self.kill()
            raise _WorkerGone(f"it did not start: {reply!r}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def run(self, backend: str, spec: GrammarSpec, timeout: float) -> Any:
        """The worker's reply to one job; None if it took over ``timeout`` (the worker is
        then killed). Raises _WorkerGone if it died."""
        try:
            _write_frame(self._out, (backend, spec))
        except OSError as e:  # it died while idle
            raise _WorkerGone(repr(e)) from None
        try:
            return self._read(timeout)
        except TimeoutError:
            self.kill()
            return None

    def _read(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        header = self._read_exactly(_HEADER.size, deadline)
        return pickle.loads(self._read_exactly(_HEADER.unpack(header)[0], deadline))

    def _read_exactly(self, size: int, deadline: float) -> bytes:
        chunks, got, fd = [], 0, self._in.fileno()
        while got < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(size - got, 1 << 20))
            if not chunk:
                raise _WorkerGone(f"the compile worker exited ({self.process.wait()})")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self._out, self._in):
            try:
                pipe.close()
            except OSError:
                pass


class CompileWorkers:
    """Up to ``config.grammar_compile_workers`` workers, started as compiles need them
    (``warm`` starts the first ahead of time). Thread-safe."""

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig) -> None:
        self._vocab = vocab
        self._config = config
        self._lock = threading.Condition()
        self._idle: list[_Worker] = []
        self._num_starting = 0
        self._all: set[_Worker] = set()  # every started, not yet killed, worker (idle or busy)
        self._closed = False
        self._finalizer = weakref.finalize(self, _kill_all, self._all)

    def warm(self) -> None:
        """Starts the first worker in the background (the first compile need not wait)."""
        with self._lock:
            if self._num_workers or self._closed:
                return
            self._num_starting += 1
        threading.Thread(target=self._start_idle, name="radixlm-grammar-warm", daemon=True).start()

    def compile(self, backend: str, spec: GrammarSpec, timeout: float) -> CompileResult:
        """Compiles ``spec`` with ``backend`` in a worker, in at most ``timeout`` seconds
        of compile time (waiting for a free worker is not counted).

        Raises:
            GrammarError: the spec is invalid, unsupported or accepts nothing, or the
                worker died compiling it (over the memory cap).
            GrammarCompileTimeoutError: over the limit (the worker was killed).
        """
        worker = self._acquire()
        while worker.process.poll() is not None:  # it died while idle (killed from outside)
            self._discard(worker)
            worker = self._acquire()
        try:
            reply = worker.run(backend, spec, timeout)
        except _WorkerGone as e:
            if self._closed:
                raise GrammarError(spec.kind, "the engine shut down while it compiled") from None
            self._discard(worker)
            cap = self._config.grammar_compile_memory_mb
            raise GrammarError(
                spec.kind,
                f"compiling it with the {backend} backend killed its worker ({e}); it may "
                f"need more than grammar_compile_memory_mb ({cap} MB)",
            ) from None
        if reply is None:
            self._discard(worker)
            raise GrammarCompileTimeoutError(
                spec.kind,
                f"compiling it with the {backend} backend took over {timeout:g} s "
                f"(grammar_compile_timeout); the compile was stopped{_hint(spec, backend)}",
            )
        self._release(worker)
        status, *payload = reply
        if status == "ok":
            return CompileResult(*payload)
        kind, field, reason = payload
        raise _ERRORS.get(kind, GrammarError)(field, reason)

    def close(self) -> None:
        """Kills every worker; compiles after this fail."""
        with self._lock:
            self._closed = True
            self._idle.clear()
            self._lock.notify_all()
        _kill_all(self._all)

    @property
    def _num_workers(self) -> int:
        """Idle, busy and starting (read under ``_lock``)."""
        return len(self._all) + self._num_starting

    def pids(self) -> list[int]:
        """The live workers' process ids (tests check a killed one is gone)."""
        return [w.pid for w in list(self._all) if w.process.poll() is None]

    def _acquire(self) -> _Worker:
        with self._lock:
            while True:
                if self._closed:
                    raise GrammarError("grammar", "the engine is shutting down")
                if self._idle:
                    return self._idle.pop()
                # one starting is sooner ready than another started now
                if (
                    not self._num_starting
                    and self._num_workers < self._config.grammar_compile_workers
                ):
                    self._num_starting += 1
                    break
                self._lock.wait()
        return self._start_counted()

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.kill()
                self._all.discard(worker)
                return
            self._idle.append(worker)
            self._lock.notify()

    def _discard(self, worker: _Worker) -> None:
        """Drops a killed or dead worker. Its successor starts only when a compile needs
        it: started now, its start-up (seconds of CPU) would slow the engine right after
        the refusal it is there to contain."""
        worker.kill()
        with self._lock:
            self._all.discard(worker)
            self._lock.notify_all()

    def _start_idle(self) -> None:
        """``_start_counted``, in the background: the worker waits idle."""
        try:
            worker = self._start_counted()
        except GrammarError:  # the compile that needs it starts another and says why
            return
        self._release(worker)

    def _start_counted(self) -> _Worker:
        """Starts a worker for a slot already counted in ``_num_starting``; a failed
        start gives the slot back."""
        try:
            worker = self._start()
        except BaseException:
            with self._lock:
                self._num_starting -= 1
                self._lock.notify_all()
            raise
        with self._lock:
            self._all.add(worker)
            self._num_starting -= 1
            self._lock.notify_all()  # a waiter may now start the next one
        return worker

    def _start(self) -> _Worker:
        try:
            worker = _Worker(self._vocab, self._config)
        except (_WorkerGone, OSError) as e:
            raise GrammarError("grammar", f"the grammar compile worker failed to start: {e}") from e
        return worker


def _kill_all(workers: set[_Worker]) -> None:
    for worker in list(workers):
        worker.kill()
        workers.discard(worker)


def _hint(spec: GrammarSpec, backend: str) -> str:
    if backend == "outlines" and spec.kind in ("json_schema", "choices"):
        return "; the llguidance backend compiles these in milliseconds"
    return ""


def build_backend(name: str, vocab: TokenVocabulary, config: GrammarConfig) -> Any:
    """The backend called ``name`` (its packages are imported here, on first use).

    Raises:
        KeyError: no backend of that name.
    """
    if name == "outlines":
        from radixlm.runtime.constrained.outlines_backend import OutlinesBackend

        return OutlinesBackend(vocab, config.grammar_max_states, config.grammar_max_schema_depth)
    if name == "xgrammar":
        from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(vocab, config.grammar_max_schema_depth)
    if name == "llguidance":
        from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(vocab, config.grammar_max_schema_depth)
    raise KeyError(name)


# ---- the worker's side ----------------------------------------------------------------


def _write_frame(pipe: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_HEADER.pack(len(data)) + data)
    pipe.flush()


def _read_frame(pipe: BinaryIO) -> Any:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    size = _HEADER.unpack(header)[0]
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """The worker's loop: one job at a time until its parent closes the pipe."""
    import resource

    import torch

    try:
        vocab, config = _read_frame(requests)
    except EOFError:  # stopped while starting
        return
    cap = config.grammar_compile_memory_mb * 1024 * 1024
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ValueError, OSError) as e:  # a platform without the limit: uncapped, said so
        print(f"radixlm compile worker: no address-space cap ({e})", file=sys.stderr)
    torch.set_num_threads(1)
    # Every backend now, before "ready": building one takes ~0.5 s, which is not part
    # of any grammar's time limit.
    backends: dict[str, Any] = {}
    for name in BACKEND_NAMES:
        try:
            backends[name] = build_backend(name, vocab, config)
        except ImportError:  # the parent names the missing package to the caller
            pass
    _write_frame(replies, "ready")
    while True:
        try:
            backend_name, spec = _read_frame(requests)
        except EOFError:
            return
        reply = _compile_job(backends, backend_name, spec, vocab, config)
        try:
            _write_frame(replies, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # a backend bug
            _write_frame(replies, ("error", "GrammarError", spec.kind, f"{backend_name}: {e!r}"))


def _compile_job(
    backends: dict[str, Any],
    name: str,
    spec: GrammarSpec,
    vocab: TokenVocabulary,
    config: GrammarConfig,
) -> tuple:
    start = time.perf_counter()
    try:
        backend = backends[name]
        compiled = backend.compile(spec)
        _check_accepts_something(compiled, spec, vocab)
        return ("ok", backend.export(compiled), time.perf_counter() - start)
    except GrammarError as e:
        return ("error", type(e).__name__, e.field, e.reason)
    except MemoryError:
        cap = config.grammar_compile_memory_mb
        reason = f"compiling it needs more than grammar_compile_memory_mb ({cap} MB)"
        return ("error", "GrammarError", spec.kind, reason)
    except Exception as e:  # a backend bug: still the caller's error, never a hang
        return ("error", "GrammarError", spec.kind, f"{name} failed: {e!r}")


def _check_accepts_something(compiled: Any, spec: GrammarSpec, vocab: TokenVocabulary) -> None:
    """A grammar that allows no first token and is not already complete accepts nothing
    (backends catch most such specs earlier, with a sharper message)."""
    import torch

    matcher = compiled.new_matcher()
    bitmask = torch.zeros(1, vocab.bitmask_width, dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    if not bool(bitmask.any()) and not matcher.is_terminal():
        raise GrammarError(spec.kind, "it accepts nothing this vocabulary can spell")


def serve() -> None:
    """A worker's whole life (``worker_main`` runs it)."""
    # The frames own stdout: whatever a library prints goes to stderr instead.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, replies)
