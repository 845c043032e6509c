"""Grammar compiles in child processes that can be stopped: one past its time limit is
killed, so a hostile grammar (a 10 MB regex, 5,000 choices on the FSM backend) costs its
limit and no more, and leaves no CPU burning after its refusal.

    submit (any thread)   driver thread ("radixlm-compile")     worker (python -m ...)
    -------------------   ---------------------------------     ----------------------
    CompileWorkers.submit(CompileJob) -> the driver (started if none runs)
                          its lane's queue (fast if small, else general)
                          waits on the pipes (select), then:
                          an idle worker takes its lane's next job --job-->  backend.compile
                                                              ("auto": auto_backends in turn)
                          each reply as it arrives    <--ok--  backend.export, its name
                            past the job's limit: SIGKILL the worker (the next job
                            starts a fresh one)
                            a queued job past its limit: refused, never started
                          the job's future gets a CompileResult or its GrammarError
    that backend's load(exported) in the caller (compiler.py): the grammar's home is
    the engine

Two lanes, so that compiles cannot starve each other (with one, two hostile regexes
hold both workers for their whole limit, and a trivial schema waits behind them):

    fast lane      1 worker, started with the engine (``warm``) and restarted when
                   killed; small jobs only (``spec_limits.is_small``: predicted from the
                   text), each held FAST_LANE_S at most: one that runs longer was not
                   small, its worker is killed and the job moves to the general lane
    general lane   up to grammar_compile_workers, started while its jobs wait; any job

A slow compile can hold every general worker for its limit, never the fast one past
FAST_LANE_S, so a cached or small constraint waits for no slow compile. Growing workers
on demand instead would not do: a worker takes seconds of CPU to start (torch and three
backends), longer than a small compile waits behind a slow one on 2 cores.

A job's limit (``grammar_compile_timeout``) counts from the request's arrival, not from
when a worker takes it: a queued job past it is refused with the timeout error and never
started, and a running one is killed at it. Only a job that arrives to find no worker
ready to take it (the lane's first start, or a restart after its workers were killed:
seconds of imports, not the grammar's fault) has its clock paused until one is ready; a
job queued behind a busy worker is charged every second, that worker's kill and restart
included (else each hostile compile would lengthen the wait of those queued behind it).
Everything a request can be refused for cheaply (its size, depth, enum values, counted
repeats) is refused before it is queued at all (``spec_limits``, in the caller).

A JSON schema under ``grammar_backend="auto"`` is one job: the worker tries each backend
of ``auto_backends`` until one compiles it, all under the job's one time limit, and the
result names the backend that did.

The driver is a thread of its own, not the engine loop between its steps: a reply is
handled the moment it arrives, so a burst of new schemas on a busy engine compiles at
the workers' pace, not one job per worker per engine step (on 2 cores, 60 new schemas
beside 16 decoding requests took 18x as long as on an idle engine when the engine loop
drove them: ``benchmarks/bench_compile_burst.py``). It runs no torch and holds the GIL
only to move bytes; it waits on the pipes with ``select`` (every pipe non-blocking), so
it never stalls on a slow compile or a worker still starting, and it ends when no job
waits or runs.

The fast lane's worker starts nicer than the engine (``_STARTING_NICENESS``): it
starts with the engine (``warm``), before any job, and its start, torch and three
backends imported and the vocabulary read, is seconds of CPU. Beside the engine's
first passes (an offline Engine takes requests at once) it took a core from their two
OpenMP threads: on 2 cores the default model's first ten 150-token prompts took 171.5
ms each (median), 50.1 with no worker starting, 58.3 with it niced
(``benchmarks/bench_start_passes.py``). Ready, the worker is set back to the engine's
niceness where the OS allows it (lowering a niceness takes CAP_SYS_NICE: elsewhere its
compiles stay nicer too). A general worker starts for a job that waits for it, at the
engine's niceness.

A worker is a fresh interpreter (not a fork: the engine runs OpenMP and threads, and
a fork of a user's script would run it again), started with the vocabulary and the
grammar config, single-threaded, under an address-space cap
(``grammar_compile_memory_mb``): a compile that needs more fails in the worker alone.
Frames on its stdin / stdout are an 8-byte length and a pickle (both ends are ours);
anything a library prints goes to stderr. A worker whose parent dies reads EOF and
exits.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import torch

from radixlm.runtime.child_process import python_module_command
from radixlm.runtime.constrained.base import GrammarBackend
from radixlm.runtime.constrained.config import GrammarConfig
from radixlm.runtime.constrained.registry import AUTO, REGISTRY
from radixlm.runtime.constrained.schema_check import load_drafts
from radixlm.runtime.constrained.spec import GrammarSpec
from radixlm.runtime.constrained.vocab import TokenVocabulary
from radixlm.runtime.errors import (
    GrammarCompileTimeoutError,
    GrammarError,
    UnsupportedGrammarError,
)

__all__ = [
    "FAST_LANE_S", "CompileJob", "CompileResult", "CompileWorkers", "auto_backends",
    "build_backend",
]  # fmt: skip

logger = logging.getLogger(__name__)

_HEADER = struct.Struct(">Q")
# How much nicer than the engine the fast lane's worker runs while it starts (see the
# module doc).
_STARTING_NICENESS = 10
# Starting a worker imports torch and the three backends: seconds, not the grammar's
# fault, so not part of its limit; past this the worker is broken.
_START_TIMEOUT = 120.0
# The most a job holds the fast lane's worker: past it the job was not small after all,
# and moves to the general lane (the worker is killed; another starts for the lane).
FAST_LANE_S = 2.0
FAST, GENERAL = "fast", "general"  # the lanes
DRIVER_THREAD = "radixlm-compile"  # the thread that drives the workers
# The most the driver waits on the pipes between deadline checks (a job's limit or a
# worker's start ends sooner when it is sooner).
_DRIVER_POLL_S = 0.5
_READ_SIZE = 1 << 20
_ERRORS = {"GrammarError": GrammarError, "UnsupportedGrammarError": UnsupportedGrammarError}


@dataclass(frozen=True)
class CompileResult:
    """A compiled grammar as a worker sends it back (``backend``'s ``load`` rebuilds it)."""

    exported: Any
    seconds: float  # the compile's own time in the worker ("auto": every backend tried)
    backend: str  # the backend that compiled it (under "auto", the one that took it)


@dataclass(eq=False)
class CompileJob:
    """One compile to run: ``future`` gets its ``CompileResult`` or its ``GrammarError``.

    ``backend`` is a backend's name, or "auto" for a JSON schema (``auto_backends``).
    ``timeout`` counts from ``arrived`` (the request's arrival: a wait for a busy worker
    counts; while ``cold``, it arrived to find no worker ready to take it, and its
    ``deadline`` moves on until one is). ``small``: it may take the fast lane
    (``spec_limits.is_small``).
    """

    backend: str
    spec: GrammarSpec
    timeout: float
    future: Future[CompileResult] = field(default_factory=Future)
    small: bool = False
    arrived: float = field(default_factory=time.monotonic)
    deadline: float = field(init=False)
    cold: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.deadline = self.arrived + self.timeout


def _set_niceness(pid: int, niceness: int) -> None:
    """Sets a worker's niceness where the OS allows it (a lower one takes CAP_SYS_NICE;
    the worker may have exited already)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, niceness)
    except OSError:
        pass


class _WorkerGone(Exception):
    """The worker died or was killed."""


class _Worker:
    """One child process, its non-blocking pipes and the job it runs.

    States: starting (``ready`` False: its start frame is being written and its "ready"
    awaited), idle (``job`` None) or busy. ``deadline`` bounds the start or the job.
    """

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig, lane: str) -> None:
        self.lane = lane
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            python_module_command("radixlm.runtime.constrained.worker_main"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            # a process group of its own: a Ctrl-C in the terminal is the engine's to handle
            # (it stops its workers), not a KeyboardInterrupt in a worker mid-import
            process_group=0,
        )
        if lane == FAST:
            niceness = os.getpriority(os.PRIO_PROCESS, 0) + _STARTING_NICENESS
            _set_niceness(self.process.pid, niceness)
        assert self.process.stdin is not None and self.process.stdout is not None
        self._out = self.process.stdin.fileno()
        self._in = self.process.stdout.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._in, False)
        self._outbox = bytearray(_frame((vocab, config)))
        self._inbox = bytearray()
        self.ready = False
        self.job: CompileJob | None = None
        self.deadline = time.monotonic() + _START_TIMEOUT

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def read_fd(self) -> int:
        return self._in

    @property
    def write_fd(self) -> int | None:
        """The fd to wait on for writing, while a frame is still being written."""
        return self._out if self._outbox else None

    def take(self, job: CompileJob, now: float) -> None:
        """Starts ``job`` (the worker must be ready and idle); on the fast lane it may
        hold the worker ``FAST_LANE_S`` at most."""
        self.job = job
        self.deadline = job.deadline
        if self.lane == FAST:
            self.deadline = min(job.deadline, now + FAST_LANE_S)
        self._outbox += _frame((job.backend, job.spec))

    def exchange(self) -> list[Any]:
        """Writes what the pipe takes, reads what arrived; the whole frames received.

        Raises _WorkerGone if the worker exited or closed its pipes."""
        sending_start = not self.ready and bool(self._outbox)
        try:
            while self._outbox:
                self._outbox = self._outbox[os.write(self._out, self._outbox) :]
        except BlockingIOError:
            pass
        except OSError as e:  # it died (a broken pipe)
            raise _WorkerGone(repr(e)) from None
        if sending_start and not self._outbox:
            # Its start is timed from when it has all it needs (a driver that paused,
            # e.g. an idle loop thread that retired, is not the worker's fault).
            self.deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                chunk = os.read(self._in, _READ_SIZE)
            except BlockingIOError:
                break
            if not chunk:
                raise _WorkerGone(f"the compile worker exited ({self.process.wait()})")
            self._inbox += chunk
        return self._frames()

    def _frames(self) -> list[Any]:
        frames = []
        while len(self._inbox) >= _HEADER.size:
            size = _HEADER.unpack_from(self._inbox)[0]
            end = _HEADER.size + size
            if len(self._inbox) < end:
                break
            frames.append(pickle.loads(self._inbox[_HEADER.size : end]))
            del self._inbox[:end]
        return frames

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass


class CompileWorkers:
    """Compile workers in two lanes, started as jobs need them, each lane first come,
    first served:

        fast lane     one worker (``warm`` starts it with the engine); takes only small
                      jobs, each for ``FAST_LANE_S`` at most (past it the worker is
                      killed and the job moves to the general lane)
        general lane  up to ``config.grammar_compile_workers``; takes every job, the
                      general queue's first (a small job too, when it waits alone)

    So a small constraint never waits behind a slow compile, whatever runs. A job's
    limit counts from its arrival: one still queued at its deadline fails with the
    timeout error and is never started.

    Thread-safe: ``submit``, ``warm`` and ``close`` may come from any thread. A driver
    thread of its own (``DRIVER_THREAD``) does the rest: it waits on the workers' pipes
    and handles each reply as it arrives, so a compile's result never waits for whatever
    the submitting thread does next (an engine step, a whole pass on a busy engine). It
    runs while a job waits or runs or a worker starts, and ends when none does (the next
    ``submit`` starts another), so an idle engine keeps no thread awake.
    """

    def __init__(self, vocab: TokenVocabulary, config: GrammarConfig) -> None:
        self._vocab = vocab
        self._config = config
        # The driver's own (no other thread touches them while it runs):
        self._queues: dict[str, deque[CompileJob]] = {FAST: deque(), GENERAL: deque()}
        self._workers: list[_Worker] = []  # starting, idle and busy
        self._last_pump = time.monotonic()
        self._keep_fast = False  # warmed: the fast lane's worker is kept started
        # Shared, under _lock: what submit and warm hand over, and the driver's lifecycle.
        self._lock = threading.Lock()
        self._inbox: deque[CompileJob] = deque()
        self._warm_asked = False
        self._closed = False
        # set once the fast lane's first worker is ready, or can no longer be (its start
        # failed, or close): what ``wait_warm`` waits for
        self._warmed = threading.Event()
        self._driver: threading.Thread | None = None
        self._wake_read, self._wake_write = os.pipe()  # a byte here wakes the driver
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        # set once the workers are killed (``close``, collection, or the interpreter's
        # exit, which may come while the driver is mid-step: it then stops quietly)
        self._released = threading.Event()
        self._finalizer = weakref.finalize(
            self, _release, self._workers, (self._wake_read, self._wake_write), self._released
        )

    def warm(self) -> None:
        """Starts the fast lane's worker now, and again whenever it is killed (it starts
        in the background: nothing waits)."""
        with self._lock:
            if self._closed:
                return
            self._warm_asked = True
            self._ensure_driver()

    def wait_warm(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds, after ``warm``, for the fast lane's worker to
        be ready; whether it is (False: still starting, or it failed to start). A server
        waits before it takes requests: started beside the first passes, the worker's
        imports take a core from them for seconds."""
        return self._warmed.wait(timeout) and any(
            w.lane == FAST and w.ready for w in list(self._workers)
        )

    def submit(self, job: CompileJob) -> None:
        """Hands ``job`` to the driver, which queues it in its lane and runs it. After
        ``close`` it fails at once."""
        with self._lock:
            if not self._closed:
                self._inbox.append(job)
                self._ensure_driver()
                return
        job.future.set_exception(GrammarError("grammar", "the engine is shutting down"))

    def close(self) -> None:
        """Stops the driver and kills every worker; queued and running jobs, and jobs
        after this, fail."""
        with self._lock:
            if self._closed:  # closed already (its pipe's descriptors may be reused)
                return
            self._closed = True
            driver = self._driver
        self._wake()
        if driver is not None and driver is not threading.current_thread():
            driver.join()
        # no driver runs now, and none starts: its state is this thread's
        for worker in self._workers:
            if worker.job is not None:
                _fail(worker.job, "the engine shut down while it compiled")
        with self._lock:
            self._queues[GENERAL].extend(self._inbox)
            self._inbox.clear()
        self._fail_queued("the engine is shutting down")
        self._warmed.set()
        self._finalizer()

    def pids(self) -> list[int]:
        """The live workers' process ids (tests check a killed one is gone)."""
        return [w.pid for w in list(self._workers) if w.alive]

    def lane_pids(self, lane: str) -> list[int]:
        """The live workers' process ids in ``lane`` ("fast" or "general")."""
        return [w.pid for w in list(self._workers) if w.alive and w.lane == lane]

    # ---- the driver thread ------------------------------------------------------------

    def _ensure_driver(self) -> None:
        """Wakes the driver, or starts one if none runs (under ``_lock``). The driver
        holds this object weakly between its steps, so one its owner dropped without
        ``close`` is still collected, and its finalizer kills the workers."""
        if self._driver is None:
            self._driver = threading.Thread(
                target=_drive, args=(weakref.ref(self),), name=DRIVER_THREAD, daemon=True
            )
            self._driver.start()
        else:
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"x")
        except (BlockingIOError, OSError):  # already woken (a full pipe), or closed
            pass

    def _step(self) -> bool:
        """One driver step: what ``submit`` handed over is queued and the workers are
        moved on; False (and the driver is gone) once no job waits or runs and no
        worker starts, or after ``close``."""
        with self._lock:
            if self._closed:
                self._driver = None
                return False
            jobs, warm = list(self._inbox), self._warm_asked
            self._inbox.clear()
            self._warm_asked = False
            if not jobs and not warm and not self._has_work():
                self._driver = None
                return False
        self._queue(jobs, warm)
        self._pump(self._wait_s(time.monotonic()))
        return True

    def _driver_failed(self, exc: BaseException) -> None:
        """A bug in the driver: every compile it holds fails, loudly, rather than leave
        its caller waiting; the next ``submit`` starts another driver."""
        logger.exception("the grammar compile driver failed", exc_info=exc)
        with self._lock:
            self._driver = None
            self._queues[GENERAL].extend(self._inbox)
            self._inbox.clear()
        for worker in list(self._workers):
            if worker.job is not None:
                _fail(worker.job, f"the compile driver failed: {exc!r}")
            self._discard(worker)
        self._fail_queued(f"the compile driver failed: {exc!r}")

    def _queue(self, jobs: list[CompileJob], warm: bool) -> None:
        """Queues what ``submit`` handed over, each job in its lane; after ``warm``,
        keeps the fast lane's worker started."""
        if warm:
            self._keep_fast = True
        for job in jobs:
            lane = FAST if job.small else GENERAL
            job.cold = not self._ready_for(lane)
            self._queues[lane].append(job)
        self._assign(time.monotonic())

    def _has_work(self) -> bool:
        """Whether a job waits or runs, or a worker starts: the driver keeps going."""
        return self._queued() or any(w.job is not None or not w.ready for w in self._workers)

    def _wait_s(self, now: float) -> float:
        """How long the driver may wait on the pipes: until the nearest deadline (a
        worker's start or job, a queued job's limit), at most ``_DRIVER_POLL_S``."""
        deadlines = [w.deadline for w in self._workers]
        deadlines += [job.deadline for queue in self._queues.values() for job in queue]
        return max(0.0, min([now + _DRIVER_POLL_S, *deadlines]) - now)

    def _pump(self, timeout: float) -> None:
        """Moves every worker on (the driver's step): waits up to ``timeout`` seconds
        for a pipe to be ready or a wake-up, then writes, reads, settles finished jobs,
        kills what overran its limit, refuses queued jobs past theirs and hands queued
        jobs to idle workers (starting a worker when none is free)."""
        reads = [self._wake_read, *(w.read_fd for w in self._workers)]
        writes = [fd for w in self._workers if (fd := w.write_fd) is not None]
        if timeout > 0:
            select.select(reads, writes, [], timeout)
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        now = time.monotonic()
        for worker in list(self._workers):
            self._move(worker, now)
        self._settle_queued(now)
        self._assign(now)

    def _queued(self) -> bool:
        return any(self._queues.values())

    def _move(self, worker: _Worker, now: float) -> None:
        """One worker's writes, reads and deadline (it may be discarded)."""
        try:
            frames = worker.exchange()
        except _WorkerGone as e:
            self._on_gone(worker, str(e))
            return
        for frame in frames:
            self._on_frame(worker, frame)
            if worker not in self._workers:
                return
        if now > worker.deadline:
            self._on_overrun(worker, now)

    def _ready_for(self, lane: str) -> bool:
        """Whether a worker that takes ``lane``'s jobs is ready (idle or busy)."""
        return any(w.ready and w.lane in (GENERAL, lane) for w in self._workers)

    def _settle_queued(self, now: float) -> None:
        """Moves on the deadline of each cold job while still no worker is ready to take
        it, and refuses the queued jobs past their limit."""
        since = self._last_pump
        self._last_pump = now
        for lane, queue in self._queues.items():
            ready = self._ready_for(lane)
            for job in list(queue):
                if job.cold and not ready:
                    job.deadline += now - max(since, job.arrived)
                    continue
                job.cold = False
                if now > job.deadline:
                    queue.remove(job)
                    job.future.set_exception(_timed_out(job, started=False))

    def _on_frame(self, worker: _Worker, frame: Any) -> None:
        if not worker.ready:
            if frame != "ready":
                self._on_start_failed(worker, f"it did not start: {frame!r}")
                return
            worker.ready, worker.deadline = True, float("inf")
            if worker.lane == FAST:
                _set_niceness(worker.pid, os.getpriority(os.PRIO_PROCESS, 0))
                self._warmed.set()
            return
        job, worker.job, worker.deadline = worker.job, None, float("inf")
        assert job is not None, "a reply without a job"
        status, *payload = frame
        if status == "ok":
            job.future.set_result(CompileResult(*payload))
            return
        kind, field_name, reason = payload
        job.future.set_exception(_ERRORS.get(kind, GrammarError)(field_name, reason))

    def _on_gone(self, worker: _Worker, why: str) -> None:
        if not worker.ready:
            self._on_start_failed(worker, f"it did not start: {why}")
            return
        self._discard(worker)
        if worker.job is not None:
            cap = self._config.grammar_compile_memory_mb
            _fail(
                worker.job,
                f"compiling it {_with(worker.job)} killed its worker "
                f"({why}); it may need more than grammar_compile_memory_mb ({cap} MB)",
            )

    def _on_overrun(self, worker: _Worker, now: float) -> None:
        if not worker.ready:
            self._on_start_failed(worker, f"it did not start within {_START_TIMEOUT:g} s")
            return
        job = worker.job
        assert job is not None
        self._discard(worker)
        if worker.lane == FAST and now <= job.deadline:  # not small after all
            job.small, job.cold = False, not self._ready_for(GENERAL)
            self._queues[GENERAL].appendleft(job)  # it arrived before those queued there
            return
        job.future.set_exception(_timed_out(job, started=True))

    def _on_start_failed(self, worker: _Worker, why: str) -> None:
        """A worker that cannot start would fail again: the queued jobs fail with it."""
        self._discard(worker)
        self._keep_fast = False  # a restart would fail again
        self._warmed.set()  # (not ready: no waiter waits for what cannot come)
        self._fail_queued(f"the grammar compile worker failed to start: {why}")

    def _discard(self, worker: _Worker) -> None:
        """Drops a killed or dead worker. Its successor starts only when a job needs it:
        started now, its start-up (seconds of CPU) would slow the engine right after the
        refusal it is there to contain."""
        worker.kill()
        if worker in self._workers:  # (released meanwhile: the list was emptied)
            self._workers.remove(worker)

    def _assign(self, now: float) -> None:
        """Hands queued jobs to idle workers (a fast worker takes small jobs only, a
        general one its own queue first); starts a worker where a lane's jobs wait and
        it may grow."""
        for worker in list(self._workers):
            if not (worker.ready and worker.job is None):
                continue
            if not worker.alive:  # it died while idle (killed from outside)
                self._discard(worker)
                continue
            queue = self._queues[GENERAL]
            if worker.lane == FAST or not queue:
                queue = self._queues[FAST]
            if queue:
                worker.take(queue.popleft(), now)
        wanted = self._queues[FAST] or self._keep_fast
        if wanted and not self._closed and not any(w.lane == FAST for w in self._workers):
            self._start(FAST)
        general = [w for w in self._workers if w.lane == GENERAL]
        # one starting is sooner ready than another started now
        if self._queues[GENERAL] and all(w.ready for w in general):
            if len(general) < self._config.grammar_compile_workers:
                self._start(GENERAL)

    def _start(self, lane: str) -> None:
        try:
            self._workers.append(_Worker(self._vocab, self._config, lane))
        except OSError as e:
            self._fail_queued(f"the grammar compile worker failed to start: {e}")

    def _fail_queued(self, reason: str) -> None:
        for queue in self._queues.values():
            for job in queue:
                _fail(job, reason)
            queue.clear()


