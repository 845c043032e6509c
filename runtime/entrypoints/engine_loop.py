"""The engine's loop thread: the one place the scheduler and the model run.

    Engine (caller threads)                 EngineLoop (its own thread)
    post(LoopMessage) --- queue --------->  apply messages: AddRequests (sinks),
                                              Abort, FlushCache, Wake
                                            step(): schedule -> launch -> process_output
    sink(OutputDelta) <------------------   publish what changed to its request's sink

A step is ``Stepper.step``: one pass at a time, or, with overlap scheduling (on for
a GPU), pass N+1 launched before pass N's results are applied.

All torch work happens on this thread: a second thread running torch ops creates
a second OpenMP team, and on a 2-core machine the two teams' workers throttle each
other (benchmarks/README.md, "CPU engine choices"). The runtime is built here too.

While another engine's loop thread runs in the process, the loop thread retires
after ``IDLE_EXIT_S`` without work, and the next message starts a fresh one. GNU OpenMP
(torch's CPU threads) keeps a team of workers for every thread that ever ran a
parallel op; once a process holds more workers than cores, libgomp stops
spin-waiting between ops and every op pays a wake-up. An idle engine's team alone
slows a busy engine's decode down to about half; a retired thread's team ends with it.
A lone loop thread stays: a fresh thread and team add a few ms to the next request
(figures: benchmarks/README.md, "CPU engine choices"). Which
loop threads run is read from the process's threads (by name), not kept in a
registry of ours.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

from radixlm.runtime.config import EngineConfig
from radixlm.runtime.constrained import CompiledGrammar
from radixlm.runtime.constrained.compiler import PendingGrammar
from radixlm.runtime.entrypoints.assembly import Runtime, build_runtime
from radixlm.runtime.entrypoints.stepper import Stepper
from radixlm.runtime.errors import EngineStoppedError, InvalidRequestError, RankFailedError
from radixlm.runtime.executor.cpu_threads import configure_cpu
from radixlm.runtime.io.messages import (
    Abort,
    AddRequests,
    DeltaSink,
    FlushCache,
    LoopMessage,
    OutputDelta,
    ReadStats,
    Wake,
)
from radixlm.runtime.scheduling.scheduler import Scheduler

__all__ = ["IDLE_EXIT_S", "THREAD_NAME", "WAKE_CHECK_S", "EngineLoop"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

IDLE_EXIT_S = 2.0  # seconds without work after which the loop thread retires
WAKE_CHECK_S = 1.0  # how often a waiting caller checks that the loop still runs
# A compiled constraint whose spec is longer than this (characters) is loaded into the
# engine's process in a worker thread, not on the awaiting caller's event loop.
LOAD_ON_LOOP_CHARS = 8192
THREAD_NAME = "radixlm-engine"  # every loop thread's name


class EngineLoop:
    """Builds the runtime on its thread, then serves the messages posted to it.

    Raises (from the constructor) what building the runtime raised:
    ModelNotFoundError, ModelLoadError, ConfigError.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.error: BaseException | None = None  # what crashed the loop, if it did
        self.thread: threading.Thread | None = None  # None: retired while idle
        self._messages: queue.SimpleQueue[LoopMessage] = queue.SimpleQueue()
        self._sinks: dict[str, DeltaSink] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # guards ``thread`` against a retiring loop
        self.runtime = self._start()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def scheduler(self) -> Scheduler:
        return self.runtime.scheduler

    def post(self, message: LoopMessage) -> None:
        """Queues a message, starting a loop thread if the last one retired.

        Raises EngineStoppedError for new requests once the loop is shut down or has
        failed (they would never run; ``fail`` shuts down on a thread of its own, so
        its error is checked too); other messages are then moot and dropped by nobody."""
        if isinstance(message, AddRequests):
            if self.error is not None:
                raise EngineStoppedError("the engine loop stopped") from self.error
            if self._stopping.is_set():
                raise EngineStoppedError("the engine was shut down")
        with self._lock:
            self._messages.put(message)
            if self.thread is None and not self._stopping.is_set():
                self.thread = _start_thread(self._resumed)

    def wait_on(self, results: queue.SimpleQueue[T]) -> T:
        """The next item the loop puts in ``results``; raises EngineStoppedError if
        the loop died (or was shut down) first."""
        while True:
            try:
                return results.get(timeout=WAKE_CHECK_S)
            except queue.Empty:
                self.check_alive()

    def wait_grammar(self, pending: PendingGrammar | None) -> CompiledGrammar | None:
        """``pending``'s compiled grammar, waiting in this thread while the compile
        workers' driver runs its compile. Raises its GrammarError, or EngineStoppedError
        if the loop died."""
        if pending is None:
            return None
        while True:
            try:
                pending.future.exception(timeout=WAKE_CHECK_S)
                return pending.result()
            except TimeoutError:
                self.check_alive()

    async def await_grammar(self, pending: PendingGrammar | None) -> CompiledGrammar | None:
        """``wait_grammar`` for an event loop: the compile is awaited."""
        if pending is None:
            return None
        if not pending.done():
            loop = asyncio.get_running_loop()
            settled = loop.create_future()
            # Not asyncio.wrap_future: cancelling the waiter would cancel the shared,
            # cached compile. This waiter's future only learns that it is done.
            pending.future.add_done_callback(lambda _: loop.call_soon_threadsafe(_settle, settled))
            while not pending.done():
                await asyncio.wait({settled}, timeout=WAKE_CHECK_S)
                self.check_alive()
        if len(pending.spec.text) <= LOAD_ON_LOOP_CHARS:
            return pending.result()
        return await asyncio.to_thread(pending.result)  # seconds for big grammars: off the loop

    def check_alive(self) -> None:
        """Raises EngineStoppedError when the loop has stopped: shut down, or crashed.
        (A thread retired while idle is not stopped: the next ``post`` restarts it.)"""
        thread = self.thread
        if (thread is None and self._stopping.is_set()) or (
            thread is not None and not thread.is_alive()
        ):
            raise EngineStoppedError("the engine loop stopped") from self.error

    def fail(self, error: BaseException) -> None:
        """Stops the engine for ``error`` (a tensor-parallel rank died): requests
        still running finish with an abort, waiting callers raise EngineStoppedError
        from it, and ``error`` stays readable (``Engine.failure``)."""
        if self.error is None:
            self.error = error
        threading.Thread(target=self.shutdown, name="radixlm-fail").start()

    def shutdown(self) -> None:
        """Stops the loop; requests still running finish with an abort."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            thread = self.thread
            self._messages.put(Wake())
        if thread is not None:
            thread.join(timeout=30)
        # a pass still running keeps the model and the mask threads
        self.runtime.close(passes_done=thread is None or not thread.is_alive())

    # ---- on the loop thread -------------------------------------------------------------

    def _start(self) -> Runtime:
        built: queue.SimpleQueue[Runtime | BaseException] = queue.SimpleQueue()
        with self._lock:
            self.thread = _start_thread(self._first, built)
        result = built.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def _first(self, built: queue.SimpleQueue) -> None:
        configure_cpu(self.config.resolved_num_threads)
        try:
            self.runtime = build_runtime(self.config)
        except BaseException as exc:  # handed to the constructor, which raises it
            built.put(exc)
            return
        ranks = self.runtime.runner.tensor_parallel
        if ranks is not None:
            ranks.watch(self.fail)
        self._stepper = Stepper(
            self.runtime.scheduler,
            self.runtime.runner,
            self.runtime.placement.overlap_schedule,
            self._publish,
        )
        built.put(self.runtime)
        self._run()

    def _resumed(self) -> None:
        configure_cpu(self.config.resolved_num_threads)  # thread counts are per thread
        self._run()

    def _run(self) -> None:
        """Steps until shut down; returns early once idle for ``IDLE_EXIT_S`` while
        another engine's loop thread runs."""
        try:
            while not self._stopping.is_set():
                block = not (self.scheduler.has_work or self._stepper.in_flight)
                if not self._apply_messages(block=block):
                    return
                self.step()
        except RankFailedError as exc:  # not a bug here: a rank died (its own log says why)
            logger.error("engine stopped: %s", exc)
            self.error = exc
        except BaseException as exc:  # a bug: fail every request loudly, never hang callers
            logger.exception("engine loop crashed")
            self.error = exc
            raise
        finally:
            if self._stopping.is_set() or self.error is not None:
                self._publish(self.scheduler.abort_all("the engine stopped"))

    def _apply_messages(self, block: bool) -> bool:
        """Applies the queued messages, first waiting for one if ``block``.

        Returns False when it waited ``IDLE_EXIT_S`` for nothing while another engine's
        loop thread runs, and retired this thread (the next ``post`` starts another).
        """
        try:
            message = self._wait_message() if block else self._messages.get_nowait()
        except queue.Empty:
            if not block or not _another_loop_thread_runs():
                return True
            with self._lock:
                if self._messages.empty():
                    self.thread = None
                    return False
            message = self._messages.get_nowait()  # posted just now; only this thread takes
        self._apply(message)
        while True:
            try:
                self._apply(self._messages.get_nowait())
            except queue.Empty:
                return True

    def _wait_message(self) -> LoopMessage:
        """The next message, waiting up to ``IDLE_EXIT_S``.

        Raises queue.Empty when none came."""
        return self._messages.get(timeout=IDLE_EXIT_S)

    def _apply(self, message: LoopMessage) -> None:
        _HANDLERS[type(message)](self, message)

    def _add(self, message: AddRequests) -> None:
        for tokenized in message.requests:
            self._sinks[tokenized.rid] = message.sink
            self.scheduler.add_request(tokenized)

    def _abort(self, message: Abort) -> None:
        self._publish(self.scheduler.abort(message.rid))

    def _flush(self, message: FlushCache) -> None:
        try:
            self.scheduler.flush_cache()
        except InvalidRequestError as exc:
            message.reply(exc)
        else:
            message.reply(None)

    def _wake(self, message: Wake) -> None:
        return None

    def _read_stats(self, message: ReadStats) -> None:
        message.reply(message.read(self.runtime))

    def step(self) -> bool:
        """One scheduling step (``Stepper.step``); returns whether a pass ran."""
        return self._stepper.step()

    def _publish(self, deltas: list[OutputDelta]) -> None:
        for delta in deltas:
            self._sinks[delta.rid](delta)
            if delta.finished:
                del self._sinks[delta.rid]


_HANDLERS: dict[type, Callable[..., None]] = {  # message type -> EngineLoop method
    AddRequests: EngineLoop._add,
    Abort: EngineLoop._abort,
    FlushCache: EngineLoop._flush,
    Wake: EngineLoop._wake,
    ReadStats: EngineLoop._read_stats,
}


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _another_loop_thread_runs() -> bool:
    """Whether a loop thread other than the calling one runs in this process."""
    me = threading.current_thread()
    return any(t.name == THREAD_NAME and t is not me for t in threading.enumerate())


def _start_thread(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=THREAD_NAME, daemon=True)
    thread.start()
    return thread