def _drive(ref: weakref.ref[CompileWorkers]) -> None:
    """The driver thread: ``CompileWorkers._step`` until it says done, holding the
    workers strongly only during a step (at most ``_DRIVER_POLL_S`` of waiting)."""
    while True:
        workers = ref()
        if workers is None or workers._released.is_set():  # collected, closed or exiting
            return
        try:
            going = workers._step()
        except BaseException as exc:
            if not workers._released.is_set():  # (else its pipes closed under the step)
                workers._driver_failed(exc)
            return
        if not going:
            return
        del workers


def _timed_out(job: CompileJob, started: bool) -> GrammarCompileTimeoutError:
    """A job past its limit: it ran (and was stopped), or waited for a worker all along."""
    what = (
        "the compile was stopped"
        if started
        else "it waited that long for a busy compile worker and was never started"
    )
    return GrammarCompileTimeoutError(
        job.spec.kind,
        f"compiling it {_with(job)} took over {job.timeout:g} s (grammar_compile_timeout, "
        f"counted from the request's arrival); {what}{_hint(job.spec, job.backend)}",
    )


def _fail(job: CompileJob, reason: str) -> None:
    job.future.set_exception(GrammarError(job.spec.kind, reason))


def _release(workers: list[_Worker], fds: tuple[int, ...], released: threading.Event) -> None:
    """Kills every worker and closes the wake-up pipe (``close``, or the finalizer: on
    collection or at the interpreter's exit)."""
    released.set()
    for worker in list(workers):
        worker.kill()
    workers.clear()
    for fd in fds:
        os.close(fd)


def _frame(value: Any) -> bytes:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _hint(spec: GrammarSpec, backend: str) -> str:
    if backend == AUTO:  # it tried every backend worth trying
        return ""
    return REGISTRY.timeout_hint(backend, spec.kind)


def _with(job: CompileJob) -> str:
    """How a message names the job's backend(s)."""
    if job.backend == AUTO:
        return f"with grammar_backend='auto' ({', then '.join(auto_backends(job.spec))})"
    return f"with the {job.backend} backend"


def auto_backends(spec: GrammarSpec) -> tuple[str, ...]:
    """The backends ``grammar_backend="auto"`` tries on JSON schema ``spec``, in order.

    The ones that compile it (``REGISTRY.compiling``: the default, llguidance, first, so
    a schema it enforces gets what "auto" always gave), less those slow on it: outlines'
    FSM over a schema's regex can take the whole time limit, which the tries share, and
    outlines enforces no keyword or format xgrammar does not (its tables are a subset of
    xgrammar's), so a schema both others refuse it would refuse too. A lenient spec gets
    the first alone: lenient drops what it cannot enforce instead of refusing by keyword.
    """
    kind = spec.kind
    names = tuple(n for n in REGISTRY.compiling(kind) if kind not in REGISTRY.entry(n).slow_kinds)
    return names[:1] if spec.lenient else names


def build_backend(name: str, vocab: TokenVocabulary, config: GrammarConfig) -> GrammarBackend:
    """The backend called ``name`` (``registry.REGISTRY``; its packages are imported
    here, on first use, and jsonschema with them: every backend checks JSON schemas).

    Raises:
        UnsupportedGrammarError: no backend of that name (the message names them).
        ImportError: a package it needs is not installed.
    """
    backend = REGISTRY.build(name, vocab, config)
    load_drafts()
    return backend


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
    import resource  # lazy: POSIX only, and only the worker process caps itself

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
    # Every backend now, before "ready": building one takes a while, which is not part
    # of any grammar's time limit.
    backends: dict[str, Any] = {}
    for name in REGISTRY.names():
        try:
            backends[name] = build_backend(name, vocab, config)
        except ImportError:  # the parent names the missing package to the caller
            pass
    # A vocabulary variant's backends (a grammar writing special tokens), built as used.
    variants: dict[tuple[str, ...], _VariantBackends] = {}
    _write_frame(replies, "ready")
    while True:
        try:
            backend_name, spec = _read_frame(requests)
        except EOFError:
            return
        pool: dict[str, Any] = backends
        if spec.special_tokens:
            pool = variants.get(spec.special_tokens) or variants.setdefault(
                spec.special_tokens,
                _VariantBackends(backends, vocab.with_special_tokens(spec.special_tokens), config),
            )
        reply = _compile_job(pool, backend_name, spec, vocab, config)
        try:
            _write_frame(replies, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # a backend bug
            _write_frame(replies, ("error", "GrammarError", spec.kind, f"{backend_name}: {e!r}"))


class _VariantBackends(dict):
    """The backends over a vocabulary variant: those installed (the keys of ``base``),
    each built on its first use (its build counts in that compile's time)."""

    def __init__(self, base: dict[str, Any], vocab: TokenVocabulary, config: GrammarConfig):
        super().__init__()
        self._names, self._vocab, self._config = frozenset(base), vocab, config

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __missing__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        backend = self[name] = build_backend(name, self._vocab, self._config)
        return backend


def _compile_job(
    backends: dict[str, Any],
    name: str,
    spec: GrammarSpec,
    vocab: TokenVocabulary,
    config: GrammarConfig,
) -> tuple:
    """One job's reply: ("ok", exported, seconds, backend) or ("error", class, field,
    reason). ``name`` "auto" tries ``auto_backends`` (those this worker has) in turn."""
    start = time.perf_counter()
    names = (name,)
    if name == AUTO:
        chain = auto_backends(spec)
        names = tuple(n for n in chain if n in backends) or chain[:1]
    try:
        compiled_by, exported = _compile_first(backends, names, spec, vocab)
        return ("ok", exported, time.perf_counter() - start, compiled_by)
    except GrammarError as e:
        return ("error", type(e).__name__, e.field, e.reason)
    except MemoryError:
        cap = config.grammar_compile_memory_mb
        reason = f"compiling it needs more than grammar_compile_memory_mb ({cap} MB)"
        return ("error", "GrammarError", spec.kind, reason)


def _compile_first(
    backends: dict[str, Any], names: tuple[str, ...], spec: GrammarSpec, vocab: TokenVocabulary
) -> tuple[str, Any]:
    """The first of ``names`` to compile ``spec``, and its export.

    Only a refusal (``UnsupportedGrammarError``: something that backend cannot enforce)
    moves on to the next: any other error is the spec's own (invalid, accepting nothing,
    too large) and every backend would answer it alike.

    Raises:
        UnsupportedGrammarError: every one refused (``_refused``).
        GrammarError: the first other error.
    """
    refusals: list[tuple[str, UnsupportedGrammarError]] = []
    for name in names:
        try:
            return name, _compile_one(backends, name, spec, vocab)
        except UnsupportedGrammarError as e:
            refusals.append((name, e))
    raise _refused(refusals)


def _compile_one(
    backends: dict[str, Any], name: str, spec: GrammarSpec, vocab: TokenVocabulary
) -> Any:
    """``spec`` compiled by backend ``name``, checked, exported."""
    try:
        backend = backends[name]
        compiled = backend.compile(spec)
        _check_accepts_something(compiled, spec, vocab)
        return backend.export(compiled)
    except (GrammarError, MemoryError):
        raise
    except Exception as e:  # a backend bug: still the caller's error, never a hang
        raise GrammarError(spec.kind, f"{name} failed: {e!r}") from e


def _refused(refusals: list[tuple[str, UnsupportedGrammarError]]) -> UnsupportedGrammarError:
    """Every backend's refusal as one: the first's (the kind's default, so the message
    names the keyword and where, as that backend alone would), noting the others."""
    (_, first), others = refusals[0], [name for name, _ in refusals[1:]]
    if not others:
        return first
    note = f"; grammar_backend='auto' tried {' and '.join(others)} too, which refused it as well"
    return UnsupportedGrammarError(first.field, first.reason + note)


def _check_accepts_something(compiled: Any, spec: GrammarSpec, vocab: TokenVocabulary) -> None:
    """A grammar that allows no first token and is not already complete accepts nothing
    (backends catch most such specs earlier, with a sharper message)."""
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
